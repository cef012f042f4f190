"""`Lookahead`: llama-cpp-python's completion API over any `Target`, with exact speculation inside.

`create_completion` and `create_chat_completion` take the same main arguments as
`llama_cpp.Llama`'s and return the same dict shapes, plus a `speculation` entry with the
request's stats. The text rules (EOS, stop strings, UTF-8, streaming) are in
`lookahead.pipeline`; the decode loop in `lookahead.engine`; everything about a backend (how
a prompt is tokenized, the chat template, the plain path for arguments the engine does not
implement) in its `Target` (the contract: `lookahead.engine.TextTarget` and the optional
Protocols beside it; the implementation: `lookahead.adapters.llama_cpp`, which `lookahead.wrap`
and `lookahead.load` use). Front ends read the model through the wrapper (`n_ctx`,
`count_tokens`, `model_path`, `prompt_cache_off`, ...), never through its target.
"""
from __future__ import annotations

import time
import uuid
from contextlib import nullcontext
from typing import Any, Callable, ContextManager, Iterator, Sequence

import numpy as np

from .drafter import CostModel, Drafter
from .engine import ModelFileTarget, PaddedTarget, PlainTarget, TextTarget, TreeTarget, generate_tokens
from .index import SuffixIndex
from .pipeline import CompletionText
from .sampling import LIBRARY_DEFAULTS as DEFAULTS
from .sampling import SamplingParams
from .stats import SpeculationStats
from .streams import Clock, CompletionStream, closing, recording_speculation, with_speculation_last

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

    def __init__(self, target: TextTarget, speculate: bool = True, max_draft: int = 64, calibrate: bool = True,
                 cost: CostModel | None = None,
                 observer: Callable[[np.ndarray, Sequence[int], Any], None] | None = None):
        if not isinstance(max_draft, int) or max_draft < 0:
            raise ValueError(f"max_draft must be an integer >= 0, got {max_draft!r}")
        self.target = target
        self.speculate = bool(speculate)
        self.max_draft = int(max_draft)
        if cost is None or cost.max_batch != target.max_batch:
            cost = CostModel(max_batch=target.max_batch, padding=batch_padding(target))
        self.cost = cost
        if calibrate and not cost.calibrated:
            cost.needs_calibration = True  # done in the first speculative request
        self.observer = observer
        self._references: list[list[int]] = []

    @property
    def llm(self) -> Any:
        """The backend object the target drives (the `llama_cpp.Llama` for lookahead.wrap)."""
        return getattr(self.target, "llm", None)

    # ---- the model, as front ends see it ----------------------------------------------
    @property
    def n_ctx(self) -> int:
        """Tokens the context holds: prompt and completion together."""
        return self.target.n_ctx

    @property
    def n_vocab(self) -> int:
        return self.target.n_vocab

    @property
    def model_name(self) -> str:
        """The backend's name for the model (the `model` of responses that name none)."""
        return self.target.model_name

    @property
    def model_path(self) -> str | None:
        """The model file, if the backend has one."""
        files = _model_file(self.target)
        return files.model_path if files is not None else None

    @property
    def has_chat_template(self) -> bool:
        """Whether the model has a chat template of its own (else chat requests get the
        backend's fallback format)."""
        files = _model_file(self.target)
        return files.has_chat_template if files is not None else False

    def prompt_cache_off(self) -> ContextManager[None]:
        """A block whose requests start from an empty KV cache and neither use nor fill the
        saved prompt prefixes, so each pays its whole prefill (the server's `cache_prompt:
        false`). A backend without a prompt cache: the block changes nothing."""
        files = _model_file(self.target)
        return files.prompt_cache_off() if files is not None else nullcontext()

    def count_tokens(self, text: str) -> int:
        """Tokens of `text`, by the one rule lookahead counts text with: no BOS, and
        special-token markup ("<|im_end|>") counted as the plain text it is (special=False),
        as references are indexed and a rewrite's pieces are sized."""
        return len(self.target.tokenize(text, add_bos=False, special=False))

    def detokenize(self, tokens: Sequence[int]) -> str:
        """The text of `tokens` as a completion shows it (an echoed token prompt): their pieces,
        bytes that make no UTF-8 character dropped."""
        return b"".join(self.target.piece(int(t)) for t in tokens).decode("utf-8", errors="ignore")

    def verify_cost_ms(self, sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64)) -> dict[int, float]:
        """The verify-cost curve as measured so far: {n: ms of one decode of n tokens}."""
        curve = self.cost.curve()
        return {int(n): round(float(curve[n]), 3) for n in sizes if 1 <= n < len(curve)}

    # ---- text ---------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` as a reference is indexed (no BOS, special tokens as text)."""
        return self.target.tokenize(text, add_bos=False, special=False)

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
        temperature: float = DEFAULTS.temperature,
        top_p: float = DEFAULTS.top_p,
        min_p: float = DEFAULTS.min_p,
        typical_p: float = DEFAULTS.typical_p,
        logprobs: int | None = None,
        echo: bool = False,
        stop: str | list[str] | None = None,
        frequency_penalty: float = DEFAULTS.frequency_penalty,
        presence_penalty: float = DEFAULTS.presence_penalty,
        repeat_penalty: float = DEFAULTS.repeat_penalty,
        top_k: int = DEFAULTS.top_k,
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
        clock = Clock()
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
            presence_penalty=presence_penalty, penalty_last_n=int(self.target.penalty_last_n),
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
        model_name = model if model is not None else self.target.model_name

        def chunk(piece: str, finish: str | None) -> dict:
            return {"id": completion_id, "object": "text_completion", "created": created, "model": model_name,
                    "choices": [{"text": piece, "index": 0, "logprobs": None, "finish_reason": finish}]}

        if stream:
            def stream_chunks() -> Iterator[dict]:
                with closing(pieces):
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
            out = (prompt if isinstance(prompt, str) else self.detokenize(prompt_tokens)) + out
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
                              tree_width=self.target.tree_width if isinstance(self.target, TreeTarget) else 1,
                              is_stop=self.target.is_eog, piece=self.target.piece)
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
        answer_prefix: str | None = None,
        **kwargs: Any,
    ):
        """Chat completion through the model's own chat template (the target formats it).

        Same arguments and dict shape as `Llama.create_chat_completion`, plus `references`,
        `prediction` and `speculate` as in `create_completion`, and a `speculation` entry
        (stream: in the last chunk). `answer_prefix`: text the assistant's answer starts with,
        put after the template's prompt, so that the model continues it (the returned content
        is what follows it; `usage.prompt_tokens` counts it); a rewrite of a code file opens
        its answer with the code fence. Not with `tools` or `functions`.
        """
        if answer_prefix is not None and not isinstance(answer_prefix, str):
            raise ValueError(f"answer_prefix must be a str or None, got {answer_prefix!r}")
        if answer_prefix and (kwargs.get("tools") or kwargs.get("functions")):
            # a tool-calling template completes more than once (choosing a tool, then its call)
            raise ValueError("answer_prefix cannot be combined with tools or functions")
        prefix_tokens = self.target.tokenize(answer_prefix, add_bos=False, special=False) if answer_prefix else []
        clock = Clock()
        captured: list[dict] = []  # this request's stats, whatever the template does with chunks
        usage: list[dict] = []  # and its token counts (a chat stream's chunks drop them)
        inner: list[CompletionStream] = []  # the completion stream under a chat stream

        def complete(*args: Any, **completion_kwargs: Any):
            completion_kwargs.update(references=references, prediction=prediction, speculate=speculate)
            if prefix_tokens:  # after the templated prompt, as tokens (a str prompt tokenized first)
                prompt = args[0] if args else completion_kwargs.pop("prompt")
                if isinstance(prompt, str):
                    prompt = self.target.completion_prompt_tokens(prompt)
                args = ([*prompt, *prefix_tokens], *args[1:])
            result = self.create_completion(*args, **completion_kwargs)
            if isinstance(result, dict):
                captured.append(result.get("speculation"))
                return result
            inner.append(result)
            return recording_speculation(result, captured, usage)

        result = self.target.chat_completion(complete, messages, **kwargs)
        if isinstance(result, dict):
            # the template and the chat conversion are the library's time too
            result["speculation"] = {**captured[-1], "request_ms": round(clock.ms(), 3)} if captured else None
            return result
        return CompletionStream(with_speculation_last(result, captured, usage=usage, clock=clock),
                                lambda: inner[-1].speculation if inner else (captured[-1] if captured else None),
                                clock)

    def _fallback(self, unsupported: list[str], arguments: dict[str, Any], clock: "Clock"):
        """Run a request the engine cannot on the target's plain path; the stats say why."""
        if not isinstance(self.target, PlainTarget):
            raise ValueError(f"unsupported by lookahead: {', '.join(unsupported)} "
                             f"(and this target has no plain path to run them)")
        stats = SpeculationStats(speculative=False, fallback="unsupported by lookahead: " + ", ".join(unsupported))
        t0 = time.perf_counter()
        result = self.target.plain_completion(**arguments)
        if isinstance(result, dict):
            stats.total_ms = 1000 * (time.perf_counter() - t0)
            stats.request_ms = clock.ms()
            result["speculation"] = stats.to_dict()
            return result
        return CompletionStream(with_speculation_last(result, [stats.to_dict()], t0=t0, stats=stats, clock=clock),
                                stats.to_dict, clock)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def batch_padding(target: Any) -> tuple[int, int] | None:
    """The target's batch padding (`lookahead.engine.PaddedTarget`), None if it has none."""
    return target.batch_padding if isinstance(target, PaddedTarget) else None


def _model_file(target: Any) -> ModelFileTarget | None:
    """The target's `ModelFileTarget` members, or None for a backend without a model file."""
    return target if isinstance(target, ModelFileTarget) else None
