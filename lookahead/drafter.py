"""Choosing what to draft: a measured verify-cost curve and the evidence from the index.

A draft of k tokens is checked in one decode of k + 1 tokens ([last token] + draft), which
costs t(k + 1) milliseconds. If the i-th draft token is accepted with probability c_i (given
the earlier ones were), the pass emits on average

    E(k) = 1 + sum_{i=1..k} prod_{j<=i} c_j      tokens      (the 1 is the corrected/bonus token)

so the rate is E(k) / t(k + 1) tokens per ms, against 1 / t(1) for a plain decode. The
drafter picks the k (0 = no draft) with the best rate. On a CPU, where t(n) grows almost
linearly, that means drafting only when acceptance is likely; on a flat curve (GPU, larger
model) it drafts long.

With a backend that can verify several branches in one decode (llama.cpp sequence ids,
`tree_width` > 1), the draft may be a tree: nodes are added best-first by the probability of
reaching them, and the size (and width) that maximises E / t(n + 1) is kept, so a tree is
proposed only where the occurrences disagree and a wider batch pays for itself.

c_i comes from two pieces of evidence:
* a per-token acceptance estimate for the match's kind (context, reference, or a rejoin: see
  below) and length, a Beta posterior that starts at a prior measured by replay (see _PRIOR_MEAN) and is
  updated from the first step of every request: by the verified drafts and, for free, by
  comparing every step's candidate with the tokens the target then emitted, drafted or not;
* the agreement of the occurrences: when several earlier occurrences of the suffix continue
  differently, the branch followed carries count(branch) / count(parent) of them.

Rejoining after an edit point: when the output has copied a source for a while and then
departs from it (a renamed word, a changed line), the suffix match right after the change is
short, and short matches are weak evidence in general. But a short match whose occurrence lies
just after the point where the copy left the source (within the tokens emitted since, plus
REJOIN_SLACK) is the output rejoining its source: it is followed alone and has its own,
higher, prior row (REJOIN_KIND), measured like the others.

Learned substitutions: at a rejoin the drafter also knows what the change was, the source's
tokens between the two points (at most MAX_RULE_TOKENS) and the output's tokens instead. A
rename or a changed path recurs: every later candidate that holds the same source tokens gets
the output's tokens in their place, so the draft runs through the next edit point instead of
failing at it. Deletions are not learned, and a substitution the target contradicts is
dropped for the rest of the request (an edit made once, a number that counts up); a wrong one
only ever costs a rejected draft, as the verifier keeps the output exact.
"""
from __future__ import annotations

import heapq
import itertools
import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from .index import CONTEXT, Branch, Match, SuffixIndex
from .sequences import agreeing_prefix

CONTEXT_KIND = 0  # the candidate follows an occurrence in the running context (prompt + output)
REFERENCE_KIND = 1  # ... in a registered reference
REJOIN_KIND = 2  # ... just after the place where a copy of a source was left (either source)
N_KINDS = 3
KIND_NAMES = ("context", "reference", "rejoin")

# Rejoining (see the module doc): a copy of at least REJOIN_RUN tokens that departs from its
# source leaves an anchor there; for the next REJOIN_WINDOW tokens, a match shorter than
# REJOIN_BELOW whose text starts from 2 tokens before the anchor to REJOIN_SLACK tokens past
# it (plus the tokens emitted since) is a rejoin.
REJOIN_RUN = 8
REJOIN_SLACK = 32
REJOIN_BELOW = 16
REJOIN_WINDOW = 64
MAX_RULE_TOKENS = 6  # longest source or output span a learned substitution may have (a name, a path)
MAX_RULES = 16  # substitutions kept per request, the newest

# Match-length buckets (upper bounds, inclusive).
_BUCKET_UPPER = (1, 2, 3, 5, 7, 11, 15, 23, 31, 47, 63, 1 << 30)
# The prior per-token acceptance by [source kind][bucket]: the probability that a
# candidate token is the target's next token, given the earlier ones were, when the matched
# suffix (grown by the accepted tokens) has that length. Measured at every output position of
# recorded plain outputs of samples/workloads.jsonl and samples/examples/short_rag.jsonl
# (no workload registers references, so the reference rows are the pooled rates), greedy and
# sampled at 0.7 (a replayed sample decides acceptance exactly as the point-mass rule does).
# Reproduce with (tests/test_simulate.py checks that they match):
#     .venv/bin/python samples/examples/record_traces.py      # -> samples/examples/traces.json
#     .venv/bin/python -m lookahead.simulate priors samples/examples/traces.json
# The posterior of each request moves away from them with every step.
_PRIOR_MEAN = (
    (0.210, 0.503, 0.647, 0.802, 0.820, 0.868, 0.926, 0.954, 0.954, 0.993, 0.993, 0.995),  # context
    (0.224, 0.530, 0.678, 0.822, 0.836, 0.894, 0.928, 0.953, 0.953, 0.993, 0.993, 0.995),  # reference
    (0.276, 0.615, 0.758, 0.864, 0.867, 0.938, 0.938, 0.951, 0.951, 0.991, 0.995, 0.995),  # rejoin
)
_PRIOR_MEAN_SAMPLED = (
    (0.210, 0.477, 0.539, 0.710, 0.773, 0.809, 0.885, 0.933, 0.933, 0.975, 0.984, 0.995),  # context
    (0.220, 0.505, 0.594, 0.750, 0.818, 0.818, 0.898, 0.924, 0.924, 0.972, 0.985, 0.995),  # reference
    (0.253, 0.597, 0.751, 0.833, 0.890, 0.890, 0.918, 0.918, 0.934, 0.954, 0.995, 0.995),  # rejoin
)
_PRIOR_STRENGTH = 10.0


def _bucket(match_length: int) -> int:
    for b, upper in enumerate(_BUCKET_UPPER):
        if match_length <= upper:
            return b
    return len(_BUCKET_UPPER) - 1


class CostModel:
    """Verify cost t(n), in ms, of one decode of n tokens; learned from observed decodes.

    Attention makes every decode dearer as the context grows (measured here, SmolLM2-135M
    Q4_1, 2 threads: t(1) 7.6 ms at position 200, 9.6 at 1000, 10.9 at 1400; t(32) 95 ->
    124 -> 133), and a shared machine speeds up and slows down. The ratio t(n) / t(1) at one
    position hardly moves (t(32) / t(1): 12.5, 12.9, 12.2 at those positions), and drafting
    decisions depend on nothing else. So the model keeps two things apart:

    * the scale: the median of the last `window` one-token decodes, which are timed at
      nearly every step, so it follows the request's position and the machine's state;
    * the shape: each size's timings divided by the scale when they were taken, the median
      of its last `window` ratios.

    t(n) is shape x scale. A size timed only during a long request (late positions) thus
    does not make the sizes timed early look cheap, nor the reverse. Before any one-token
    timing there is no scale: the timings are kept as they are, and become ratios against
    the first one-token timing.

    Sizes that were observed use their estimate; other sizes are interpolated linearly
    between observed neighbours; beyond the largest observed size the curve is extrapolated
    with the slope of its last segment (or `prior_slope` times t(1) when only one size was
    seen).

    A curve measured once can be kept across processes: `to_dict()` gives a small JSON-able
    dict, `CostModel.from_dict(d)` restores it. A restored curve is on probation: the first
    real observations of each size are compared with it, and when `revalidate_after` of them
    are off by more than `tolerance` (a factor, either way; a median of them, so one spike
    does not count), the restored figures are dropped and `needs_calibration` is set, so the
    owner measures afresh at the next chance.
    """

    def __init__(self, max_batch: int = 512, prior_slope: float = 0.4, window: int = 9,
                 learning: bool = True):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.max_batch = int(max_batch)
        self.prior_slope = float(prior_slope)
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = int(window)
        self.learning = bool(learning)  # False: observe() is ignored (a pinned curve)
        self.needs_calibration = False  # set by the owner: time the sizes below at the next chance
        self.calibration_sizes = (1, 2, 4, 8, 16)  # larger sizes extrapolate
        self._reset()
        # Probation of a restored curve: {n: restored ms} and the ratios observed / restored.
        self._restored: dict[int, float] = {}
        self._checks: list[float] = []
        self.revalidate_after = 3
        self.tolerance = 1.5

    def _reset(self) -> None:
        self._scale_recent: deque = deque(maxlen=self.window)  # one-token timings, ms
        self._scale = math.nan  # their median: t(1) now
        # [n] per size n >= 2: recent timings / the scale at the time (ms while there is no scale)
        self._recent: dict[int, deque] = {}
        self._shape = np.full(self.max_batch + 1, np.nan)  # [n] median of _recent[n]; [1] = 1
        self._seen = np.zeros(self.max_batch + 1, dtype=np.int64)
        self._curve: np.ndarray | None = None  # cached t(n) for n in 0..max_batch
        self._built_shape = self._shape.copy()  # what the cached curve was built from
        self._built_scale = math.nan

    def observe(self, n_tokens: int, ms: float) -> None:
        """Record one decode of `n_tokens` that took `ms`. Estimates are medians of the last
        `window` timings: robust to the spikes of a shared machine."""
        if not self.learning:
            return
        if not 1 <= n_tokens <= self.max_batch or not ms > 0 or math.isinf(ms):
            return
        if self._restored and self._probation(n_tokens, float(ms)):
            return
        self._seen[n_tokens] += 1
        if n_tokens == 1:
            first = math.isnan(self._scale)
            self._scale_recent.append(float(ms))
            # (statistics.median: a few values, at every step; numpy's costs tens of microseconds)
            self._scale = statistics.median(self._scale_recent)
            self._shape[1] = 1.0
            if first:  # timings taken without a scale become ratios against this first one
                for n, recent in self._recent.items():
                    self._recent[n] = deque((x / ms for x in recent), maxlen=self.window)
                    self._shape[n] = statistics.median(self._recent[n])
                self._curve = None
            # Rebuild the curve (and what depends on it) only when the scale moved by more
            # than SCALE_TOLERANCE since the curve was built: drafting decisions depend on the
            # shape alone, and a rebuild at every step cost more than the drafting itself.
            elif not abs(self._scale - self._built_scale) <= SCALE_TOLERANCE * self._built_scale:
                self._curve = None
            return
        value = float(ms) if math.isnan(self._scale) else float(ms) / self._scale
        recent = self._recent.setdefault(n_tokens, deque(maxlen=self.window))
        recent.append(value)
        median = statistics.median(recent)
        self._shape[n_tokens] = median
        # ... and only when a size's estimate moved by more than CURVE_TOLERANCE.
        built = self._built_shape[n_tokens]
        if not abs(median - built) <= CURVE_TOLERANCE * built:  # (NaN: a new size)
            self._curve = None

    def _probation(self, n_tokens: int, ms: float) -> bool:
        """Compare a real timing with the restored curve; True if the curve was just dropped."""
        self._checks.append(ms / self.cost_ms(n_tokens))
        if len(self._checks) < self.revalidate_after:
            return False
        ratio = float(np.median(self._checks))
        self._restored = {}
        self._checks = []
        if 1 / self.tolerance <= ratio <= self.tolerance:
            return False  # confirmed: keep learning on top of it
        # The machine, load or build changed: forget the restored figures and measure again.
        self._reset()
        self.needs_calibration = True
        return True

    @property
    def calibrated(self) -> bool:
        return int(np.count_nonzero(self._seen)) >= 2

    @property
    def observations(self) -> int:
        """Timings taken into the curve so far (restored points count once)."""
        return int(self._seen.sum())

    def _times(self, sizes: np.ndarray) -> np.ndarray:
        """The current estimate, in ms, of each observed size in `sizes`."""
        if math.isnan(self._scale):
            return self._shape[sizes].copy()  # no scale yet: timings as they were taken
        return self._shape[sizes] * self._scale

    def to_dict(self) -> dict[str, Any]:
        """The measured curve as {"max_batch", "ms": {n: ms}} (observed sizes only, at the
        current scale)."""
        sizes = np.flatnonzero(self._seen)
        times = self._times(sizes)
        return {"max_batch": self.max_batch,
                "ms": {str(int(n)): round(float(ms), 3) for n, ms in zip(sizes, times)}}

    @classmethod
    def from_dict(cls, data: dict[str, Any], max_batch: int | None = None, **kwargs: Any) -> "CostModel":
        """A cost model holding a curve saved by `to_dict`, on probation (see the class doc).

        Raises ValueError naming the problem when `data` is not such a dict.
        """
        try:
            points = {int(n): float(ms) for n, ms in data["ms"].items()}
            saved_max = int(data["max_batch"])
        except (KeyError, TypeError, ValueError, AttributeError):
            raise ValueError(f"not a saved cost curve (want {{'max_batch': N, 'ms': {{n: ms}}}}): {data!r}") from None
        cost = cls(max_batch=saved_max if max_batch is None else max_batch, **kwargs)
        learning, cost.learning = cost.learning, True
        for n_tokens, ms in sorted(points.items()):  # t(1) first: the scale of the others
            if 1 <= n_tokens <= cost.max_batch and ms > 0 and not math.isinf(ms):
                cost.observe(n_tokens, ms)
        cost.learning = learning
        cost._restored = {n: ms for n, ms in points.items() if 1 <= n <= cost.max_batch and cost._seen[n]}
        return cost

    def curve(self) -> np.ndarray:
        """t(n) for n = 0..max_batch (index 0 unused), in ms."""
        if self._curve is not None:
            return self._curve
        self._built_shape = self._shape.copy()
        self._built_scale = self._scale
        sizes = np.flatnonzero(self._seen)
        n = np.arange(self.max_batch + 1, dtype=np.float64)
        if len(sizes) == 0:
            t1 = 10.0  # no evidence yet: an arbitrary scale; only ratios matter
            curve = t1 * (1 + self.prior_slope * (n - 1))
        else:
            times = self._times(sizes)
            # A decode of more tokens never costs less: enforce a non-decreasing curve, from the
            # right. A size's time is capped by every larger size's, so one slow outlier (a
            # shared machine's preemption, kept by a size seen only once) cannot raise the
            # whole curve above it and switch drafting off; a too-fast timing is not a failure
            # mode of a busy machine.
            times = np.minimum.accumulate(times[::-1])[::-1]
            curve = np.interp(n, sizes, times)
            last_n, last_t = sizes[-1], times[-1]
            if len(sizes) >= 2:
                prev_n, prev_t = sizes[-2], times[-2]
                slope = max((last_t - prev_t) / (last_n - prev_n), 0.0)
            else:
                slope = self.prior_slope * last_t / max(last_n, 1)
            beyond = n > last_n
            curve[beyond] = last_t + slope * (n[beyond] - last_n)
            below = n < sizes[0]
            curve[below] = times[0] * np.maximum(n[below], 1) / sizes[0] if sizes[0] > 1 else times[0]
        curve[0] = curve[1]
        self._curve = curve
        return curve

    def cost_ms(self, n_tokens: int) -> float:
        return float(self.curve()[min(max(n_tokens, 1), self.max_batch)])


# A measured size moves the cost curve when its estimate drifts by more than this share.
CURVE_TOLERANCE = 0.01
# ... and the scale (t(1) now) when it drifts by more than this share: it moves with the
# position at every step, and only the shape changes what gets drafted.
SCALE_TOLERANCE = 0.05


# How much dearer a batch is, against one token, with the Llama's own threads (half the cores)
# than with all of them: on 2 cores t(8) / t(1) is 41 / 8.0 ms with 1 thread, 27 / 7.3 with 2.
CONTENDED_BATCH_FACTOR = 1.4


@dataclass
class AcceptanceModel:
    """Per-token acceptance estimates by (candidate kind, match-length bucket): Beta posteriors."""

    accepted: np.ndarray = field(default_factory=lambda: np.zeros((N_KINDS, len(_BUCKET_UPPER))))
    rejected: np.ndarray = field(default_factory=lambda: np.zeros((N_KINDS, len(_BUCKET_UPPER))))
    sampled: bool = False  # temperature > 0: the target sometimes picks another token than a copy

    def _prior(self) -> np.ndarray:
        return np.asarray(_PRIOR_MEAN_SAMPLED if self.sampled else _PRIOR_MEAN)  # [kinds, buckets]

    def rates(self, kind: int, match_lengths: np.ndarray) -> np.ndarray:
        """Posterior mean per-token acceptance for candidate tokens at these match lengths.

        `kind`: CONTEXT_KIND or REFERENCE_KIND (a bool: from a reference or not).
        """
        kind = int(kind)
        a0 = self._prior()[kind] * _PRIOR_STRENGTH
        means = (self.accepted[kind] + a0) / (self.accepted[kind] + self.rejected[kind] + _PRIOR_STRENGTH)
        buckets = np.searchsorted(_BUCKET_UPPER, match_lengths)  # first upper bound >= length
        return means[np.minimum(buckets, len(_BUCKET_UPPER) - 1)]

    def rate(self, kind: int, match_length: int) -> float:
        """`rates` for one match length, without numpy (called at every step)."""
        b = _bucket(match_length)
        kind = int(kind)
        acc, rej = self.accepted[kind, b], self.rejected[kind, b]
        prior = (_PRIOR_MEAN_SAMPLED if self.sampled else _PRIOR_MEAN)[kind][b]
        return float((acc + prior * _PRIOR_STRENGTH) / (acc + rej + _PRIOR_STRENGTH))

    def update(self, kind: int, match_length: int, drafted: int, accepted: int) -> None:
        """A candidate of `drafted` tokens had its first `accepted` confirmed by the target.

        Tokens after the first rejection were never tested, so they are not evidence.
        """
        kind = int(kind)
        for i in range(accepted):
            self.accepted[kind, _bucket(match_length + i)] += 1
        if accepted < drafted:
            self.rejected[kind, _bucket(match_length + accepted)] += 1


@dataclass(frozen=True)
class Draft:
    """What the drafter proposes for one step: a linear draft and the evidence behind it."""

    tokens: list[int]
    match_length: int
    from_reference: bool
    expected_tokens: float  # E(k): expected tokens emitted by the pass, bonus included
    # A tree: parents[j] is the node that token j follows (-1: the last emitted token), in
    # topological order. None: a chain (token j follows token j - 1).
    parents: tuple[int, ...] | None = None
    kind: int = -1  # CONTEXT_KIND or REFERENCE_KIND; -1: from from_reference
    source: int = CONTEXT  # index source of the preferred occurrence (stats per reference)
    # The index sources that hold the drafted tokens (`SuffixIndex.sources_containing`): a
    # prediction repeated in the prompt backs a copy as much as the prompt does. For the
    # stats only; empty: `source` alone.
    sources: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind < 0:
            object.__setattr__(self, "kind", REFERENCE_KIND if self.from_reference else CONTEXT_KIND)

    def __len__(self) -> int:
        return len(self.tokens)


EMPTY_DRAFT = Draft([], 0, False, 1.0)


@dataclass(frozen=True)
class Candidate:
    """A continuation the drafter may draft, and the evidence behind it."""

    tokens: list[int]
    agreement: np.ndarray  # [len(tokens)] share of the occurrences that agree on each token
    match_length: int
    kind: int  # CONTEXT_KIND, REFERENCE_KIND or REJOIN_KIND
    source: int = CONTEXT  # index source of the preferred occurrence
    position: int = 0  # where in that source its continuation starts
    substituted: tuple[tuple[int, int, tuple[int, ...]], ...] = ()  # learned substitutions: (start, end, rule)


@dataclass
class _Pending:
    """The last step's candidate, to be compared with the tokens the target emitted."""

    index: SuffixIndex
    at: int  # context length when it was proposed
    candidate: Candidate | None  # None: not built yet (no draft could pay); built from `match`
    drafted: int  # how many of its tokens were drafted (record() accounts for those)
    match: Match | None = None
    kind: int = CONTEXT_KIND


def best_length(confidences: np.ndarray, cost_curve: np.ndarray, min_gain: float = 1.02) -> tuple[int, float]:
    """The draft length k (0..len(confidences)) maximising E(k) / t(k + 1), and E(k).

    `confidences[i]` is the probability that draft token i is accepted given tokens < i were.
    Returns (0, 1.0) unless some k beats a plain decode by the factor `min_gain`.
    """
    k_max = min(len(confidences), len(cost_curve) - 2)
    if k_max <= 0:
        return 0, 1.0
    survive = np.cumprod(confidences[:k_max])  # [k_max] P(first i+1 tokens accepted)
    expected = 1.0 + np.concatenate(([0.0], np.cumsum(survive)))  # [k_max + 1] E(k)
    rate = expected / cost_curve[1 : k_max + 2]  # [k_max + 1]
    k = int(np.argmax(rate))
    if k == 0 or rate[k] < min_gain * rate[0]:
        return 0, 1.0
    return k, float(expected[k])


class Drafter:
    """Proposes a draft from the suffix index, sized by the cost model; learns per request.

    The engine calls `propose` before every target pass and `record` after it, on the same
    index, which it extends with the emitted tokens in between; `reset` starts a new request.
    """

    def __init__(self, cost: CostModel, max_draft: int = 64, min_gain: float = 1.1, sampled: bool = False,
                 tree_width: int = 1, is_stop: Callable[[int], bool] | None = None):
        """`is_stop(token)`: whether the token ends generation (the target's end-of-generation
        tokens). A draft never goes past one: the tokens after it could not be emitted, and a
        copy of a prompt document runs on into the chat template's end-of-turn token and the
        next turn's text (41 tokens drafted past the end of one in a replayed edit)."""
        if max_draft < 0:
            raise ValueError(f"max_draft must be >= 0, got {max_draft}")
        if tree_width < 1:
            raise ValueError(f"tree_width must be >= 1, got {tree_width}")
        self.cost = cost
        self.max_draft = int(max_draft)
        self.min_gain = float(min_gain)
        self.sampled = bool(sampled)
        self.tree_width = int(tree_width)  # most branches (leaves) one draft may have
        self.is_stop = is_stop
        self._stops: dict[int, bool] = {}  # is_stop's answers so far (a C call each)
        self._threshold_curve: np.ndarray | None = None  # the curve `_threshold` was computed for
        self._threshold = 0.0
        self.reset()

    def reset(self) -> None:
        """Start a new request: forget acceptance history (the cost curve is kept)."""
        self.acceptance = AcceptanceModel(sampled=self.sampled)
        self._pending: _Pending | None = None
        # Where the last copy left its source: (source, position there, context length then).
        self._anchor: tuple[int, int, int] | None = None
        # Learned substitutions: source tokens -> the output's tokens in their place.
        self.rules: dict[tuple[int, ...], tuple[int, ...]] = {}
        self._rules_by_first: dict[int, list[tuple[int, ...]]] = {}  # the newest first
        self._contradicted: set[tuple[int, ...]] = set()  # keys of rules the target contradicted
        # Set by the engine when the backend runs decodes with fewer threads than the curve was
        # measured with (another process took the cores): batches then cost more per token.
        self.contended = False

    def _curve(self) -> np.ndarray:
        """The cost curve drafts are sized by: the measured one, batches dearer when contended."""
        curve = self.cost.curve()
        if self.contended:
            curve = curve.copy()
            curve[2:] *= CONTENDED_BATCH_FACTOR
        return curve

    # ---- proposing -------------------------------------------------------------------
    def propose(self, index: SuffixIndex, limit: int, tree: bool = True) -> Draft:
        """The draft to verify next, at most `limit` tokens; EMPTY_DRAFT when none pays.

        `tree=False` forces a chain even with tree_width > 1 (the engine's first pass).
        """
        self._learn(index)
        limit = min(limit, self.max_draft, self.cost.max_batch - 1)
        if limit <= 0:
            return EMPTY_DRAFT
        match = index.query()
        if tree and self.tree_width > 1 and match is not None and len(match.positions) > 1:
            return self._propose_tree(index, match, limit)
        if match is None:
            return EMPTY_DRAFT
        match, kind = self._classify(index, match)
        if not self._may_pay(match, kind):
            # No draft of this match can pay, whatever its tokens: skip building the candidate
            # (following the occurrences is most of a step's drafting time); `_learn` builds
            # the few tokens it compares with the emitted ones.
            self._pending = _Pending(index, len(index), None, 0, match, kind)
            return EMPTY_DRAFT
        cand = self._candidate(index, match, limit, kind)
        if cand is None:
            return EMPTY_DRAFT
        self._pending = _Pending(index, len(index), cand, 0, match, kind)
        # Each accepted token lengthens the matched suffix, so later draft tokens are backed
        # by a longer match: use the bucket of the length they will have.
        rates = self.acceptance.rates(cand.kind, cand.match_length + np.arange(len(cand.tokens)))
        k, expected = best_length(rates * cand.agreement, self._curve(), self.min_gain)
        self._pending.drafted = k
        if k == 0:
            return EMPTY_DRAFT
        return Draft(cand.tokens[:k], cand.match_length, cand.source != CONTEXT, expected, kind=cand.kind,
                     source=cand.source, sources=index.sources_containing(cand.tokens[:k]))

    def _classify(self, index: SuffixIndex, match: Match) -> tuple[Match, int]:
        """The match to follow and its kind: a rejoin (that occurrence alone) or its source's."""
        anchor = self._anchor
        if anchor is not None and match.length < REJOIN_BELOW:
            source, left_at, context_length = anchor
            since = len(index) - context_length
            if since > REJOIN_WINDOW:
                self._anchor = None
            else:
                for sid, p in match.positions:
                    if sid == source and left_at - 2 <= p - match.length <= left_at + since + REJOIN_SLACK:
                        if match.length >= 2:
                            self._learn_rule(index, sid, left_at, p - match.length, context_length,
                                             len(index) - match.length)
                        return Match(match.length, ((sid, p),)), REJOIN_KIND
        return match, CONTEXT_KIND if match.positions[0][0] == CONTEXT else REFERENCE_KIND

    def _learn_rule(self, index: SuffixIndex, source: int, left_at: int, rejoined_at: int, context_left: int,
                    context_rejoined: int) -> None:
        """The output replaced source[left_at:rejoined_at] by context[context_left:context_rejoined]."""
        if not (left_at < rejoined_at <= left_at + MAX_RULE_TOKENS
                and context_left < context_rejoined <= context_left + MAX_RULE_TOKENS):
            return  # (a deletion is not learned: dropping a token wherever it recurs is rarely right)
        key = tuple(index.source_tokens(source)[left_at:rejoined_at].tolist())
        value = tuple(index.context()[context_left:context_rejoined].tolist())
        if key == value or self.rules.get(key) == value or key in self._contradicted:
            return
        self.rules.pop(key, None)
        self.rules[key] = value
        while len(self.rules) > MAX_RULES:
            del self.rules[next(iter(self.rules))]
        self._index_rules()

    def _forget_rule(self, key: tuple[int, ...]) -> None:
        """The target wrote something else where the rule for `key` applied: drop it for the
        rest of the request (an edit the model does not repeat, or a number that counts up)."""
        self._contradicted.add(key)
        if self.rules.pop(key, None) is not None:
            self._index_rules()

    def _index_rules(self) -> None:
        self._rules_by_first = {}
        for key in reversed(self.rules):
            self._rules_by_first.setdefault(key[0], []).append(key)

    def _substitute(self, tokens: list[int], agreement: np.ndarray, limit: int
                    ) -> tuple[list[int], np.ndarray, tuple[tuple[int, int, tuple[int, ...]], ...]]:
        """Apply the learned substitutions to a candidate's tokens; also where each one landed:
        (start, end, rule) in the returned tokens."""
        out: list[int] = []
        agree: list[float] = []
        spans: list[tuple[int, int, tuple[int, ...]]] = []
        i = 0
        while i < len(tokens) and len(out) < limit:
            for key in self._rules_by_first.get(tokens[i], ()):
                if tuple(tokens[i : i + len(key)]) == key:
                    replacement = self.rules[key]
                    spans.append((len(out), len(out) + len(replacement), key))
                    out.extend(replacement)
                    agree.extend([float(agreement[i])] * len(replacement))
                    i += len(key)
                    break
            else:
                out.append(tokens[i])
                agree.append(float(agreement[i]))
                i += 1
        if not spans:
            return tokens, agreement, ()
        return out[:limit], np.array(agree[:limit]), tuple(spans)

    def _may_pay(self, match: Match, kind: int) -> bool:
        """Whether some draft of `match` could beat a plain decode by `min_gain`.

        An upper bound that needs no candidate: the first token is accepted with probability
        at most c1 (its bucket's estimate; agreement only lowers it) and every later one with
        at most 1, so E(k) <= 1 + c1 * k. No k pays when c1 is below the least c1 for which
        (1 + c1 * k) / t(k + 1) reaches min_gain / t(1) for some k: the threshold depends on
        the curve alone and is kept until the curve changes.
        """
        curve = self._curve()
        if self._threshold_curve is not curve:
            k = np.arange(1, min(self.max_draft, len(curve) - 2) + 1)
            need = (self.min_gain * curve[k + 1] / curve[1] - 1.0) / k if len(k) else np.array([np.inf])
            self._threshold = float(need.min())
            self._threshold_curve = curve
        return self.acceptance.rate(kind, match.length) >= self._threshold

    def candidate(self, index: SuffixIndex, limit: int) -> Candidate | None:
        """What `propose` would weigh, untruncated (the simulator's oracle drafts from it).

        Like `propose`, it first learns from the tokens emitted since the last call; call
        `note_drafted` afterwards if some of its tokens are then drafted."""
        self._learn(index)
        limit = min(limit, self.max_draft, self.cost.max_batch - 1)
        match = index.query() if limit > 0 else None
        if match is None:
            return None
        match, kind = self._classify(index, match)
        cand = self._candidate(index, match, limit, kind)
        if cand is not None:
            self._pending = _Pending(index, len(index), cand, 0, match, kind)
        return cand

    def note_drafted(self, drafted: int) -> None:
        """After `candidate`: its first `drafted` tokens were drafted (and passed to `record`)."""
        if self._pending is not None:
            self._pending.drafted = drafted

    def _candidate(self, index: SuffixIndex, match: Match, limit: int, kind: int,
                   context_end: int | None = None) -> Candidate | None:
        tokens, agreement = _follow_majority(index, match, limit, context_end)
        spans: tuple = ()
        if self._rules_by_first and tokens:
            tokens, agreement, spans = self._substitute(tokens, agreement, limit)
        end = self._through_stop(tokens)
        if end < len(tokens):
            tokens, agreement = tokens[:end], agreement[:end]
        if not tokens:
            return None
        return Candidate(tokens, agreement, match.length, kind, *match.positions[0], substituted=spans)

    def _is_stop(self, token: int) -> bool:
        known = self._stops.get(token)
        if known is None:
            known = self._stops[token] = bool(self.is_stop(token))
        return known

    def _through_stop(self, tokens: Sequence[int]) -> int:
        """How many of `tokens` a draft may hold: up to and with the first stop token."""
        if self.is_stop is not None:
            for i, token in enumerate(tokens):
                if self._is_stop(token):
                    return i + 1
        return len(tokens)

    def _propose_tree(self, index: SuffixIndex, match: Match, limit: int) -> Draft:
        """Best-first tree over the occurrences' continuations, sized by the cost curve.

        A node's probability of being reached is the product, along its path, of the
        acceptance estimate for its match length times the share of its parent's occurrences
        that continue with it. Nodes are added in decreasing probability (a parent always
        before its children), never more than `tree_width` leaves; the prefix of that order
        with the best E / t(n + 1) is the draft.
        """
        roots = index.continuation_trie(match, limit, cyclic=True)
        if not roots:
            return EMPTY_DRAFT
        kind = CONTEXT_KIND if match.positions[0][0] == CONTEXT else REFERENCE_KIND
        rates = self.acceptance.rates(kind, match.length + np.arange(limit))  # by depth - 1
        curve = self._curve()
        limit = min(limit, len(curve) - 2)
        # Frontier: (-reach, push order, depth, parent's place in the draft, branch). Siblings
        # are pushed in the trie's order (count, then preference), so equal reaches go to it.
        heap: list[tuple[float, int, int, int, Branch]] = []
        order = itertools.count()

        def push(children: list[Branch], parent: int, parent_reach: float, depth: int) -> None:
            parent_count = sum(b.count for b in children) if parent < 0 else draft_counts[parent]
            for br in children:
                reach = parent_reach * rates[depth - 1] * br.count / parent_count
                heapq.heappush(heap, (-reach, next(order), depth, parent, br))

        tokens: list[int] = []
        parents: list[int] = []
        draft_counts: list[int] = []
        has_child: set[int] = set()
        leaves = 0
        expected = 1.0
        best_rate, best_n, best_expected = 1.0 / curve[1], 0, 1.0
        push(roots, -1, 1.0, 1)
        while heap and len(tokens) < limit:
            neg_reach, _, depth, parent, br = heapq.heappop(heap)
            new_leaf = parent < 0 or parent in has_child  # else it extends its parent's branch
            if new_leaf and leaves >= self.tree_width:
                continue
            leaves += int(new_leaf)
            has_child.add(parent)
            tokens.append(br.token)
            parents.append(parent)
            draft_counts.append(br.count)
            expected += -neg_reach
            rate = expected / curve[len(tokens) + 1]
            if rate > best_rate:
                best_rate, best_n, best_expected = rate, len(tokens), expected
            if self.is_stop is None or not self._is_stop(br.token):  # nothing follows a stop token
                push(br.children, len(tokens) - 1, -neg_reach, depth + 1)
        if best_n == 0 or best_rate < self.min_gain / curve[1]:
            return EMPTY_DRAFT
        chosen_parents = tuple(parents[:best_n])
        if all(p == i - 1 for i, p in enumerate(chosen_parents)):
            chosen_parents = None  # a chain: verified and rolled back like a linear draft
        return Draft(tokens[:best_n], match.length, kind == REFERENCE_KIND, best_expected, chosen_parents, kind,
                     source=match.positions[0][0])

    # ---- learning ----------------------------------------------------------------------
    def record(self, draft: Draft, accepted: int, path: list[int] | None = None) -> None:
        """The verifier accepted `accepted` tokens (for a tree: the nodes in `path`)."""
        if not len(draft):
            return
        if draft.parents is None:
            self.acceptance.update(draft.kind, draft.match_length, len(draft), accepted)
            return
        # A tree: the walk went `accepted` levels deep; it failed at the next level only if
        # the node it stopped at had children to offer.
        last = path[-1] if path else -1
        failed = last in draft.parents
        self.acceptance.update(draft.kind, draft.match_length, accepted + int(failed), accepted)

    def _learn(self, index: SuffixIndex) -> None:
        """Compare the last step's candidate with the tokens the target emitted since.

        Free evidence: a candidate that was not drafted (or the token after a draft that was
        accepted whole) is confirmed or refuted by the emitted tokens without any verify cost.
        `record` has already counted the drafted tokens.
        """
        pending, self._pending = self._pending, None
        if pending is None or pending.index is not index or len(index) <= pending.at:
            return
        emitted = index.context()[pending.at :]
        cand, skip = pending.candidate, pending.drafted
        if cand is None:  # skipped by propose: only the tokens that can be compared are needed
            cand = self._candidate(index, pending.match, len(emitted), pending.kind, context_end=pending.at)
            if cand is None:
                return
        agree = agreeing_prefix(cand.tokens, emitted)
        tested = min(len(cand.tokens), len(emitted))
        if agree < tested:
            for start, end, key in cand.substituted:
                if start <= agree < end:  # the target wrote something else than the substitution
                    self._forget_rule(key)
            if cand.match_length + agree >= REJOIN_RUN:  # a copy left its source here
                self._anchor = (cand.source, cand.position + _source_offset(cand.substituted, agree),
                                pending.at + agree)
        if agree >= skip and tested > skip:  # the positions past what record() counted
            self.acceptance.update(cand.kind, cand.match_length + skip, tested - skip, agree - skip)


def _source_offset(substituted: tuple[tuple[int, int, tuple[int, ...]], ...], i: int) -> int:
    """Where candidate token i came from, counted from the candidate's source position, given
    the substitutions made in it ((start, end, rule) each; a token inside one maps to its start)."""
    shift = 0
    for start, end, key in substituted:
        if i < end:
            return min(i, start) + shift
        shift += len(key) - (end - start)
    return i + shift


def _follow_majority(index: SuffixIndex, match: Match, depth: int,
                     context_end: int | None = None) -> tuple[list[int], np.ndarray]:
    """Follow the most frequent continuation of the match's occurrences, token by token.

    Returns the tokens and, for each, the fraction of the occurrences still followed that
    agree on it (1.0 where they all agree). Ties go to the preferred (most recent) occurrence.
    `context_end`: as the index was when it held that many context tokens (the match's time).
    """
    if depth == 1 and len(match.positions) > 1:  # one token (the step after a plain decode): count
        counts: dict[int, int] = {}
        for pos in match.positions:
            first = index.continuation(pos, 1, cyclic=True, context_end=context_end)
            if len(first):
                counts[int(first[0])] = counts.get(int(first[0]), 0) + 1
        if not counts:
            return [], np.ones(0)
        token = max(counts, key=counts.__getitem__)  # the first seen among the most frequent
        return [token], np.array([counts[token] / sum(counts.values())])
    conts = [index.continuation(pos, depth, cyclic=True, context_end=context_end) for pos in match.positions]
    if len(conts) == 1:
        return conts[0].tolist(), np.ones(len(conts[0]))
    width = max(len(c) for c in conts)
    table = np.full((len(conts), width), -1, dtype=np.int64)  # [occurrences, depth], -1 = ended
    for row, c in enumerate(conts):
        table[row, : len(c)] = c
    alive = np.arange(len(conts))
    tokens: list[int] = []
    agreement: list[float] = []
    d = 0
    while d < width and len(alive):
        sub = table[alive, d:]  # [alive, width - d]
        lead = sub[0]
        unanimous = (sub == lead).all(axis=0) & (lead >= 0)
        run = int(np.argmin(unanimous)) if not unanimous.all() else len(unanimous)
        tokens.extend(lead[:run].tolist())
        agreement.extend([1.0] * run)
        d += run
        if d >= width:
            break
        col = table[alive, d]
        present = col >= 0
        if not present.any():
            break
        values, first_seen, counts = np.unique(col[present], return_index=True, return_counts=True)
        best = np.flatnonzero(counts == counts.max())
        choice = best[np.argmin(first_seen[best])]  # tie: the most preferred occurrence
        token = int(values[choice])
        tokens.append(token)
        agreement.append(float(counts[choice]) / int(present.sum()))
        alive = alive[col == token]
        d += 1
    return tokens, np.array(agreement)
