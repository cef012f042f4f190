"""Setting a `llama_cpp.Llama` up for lookahead: `wrap` an existing one, `load` a GGUF file,
`enable_tree_drafts` on a Llama's context."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Sequence

from lookahead.api import Lookahead
from lookahead.drafter import CostModel
from lookahead.models import resolve

from .. import exact as exact_mode
from .backend import lib
from .prefix_states import PrefixStates
from .state import state_of
from .target import MAX_TREE_WIDTH, LlamaCppTarget

if TYPE_CHECKING:  # pragma: no cover
    import llama_cpp


def wrap(llm: "llama_cpp.Llama", speculate: bool = True, max_draft: int = 64, calibrate: bool = True,
         threads: int | str = "auto", observer=None, prefix_cache_mb: float = 256) -> Lookahead:
    """Wrap an existing `llama_cpp.Llama`: same completion API, exact speculative decoding.

    `prefix_cache_mb`: memory for saved KV states of recent prompt prefixes (see
    `PrefixStates`): a document sent again after another one skips its prefill. 0: off.

    `threads`: threads of one-token decodes. "auto" times the Llama's `n_threads` against its
    `n_threads_batch` once and keeps the faster (llama-cpp-python's default is half the CPUs,
    slow where they are not SMT siblings); "keep" uses the Llama's own; an int that many.
    Outputs do not depend on it; the Llama's settings are restored after each request.

    With `speculate`, the backend's one-off work for batched decodes is done here, not in the
    first request (`LlamaCppTarget.prepare`: in the set-up's build on a CPU with AVX-512 VNNI,
    a packed copy of the Q4_K and Q6_K weights, about a second for the default model).
    """
    if not isinstance(prefix_cache_mb, (int, float)) or isinstance(prefix_cache_mb, bool) or prefix_cache_mb < 0:
        raise ValueError(f"prefix_cache_mb must be a number >= 0, got {prefix_cache_mb!r}")
    target = LlamaCppTarget(llm, threads=threads)
    if speculate:
        target.prepare()  # the backend's one-off work for batches, here rather than in a request
    state = state_of(llm)
    if prefix_cache_mb > 0:
        if state.prefix_states is None:
            state.prefix_states = PrefixStates(int(prefix_cache_mb * 2**20))
        else:
            state.prefix_states.max_bytes = int(prefix_cache_mb * 2**20)
    else:
        state.prefix_states = None
    cost = state.cost
    if cost is None or cost.max_batch != target.max_batch:
        # The curve measured for this model, build and machine in an earlier process: no
        # calibration in the first request. Its scale follows this process's one-token
        # decodes, and its shape is on probation: if the first real batches disagree with it
        # by more than 1.5x (another machine, build or setting), it is dropped and measured
        # again (CostModel.from_dict).
        known = target.measurements.known()
        if known.get("decode_threads") and threads == "auto" and state.tuned_threads is None:
            state.tuned_threads = int(known["decode_threads"])
        single = one_token_threads(llm, threads)
        try:
            if "verify_ms" in known:
                points = restorable_curve(known, single)
            else:  # none for this Llama's n_threads: one timed for another (doctor's: the defaults)
                points = restorable_curve(target.measurements.sibling_curve(), single, borrowed=True)
            cost = CostModel.from_dict({"max_batch": target.max_batch, "ms": points}, padding=target.batch_padding)
        except (KeyError, TypeError, ValueError):  # none kept, or not a curve
            cost = CostModel(max_batch=target.max_batch, padding=target.batch_padding)
        state.cost = cost
    return Lookahead(target, speculate=speculate, max_draft=max_draft, calibrate=calibrate, cost=cost,
                     observer=observer)


def one_token_threads(llm: "llama_cpp.Llama", threads: int | str) -> int | None:
    """The thread count a wrapper with this `threads` setting decodes single tokens with,
    where it is known before the first request (None: "auto", not measured yet)."""
    if threads == "keep":
        return int(llm.n_threads)
    if threads == "auto":
        if int(llm.n_threads) == int(llm.n_threads_batch):
            return int(llm.n_threads)  # the one candidate tune() has
        return state_of(llm).tuned_threads
    return int(threads)


def restorable_curve(known: dict[str, Any], threads: int | None, borrowed: bool = False) -> dict[str, float]:
    """The cached curve's timings ({n: ms}; KeyError without one) that hold for one-token
    decodes with `threads`: t(1) is dropped when it was measured with another count (batches
    run with `n_threads_batch`, which the cache key holds), and the first one-token decodes
    of a request then set the curve's scale. `borrowed`: a curve kept for a Llama that
    differs only in its own `n_threads` (`Measurements.sibling_curve`), whose t(1) is kept
    only when both counts are known and equal."""
    points = dict(known["verify_ms"])
    measured_with = known.get("verify_threads")
    if borrowed:
        other = threads is None or measured_with is None or int(measured_with) != threads
    else:
        other = threads is not None and measured_with is not None and int(measured_with) != threads
    if other:
        points.pop("1", None)
    return points


def load(model_path: str | os.PathLike | None = None, n_ctx: int = 4096, n_threads: int | None = None,
         verbose: bool = False, speculate: bool = True, max_draft: int = 64, tree_width: int = 1,
         threads: int | str = "auto", exact: bool | None = None, rpc: str | Sequence[str] | None = None,
         **llama_kwargs: Any) -> Lookahead:
    """Load a model and wrap it: a name (`lookahead.models.MODELS`: "qwen2.5-coder-1.5b",
    "smollm2-135m"), a GGUF path, or None for $LOOKAHEAD_MODEL, else qwen2.5-coder-1.5b.

    `exact`: batched decodes computed exactly as one-token decodes, so greedy output is plain
    decoding's token for token (lookahead.adapters.exact). None: the process's mode (on unless
    $LOOKAHEAD_EXACT_BATCHES=0). It is chosen once per process, before its first model.
    `llama_kwargs` go to `llama_cpp.Llama` (n_gpu_layers, n_threads_batch, n_batch, ...);
    flash_attn defaults to True, as in llama.cpp's own tools: on a CPU it makes the prompt's
    prefill cheaper, and the set-up's build keeps it exact (greedy output differs between the
    two settings at near-ties, each setting's speculation matching its own plain decoding).
    use_mmap defaults to False: the weights are read into memory of the process, which the
    set-up's build puts on 2 MiB pages on Linux (every decode streams them; mapped from the
    file they stay on 4 KiB pages). It costs the model's size in memory beside the file's
    cached pages, and about a second more to load; use_mmap=True maps them instead.
    `rpc`: llama.cpp RPC servers ("host:port", a list, or "h1:p1,h2:p2") to split the model
    across (`adapters.llama_cpp.rpc`); they are registered first, and n_gpu_layers defaults
    to -1 (every layer on them) unless given. A server that is down raises RpcError naming it.
    `tree_width` > 1 builds the context with that many sequences over a unified KV cache,
    so that drafts may branch where the index's occurrences disagree (each decode verifies
    up to `tree_width` branches; the cost model decides when a wider batch pays). A plain
    `llama_cpp.Llama` has one sequence: `wrap` then drafts chains only.
    """
    if isinstance(tree_width, bool) or not isinstance(tree_width, int) or not 1 <= tree_width <= MAX_TREE_WIDTH:
        raise ValueError(f"tree_width must be an integer in 1..{MAX_TREE_WIDTH}, got {tree_width!r}")
    path = resolve(model_path)
    if exact is not None:
        exact_mode.set_for_process(bool(exact))
    if rpc:
        from . import rpc as rpc_servers

        rpc_servers.register(rpc)
        llama_kwargs["n_gpu_layers"] = rpc_servers.offload_layers(llama_kwargs.get("n_gpu_layers"))
    llama_kwargs.setdefault("flash_attn", True)
    llama_kwargs.setdefault("use_mmap", False)
    llm = lib().Llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, verbose=verbose, **llama_kwargs)
    if tree_width > 1:
        enable_tree_drafts(llm, tree_width)
    return wrap(llm, speculate=speculate, max_draft=max_draft, threads=threads)


def enable_tree_drafts(llm: "llama_cpp.Llama", width: int = 4) -> "llama_cpp.Llama":
    """Give `llm` a context with `width` sequences over one unified KV cache, for tree drafts.

    llama-cpp-python builds its context with a single sequence, so one decode cannot hold
    several branches. This replaces the context (same parameters otherwise; the KV cache
    starts empty) and returns the Llama. Call it before `lookahead.wrap(llm)`. Plain calls
    keep working: they use sequence 0, like before.
    """
    from llama_cpp import _internals

    if not 2 <= width <= MAX_TREE_WIDTH:
        raise ValueError(f"width must be in 2..{MAX_TREE_WIDTH}, got {width}")
    params = llm.context_params
    params.n_seq_max = int(width)
    params.kv_unified = True
    old = llm._ctx
    llm._ctx = _internals.LlamaContext(model=llm._model, params=params, verbose=llm.verbose)
    old.close()
    llm.n_tokens = 0
    return llm
