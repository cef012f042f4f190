"""The decode loop: propose, verify in one target pass, emit, roll back. Backend-agnostic.

A step decodes [last token] + draft at positions n_past .. n_past + k, which gives k + 1
logits rows: row i predicts draft token i, row k the bonus token. The verifier keeps the
exact rule; the target's KV cache is then cut back to the last accepted position. The
newest emitted token is never in the KV cache yet: it is the `last` token of the next step.
With speculation off every draft is empty, so the plain path runs through the same code.
"""
from __future__ import annotations

import time
from typing import Iterator, Protocol, Sequence

import numpy as np

from .drafter import EMPTY_DRAFT, Drafter
from .index import SuffixIndex
from .sampling import SamplingParams, recent_window
from .stats import SpeculationStats
from .verify import verify_draft


class Target(Protocol):
    """What the engine needs from a backend (see lookahead.adapters.llama_cpp)."""

    n_ctx: int
    n_vocab: int
    max_batch: int  # most tokens one decode may take

    def begin(self, prompt: Sequence[int]) -> int:
        """Make the KV cache hold exactly prompt[:-1]; returns how many entries were reused."""

    def decode(self, tokens: Sequence[int]) -> np.ndarray:
        """Append tokens at the current position; logits rows for all of them [n, n_vocab]."""

    def rollback(self, n_keep: int) -> None:
        """Drop KV entries at positions >= n_keep."""

    def end(self, kv_tokens: Sequence[int]) -> None:
        """The request is over; `kv_tokens` are the tokens the KV cache holds."""


def generate_tokens(
    target: Target,
    prompt: Sequence[int],
    params: SamplingParams,
    rng: np.random.Generator,
    max_new_tokens: int,
    drafter: Drafter | None,
    index: SuffixIndex,
    stats: SpeculationStats,
) -> Iterator[int]:
    """Yield generated tokens one at a time, distributed exactly as plain sampling.

    `index` must already hold the caller's references; the prompt and every emitted token
    are appended to its running context here. The consumer may stop iterating at any time
    (EOS, stop string); closing the generator leaves the target consistent.
    """
    if len(prompt) == 0:
        raise ValueError("the prompt must hold at least one token")
    if len(prompt) >= target.n_ctx:
        raise ValueError(f"prompt of {len(prompt)} tokens does not fit the context of {target.n_ctx} tokens")
    t_start = time.perf_counter()
    stats.prompt_tokens = len(prompt)
    stats.speculative = drafter is not None
    kv_tokens = list(prompt[:-1])  # tokens whose KV entries exist
    try:
        stats.reused_prompt_tokens = target.begin(prompt)
        stats.prefill_ms = 1000 * (time.perf_counter() - t_start)
        index.extend(prompt)
        generated: list[int] = []
        last = int(prompt[-1])
        while len(generated) < max_new_tokens:
            t0 = time.perf_counter()
            room = min(
                max_new_tokens - len(generated) - 1,  # tokens beyond max_tokens are wasted
                target.n_ctx - len(kv_tokens) - 1,  # KV must hold [last] + draft
                target.max_batch - 1,
            )
            draft = drafter.propose(index, room) if drafter is not None and room > 0 else EMPTY_DRAFT
            t1 = time.perf_counter()
            rows = target.decode([last, *draft.tokens])  # [k + 1, n_vocab]
            t2 = time.perf_counter()
            window = recent_window(generated, params) if params.uses_penalties else ()
            verdict = verify_draft(rows, draft.tokens, params, rng, window)
            t3 = time.perf_counter()
            kv_tokens.append(last)
            kv_tokens.extend(draft.tokens[: verdict.accepted])
            if verdict.accepted < len(draft):
                target.rollback(len(kv_tokens))
            if drafter is not None:
                drafter.record(draft, verdict.accepted)
                drafter.cost.observe(len(draft) + 1, 1000 * (t2 - t1))
            stats.record_step(len(draft), verdict.accepted, len(verdict.tokens))
            stats.propose_ms += 1000 * (t1 - t0)
            stats.verify_ms += 1000 * (t2 - t1)
            stats.sample_ms += 1000 * (t3 - t2)
            index.extend(verdict.tokens)
            for token in verdict.tokens:
                if len(generated) >= max_new_tokens:
                    break
                generated.append(token)
                yield token
            last = verdict.tokens[-1]
    finally:
        target.end(kv_tokens)
        stats.total_ms = 1000 * (time.perf_counter() - t_start)
