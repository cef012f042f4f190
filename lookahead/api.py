"""`lookahead.wrap(llm)`: llama-cpp-python's completion API, with exact speculation inside.

`create_completion` and `create_chat_completion` take the same main arguments as
`llama_cpp.Llama`'s and return the same dict shapes, plus a `speculation` entry with the
request's stats. The prompt is tokenized exactly as llama-cpp-python does it, stop strings,
EOS and `max_tokens` behave the same, and the sampled tokens follow the same distribution
(identical at temperature 0, up to llama.cpp's batched-vs-single decode differences at
near-ties). Arguments the engine does not implement (grammar, logits_processor, logprobs,
logit_bias, mirostat, suffix) are passed to the plain `llm.create_completion`, and the stats
say so in `fallback`.
"""
from __future__ import annotations

import os
import time
import uuid
import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np

from .drafter import CostModel, Drafter
from .engine import generate_tokens
from .index import SuffixIndex
from .sampling import SamplingParams
from .stats import SpeculationStats

_COST_MODELS: "weakref.WeakKeyDictionary[Any, CostModel]" = weakref.WeakKeyDictionary()


def utf8_complete_length(data: bytes) -> int:
    """Length of the longest prefix of `data` that does not end inside a UTF-8 sequence."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4 if byte & 0xF8 == 0xF0 else 1
        return n if back >= need else n - back
    return n


def _stop_prefix_hold(text: bytes, stops: Sequence[bytes]) -> int:
    """How many trailing bytes of `text` could be the start of a stop string."""
    hold = 0
    for s in stops:
        for i in range(min(len(s), len(text)), 0, -1):
            if text.endswith(s[:i]):
                hold = max(hold, i)
                break
    return hold


@dataclass
class _Outcome:
    text: bytes = b""
    completion_tokens: list[int] = field(default_factory=list)
    finish_reason: str = "length"


class Lookahead:
    """Exact prompt-lookup speculative decoding around an existing `llama_cpp.Llama`.

    Repeated calls are independent requests: the acceptance history starts afresh each
    time; only the measured cost curve of the machine, the chosen decode thread count and
    the KV prefix cache are kept.

    `threads`: threads of one-token decodes. "auto" times the Llama's `n_threads` against its
    `n_threads_batch` once and keeps the faster (on this 2-core machine llama-cpp-python's
    default of 1 thread is ~1.3x slower than 2); "keep" uses the Llama's own; an int that
    many. Outputs do not depend on it; the Llama's settings are restored after each request.
    """

    def __init__(self, llm: Any, speculate: bool = True, max_draft: int = 64, calibrate: bool = True,
                 threads: int | str = "auto"):
        from lookahead.adapters.llama_cpp import LlamaCppTarget

        if max_draft < 0:
            raise ValueError(f"max_draft must be >= 0, got {max_draft}")
        self.llm = llm
        self.target = LlamaCppTarget(llm, threads=threads)
        self.speculate = bool(speculate)
        self.max_draft = int(max_draft)
        # The cost curve belongs to the machine and model, not to one wrapper: share it
        # between wrappers of the same Llama, and measure it once.
        self.cost = _COST_MODELS.get(llm)
        if self.cost is None or self.cost.max_batch != self.target.max_batch:
            self.cost = CostModel(max_batch=self.target.max_batch)
            _COST_MODELS[llm] = self.cost
        if calibrate and not self.cost.calibrated:
            self.cost.needs_calibration = True  # done in the first speculative request
        self._references: list[list[int]] = []
        self.last_stats: SpeculationStats | None = None
        self.observer = None  # engine step observer (tests, diagnostics); see engine.generate_tokens

    # ---- references ---------------------------------------------------------------
    def add_reference(self, text: str | Sequence[int]) -> int:
        """Register a reference (the file under edit, a retrieved passage) for every request."""
        self._references.append(self._reference_tokens(text))
        return len(self._references)

    def clear_references(self) -> None:
        self._references.clear()

    def _reference_tokens(self, text: str | Sequence[int]) -> list[int]:
        if isinstance(text, str):
            return self.target.tokenize(text, add_bos=False, special=False)
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
        speculate: bool | None = None,
    ):
        """Generate a completion; same arguments and dict shape as `Llama.create_completion`.

        Extra arguments: `references`, texts (or token lists) whose continuations may be
        drafted in this request only; `speculate=False` for the plain path through the same
        engine. The result has a `speculation` entry (stream: in the last chunk).
        """
        params = SamplingParams(
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
            typical_p=typical_p,
            repeat_penalty=repeat_penalty,
            frequency_penalty=frequency_penalty,
            presence_penalty=presence_penalty,
            penalty_last_n=int(getattr(self.llm, "last_n_tokens_size", 64)),
        )
        if max_tokens is not None and not isinstance(max_tokens, (int, np.integer)):
            raise ValueError(f"max_tokens must be an integer or None, got {max_tokens!r}")
        unsupported = [
            name
            for name, value in (("suffix", suffix), ("logprobs", logprobs), ("grammar", grammar),
                                ("logits_processor", logits_processor), ("logit_bias", logit_bias))
            if value is not None
        ]
        if mirostat_mode:
            unsupported.append("mirostat_mode")
        if tfs_z != 1.0:
            unsupported.append("tfs_z")
        if unsupported:
            return self._fallback(
                unsupported, prompt=prompt, suffix=suffix, max_tokens=max_tokens, temperature=temperature,
                top_p=top_p, min_p=min_p, typical_p=typical_p, logprobs=logprobs, echo=echo, stop=stop,
                frequency_penalty=frequency_penalty, presence_penalty=presence_penalty,
                repeat_penalty=repeat_penalty, top_k=top_k, stream=stream, seed=seed, tfs_z=tfs_z,
                mirostat_mode=mirostat_mode, mirostat_tau=mirostat_tau, mirostat_eta=mirostat_eta,
                model=model, stopping_criteria=stopping_criteria, logits_processor=logits_processor,
                grammar=grammar, logit_bias=logit_bias,
            )
        prompt_tokens = self.target.completion_prompt_tokens(prompt)
        n_ctx = self.target.n_ctx
        if len(prompt_tokens) >= n_ctx:
            raise ValueError(
                f"Requested tokens ({len(prompt_tokens)}) exceed context window of {n_ctx}"
            )
        if max_tokens is None or max_tokens <= 0:
            max_tokens = n_ctx - len(prompt_tokens)
        max_tokens = min(int(max_tokens), n_ctx - len(prompt_tokens))
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        stop_bytes = [s.encode("utf-8") for s in stops if s]
        spec = self.speculate if speculate is None else bool(speculate)
        refs = [self._reference_tokens(r) for r in (references or [])]
        rng = np.random.default_rng(seed)
        completion_id = f"cmpl-{uuid.uuid4()}"
        created = int(time.time())
        model_name = model if model is not None else getattr(self.llm, "model_path", "")
        prompt_text = prompt if isinstance(prompt, str) else ""

        stats = SpeculationStats()
        outcome = _Outcome()
        events = self._events(prompt_tokens, params, max_tokens, stop_bytes, stopping_criteria,
                              rng, spec, refs, stats, outcome, stream)

        def chunk(text: str, finish: str | None) -> dict:
            return {
                "id": completion_id, "object": "text_completion", "created": created, "model": model_name,
                "choices": [{"text": text, "index": 0, "logprobs": None, "finish_reason": finish}],
            }

        if stream:
            def stream_chunks() -> Iterator[dict]:
                if echo and prompt_text:
                    yield chunk(prompt_text, None)
                for text in events:
                    yield chunk(text, None)
                last = chunk("", outcome.finish_reason)
                last["speculation"] = stats.to_dict()
                yield last

            return stream_chunks()

        for _ in events:
            pass
        text = outcome.text.decode("utf-8", errors="ignore")
        if echo:
            text = prompt_text + text
        result = chunk(text, outcome.finish_reason)
        result["usage"] = {
            "prompt_tokens": len(prompt_tokens),
            "completion_tokens": len(outcome.completion_tokens),
            "total_tokens": len(prompt_tokens) + len(outcome.completion_tokens),
        }
        result["speculation"] = stats.to_dict()
        return result

    __call__ = create_completion

    def _events(self, prompt_tokens, params, max_tokens, stop_bytes, stopping_criteria, rng, spec,
                refs, stats, outcome, stream) -> Iterator[str]:
        """Run one request; yield text pieces that are safe to show (stream), fill `outcome`."""
        self.last_stats = stats
        index = SuffixIndex()
        for ref in self._references + refs:
            if ref:
                index.add_reference(ref)
        drafter = None
        if spec and self.max_draft > 0:
            drafter = Drafter(self.cost, max_draft=self.max_draft, sampled=not params.greedy,
                              tree_width=self.target.tree_width)
        target = self.target
        # llama-cpp-python keeps sampling past max_tokens while the text ends inside a
        # multi-byte character; allow the engine a few tokens for that.
        engine_max = min(max_tokens + 3, target.n_ctx - len(prompt_tokens))
        tokens = generate_tokens(target, prompt_tokens, params, rng, engine_max, drafter, index, stats, self.observer)
        completion = outcome.completion_tokens
        text = b""
        emitted = 0
        multibyte_fix = 0
        if stopping_criteria is not None:  # llama-cpp-python's form: (input_ids so far, logits)
            input_ids = np.zeros(len(prompt_tokens) + engine_max + 1, dtype=np.intc)
            input_ids[: len(prompt_tokens)] = prompt_tokens
            no_logits = np.zeros(target.n_vocab, dtype=np.single)
        try:
            for token in tokens:
                if stopping_criteria is not None and stopping_criteria(
                    input_ids[: len(prompt_tokens) + len(completion)], no_logits
                ):
                    outcome.finish_reason = "stop"
                    break
                if target.is_eog(token):
                    outcome.finish_reason = "stop"
                    break
                completion.append(token)
                if stopping_criteria is not None:
                    input_ids[len(prompt_tokens) + len(completion) - 1] = token
                text += target.piece(token)
                # The same hold-back rule as llama-cpp-python for a trailing partial character.
                for k, char in enumerate(text[-3:]):
                    k = 3 - k
                    for num, pattern in ((2, 192), (3, 224), (4, 240)):
                        if num > k and pattern & char == pattern:
                            multibyte_fix = num - k
                if multibyte_fix > 0:
                    multibyte_fix -= 1
                    continue
                hit = next((s for s in stop_bytes if s in text), None)
                if hit is not None:
                    text = text[: text.index(hit)]
                    outcome.finish_reason = "stop"
                    break
                if stream:
                    safe = len(text) - _stop_prefix_hold(text[emitted:], stop_bytes)
                    safe = utf8_complete_length(text[:safe])
                    if safe > emitted:
                        yield text[emitted:safe].decode("utf-8", errors="ignore")
                        emitted = safe
                if len(completion) >= max_tokens:
                    outcome.finish_reason = "length"
                    break
            else:
                outcome.finish_reason = "length"
        finally:
            tokens.close()
            outcome.text = text
        if stream and len(text) > emitted:
            yield text[emitted:].decode("utf-8", errors="ignore")

    # ---- chat ---------------------------------------------------------------------
    def create_chat_completion(
        self,
        messages: list[dict],
        references: Sequence[str | Sequence[int]] | None = None,
        speculate: bool | None = None,
        **kwargs: Any,
    ):
        """Chat completion through the model's own chat template (llama-cpp-python's handler).

        Same arguments and dict shape as `Llama.create_chat_completion`, plus `references`
        and `speculate` as in `create_completion`, and a `speculation` entry.
        """
        llm = self.llm
        proxy = _CompletionProxy(llm, self, references, speculate)
        # Run the Llama's own create_chat_completion with the proxy as `self`: the same
        # defaults, handler lookup and template; only its create_completion call is ours.
        result = type(llm).create_chat_completion(proxy, messages, **kwargs)
        if kwargs.get("stream"):
            return self._attach_stats_to_stream(result)
        if isinstance(result, dict) and self.last_stats is not None:
            result["speculation"] = self.last_stats.to_dict()
        return result

    def _attach_stats_to_stream(self, chunks: Iterator[dict]) -> Iterator[dict]:
        previous = None
        for item in chunks:
            if previous is not None:
                yield previous
            previous = item
        if previous is not None:
            if self.last_stats is not None:
                previous["speculation"] = self.last_stats.to_dict()
            yield previous

    def _fallback(self, unsupported: list[str], **kwargs: Any):
        stats = SpeculationStats(speculative=False, fallback="unsupported by lookahead: " + ", ".join(unsupported))
        self.last_stats = stats
        t0 = time.perf_counter()
        result = self.llm.create_completion(**kwargs)
        if isinstance(result, dict):
            stats.total_ms = 1000 * (time.perf_counter() - t0)
            result["speculation"] = stats.to_dict()
        return result


class _CompletionProxy:
    """Looks like the Llama to a chat handler, but completes through lookahead."""

    def __init__(self, llm: Any, owner: Lookahead, references, speculate):
        self._llm = llm
        self._owner = owner
        self._references = references
        self._speculate = speculate

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    def create_completion(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("references", self._references)
        kwargs.setdefault("speculate", self._speculate)
        return self._owner.create_completion(*args, **kwargs)

    __call__ = create_completion


def wrap(llm: Any, speculate: bool = True, max_draft: int = 64, calibrate: bool = True,
         threads: int | str = "auto") -> Lookahead:
    """Wrap an existing `llama_cpp.Llama`: same completion API, exact speculative decoding.

    See `Lookahead` for `threads` (one-token decode threads: "auto", "keep" or a count).
    """
    return Lookahead(llm, speculate=speculate, max_draft=max_draft, calibrate=calibrate, threads=threads)


def load(
    model_path: str | os.PathLike | None = None,
    n_ctx: int = 4096,
    n_threads: int | None = None,
    verbose: bool = False,
    speculate: bool = True,
    max_draft: int = 64,
    tree_width: int = 1,
    threads: int | str = "auto",
    **llama_kwargs: Any,
) -> Lookahead:
    """Load a GGUF model (default: the embedded SmolLM2-135M-Instruct) and wrap it.

    `tree_width` > 1 builds the context with that many sequences over a unified KV cache,
    so that drafts may branch where the index's occurrences disagree (each decode verifies
    up to `tree_width` branches; the cost model decides when a wider batch pays). A plain
    `llama_cpp.Llama` has one sequence: `wrap` then drafts chains only.
    """
    from .models import check_gguf, default_model_path

    from lookahead.adapters.llama_cpp import MAX_TREE_WIDTH

    if not isinstance(tree_width, int) or not 1 <= tree_width <= MAX_TREE_WIDTH:
        raise ValueError(f"tree_width must be an integer in 1..{MAX_TREE_WIDTH}, got {tree_width!r}")
    path = check_gguf(model_path if model_path is not None else default_model_path())
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, verbose=verbose, **llama_kwargs)
    if tree_width > 1:
        from lookahead.adapters.llama_cpp import enable_tree_drafts

        enable_tree_drafts(llm, tree_width)
    return wrap(llm, speculate=speculate, max_draft=max_draft, threads=threads)
