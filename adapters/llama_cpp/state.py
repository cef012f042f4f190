"""What lookahead keeps per `llama_cpp.Llama`: in this process (`LlamaState`, one per Llama,
shared by every wrapper of it) and for later processes (one-off measurements in the cache)."""
from __future__ import annotations

import os
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lookahead import cache

if TYPE_CHECKING:  # pragma: no cover
    import llama_cpp

    from lookahead.drafter import CostModel

    from .prefix_states import PrefixStates
    from .threads import ThreadCheck


@dataclass(eq=False)
class LlamaState:
    """Per-Llama state. It must never hold the Llama itself: it lives as long as the Llama does
    (weakly keyed by it), and a reference back would keep the Llama alive for good."""

    # Threads of one-token decodes, measured once (threads.DecodeThreads.tune) or read from the
    # cache; None until then.
    tuned_threads: int | None = None
    # The verify-cost curve belongs to the model and machine, not to one wrapper: every wrapper
    # of the same Llama shares it, so it is measured once.
    cost: CostModel | None = None
    # The fastest one-token decode seen per band of positions, in seconds (contention's yardstick).
    fastest_decode: dict[int, float] = field(default_factory=dict)
    # Contention seen: the Llama's own thread count is kept until this time.monotonic() deadline.
    contended_until: float = 0.0
    # The check of the tuned thread count while it serves; made at the first checked decode.
    thread_check: ThreadCheck | None = None
    # Saved KV states of recent prompt prefixes; None: off (wrap(..., prefix_cache_mb=0)).
    prefix_states: PrefixStates | None = None


_STATES: "weakref.WeakKeyDictionary[Any, LlamaState]" = weakref.WeakKeyDictionary()


def state_of(llm: Any) -> LlamaState:
    """The state lookahead keeps for `llm`, made on first use."""
    state = _STATES.get(llm)
    if state is None:
        state = _STATES[llm] = LlamaState()
    return state


MEASUREMENTS = "measurements"  # cache kind: verify-cost timings and decode threads per model and machine


def measurement_key(llm: "llama_cpp.Llama") -> str:
    """What one-off measurements depend on: the model file, the build, the CPU, the threads,
    the batch size, flash attention, the exact mode (its kernels cost otherwise: on one 2-vCPU
    AVX-512 VM t(8) 191 ms exact against 287 stock) and the GPU offload. A change of any of
    them measures again."""
    from .. import exact
    from ..health import build_identity

    path = str(getattr(llm, "model_path", ""))
    try:
        st = os.stat(path)
        model = f"{os.path.abspath(path)}:{st.st_size}:{int(st.st_mtime)}"
    except OSError:
        model = path
    params = llm.model_params
    flash = int(getattr(llm.context_params, "flash_attn_type", 0) or 0)
    return (f"{model}|threads={llm.n_threads},{llm.n_threads_batch}|n_batch={llm.n_batch}|flash_attn={flash}"
            f"|exact_batches={int(exact.requested())}|gpu_layers={getattr(params, 'n_gpu_layers', 0)}"
            f"|{build_identity()}")


class Measurements:
    """One Llama's one-off measurements in lookahead's cache, for the next process
    (LOOKAHEAD_NO_CACHE=1: off). The key (`measurement_key`) is computed at first use."""

    def __init__(self, llm: "llama_cpp.Llama"):
        self._llm = llm
        self._key: str | None = None

    @property
    def key(self) -> str:
        if self._key is None:
            self._key = measurement_key(self._llm)
        return self._key

    def known(self) -> dict[str, Any]:
        return cache.get(MEASUREMENTS, self.key) or {}

    def sibling_curve(self) -> dict[str, Any]:
        """A verify-cost curve kept under a key that differs from this one only in the
        Llama's own `n_threads` ({"verify_ms", "verify_threads"}, the newest; {} if none).

        Batches run with `n_threads_batch` and one-token decodes with the count kept beside
        the curve, not with `n_threads`, so a curve timed for a Llama made with the defaults
        (the set-up's `lookahead doctor`) holds for one made with `n_threads=2` too."""
        own = _without_own_threads(self.key)
        if own is None:
            return {}
        for key, value in reversed(list(cache.load(MEASUREMENTS).items())):
            if (key != self.key and _without_own_threads(key) == own and isinstance(value, dict)
                    and "verify_ms" in value):
                return {k: value[k] for k in ("verify_ms", "verify_threads") if k in value}
        return {}

    def remember(self, **values: Any) -> None:
        cache.put(MEASUREMENTS, self.key, {**self.known(), **values})


def _without_own_threads(key: str) -> str | None:
    """`key` with the Llama's own thread count taken out of its "threads=N,M" part."""
    head, sep, rest = key.partition("|threads=")
    own, comma, tail = rest.partition(",")
    return f"{head}|threads=*,{tail}" if sep and comma and own.isdigit() else None
