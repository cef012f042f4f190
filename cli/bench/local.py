"""The methods that run in this process on one model file: plain, lookahead, no-draft, prompt lookup."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from lookahead.adapters.llama_cpp import clear_kv_cache

from .measures import resolve_prompt_lookup_calls
from .methods import LOOKAHEAD, NO_DRAFT, PLAIN, PROMPT_LOOKUP
from .summary import Run


class DraftRecorder:
    """Engine observer for the lookahead wrapper: (drafted, accepted) of every verified draft."""

    def __init__(self):
        self.drafts: list[tuple[int, int]] = []

    def __call__(self, rows, draft, verdict) -> None:
        if len(draft):
            self.drafts.append((len(draft), int(verdict.accepted)))


def counting_prompt_lookup(num_pred_tokens: int):
    """llama-cpp-python's LlamaPromptLookupDecoding, noting (context length, draft length) per call."""
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    class CountingPromptLookup(LlamaPromptLookupDecoding):
        def __init__(self):
            super().__init__(num_pred_tokens=num_pred_tokens)
            self.calls: list[tuple[int, int]] = []

        def __call__(self, input_ids, /, **kwargs):
            draft = super().__call__(input_ids, **kwargs)
            self.calls.append((len(input_ids), len(draft)))
            return draft

    return CountingPromptLookup()


def _piece(chunk: dict) -> str:
    choice = chunk["choices"][0]
    if "delta" in choice:
        return choice["delta"].get("content") or ""
    return choice.get("text") or ""


def timed_stream(start: Callable[[], Iterator[dict]]) -> tuple[str, float, float | None, list[float], dict | None]:
    """Run a streaming call: (text, seconds, time to first piece, gaps between pieces in ms, last chunk)."""
    pieces, stamps = [], []
    last = None
    t0 = time.perf_counter()
    for chunk in start():
        piece = _piece(chunk)
        if piece:
            stamps.append(time.perf_counter())
            pieces.append(piece)
        last = chunk
    seconds = time.perf_counter() - t0
    gaps_ms = [1000 * (b - a) for a, b in zip(stamps, stamps[1:])]
    return "".join(pieces), seconds, (stamps[0] - t0 if stamps else None), gaps_ms, last


def request_kwargs(workload: dict, temperature: float, seed: int) -> dict:
    return dict(max_tokens=workload["max_tokens"], temperature=temperature, seed=seed, stream=True)


def call_engine(engine, workload: dict, **kwargs) -> Iterator[dict]:
    """engine.create_chat_completion(messages) or engine.create_completion(prompt)."""
    if "messages" in workload:
        return engine.create_chat_completion(workload["messages"], **kwargs)
    return engine.create_completion(workload["prompt"], **kwargs)


class LocalMethods:
    """plain, lookahead and prompt-lookup on one model file, ready to run a workload."""

    def __init__(self, model_path: Path, llama: dict[str, Any], methods: Sequence[str], pld_tokens: int):
        """`llama`: llama_cpp.Llama keyword arguments (n_ctx, threads, ...; see cli.options)."""
        import llama_cpp

        import lookahead

        settings = dict(model_path=str(model_path), **llama)
        self.llm = llama_cpp.Llama(**settings)
        self.recorder = DraftRecorder()
        self.fast = lookahead.wrap(self.llm, observer=self.recorder) if LOOKAHEAD in methods else None
        self.no_draft = lookahead.wrap(self.llm, max_draft=0) if NO_DRAFT in methods else None
        self.pld = None
        if PROMPT_LOOKUP in methods:
            self.pld_drafter = counting_prompt_lookup(pld_tokens)
            # logits_all=True: with a draft model llama-cpp-python computes every row's logits
            # anyway, but sizes its score buffer from the argument (0.3.36: n_batch rows unless
            # logits_all=True), which breaks once a prompt is longer than n_batch.
            self.pld = llama_cpp.Llama(**settings, draft_model=self.pld_drafter, logits_all=True)

    def decode_threads(self) -> int | None:
        """The one-token decode threads lookahead chose for this Llama (None if it never ran)."""
        from lookahead.adapters.llama_cpp import tuned_threads

        return tuned_threads(self.llm)

    def verify_cost_ms(self) -> list[float] | None:
        """t(n) for n = 0..max_batch as lookahead measured it (index 0 repeats t(1)), or None."""
        if self.fast is None:
            return None
        curve = self.fast.verify_cost_ms(range(1, self.fast.target.max_batch + 1))
        return [curve[1], *curve.values()]

    def run(self, method: str, workload: dict, temperature: float, seed: int) -> Run:
        kwargs = request_kwargs(workload, temperature, seed)
        if method == PLAIN:
            llm, engine = self.llm, self.llm
        elif method == LOOKAHEAD:
            llm, engine = self.llm, self.fast
            self.recorder.drafts = []
        elif method == NO_DRAFT:
            llm, engine = self.llm, self.no_draft
        elif method == PROMPT_LOOKUP:
            llm, engine = self.pld, self.pld
            self.pld_drafter.calls = []
        else:
            raise AssertionError(f"not a local method: {method}")
        clear_kv_cache(llm)
        text, seconds, ttft, gaps, last = timed_stream(lambda: call_engine(engine, workload, **kwargs))
        run = Run(workload["id"], workload["category"], temperature, -1, method, seconds, text, ttft, gaps)
        run.output_tokens = len(self.llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)) if text else 0
        if method == LOOKAHEAD:
            stats = (last or {}).get("speculation") or {}
            run.drafts = list(self.recorder.drafts)
            run.generated_tokens = stats.get("generated_tokens")
            run.target_passes = stats.get("target_passes")
            run.reused_prompt_tokens = stats.get("reused_prompt_tokens")
            run.contended = bool(stats.get("contended"))
        elif method == PROMPT_LOOKUP:
            calls = self.pld_drafter.calls
            run.drafts = resolve_prompt_lookup_calls(calls)
            run.target_passes = 1 + len(calls)  # the prompt's last chunk, then one decode per draft call
        return run
