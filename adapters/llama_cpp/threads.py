"""Threads of llama.cpp decodes: the one-token count chosen by timing, checked while it serves,
and dropped to the Llama's own count while another process takes the cores.

llama-cpp-python defaults one-token decodes to half the CPUs: right with SMT siblings, slow on
a 2-vCPU machine without them. So the count is measured, not assumed (`DecodeThreads.tune`),
and never more than the Llama's own `n_threads_batch` is tried. Thread counts do not change
llama.cpp's CPU results (checked bit for bit), only their speed. The Llama's settings are
restored after each request.
"""
from __future__ import annotations

import statistics
import time
from collections import deque
from typing import Any, Callable

import numpy as np

from .state import Measurements, state_of

# Contention (see DecodeThreads.watch): decodes whose threads got under this share of their
# cores, over this many decodes, mean another process wants them; the Llama's own thread count
# is then kept this long.
# How much dearer a batch is, against one token, when the backend decodes with half the cores
# the curve was measured with (another process took the rest): on 2 cores t(8) / t(1) is
# 41 / 8.0 ms with 1 thread against 27 / 7.3 with 2, a factor of 1.4.
CONTENDED_BATCH_FACTOR = 1.4
CONTENTION_SHARE = 0.85
CONTENTION_WINDOW = 12
CONTENTION_HOLD_S = 30.0
CONTENTION_SLOWDOWN = 1.4
# A one-token decode gets dearer with its position (attention): quiet, 2x the fastest at 2,000
# tokens against 10. So the fastest is kept per band of this many positions, per Llama, and
# carried to a later position as if a decode took (1 + position / DECODE_GROWTH_TOKENS) times
# its time at 0 (SmolLM2-135M: 7.6 ms at 200, 10.9 at 1,400, 2x at 2,000; a model whose
# attention is a smaller share grows slower, and is then judged more leniently, not less).
CONTENTION_BAND = 256
DECODE_GROWTH_TOKENS = 2048


class ThreadCheck:
    """Is the thread count of one-token decodes still the faster one? Checked while decoding.

    `tune` measures it once and the result is cached per model, build and CPU model; but a VM
    of the same CPU model, or the same VM with a neighbour on part of a core, can turn the
    answer round (two threads wait for each other at every layer, one does not): the same
    two-thread decodes can run a few percent faster than one thread's in one run and a few
    percent slower in the next.

    So every `every`-th one-token decode runs with the other candidate count instead, and its
    time is divided by the median of the last few decodes with the chosen count, taken just
    before (the same position, within a few tokens: attention cost drifts along a request).
    Once the median of the last `window` such ratios is under `margin`, the other count is
    faster and becomes the choice. When the other count is clearly slower (ratio median over
    1 / `margin` ** 3), it is tried `settled` times less often. Thread counts do not change
    the logits, so the check never changes an output; it costs about (ratio - 1) / every of
    the one-token decode time (under 1% on SmolLM2-135M).
    """

    def __init__(self, every: int = 16, window: int = 5, margin: float = 0.97, settled: int = 4):
        self.every, self.window, self.margin, self.settled = int(every), int(window), float(margin), int(settled)
        self.ratios: deque[float] = deque(maxlen=self.window)
        self.recent: deque[float] = deque(maxlen=3)  # seconds of the last decodes with the chosen count
        self.count = 0  # one-token decodes with the chosen count since the last check
        self.checks = 0  # checks made (for stats and tests)

    def due(self) -> bool:
        """Should the next one-token decode run with the other count?"""
        if len(self.recent) < self.recent.maxlen:
            return False
        settled = (len(self.ratios) == self.window
                   and statistics.median(self.ratios) > 1 / self.margin ** 3)
        return self.count >= self.every * (self.settled if settled else 1)

    def chosen(self, seconds: float) -> None:
        self.recent.append(seconds)
        self.count += 1

    def other(self, seconds: float) -> bool:
        """Record a decode with the other count; True if it is now the faster one."""
        self.ratios.append(seconds / statistics.median(self.recent))
        self.count = 0
        self.checks += 1
        if len(self.ratios) == self.window and statistics.median(self.ratios) < self.margin:
            self.ratios.clear()
            self.recent.clear()
            return True
        return False


def quiet_decode_s(fastest: dict[int, float], band: int) -> float:
    """What a quiet one-token decode takes in position band `band`, from the fastest seen per
    band: each band's fastest carried forward by DECODE_GROWTH_TOKENS (a later band's as it
    is: a lenient guess), the least of them."""
    def growth(b: int) -> float:
        return 1.0 + b * CONTENTION_BAND / DECODE_GROWTH_TOKENS

    return min(s * growth(band) / growth(b) if b < band else s for b, s in fastest.items())


def faster_thread_count(medians: dict[int, float], own: int) -> int:
    """Of one-token decode times per thread count ({threads: median ms}), the count to use:
    the Llama's `own` unless another is at least 3% faster (a smaller gap is this machine's
    noise, and the Llama's setting is the user's)."""
    best = min(medians, key=medians.get)
    return best if medians[best] < 0.97 * medians[own] else own


def tuned_threads(llm: Any) -> int | None:
    """The one-token decode thread count lookahead measured for `llm`, or None if not yet."""
    return state_of(llm).tuned_threads


class DecodeThreads:
    """The thread counts of one Target's decodes, request by request.

    `setting`: "auto" times the Llama's own `n_threads` against its `n_threads_batch` once
    (`tune`), keeps the faster, and checks the choice while it serves (`checked_decode`);
    "keep" leaves the Llama's setting; an int uses that many. Batched decodes (prefill,
    drafts) always run with the Llama's `n_threads_batch`. `begin` and `end` bracket a
    request; `end` gives the Llama back its own settings.
    """

    def __init__(self, llm: Any, ctx: Any, setting: int | str, measurements: Measurements, lib: Any):
        self.llm = llm
        self.setting = setting
        self._ctx = ctx
        self._lib = lib
        self._measurements = measurements
        self._state = state_of(llm)
        self.own: tuple[int, int] | None = None  # the Llama's (n_threads, n_threads_batch), in a request
        self.contended = False  # see watch
        # (with layers on a GPU the CPU threads mostly wait for it: their CPU time says nothing)
        self._watch = int(getattr(llm.model_params, "n_gpu_layers", 0) or 0) == 0
        self._shares: deque[float] = deque(maxlen=CONTENTION_WINDOW)  # CPU / wall / threads per decode
        self._walls: deque[float] = deque(maxlen=CONTENTION_WINDOW)  # seconds of one-token decodes

    @property
    def current(self) -> int:
        """Threads of one-token decodes right now."""
        return int(self._lib.llama_n_threads(self._ctx))

    def begin(self) -> None:
        """A request starts: note the Llama's own settings, then set the one-token count."""
        llm = self.llm
        self.own = (int(llm.n_threads), int(llm.n_threads_batch))
        self._shares.clear()
        self._walls.clear()
        self.contended = time.monotonic() < self._state.contended_until
        if self.contended:  # contention was seen a moment ago: start where it left off
            self._lib.llama_set_n_threads(self._ctx, self.own[0], self.own[0])
        else:
            self._set(self._chosen())

    def end(self) -> None:
        """The request is over: the Llama's own thread settings again."""
        if self.own is not None:
            self._lib.llama_set_n_threads(self._ctx, *self.own)
            self.own = None

    def _chosen(self) -> int | None:
        if self.setting == "keep":
            return None
        if self.setting == "auto":
            return self._state.tuned_threads
        return int(self.setting)

    def _set(self, n: int | None) -> None:
        if n is not None and self.own is not None and n != self.current:
            self._lib.llama_set_n_threads(self._ctx, n, self.own[1])

    # ---- checking the choice while it serves ---------------------------------------
    @property
    def checking(self) -> bool:
        """Do one-token decodes go through `checked_decode`?"""
        return self.setting == "auto" and not self.contended and self.own is not None

    def checked_decode(self, decode: Callable[[], None]) -> None:
        """Run `decode` (a one-token decode) with the tuned thread count, or now and then with
        the other candidate, to see whether it has become the faster one (ThreadCheck)."""
        state = self._state
        chosen = state.tuned_threads
        own, batch = self.own
        other = batch if chosen == own else own  # the candidates tune() chose between
        if chosen is None or other == chosen:
            decode()
            return
        check = state.thread_check
        if check is None:
            check = state.thread_check = ThreadCheck()
        if not check.due():
            t0 = time.perf_counter()
            decode()
            check.chosen(time.perf_counter() - t0)
            return
        self._set(other)
        t0 = time.perf_counter()
        try:
            decode()
        finally:
            seconds = time.perf_counter() - t0
            if not self.contended:  # (else the contention watch has just set the relief: keep it)
                self._set(chosen)
        if not self.contended and check.other(seconds):
            state.tuned_threads = other
            self._measurements.remember(decode_threads=other)
            self._set(other)

    # ---- contention -----------------------------------------------------------------
    def watched(self, n_tokens: int) -> int:
        """The threads a decode of `n_tokens` is about to run with, if it is to be watched
        for contention (its CPU and wall time passed to `watch`); else 0."""
        if not self._watch or self.contended or self.own is None:
            return 0
        lib = self._lib
        return int(lib.llama_n_threads(self._ctx) if n_tokens == 1 else lib.llama_n_threads_batch(self._ctx))

    def watch(self, wall_s: float, cpu_s: float, threads: int, n_tokens: int, n_past: int) -> None:
        """After a decode with `threads` > 1 at position `n_past`: did its threads get the cores?

        llama.cpp's threads wait for each other at every layer, so when another process takes
        a core a decode with as many threads as cores stalls. On 2 cores with one busy process
        beside it, one-token decodes with 2 threads went from 7.3 to 12-16 ms (up to 375),
        with 1 thread they stayed at 7.9; 8-token decodes 27 -> 57 ms with 2, 41 with 1. Two
        signs together, over the last CONTENTION_WINDOW decodes: the process's CPU time over
        wall time per thread (1.0 quiet, 0.5-0.7 with the busy process; quiet one-token
        decodes alternate between 0.8 and 1.15, so it is not enough alone) under
        CONTENTION_SHARE, and one-token decodes CONTENTION_SLOWDOWN times slower than a quiet
        one at this position: the fastest seen in each CONTENTION_BAND of positions, carried to
        this one by DECODE_GROWTH_TOKENS (a quiet decode at 2,000 tokens takes 2x the fastest
        at 10, so the fastest of all would make the second sign always true on long requests).
        Then every decode of the rest of the request, and of the requests in the next
        CONTENTION_HOLD_S seconds, uses the Llama's own `n_threads` (llama-cpp-python's
        default: half the cores), and `contended` is True.
        """
        self._shares.append(cpu_s / wall_s / threads if wall_s > 0 else 1.0)
        band = n_past // CONTENTION_BAND
        fastest = self._state.fastest_decode
        if n_tokens == 1:
            self._walls.append(wall_s)
            fastest[band] = min(fastest.get(band, wall_s), wall_s)
        if len(self._shares) < CONTENTION_WINDOW or len(self._walls) < CONTENTION_WINDOW // 2:
            return
        # (statistics.median: a dozen values, at every decode; numpy's costs tens of microseconds)
        if (statistics.median(self._shares) < CONTENTION_SHARE
                and statistics.median(self._walls) > CONTENTION_SLOWDOWN * quiet_decode_s(fastest, band)):
            self.contended = True
            self._state.contended_until = time.monotonic() + CONTENTION_HOLD_S
            own = self.own[0] if self.own is not None else int(self.llm.n_threads)
            self._lib.llama_set_n_threads(self._ctx, own, own)

    # ---- the one-off measurement ----------------------------------------------------
    def tune(self, one_decode_ms: Callable[[], float], fits: bool, reps: int = 5) -> dict[int, float]:
        """Choose the thread count of one-token decodes by timing them: {threads: median ms}.

        Only with setting "auto", once per Llama, inside a request (after its prompt, where
        the attention cost is that of real work). `one_decode_ms` times one one-token decode
        that it rolls back; `fits`: the context has room for it. Candidates: the Llama's
        `n_threads` and `n_threads_batch`, timed alternately `reps` times each. The Llama's
        own count is kept unless another is at least 3% faster.
        """
        state = self._state
        if self.setting != "auto" or state.tuned_threads is not None or self.own is None or self.contended:
            return {}  # (contended: timings now would say nothing about this machine; a later request)
        own, batch = self.own
        candidates = sorted({own, batch})
        if len(candidates) == 1 or not fits:
            state.tuned_threads = own
            return {}
        times: dict[int, list[float]] = {n: [] for n in candidates}
        for _ in range(reps):
            for n in candidates:
                self._lib.llama_set_n_threads(self._ctx, n, batch)
                times[n].append(one_decode_ms())
        if self.contended:  # it began during the timings: they are not this machine's; keep the relief
            self._lib.llama_set_n_threads(self._ctx, own, own)
            return {}
        medians = {n: float(np.median(v)) for n, v in times.items()}
        chosen = faster_thread_count(medians, own)
        state.tuned_threads = chosen
        self._measurements.remember(decode_threads=chosen)
        self._lib.llama_set_n_threads(self._ctx, chosen, batch)
        return medians
