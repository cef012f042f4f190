"""`OneOffWork`: what a `LlamaCppTarget` does once rather than in every request, mixed into it.

* `prepare`: the backend's one-off work for batched decodes, before any request;
* `tune`: the thread count of one-token decodes, by timing them;
* `calibrate`: the verify-cost curve t(n), kept for later processes.

Each decodes dummy tokens (their content does not change the cost) after what the KV cache
holds, and removes them again.
"""
from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from .. import exact, health


class OneOffWork:
    """Mixed into `LlamaCppTarget`, whose `decode`, `rollback`, `n_past` and settings it uses."""

    prepared_ms: float | None = None  # `prepare`'s time, once it ran

    def prepare(self) -> float:
        """Have the backend make its one-off preparation for batched decodes now, not in a
        request: in the exact mode with AVX-512 VNNI the set-up's build packs a copy of the
        Q4_K and Q6_K weights for batches at their first product of 2 or more tokens
        (ggml-weights-packed-small-batches.patch; about 1 s and 1 GB of memory for the default
        model on 2 vCPUs). One decode of 2 tokens with their logits after what the KV cache
        holds, removed again. Returns its ms, 0.0 where nothing needs it or there is no room."""
        if self.prepared_ms is not None:
            return self.prepared_ms
        self.prepared_ms = 0.0
        if (not self.batch_exact or not exact.packing_on()
                or health.PACKED_WEIGHTS not in health.build_patches()):
            return 0.0
        llm = self.llm
        base = int(llm.n_tokens)
        if base + 2 > self.n_ctx or self.max_batch < 2:
            return 0.0
        n_past, self.n_past = self.n_past, base
        t0 = time.perf_counter()
        try:
            self.decode(self._dummy_tokens(2), 2)
        except RuntimeError:
            return 0.0  # the first request's batches prepare it instead
        finally:
            if not self._lib.llama_memory_seq_rm(self._memory, -1, base, -1):
                # a memory that cannot drop a tail (recurrent state): start the Llama afresh
                self._lib.llama_memory_clear(self._memory, True)
                llm.n_tokens = 0
            self.n_past = n_past
            if hasattr(llm, "_requires_eval"):
                # the context's logits are the dummy tokens': the Llama must not sample from them
                llm._requires_eval = True
        self.prepared_ms = 1000 * (time.perf_counter() - t0)
        return self.prepared_ms

    def tune(self, reps: int = 5) -> dict[int, float]:
        """Choose the thread count of one-token decodes by timing them (DecodeThreads.tune):
        {threads: median ms}, empty when nothing was measured."""
        return self._threads.tune(lambda: self._dummy_decode_ms(1), fits=self.n_past + 1 <= self.n_ctx, reps=reps)

    def calibrate(self, sizes: Sequence[int], reps: int = 1) -> dict[int, float]:
        """Time decodes of each size at the current position, rolled back: {n: median ms}.

        Call it with a real context in the KV cache: attention makes a decode at position
        600 markedly dearer than the same decode at position 0. The sizes are timed in turn,
        `reps` rounds, and the median kept. One round by default: it runs inside a user's
        request (the default model on 2 vCPUs: 0.5 s, where three rounds took 1.4 s), and
        an unlucky timing does not last: the curve goes on learning from every real decode,
        and a restored curve's shape is checked against them (CostModel).
        """
        sizes = [n for n in sizes if n <= self.max_batch and self.n_past + n <= self.n_ctx]
        times: dict[int, list[float]] = {n: [] for n in sizes}
        for _ in range(max(1, reps)):
            for n in sizes:
                times[n].append(self._dummy_decode_ms(n))
        out = {n: float(np.median(v)) for n, v in times.items()}
        if out:
            self._remember_curve({str(n): round(ms, 3) for n, ms in out.items()})
        return out

    def _dummy_tokens(self, n: int) -> list[int]:
        return [(97 + i) % self.n_vocab for i in range(n)]

    def _dummy_decode_ms(self, n: int) -> float:
        """One decode of n dummy tokens with their logits at the current position, timed and
        rolled back."""
        base = self.n_past
        t0 = time.perf_counter()
        self.decode(self._dummy_tokens(n), n)
        ms = 1000 * (time.perf_counter() - t0)
        self.rollback(base)
        return ms

    def _remember_curve(self, verify_ms: dict[str, float]) -> None:
        """Keep a verify-cost curve for later processes, with the thread count its one-token
        decodes ran with: the cache key holds the Llama's own `n_threads`, but a wrapper may
        decode single tokens with another count (`threads`), 1.5x apart on 2 cores."""
        self.measurements.remember(verify_ms=verify_ms, verify_threads=self._threads.current)
