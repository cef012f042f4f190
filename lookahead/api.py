"""`Lookahead`: llama-cpp-python's completion API over any `Target`, with exact speculation inside.

`create_completion` and `create_chat_completion` take the same main arguments as
`llama_cpp.Llama`'s and return the same dict shapes, plus a `speculation` entry with the
request's stats. The text rules (EOS, stop strings, UTF-8, streaming) are in
`lookahead.pipeline`; the decode loop in `lookahead.engine`; everything about a backend (how
a prompt is tokenized, the chat template, the plain path for arguments the engine does not
implement) in its `Target` (see `lookahead.adapters.llama_cpp`, which `lookahead.wrap` and
`lookahead.load` use).
"""
from __future__ import annotations

import time
import uuid
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .drafter import CostModel, Drafter
from .engine import Target, generate_tokens
from .index import SuffixIndex
from .pipeline import CompletionText
from .sampling import SamplingParams
from .stats import SpeculationStats

# Arguments llama-cpp-python accepts that the engine does not implement: such requests run
# on the target's plain path (if it has one), and the stats say so in `fallback`.
UNSUPPORTED_DEFAULTS = {"suffix": None, "logprobs": None, "grammar": None, "logits_processor": None,
                        "logit_bias": None, "mirostat_mode": 0, "tfs_z": 1.0}


class Lookahead:
    """Exact prompt-lookup speculative decoding over a `Target` (e.g. a `llama_cpp.Llama`).

    Repeated calls are independent requests: the acceptance history starts afresh each
    time; only the measured cost curve (`cost`, shared by every wrapper of the same model),
    the target's own one-off settings and its KV prefix cache are kept.

    `observer`: called with every engine step's (logits rows, draft, verdict), for tests and
    diagnostics (see `lookahead.engine.generate_tokens`).
    """

    def __init__(self, target: Target, speculate: bool = True, max_draft: int = 64, calibrate: bool = True,
                 cost: CostModel | None = None,
                 observer: Callable[[np.ndarray, Sequence[int], Any], None] | None = None):
        if not isinstance(max_draft, int) or max_draft < 0:
            raise ValueError(f"max_draft must be an integer >= 0, got {max_draft!r}")
        self.target = target
        self.speculate = bool(speculate)
        self.max_draft = int(max_draft)
        if cost is None or cost.max_batch != target.max_batch:
            cost = CostModel(max_batch=target.max_batch)
        self.cost = cost
        if calibrate and not cost.calibrated:
            cost.needs_calibration = True  # done in the first speculative request
        self.observer = observer
        self._references: list[list[int]] = []

    @property
    def llm(self) -> Any:
        """The backend object the target drives (the `llama_cpp.Llama` for lookahead.wrap)."""
        return getattr(self.target, "llm", None)

    @property
    def n_ctx(self) -> int:
        """The context size in tokens: prompt and output together."""
        return self.target.n_ctx

    def verify_cost_ms(self, sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)) -> dict[int, float]:
        """The verify-cost curve as measured so far: {n: ms of one decode of n tokens}."""
        curve = self.cost.curve()
        return {int(n): round(float(curve[n]), 3) for n in sizes if 1 <= n < len(curve)}

    # ---- text ---------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` as a reference is indexed (no BOS, special tokens as text)."""
        return self.target.tokenize(text, add_bos=False, special=False)

    def count_tokens(self, text: str) -> int:
        """How many tokens `text` is on its own (no BOS, special tokens as text)."""
        return len(self.target.tokenize(text, add_bos=False, special=False))

    # ---- references ---------------------------------------------------------------
    def add_reference(self, text: str | Sequence[int]) -> int:
        """Register a reference (the file under edit, a retrieved passage) for every request."""
        self._references.append(self._reference_tokens(text))
        return len(self._references)

    def clear_references(self) -> None:
        self._references.clear()

    def _reference_tokens(self, text: str | Sequence[int]) -> list[int]:
        if isinstance(text, str):
            return self.tokenize(text)
        return [int(t) for t in text]

    # ---- completion -----------------------------------------------------------------
    def create_completion(
        self,
        prompt: str | list[int],
        suffix: str | None = None,
        max_tokens: int | None = 16,
        temperature: float = 0.8,
        top_p: float = 0.95,
        min_p: float = 0.05,
        typical_p: float = 1.0,
        logprobs: int | None = None,
        echo: bool = False,
        stop: str | list[str] | None = None,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_penalty: float = 1.0,
        top_k: int = 40,
        stream: bool = False,
        seed: int | None = None,
        tfs_z: float = 1.0,
        mirostat_mode: int = 0,
        mirostat_tau: float = 5.0,
        mirostat_eta: float = 0.1,
        model: str | None = None,
        stopping_criteria: Any = None,
        logits_processor: Any = None,
        grammar: Any = None,
        logit_bias: Any = None,
        references: Sequence[str | Sequence[int]] | None = None,
        prediction: str | Sequence[int] | None = None,
        speculate: bool | None = None,
    ):
        """Generate a completion; same arguments and dict shape as `Llama.create_completion`.

        Extra arguments: `references`, texts (or token lists) whose continuations may be
        drafted in this request only; `prediction`, one more such text whose drafted and
        accepted tokens are counted apart (`speculation["prediction_drafted"]`,
        `["prediction_accepted"]`: OpenAI's Predicted Outputs); `speculate=False` for the
        plain path through the same engine. The result has a `speculation` entry (stream: in
        the last chunk).
        """
        clock = _Clock()
        arguments = dict(locals())
        del arguments["clock"]
        unsupported = [name for name, default in UNSUPPORTED_DEFAULTS.items() if arguments[name] != default]
        if unsupported:
            plain = {k: v for k, v in arguments.items()
                     if k not in ("self", "references", "prediction", "speculate")}
            return self._fallback(unsupported, plain, clock)
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, (int, np.integer))):
            raise ValueError(f"max_tokens must be an integer or None, got {max_tokens!r}")
        params = SamplingParams(
            temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, typical_p=typical_p,
            repeat_penalty=repeat_penalty, frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty, penalty_last_n=int(getattr(self.target, "penalty_last_n", 64)),
        )
        prompt_tokens = self.target.completion_prompt_tokens(prompt)
        n_ctx = self.target.n_ctx
        if len(prompt_tokens) >= n_ctx:
            raise ValueError(f"Requested tokens ({len(prompt_tokens)}) exceed context window of {n_ctx}")
        room = n_ctx - len(prompt_tokens)
        max_tokens = room if max_tokens is None or max_tokens <= 0 else min(int(max_tokens), room)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        stats = SpeculationStats()
        text = CompletionText(self.target.piece, self.target.is_eog, max_tokens, stops, stream,
                              prompt_tokens, stopping_criteria)
        pieces = self._generate(prompt_tokens, params, np.random.default_rng(seed), text, stopping_criteria,
                                self.speculate if speculate is None else bool(speculate),
                                references or (), prediction, stats)
        completion_id = f"cmpl-{uuid.uuid4()}"
        created = int(time.time())
        model_name = model if model is not None else getattr(self.target, "model_name", "")

        def chunk(piece: str, finish: str | None) -> dict:
            return {"id": completion_id, "object": "text_completion", "created": created, "model": model_name,
                    "choices": [{"text": piece, "index": 0, "logprobs": None, "finish_reason": finish}]}

        if stream:
            def stream_chunks() -> Iterator[dict]:
                with _closing(pieces):
                    for piece in pieces:
                        if piece:
                            yield chunk(piece.decode("utf-8", errors="ignore"), None)
                last = chunk("", text.finish_reason)
                last["usage"] = _usage(len(prompt_tokens), len(text.tokens))
                stats.request_ms = clock.ms()
                last["speculation"] = stats.to_dict()
                yield last

            return CompletionStream(stream_chunks(), stats.to_dict, clock)

        for _ in pieces:
            pass
        out = text.text.decode("utf-8", errors="ignore")
        if echo:
            out = (prompt if isinstance(prompt, str) else
                   b"".join(self.target.piece(t) for t in prompt_tokens).decode("utf-8", errors="ignore")) + out
        result = chunk(out, text.finish_reason)
        result["usage"] = _usage(len(prompt_tokens), len(text.tokens))
        stats.request_ms = clock.ms()
        result["speculation"] = stats.to_dict()
        return result

    __call__ = create_completion

    def _generate(self, prompt_tokens: list[int], params: SamplingParams, rng: np.random.Generator,
                  text: CompletionText, stopping_criteria: Any, speculate: bool,
                  references: Sequence[str | Sequence[int]], prediction: str | Sequence[int] | None,
                  stats: SpeculationStats) -> Iterator[bytes]:
        """Run one request through the engine; yield the bytes that are safe to stream."""
        t0 = time.perf_counter()
        index = SuffixIndex()
        for ref in [*self._references, *(self._reference_tokens(r) for r in references)]:
            if ref:
                index.add_reference(ref)
        prediction_source = None
        if prediction is not None:
            tokens = self._reference_tokens(prediction)
            if tokens:
                prediction_source = index.add_reference(tokens)
        stats.index_ms = 1000 * (time.perf_counter() - t0)  # the engine adds the prompt's share
        drafter = None
        if speculate and self.max_draft > 0:
            drafter = Drafter(self.cost, max_draft=self.max_draft, sampled=not params.greedy,
                              tree_width=int(getattr(self.target, "tree_width", 1)), is_stop=self.target.is_eog)
        # Beyond max_tokens the engine may need a few tokens to finish a multi-byte character
        # (llama-cpp-python keeps sampling while the text ends inside one).
        engine_max = min(text.max_tokens + 3, self.target.n_ctx - len(prompt_tokens))
        steps = generate_tokens(self.target, prompt_tokens, params, rng, engine_max, drafter, index, stats,
                                self.observer, with_rows=stopping_criteria is not None,
                                draft_limit=text.max_tokens)
        try:
            for step in steps:
                token, row = step if stopping_criteria is not None else (step, None)
                piece = text.push(token, row)
                if piece:
                    yield piece
                if text.finished:
                    break
        finally:
            steps.close()  # the engine leaves the target consistent before the text is closed
            rest = text.close()
            if prediction_source is not None:
                stats.prediction_drafted, stats.prediction_accepted = stats.by_source.get(prediction_source, (0, 0))
        if rest:
            yield rest

    # ---- chat ---------------------------------------------------------------------
    def create_chat_completion(
        self,
        messages: list[dict],
        references: Sequence[str | Sequence[int]] | None = None,
        prediction: str | Sequence[int] | None = None,
        speculate: bool | None = None,
        **kwargs: Any,
    ):
        """Chat completion through the model's own chat template (the target formats it).

        Same arguments and dict shape as `Llama.create_chat_completion`, plus `references`,
        `prediction` and `speculate` as in `create_completion`, and a `speculation` entry
        (stream: in the last chunk).
        """
        clock = _Clock()
        captured: list[dict] = []  # this request's stats, whatever the template does with chunks
        usage: list[dict] = []  # and its token counts (a chat stream's chunks drop them)
        inner: list[CompletionStream] = []  # the completion stream under a chat stream

        def complete(*args: Any, **completion_kwargs: Any):
            completion_kwargs.update(references=references, prediction=prediction, speculate=speculate)
            result = self.create_completion(*args, **completion_kwargs)
            if isinstance(result, dict):
                captured.append(result.get("speculation"))
                return result
            inner.append(result)
            return _recording_speculation(result, captured, usage)

        result = self.target.chat_completion(complete, messages, **kwargs)
        if isinstance(result, dict):
            # the template and the chat conversion are the library's time too
            result["speculation"] = {**captured[-1], "request_ms": round(clock.ms(), 3)} if captured else None
            return result
        return CompletionStream(_with_speculation_last(result, captured, usage=usage, clock=clock),
                                lambda: inner[-1].speculation if inner else (captured[-1] if captured else None),
                                clock)

    def _fallback(self, unsupported: list[str], arguments: dict[str, Any], clock: "_Clock"):
        """Run a request the engine cannot on the target's plain path; the stats say why."""
        plain = getattr(self.target, "plain_completion", None)
        if plain is None:
            raise ValueError(f"unsupported by lookahead: {', '.join(unsupported)} "
                             f"(and this target has no plain path to run them)")
        stats = SpeculationStats(speculative=False, fallback="unsupported by lookahead: " + ", ".join(unsupported))
        t0 = time.perf_counter()
        result = plain(**arguments)
        if isinstance(result, dict):
            stats.total_ms = 1000 * (time.perf_counter() - t0)
            stats.request_ms = clock.ms()
            result["speculation"] = stats.to_dict()
            return result
        return CompletionStream(_with_speculation_last(result, [stats.to_dict()], t0=t0, stats=stats, clock=clock),
                                stats.to_dict, clock)


class _Clock:
    """The library's own time for one request (`speculation["request_ms"]`): it runs from the
    call until the call returns, then, for a stream, only while the next chunk is being made,
    so the time the consumer spends between chunks (a server writing them out) is not counted."""

    def __init__(self):
        self._ms = 0.0
        self._since: float | None = time.perf_counter()

    def pause(self) -> None:
        if self._since is not None:
            self._ms += 1000 * (time.perf_counter() - self._since)
            self._since = None

    def resume(self) -> None:
        if self._since is None:
            self._since = time.perf_counter()

    def ms(self) -> float:
        running = 1000 * (time.perf_counter() - self._since) if self._since is not None else 0.0
        return self._ms + running


class CompletionStream:
    """A streamed response: an iterator of llama-cpp-python's chunks (the last one carries the
    `speculation` stats), whose `speculation` property gives the request's stats at any time,
    also after `close()` ends it early (generation stops at the next step)."""

    def __init__(self, chunks: Iterator[dict], speculation: Callable[[], dict | None], clock: _Clock | None = None):
        self._chunks = chunks
        self._speculation = speculation
        self._clock = clock
        if clock is not None:
            clock.pause()  # the call returns: the consumer's time starts

    def __iter__(self) -> "CompletionStream":
        return self

    def __next__(self) -> dict:
        if self._clock is None:
            return next(self._chunks)
        self._clock.resume()
        try:
            return next(self._chunks)
        finally:
            self._clock.pause()

    def close(self) -> None:
        close = getattr(self._chunks, "close", None)
        if close is not None:
            close()

    @property
    def speculation(self) -> dict | None:
        return self._speculation()


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


class _closing:
    """Close a generator when the block ends, however it ends (a stream closed early, too)."""

    def __init__(self, gen):
        self.gen = gen

    def __enter__(self):
        return self.gen

    def __exit__(self, *exc):
        close = getattr(self.gen, "close", None)
        if close is not None:
            close()
        return False


def _recording_speculation(chunks: Iterator[dict], captured: list[dict], usage: list[dict]) -> Iterator[dict]:
    """Pass a completion stream through, noting its stats and usage (the last chunk's)."""
    with _closing(chunks):
        for item in chunks:
            if isinstance(item, dict) and "speculation" in item:
                captured.append(item["speculation"])
            if isinstance(item, dict) and "usage" in item:
                usage.append(item["usage"])
            yield item


def _with_speculation_last(chunks: Iterator[dict], captured: list[dict], t0: float | None = None,
                           stats: SpeculationStats | None = None,
                           usage: list[dict] | None = None, clock: _Clock | None = None) -> Iterator[dict]:
    """Yield the chunks; the last one gets the request's stats (`captured[-1]`, with the
    request's time on `clock`) and, when the stream's own chunks dropped it, its usage."""
    with _closing(chunks):
        previous = None
        for item in chunks:
            if previous is not None:
                yield previous
            previous = item
    if previous is not None:
        if stats is not None and t0 is not None:
            stats.total_ms = 1000 * (time.perf_counter() - t0)
            captured = [stats.to_dict()]
        speculation = captured[-1] if captured else None
        if speculation is not None and clock is not None:
            speculation = {**speculation, "request_ms": round(clock.ms(), 3)}
        previous["speculation"] = speculation
        if usage and "usage" not in previous:
            previous["usage"] = usage[-1]
        yield previous
