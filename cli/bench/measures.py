"""Pure computations: acceptance fit, predicted speedup, geometric mean, seeds and order."""
from __future__ import annotations

import math
import zlib
from typing import Iterable, Sequence


def geometric_mean(values: Iterable[float | None]) -> float | None:
    """exp(mean(log x)) over the positive values given (None skipped); None when there are none."""
    logs = [math.log(v) for v in values if v is not None and v > 0]
    return math.exp(sum(logs) / len(logs)) if logs else None


def fit_alpha(drafts: Sequence[tuple[int, int]]) -> float | None:
    """Per-token acceptance probability alpha, maximum likelihood under the i.i.d. model.

    `drafts` holds (drafted, accepted) per verified draft. Each accepted token is a success;
    a draft with accepted < drafted also had one failure (its first rejected token); tokens
    after it were never tested. So alpha = accepted / (accepted + drafts with a rejection).
    """
    accepted = sum(a for _, a in drafts)
    rejections = sum(1 for d, a in drafts if a < d)
    return accepted / (accepted + rejections) if accepted + rejections else None


def mean_draft_length(drafts: Sequence[tuple[int, int]]) -> float | None:
    """k: tokens drafted per draft that was verified."""
    return sum(d for d, _ in drafts) / len(drafts) if drafts else None


def relative_verify_cost(cost_curve_ms: Sequence[float], k: float) -> float:
    """c = (t(k+1) - t(1)) / (k t(1)): the cost of each extra verified token, in single decodes.

    `cost_curve_ms[n]` is t(n), the time of one decode of n tokens; k may be fractional
    (linear interpolation). c = 1: verifying is no cheaper than decoding one by one; c = 0: free.
    """
    if k <= 0:
        return 0.0
    t1 = float(cost_curve_ms[1])
    x = k + 1
    lo = min(int(math.floor(x)), len(cost_curve_ms) - 1)
    hi = min(lo + 1, len(cost_curve_ms) - 1)
    t_x = float(cost_curve_ms[lo]) + (x - lo) * (float(cost_curve_ms[hi]) - float(cost_curve_ms[lo]))
    return (t_x - t1) / (k * t1)


def predicted_speedup(alpha: float, k: float, c: float) -> float:
    """(1 - alpha^(k+1)) / ((1 - alpha)(1 + k c)): the decode speedup of drafting k tokens per step.

    Expected tokens per pass, 1 + alpha + ... + alpha^k, over the pass's cost in single decodes,
    1 + k c. It assumes every step drafts k tokens and ignores the prefill, which every method pays.
    """
    if k <= 0:
        return 1.0
    expected_tokens = k + 1 if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return expected_tokens / (1 + k * c)


REPEAT_WINDOW = 48  # characters: a run this long written twice is a repeat, not a coincidence
LOOP_SHARE = 0.25  # an output with at least this share of self-repeats loops


def repeat_share(text: str, prompt: str = "", window: int = REPEAT_WINDOW) -> float:
    """The share of `text` that repeats `text` itself: how much of an output is a loop.

    A character counts when the `window` characters ending at it occurred earlier in the
    output and nowhere in the prompt: copying the prompt (an edit, a quote) is the point of
    the work, writing one's own words again is not. Small models loop on long tasks ("# Your
    code here" 40 times); a loop is cheap to draft, so a speedup measured on one says nothing
    about real output. 0.0 for a text shorter than `window`.
    """
    if len(text) <= window:
        return 0.0
    repeats = 0
    for end in range(window, len(text) + 1):
        piece = text[end - window : end]
        if text.find(piece, 0, end - 1) != -1 and piece not in prompt:
            repeats += 1
    return repeats / len(text)


def prompt_text(workload: dict) -> str:
    """The text a workload gives the model: its prompt, or its messages' contents."""
    if "prompt" in workload:
        return str(workload["prompt"])
    return "\n".join(str(m.get("content", "")) for m in workload.get("messages", ()))


def resolve_prompt_lookup_calls(calls: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """(drafted, accepted) per draft of llama-cpp-python's generate loop, from its draft-model calls.

    `calls` holds (context length, draft length) per call of the draft model. After a call
    with context L and draft d, the Llama decodes [last token] + draft, keeps the a accepted
    draft tokens and samples one more token, so the next call sees context L + a + 1. The
    last draft's outcome is unknown (no later call) and is left out; so are empty drafts.
    """
    drafts = []
    for (length, drafted), (next_length, _) in zip(calls, calls[1:]):
        if drafted:
            drafts.append((drafted, max(0, min(drafted, next_length - length - 1))))
    return drafts


def workload_seed(workload_id: str, rep: int) -> int:
    """The sampling seed of one workload and repetition: the same for every method."""
    return zlib.crc32(f"{workload_id}/{rep}".encode()) & 0x7FFFFFFF


def rotated(methods: Sequence[str], shift: int) -> list[str]:
    """The methods in the order to run them: rotated by `shift` places."""
    if not methods:
        return []
    s = shift % len(methods)
    return list(methods[s:]) + list(methods[:s])


def _round(x: float | None, digits: int = 4) -> float | None:
    return None if x is None else round(float(x), digits)
