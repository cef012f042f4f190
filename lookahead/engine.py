"""The decode loop: propose, verify in one target pass, emit, roll back. Backend-agnostic.

A step decodes [last token] + draft at positions n_past .. n_past + k, which gives k + 1
logits rows: row i predicts draft token i, row k the bonus token. (The first step decodes the
prompt's last chunk + draft, in the same chunks as llama-cpp-python's own prefill.) The verifier keeps the
exact rule; the target's KV cache is then cut back to the last accepted position. The
newest emitted token is never in the KV cache yet: it is the `last` token of the next step.
With speculation off every draft is empty, so the plain path runs through the same code.

The backend contract is here too, as Protocols: `Target` (what the loop calls), the optional
`TreeTarget`, `TunedTarget`, `ContendedTarget` and `PaddedTarget`, and what the wrapper
(`lookahead.api`) needs besides: `TextTarget`, and the optional `PlainTarget` and
`ModelFileTarget`. Optional extensions are found with `isinstance` (the Protocols are
runtime-checkable); required members are called as they are.
"""
from __future__ import annotations

import time
from typing import Any, Callable, ContextManager, Iterator, Protocol, Sequence, runtime_checkable

import numpy as np

from .drafter import EMPTY_DRAFT, Drafter
from .index import CONTEXT, SuffixIndex
from .sampling import SamplingParams
from .stats import SpeculationStats
from .verify import Verdict, verify_draft, verify_draft_with_probs, verify_tree


@runtime_checkable
class Target(Protocol):
    """What the engine needs from a backend (see lookahead.adapters.llama_cpp)."""

    n_ctx: int
    n_vocab: int
    max_batch: int  # most tokens one decode may take

    def begin(self, prompt: Sequence[int]) -> tuple[int, int]:
        """Prefill all of the prompt but its last chunk (which holds at least its last token).

        Returns (KV entries reused from the previous request, prompt tokens now in the KV).
        """

    def decode(self, tokens: Sequence[int], n_logits: int) -> np.ndarray:
        """Append tokens at the current position; logits of the last n_logits [n_logits, n_vocab]."""

    def rollback(self, n_keep: int) -> None:
        """Drop KV entries at positions >= n_keep."""

    def end(self, kv_tokens: Sequence[int]) -> None:
        """The request is over; `kv_tokens` are the tokens the KV cache holds."""

    def calibrate(self, sizes: Sequence[int]) -> dict[int, float]:
        """Time one decode of each size at the current position, then remove it: {n: ms}."""


@runtime_checkable
class TreeTarget(Target, Protocol):
    """Optional: a Target that verifies several branches of a draft in one decode."""

    tree_width: int  # branches one decode can verify (1: chains only)

    def decode_tree(self, root: int, tokens: Sequence[int], parents: Sequence[int]) -> np.ndarray:
        """Decode `root` then the tree's nodes (`parents[j]`: node j's parent, -1 for the root):
        rows [n + 1, n_vocab], row 0 after the root, row j + 1 after node j."""

    def keep_path(self, path: Sequence[int]) -> None:
        """Keep the root and the nodes of `path` (the accepted ones) in the KV cache, drop the rest."""


@runtime_checkable
class TunedTarget(Protocol):
    """Optional: a backend with one-off settings of its own to measure (llama.cpp: decode threads)."""

    decode_threads: int  # threads of one-token decodes now (reported in the stats)

    def tune(self) -> dict:
        """Called after the first step of every request; returns what it measured, empty when
        the setting was known already."""


@runtime_checkable
class ContendedTarget(Protocol):
    """Optional: a backend that notices when another process holds the cores."""

    contended: bool  # True while decodes run differently for that: the cost curve learns nothing
    batch_cost_factor: float  # batches of 2+ tokens cost this times the curve's figure, right now


@runtime_checkable
class PaddedTarget(Protocol):
    """Optional: a backend whose kernels pad batches, so that a decode of n tokens costs what
    one of the padded size costs (the cost curve prices each size at its class's top)."""

    batch_padding: tuple[int, int] | None  # (from_n, multiple): n >= from_n is padded to a multiple


@runtime_checkable
class TextTarget(Target, Protocol):
    """What `lookahead.api.Lookahead` needs on top of a Target: tokens, text, the chat template."""

    model_name: str  # the `model` of the responses
    penalty_last_n: int  # tokens the repeat/frequency/presence penalties look back on

    def tokenize(self, text: str, add_bos: bool, special: bool = True) -> list[int]:
        """Token ids of `text`; `special`: parse special-token markup ("<|im_end|>") as such."""

    def completion_prompt_tokens(self, prompt: str | Sequence[int]) -> list[int]:
        """The tokens of a completion prompt, as the backend's own completion makes them."""

    def piece(self, token: int) -> bytes:
        """The bytes of one token as the text shows it."""

    def is_eog(self, token: int) -> bool:
        """Whether the token ends generation (EOS, end of turn)."""

    def chat_completion(self, complete: Callable[..., Any], messages: list[dict], **kwargs: Any) -> Any:
        """The backend's chat completion (its template, stop tokens, chunk shapes) with `complete`
        (the wrapper's `create_completion`) as its completion call."""


@runtime_checkable
class PlainTarget(Protocol):
    """Optional: a backend's own completion, for the arguments the engine does not implement."""

    def plain_completion(self, **kwargs: Any) -> Any:
        """`Llama.create_completion(**kwargs)`: a dict, or an iterator of chunks when streamed."""


@runtime_checkable
class ModelFileTarget(Protocol):
    """Optional: what front ends show and control of the model behind a Target."""

    model_path: str  # the model file
    has_chat_template: bool  # whether chat requests get the model's own template

    def prompt_cache_off(self) -> ContextManager[None]:
        """A block whose requests start from an empty KV cache and neither use nor fill the
        saved prompt prefixes (the whole prefill is paid, for timing)."""


@runtime_checkable
class ExactTarget(Protocol):
    """Optional: a backend that knows whether its batched rows equal its one-token rows."""

    batch_exact: bool  # bit for bit: greedy output with speculation is then plain decoding's
    batch_exact_reason: str  # when not: why, and what would make it so


def generate_tokens(
    target: Target,
    prompt: Sequence[int],
    params: SamplingParams,
    rng: np.random.Generator,
    max_new_tokens: int,
    drafter: Drafter | None,
    index: SuffixIndex,
    stats: SpeculationStats,
    observer: Callable[[np.ndarray, Sequence[int], Verdict], None] | None = None,
    with_rows: bool = False,
    draft_limit: int | None = None,
) -> Iterator[int] | Iterator[tuple[int, np.ndarray]]:
    """Yield generated tokens one at a time, distributed exactly as plain sampling.

    `drafter`: anything with `propose(index, limit, tree) -> Draft` and `record(draft,
    accepted, path)` (lookahead.drafter.Drafter, or a caller's own); None for plain decoding.
    A draft that carries `probs` (a [k, n_vocab] array: the distribution each token was drawn
    from, e.g. by a draft model) is verified with the speculative-sampling rule instead of
    the point-mass one. A drafter with a `cost` (CostModel) has it fed with the measured
    verify times.

    `index` must already hold the caller's references; the prompt and every emitted token
    are appended to its running context here. The consumer may stop iterating at any time
    (EOS, stop string); closing the generator leaves the target consistent. `observer`, if
    given, sees every step's (logits rows, draft, verdict) before the rows are reused: tests
    use it to check each emitted token against the logits the verifier saw. (For a tree draft
    `rows` are re-indexed along the accepted path: rows[i] is the row emitted token i came from;
    `draft` is the whole tree's tokens.) `with_rows`: yield (token, logits row it was sampled
    from) instead; the row is a view, valid until the generator resumes. `draft_limit`: no
    draft reaches past this many generated tokens (the caller's max_tokens, when
    `max_new_tokens` leaves a few more only to finish a multi-byte character).
    """
    if len(prompt) == 0:
        raise ValueError("the prompt must hold at least one token")
    if len(prompt) >= target.n_ctx:
        raise ValueError(f"prompt of {len(prompt)} tokens does not fit the context of {target.n_ctx} tokens")
    t_start = time.perf_counter()
    tuned = target if isinstance(target, TunedTarget) else None  # the optional extensions, once
    watched = target if isinstance(target, ContendedTarget) else None
    stats.prompt_tokens = len(prompt)
    stats.speculative = drafter is not None
    if isinstance(target, ExactTarget):
        stats.exact, stats.exact_reason = target.batch_exact, target.batch_exact_reason
    kv_tokens: list[int] = []  # tokens whose KV entries exist
    try:
        stats.reused_prompt_tokens, n_prefilled = target.begin(prompt)
        kv_tokens = list(prompt[:n_prefilled])
        t_index = time.perf_counter()
        index.extend(prompt)
        index.begin_output()
        t_indexed = time.perf_counter()
        stats.prefill_ms = 1000 * (t_indexed - t_start)
        stats.index_ms += 1000 * (t_indexed - t_index)
        generated: list[int] = []
        # Tokens to decode in the next pass before the draft: the prompt's last chunk first
        # (so the first pass can already verify a draft), then always the newest token.
        pending = [int(t) for t in prompt[n_prefilled:]]
        first_step = True
        draft_end = max_new_tokens if draft_limit is None else min(draft_limit, max_new_tokens)
        while len(generated) < max_new_tokens:
            if len(kv_tokens) + len(pending) > target.n_ctx:
                break  # the context is full: the newest token was emitted, it cannot be decoded
            t0 = time.perf_counter()
            room = min(
                draft_end - len(generated) - 1,  # tokens beyond max_tokens are wasted
                target.n_ctx - len(kv_tokens) - len(pending),  # KV must hold pending + draft
                target.max_batch - len(pending),
            )
            draft = (drafter.propose(index, room, tree=len(pending) == 1) if drafter is not None and room > 0
                     else EMPTY_DRAFT)
            t1 = time.perf_counter()
            recent = generated if params.uses_penalties else ()
            draft_probs = getattr(draft, "probs", None)
            if draft.parents is None:
                rows = target.decode([*pending, *draft.tokens], len(draft) + 1)  # [k + 1, n_vocab]
                t2 = time.perf_counter()
                if draft_probs is None:
                    verdict = verify_draft(rows, draft.tokens, params, rng, recent)
                else:  # drawn from a distribution: accept with min(1, p/q), resample the residual
                    verdict = verify_draft_with_probs(rows, draft.tokens, draft_probs, params, rng, recent)
            else:  # a tree: branches verified in one decode (sequence ids), one path kept
                rows = target.decode_tree(pending[0], draft.tokens, draft.parents)  # [n + 1, n_vocab]
                t2 = time.perf_counter()
                verdict = verify_tree(rows, draft.tokens, draft.parents, params, rng, recent)
                target.keep_path(verdict.path)
                rows = rows[[0, *(j + 1 for j in verdict.path)]]  # the rows the emitted tokens came from
                stats.tree_passes += 1
            t3 = time.perf_counter()
            if observer is not None:
                observer(rows, draft.tokens, verdict)
            kv_tokens.extend(pending)
            kv_tokens.extend(verdict.tokens[: verdict.accepted])
            if draft.parents is None and verdict.accepted < len(draft):
                target.rollback(len(kv_tokens))
            cost = getattr(drafter, "cost", None)
            if watched is not None and watched.contended and not stats.contended:
                stats.contended = True  # timings under another setting: the curve learns nothing
            if watched is not None and drafter is not None and hasattr(drafter, "batch_cost_factor"):
                drafter.batch_cost_factor = watched.batch_cost_factor
            if drafter is not None:
                drafter.record(draft, verdict.accepted, verdict.path)
                if cost is not None and len(pending) == 1 and not stats.contended:
                    cost.observe(len(draft) + 1, 1000 * (t2 - t1))
            stats.record_step(len(draft), verdict.accepted, len(verdict.tokens),
                              source=getattr(draft, "source", CONTEXT), sources=getattr(draft, "sources", ()))
            stats.propose_ms += 1000 * (t1 - t0)
            if first_step:  # the first pass decodes the prompt's last chunk: prefill, not verify
                stats.prefill_ms += 1000 * (t2 - t1)
                stats.first_pass_tokens = len(verdict.tokens)
            else:
                stats.verify_ms += 1000 * (t2 - t1)
            stats.sample_ms += 1000 * (t3 - t2)
            index.extend(verdict.tokens)
            pending = [verdict.tokens[-1]]
            if first_step:
                first_step = False
                if tuned is not None:  # backend settings measured once (llama.cpp: decode threads)
                    t_cal = time.perf_counter()
                    if tuned.tune():  # it measured something (else the setting was known already)
                        stats.calibration_ms += 1000 * (time.perf_counter() - t_cal)
                    stats.decode_threads = tuned.decode_threads
            if cost is not None and cost.needs_calibration and not (watched is not None and watched.contended):
                # Time decodes of each size once, here: after the prompt, where the attention
                # cost is that of real requests (a decode of n tokens at position 0 is much
                # cheaper than at position 600). Then the KV cache is cut back.
                cost.needs_calibration = False
                t_cal = time.perf_counter()
                for n_tokens, ms in target.calibrate(cost.calibration_sizes).items():
                    cost.observe(n_tokens, ms)
                stats.calibration_ms += 1000 * (time.perf_counter() - t_cal)
            for i, token in enumerate(verdict.tokens):
                if len(generated) >= max_new_tokens:
                    break
                generated.append(token)
                if len(generated) == 1:
                    stats.first_token_ms = 1000 * (time.perf_counter() - t_start)
                yield (token, rows[i]) if with_rows else token
    finally:
        if tuned is not None and stats.decode_threads is not None:  # the backend may have changed it
            stats.decode_threads = tuned.decode_threads
        target.end(kv_tokens)
        stats.total_ms = 1000 * (time.perf_counter() - t_start)
