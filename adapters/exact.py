"""Exact batches: whether llama.cpp computes a batched decode's rows exactly as one-token decodes.

When it does, greedy output with speculation is plain decoding's, token for token: the verifier
already emits the target's own choice from the rows it saw, and those rows are then the rows
plain decoding would have seen. llama.cpp's stock CPU build computes a batch with other kernels
than a one-token decode (tiled and repacked weight products, llamafile's attention), so its
rows differ in the last bits and greedy output can part from plain's at a near-tie.

The set-up's build (scripts/setup.sh, adapters/patches) has a mode that makes them equal, bit
for bit, on x86 CPUs with AVX2, for every weight format: `LOOKAHEAD_EXACT_BATCHES=1` in the
environment. llama.cpp reads it once per process, when the first model is loaded (whether to
repack weights) and at the first product (which kernels), so it must be set before that.
lookahead sets it when it is imported, unless the variable is already set (`0` turns it off).
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

ENV = "LOOKAHEAD_EXACT_BATCHES"

# Decided when lookahead is imported: whether the variable was in force before llama.cpp could
# have loaded a model in this process (set by the user, or set here before llama_cpp was imported).
_IN_FORCE_FROM_START: bool | None = None


def requested() -> bool:
    return os.environ.get(ENV, "") not in ("", "0")


def choose_default() -> None:
    """Exact batches on unless the user chose: `ENV` is set to "1" if it is unset. Called when
    lookahead is imported, so that it is in place before the first model load."""
    global _IN_FORCE_FROM_START
    if _IN_FORCE_FROM_START is not None:
        return
    user_set = ENV in os.environ
    llama_first = "llama_cpp" in sys.modules
    if not user_set:
        os.environ[ENV] = "1"
    _IN_FORCE_FROM_START = requested() and (user_set or not llama_first)


_model_seen = False  # a model was loaded or wrapped in this process: the mode is fixed from then on


def set_for_process(on: bool) -> None:
    """Choose the mode explicitly (--exact/--no-exact, `load(exact=...)`), before any model is
    loaded: llama.cpp reads it once. Choosing the other mode afterwards is an error."""
    global _IN_FORCE_FROM_START
    if _model_seen and on != requested():
        raise ValueError(f"exact={on}: the exact mode is chosen once per process, before the first model "
                         f"is loaded, and this process already runs with it {'on' if requested() else 'off'}")
    os.environ[ENV] = "1" if on else "0"
    if not _model_seen:
        _IN_FORCE_FROM_START = on


def note_model() -> None:
    """A model is loaded or wrapped: from now on the mode cannot change."""
    global _model_seen
    _model_seen = True


@dataclass(frozen=True)
class Exactness:
    exact: bool  # batched rows equal one-token rows, bit for bit, so greedy output is plain's
    reason: str = ""  # when not: why, and what would make it so


def of_llama(llm) -> Exactness:
    """Whether `llm` (a llama_cpp.Llama) decodes batches exactly as one-token decodes, and why not."""
    from . import health

    note_model()

    if not requested():
        return Exactness(False, f"{ENV}=0 (--no-exact): batched rows may differ from one-token rows "
                                "in the last bits, so greedy output can part from plain decoding's at a near-tie")
    if not _IN_FORCE_FROM_START:
        return Exactness(False, f"llama_cpp was imported before lookahead and {ENV} was not set, so the "
                                "model may have been loaded without it: import lookahead first, or set "
                                f"{ENV}=1 in the environment")
    present = health.build_patches()  # reads the CPU library: once
    missing = [p for p in health.EXACT_PATCHES if p not in present]
    if missing:
        return Exactness(False, "this llama-cpp-python build lacks lookahead's patches "
                                f"({', '.join(missing)}): build it with scripts/setup.sh")
    offloaded = int(getattr(llm.model_params, "n_gpu_layers", 0) or 0) != 0
    from .llama_cpp import rpc

    if offloaded and rpc.registered():
        return Exactness(False, "layers run on RPC servers, whose build and mode this process cannot see (a "
                                "ggml-rpc-server from scripts/setup.sh, started with "
                                f"{ENV}=1, computes batches as exactly as this process)")
    if offloaded and _gpu_build():
        return Exactness(False, "layers run on a GPU: the exact mode covers llama.cpp's CPU kernels only")
    if int(getattr(llm.context_params, "flash_attn_type", 0)) != 0 and health.FLASH_ATTN_EXACT not in present:
        return Exactness(False, "flash attention is on, and this build lacks lookahead's patch for it: its CPU "
                                "kernel takes other paths for long batches and long contexts (flash_attn=False "
                                "is exact; scripts/setup.sh builds the patch)")
    info = health.system_info()
    if info.get("AVX2") != "1" or info.get("FMA") != "1" or info.get("F16C") != "1":
        return Exactness(False, "the exact mode's batch kernels are for x86 CPUs with AVX2, FMA and F16C")
    return Exactness(True)


# The set-up's exact kernel for K-quant weights computes a batch of fewer than 12 tokens
# column by column, and 12 or more in tiles of 16 columns, the last one padded
# (ggml-exact-k-quants.patch): measured with Qwen2.5-Coder-1.5B Q4_K_M on 2 threads at
# position 513, t(12) = 0.96 t(16), t(17) = 0.94 t(32), t(33) = 1.04 t(48), t(49) = 0.99 t(64).
K_QUANT_PADDING = (12, 16)
# Built with AVX-512 VNNI, it takes up to 16 columns of Q4_K and Q6_K weights without padding
# (lanes as columns, ggml-tiled-same-results.patch): there t(12) = 0.77 t(16), t(16) = 0.61 t(17).
# Q5_K weights keep the tiles from 12 columns. With the packed copy of the weights
# (ggml-weights-packed-small-batches.patch, unless LOOKAHEAD_PACK_WEIGHTS=0) every batch of Q4_K
# and Q6_K weights goes without padding: t(24) 192-205 ms, t(32) 260-281.
K_QUANT_PADDING_VNNI = (17, 16)
# Built with AVX2 and without AVX-512 VNNI, 12 or more columns of Q4_K and Q6_K weights go in
# steps of 4 columns (rows in lanes, ggml-x86-k-quants-in-lanes.patch), so nothing is padded.
# llama_ftype ids (llama.h) of files whose weights are nearly all Q4_K, Q5_K or Q6_K:
# Q4_K_S, Q4_K_M, Q5_K_S, Q5_K_M, Q6_K.
_K_QUANT_FILE_TYPES = frozenset({14, 15, 16, 17, 18})
# ... and of those with no Q5_K weights: Q4_K_M (Q4_K and Q6_K), Q6_K. (Q4_K_S puts Q5_K in
# some layers' ffn_down and attn_v.)
_Q4_K_Q6_K_FILE_TYPES = frozenset({15, 18})


def batch_padding(exactness: Exactness, file_type: str | int | None,
                  avx512_vnni: bool = False, packed: bool = False, lanes: bool = False) -> tuple[int, int] | None:
    """How the batches of a model with this `general.file_type` are padded (from_n, multiple),
    or None when their cost has no such steps or they are not known (the stock kernels).
    `avx512_vnni`: the build's CPU backend has AVX-512 VNNI (health.system_info(); the kernel
    also needs AVX-512 VL, which every CPU with VNNI has). `packed`: the build packs Q4_K and
    Q6_K weights for batches, and packing is on (`packing_on()`). `lanes`: the build holds
    the AVX2 kernel with rows in lanes (health.ROWS_IN_LANES, compiled in without VNNI only)."""
    try:
        ftype = int(file_type) if file_type is not None else None
    except ValueError:
        return None
    if exactness.exact and ftype in _K_QUANT_FILE_TYPES:
        if avx512_vnni and ftype in _Q4_K_Q6_K_FILE_TYPES:
            return None if packed else K_QUANT_PADDING_VNNI
        if lanes and ftype in _Q4_K_Q6_K_FILE_TYPES:
            return None
        return K_QUANT_PADDING
    return None


PACK_ENV = "LOOKAHEAD_PACK_WEIGHTS"


def packing_on() -> bool:
    """The set-up's build packs Q4_K and Q6_K weights for batches unless LOOKAHEAD_PACK_WEIGHTS=0
    (which it reads at every product)."""
    return os.environ.get(PACK_ENV) != "0"


def _gpu_build() -> bool:
    try:
        import llama_cpp

        return bool(llama_cpp.llama_supports_gpu_offload())
    except Exception:  # an old binding without the call: assume a GPU build could offload
        return True
