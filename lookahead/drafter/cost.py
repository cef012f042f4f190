"""The verify-cost curve t(n): what one decode of n tokens costs, in ms, learned from timed
decodes. The drafter sizes every draft by it (see the package doc)."""
from __future__ import annotations

import math
import statistics
from collections import deque
from typing import Any

import numpy as np

# A measured size moves the cost curve when its estimate drifts by more than this share.
CURVE_TOLERANCE = 0.01
# ... and the scale (t(1) now) when it drifts by more than this share: it moves with the
# position at every step, and only the shape changes what gets drafted.
SCALE_TOLERANCE = 0.05
# Beyond the largest size timed, the curve goes on with this share of its slope there. A
# batched matrix product costs less per token the more tokens it holds (Qwen2.5-1.5B Q4_K_M
# on 2 threads: 29 ms per added token from 8 to 16 tokens, 11 from 32 to 64), so carrying the
# slope on as it is priced long drafts out, and a size never drafted is never timed. Priced
# lower, the first long draft that pays is tried, timed, and from then on the curve holds it.
EXPLORE_SLOPE = 0.5
# The sizes a first calibration times (larger sizes extrapolate, then learn from real drafts).
CALIBRATION_SIZES = (1, 2, 4, 8, 16)


class CostModel:
    """Verify cost t(n), in ms, of one decode of n tokens; learned from observed decodes.

    Attention makes every decode dearer as the context grows, and a shared machine speeds up
    and slows down. The ratio t(n) / t(1) at one position hardly moves (SmolLM2-135M Q4_1 on 2
    threads: t(1) grows from 7.6 to 10.9 ms between positions 200 and 1400, t(32) / t(1) stays
    between 12.2 and 12.9), and drafting decisions depend on nothing else. So the model keeps
    two things apart:

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
    optimistically, with EXPLORE_SLOPE times its slope from the largest size at most half the
    largest (else the smallest) to the largest (or `prior_slope` times t(1) when only one size
    was seen), so that a longer draft gets tried and timed.

    `padding` (from_n, multiple): the backend's kernels compute a batch of from_n or more
    tokens as one padded to a multiple of `multiple` tokens, so its cost is the padded size's
    (the set-up's exact K-quant kernel: 12 and up padded to 16, see adapters.exact; t(17) is
    0.94 times t(32) there, and t(64) 0.75-0.84 times t(65)). Timings are kept under the
    padded size and every size of a class is priced as its top, so the drafter fills a class
    it pays for, and a size never drafted is priced from the class it falls in.

    A curve measured once can be kept across processes: `to_dict()` gives a small JSON-able
    dict, `CostModel.from_dict(d)` restores it. A restored curve is on probation, of its shape
    only: the scale is this process's from its first one-token timing on (a machine that runs
    slower or faster as a whole, or a longer context, changes t(1), not what to draft). Then
    the first real timings of the restored sizes of 2+ tokens are compared with the restored
    shape, and when `revalidate_after` of them are off by more than `tolerance` (a factor,
    either way; a median of them, so one spike does not count), the restored figures are
    dropped and `needs_calibration` is set, so the owner measures afresh at the next chance.
    Timings of 2+ tokens taken before the first one-token timing are not kept: there is no
    scale of this process to hold them against yet.
    """

    def __init__(self, max_batch: int = 512, prior_slope: float = 0.4, window: int = 9,
                 learning: bool = True, padding: tuple[int, int] | None = None):
        if max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.max_batch = int(max_batch)
        if padding is not None:
            ok = isinstance(padding, tuple) and len(padding) == 2 and all(type(x) is int for x in padding)
            if not (ok and padding[0] >= 2 and padding[1] >= 1):
                raise ValueError(f"padding must be (from_n >= 2, multiple >= 1), integers, got {padding!r}")
        self.padding = padding
        # [n] the size whose cost a decode of n tokens has (n itself without padding)
        sizes = np.arange(self.max_batch + 1)
        if padding is not None:
            padded = -(-sizes // padding[1]) * padding[1]
            sizes = np.where(sizes >= padding[0], np.minimum(padded, self.max_batch), sizes)
        self._class_of = sizes
        self.prior_slope = float(prior_slope)
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = int(window)
        self.learning = bool(learning)  # False: observe() is ignored (a pinned curve)
        self.needs_calibration = False  # set by the owner: time the sizes below at the next chance
        self.calibration_sizes = CALIBRATION_SIZES
        self._reset()
        # Probation of a restored curve: {n: restored ms} and the ratios observed / restored.
        self._restored: dict[int, float] = {}
        self._checks: list[float] = []
        self._live_scale = True  # False from a restore until this process's first t(1)
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
        n_tokens = int(self._class_of[n_tokens])
        if self._restored:
            if n_tokens == 1:  # t(1) is the scale, which follows the machine: no evidence on the shape
                if not self._live_scale:
                    self._live_scale = True
                    self._scale_recent.clear()  # the restored t(1) gives way to this process's
            elif not self._live_scale:
                return
            elif n_tokens in self._restored and self._probation(n_tokens, float(ms)):
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
        """Compare a real timing of a restored size of 2+ tokens with the restored shape at
        this process's scale (sizes past them are priced optimistically on purpose: no
        evidence against the restored curve); True if the curve was just dropped."""
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
        cost._restored = {int(cost._class_of[n]): ms for n, ms in points.items()
                          if 1 <= n <= cost.max_batch and cost._seen[cost._class_of[n]]}
        cost._live_scale = not cost._restored
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
                # The slope from the largest size at most half the largest (else the smallest)
                # to the largest: two sizes close together give a slope that is mostly noise.
                # Times EXPLORE_SLOPE.
                prev = max(int(np.searchsorted(sizes, last_n // 2, side="right")) - 1, 0)
                prev_n, prev_t = sizes[prev], times[prev]
                slope = EXPLORE_SLOPE * max((last_t - prev_t) / (last_n - prev_n), 0.0)
            else:
                slope = self.prior_slope * last_t / max(last_n, 1)
            beyond = n > last_n
            curve[beyond] = last_t + slope * (n[beyond] - last_n)
            below = n < sizes[0]
            curve[below] = times[0] * np.maximum(n[below], 1) / sizes[0] if sizes[0] > 1 else times[0]
        curve = curve[self._class_of]  # each size at its class's cost
        curve[0] = curve[1]
        self._curve = curve
        return curve

    def cost_ms(self, n_tokens: int) -> float:
        return float(self.curve()[min(max(n_tokens, 1), self.max_batch)])
