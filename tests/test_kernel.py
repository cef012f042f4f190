"""Weight products in the installed llama.cpp, called through ggml's C API (ctypes).

scripts/setup.sh patches llama.cpp (adapters/patches): a batch kernel for Q4_1 weights, and an
exact mode (LOOKAHEAD_EXACT_BATCHES=1, lookahead's default) in which K-quant products (Q4_K,
Q5_K, Q6_K) of any batch size give each column exactly what that column alone would. The
contract: every element of a batched product equals the one-column product bit for bit, and
both are the true product of the quantized weights. These tests hold the build to it, so a
wrong or reordered kernel fails here, and check that the set-up compiled the patches in. Q8_0
is held to the same: the exact mode keeps llamafile's Q8_0 kernel because its results equal
the one-token products.
"""
from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path

import numpy as np
import pytest
from lookahead.adapters import health

GGML_TYPE_F32 = 0
GGML_TYPE_Q4_1 = 3
GGML_TYPE_Q8_0 = 8


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@pytest.fixture(scope="module")
def ggml():
    import llama_cpp  # noqa: F401  (loads the libraries below, with their dependencies)

    return load_ggml(health.library_path())


def load_ggml(lib):
    """ggml's base and CPU libraries in folder `lib`, with the C signatures used here: the files
    llama_cpp loads (by their sonames), so that both share one instance of each library, as
    llama.cpp's own calls do (a second copy would keep state of its own)."""
    def named(stem: str) -> str:
        versioned = lib / f"{stem}.so.0"
        return str(versioned if versioned.exists() else lib / f"{stem}.so")

    base = ctypes.CDLL(named("libggml-base"))
    cpu = ctypes.CDLL(named("libggml-cpu"))
    p = ctypes.c_void_p
    base.ggml_init.argtypes, base.ggml_init.restype = [_InitParams], p
    base.ggml_free.argtypes, base.ggml_free.restype = [p], None
    base.ggml_new_tensor_2d.argtypes = [p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    base.ggml_new_tensor_2d.restype = p
    base.ggml_mul_mat.argtypes, base.ggml_mul_mat.restype = [p, p, p], p
    base.ggml_new_graph.argtypes, base.ggml_new_graph.restype = [p], p
    base.ggml_build_forward_expand.argtypes, base.ggml_build_forward_expand.restype = [p, p], None
    base.ggml_get_data.argtypes, base.ggml_get_data.restype = [p], p
    base.ggml_nbytes.argtypes, base.ggml_nbytes.restype = [p], ctypes.c_size_t
    base.ggml_quantize_chunk.argtypes = [ctypes.c_int, p, p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, p]
    base.ggml_quantize_chunk.restype = ctypes.c_size_t
    base.ggml_backend_cpu_buffer_from_ptr.argtypes = [p, ctypes.c_size_t]
    base.ggml_backend_cpu_buffer_from_ptr.restype = p
    base.ggml_backend_buffer_set_usage.argtypes, base.ggml_backend_buffer_set_usage.restype = [p, ctypes.c_int], None
    base.ggml_backend_tensor_alloc.argtypes, base.ggml_backend_tensor_alloc.restype = [p, p, p], ctypes.c_int
    base.ggml_backend_buffer_free.argtypes, base.ggml_backend_buffer_free.restype = [p], None
    cpu.ggml_graph_compute_with_ctx.argtypes, cpu.ggml_graph_compute_with_ctx.restype = [p, p, ctypes.c_int], ctypes.c_int
    if hasattr(cpu, "ggml_cpu_init"):
        cpu.ggml_cpu_init.argtypes, cpu.ggml_cpu_init.restype = [], None
        cpu.ggml_cpu_init()
    return base, cpu


GGML_BACKEND_BUFFER_USAGE_WEIGHTS = 1


def _products(ggml, wtype: int, weights: np.ndarray, xs: np.ndarray, threads: int = 2,
              memory: np.ndarray | None = None):
    """(quantized weight bytes, W·X for all columns at once, W·x for each column alone).

    The weights lie as a model's do: in a CPU buffer over memory of the caller's (as over a
    mapped file; `memory`, bytes, else a fresh array), marked as holding weights, and freed
    through ggml_backend_buffer_free."""
    base, cpu = ggml
    m, k = weights.shape
    ctx = base.ggml_init(_InitParams((256 << 20) + len(xs) * (2 << 20), None, False))  # 2 MiB a one-column product
    assert ctx, "ggml_init failed"
    wctx = base.ggml_init(_InitParams(1 << 16, None, True))  # the weights' tensor, its data elsewhere
    assert wctx, "ggml_init failed"
    buffer = None
    try:
        w = base.ggml_new_tensor_2d(wctx, wtype, k, m)
        size = base.ggml_nbytes(w)
        if memory is None:
            memory = np.zeros(size + 64, dtype=np.uint8)
        assert memory.nbytes >= size + 64
        addr = (memory.ctypes.data + 63) // 64 * 64
        buffer = base.ggml_backend_cpu_buffer_from_ptr(addr, size)
        base.ggml_backend_buffer_set_usage(buffer, GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        assert base.ggml_backend_tensor_alloc(buffer, w, addr) == 0
        wf = np.ascontiguousarray(weights, dtype=np.float32)
        base.ggml_quantize_chunk(wtype, wf.ctypes.data, base.ggml_get_data(w), 0, m, k, None)
        w_bytes = ctypes.string_at(base.ggml_get_data(w), size)

        def product(cols: np.ndarray) -> np.ndarray:
            cols = np.ascontiguousarray(cols, dtype=np.float32)
            x = base.ggml_new_tensor_2d(ctx, GGML_TYPE_F32, k, cols.shape[0])
            ctypes.memmove(base.ggml_get_data(x), cols.ctypes.data, cols.nbytes)
            y = base.ggml_mul_mat(ctx, w, x)
            graph = base.ggml_new_graph(ctx)
            base.ggml_build_forward_expand(graph, y)
            assert cpu.ggml_graph_compute_with_ctx(ctx, graph, threads) == 0
            out = np.empty((cols.shape[0], m), dtype=np.float32)
            ctypes.memmove(out.ctypes.data, base.ggml_get_data(y), out.nbytes)
            return out

        return w_bytes, product(xs), np.stack([product(xs[j : j + 1])[0] for j in range(len(xs))])
    finally:
        if buffer is not None:
            base.ggml_backend_buffer_free(buffer)
        base.ggml_free(wctx)
        base.ggml_free(ctx)


def _dequantize(wtype: int, raw: bytes, m: int, k: int) -> np.ndarray:
    if wtype == GGML_TYPE_Q4_1:
        # block_q4_1: fp16 d, fp16 m, 16 bytes of nibbles (low nibbles: the block's first 16)
        blocks = np.frombuffer(raw, dtype=np.uint8).reshape(m, k // 32, 20)
        d = blocks[..., 0:2].copy().view(np.float16).astype(np.float64)
        mn = blocks[..., 2:4].copy().view(np.float16).astype(np.float64)
        qs = blocks[..., 4:]
        q = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.float64)
        return (d * q + mn).reshape(m, k)
    # block_q8_0: fp16 d, 32 signed bytes
    blocks = np.frombuffer(raw, dtype=np.uint8).reshape(m, k // 32, 34)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float64)
    q = blocks[..., 2:].copy().view(np.int8).astype(np.float64)
    return (d * q).reshape(m, k)


# Shapes: SmolLM2-135M's (576 wide, 1536 in the MLP), and rows that are no multiple of 4.
@pytest.mark.parametrize("wtype", [GGML_TYPE_Q4_1, GGML_TYPE_Q8_0], ids=["Q4_1", "Q8_0"])
@pytest.mark.parametrize("m,k", [(576, 576), (1536, 576), (578, 1536), (3, 64)])
def test_batched_products_equal_one_column_products(ggml, wtype, m, k):
    rng = np.random.default_rng(m * 7 + k)
    weights = rng.normal(0.01, 0.05, size=(m, k))
    for n in (2, 3, 4, 5, 7, 9, 64):
        xs = rng.normal(0, 1, size=(n, k))
        raw, batched, single = _products(ggml, wtype, weights, xs)
        differ = np.flatnonzero((batched != single).any(axis=1))
        assert differ.size == 0, f"m={m} k={k} n={n}: columns {differ.tolist()} differ from one-column products"
        # And both are the product of the quantized weights with the activations (which ggml
        # rounds to 8 bits per value on the way: hence the tolerance, far below any slip).
        exact = xs @ _dequantize(wtype, raw, m, k).T
        scale = np.abs(exact).max()
        assert np.abs(batched - exact).max() < 0.02 * scale, f"m={m} k={k} n={n}: off the true product"


class _TypeTraits(ctypes.Structure):
    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p),
                ("from_float_ref", ctypes.c_void_p)]


def _dequantize_with_ggml(ggml, wtype: int, raw: bytes, m: int, k: int) -> np.ndarray:
    """ggml's own reference dequantization of `raw` (m rows of k values of type `wtype`)."""
    base, _ = ggml
    base.ggml_get_type_traits.argtypes, base.ggml_get_type_traits.restype = [ctypes.c_int], ctypes.POINTER(_TypeTraits)
    to_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(
        base.ggml_get_type_traits(wtype).contents.to_float)
    out = np.empty(m * k, dtype=np.float32)
    buf = ctypes.create_string_buffer(raw, len(raw))
    to_float(ctypes.addressof(buf), out.ctypes.data, m * k)
    return out.reshape(m, k).astype(np.float64)


GGML_K_QUANTS = {"Q4_K": 12, "Q5_K": 13, "Q6_K": 14}
GGML_OTHER_FORMATS = {"F16": 1, "Q4_0": 2, "Q5_0": 6, "Q5_1": 7}  # ggml's one-token kernels in exact mode


# Shapes: Qwen2.5-Coder-1.5B's (1536 wide; 8960 in the MLP: 35 blocks a row; 25600: 100 blocks,
# more than the small-batch kernel prepares activations for at once), and rows that are no
# multiple of 8. Batches of 1 to 11 columns take lookahead's small-batch kernel (with AVX-512
# VNNI, 7 to 16 columns of Q4_K and Q6_K its lanes-as-columns loop, four rows at a time, two
# from 13 columns: ggml's row chunks of 578 and 3 rows leave rows over at four, 18 rows (two
# chunks of 9) at two as well, and 18 x 25600 does so past the 64 blocks it prepares at once),
# 12 (17 there) and more ggml's tiled one: every column must come out the same either way,
# with 1 or 2 threads. With AVX-512 VNNI, every batch of 2 or more columns of Q4_K and Q6_K
# weights whose rows come in groups of 16 (1536, 64 and 16 rows here) takes the packed copy's
# loop instead, in passes of up to 6 (Q4_K) or 7 (Q6_K) columns (from 7 columns, passes of two
# sizes where they do not divide evenly: 100 columns against 1536 rows take 17 passes of 6 and
# 5; Q6_K passes of up to 4 columns take unsigned codes, wider ones signed codes against the
# activations + 128, and 9 columns go as one pass of each), and the others (578, 18, 3 rows)
# the loops above.
@pytest.mark.parametrize("wtype", list(GGML_K_QUANTS.values()), ids=list(GGML_K_QUANTS))
@pytest.mark.parametrize("m,k", [(1536, 1536), (64, 8960), (16, 25600), (18, 25600), (578, 512), (3, 256)])
def test_k_quant_batches_are_exact_in_exact_mode(ggml, wtype, m, k):
    if not health.exact_batches_requested():
        pytest.skip(f"{health.EXACT_BATCHES_ENV}=0: llama.cpp's stock K-quant kernels are not exact")
    if health.K_QUANT_EXACT not in health.build_patches():
        pytest.skip("this build lacks lookahead's K-quant patch (scripts/setup.sh applies it)")
    rng = np.random.default_rng(m * 11 + k + wtype)
    weights = rng.normal(0.01, 0.05, size=(m, k))
    # 200 and 300: a window of the tiled loop's 256 columns nearly full, and two windows
    for n in (*range(1, 18), 24, 64, 100, *((200, 300) if m * k < 1_000_000 else ())):
        xs = rng.normal(0, 1, size=(n, k))
        for threads in (1, 2):
            raw, batched, single = _products(ggml, wtype, weights, xs, threads=threads)
            differ = np.flatnonzero((batched != single).any(axis=1))
            assert differ.size == 0, f"m={m} k={k} n={n} threads={threads}: columns {differ.tolist()} differ"
        exact = xs @ _dequantize_with_ggml(ggml, wtype, raw, m, k).T
        scale = np.abs(exact).max()
        assert np.abs(batched - exact).max() < 0.02 * scale, f"m={m} k={k} n={n}: off the true product"


# The AVX2 kernel with rows in lanes (ggml-x86-k-quants-in-lanes.patch) sums up to 8 of
# maddubs' 16-bit pair sums before widening them (Q6_K: 2), which holds only while codes times
# activations stay inside the bounds it was sized for: the largest codes (15 for Q4_K, 63 for
# Q6_K: every value 1.0 but one -1.0 in each 16) against activations quantized to -128 (every
# value negative and equal) or 127 reach them. A wrapped sum would be far off the true product.
@pytest.mark.parametrize("wtype", [GGML_K_QUANTS["Q4_K"], GGML_K_QUANTS["Q6_K"]], ids=["Q4_K", "Q6_K"])
def test_k_quant_batches_at_the_largest_codes_and_activations(ggml, wtype):
    m, k = 64, 1024
    weights = np.ones((m, k))
    weights[:, ::16] = -1.0
    for sign in (-1.0, 1.0):
        for n in (12, 16, 64):
            xs = np.full((n, k), sign)
            raw, batched, single = _products(ggml, wtype, weights, xs)
            exact = xs @ _dequantize_with_ggml(ggml, wtype, raw, m, k).T
            assert np.abs(batched - exact).max() < 0.02 * np.abs(exact).max(), f"sign {sign} n={n}: off the true product"
            if health.exact_batches_requested() and health.K_QUANT_EXACT in health.build_patches():
                differ = np.flatnonzero((batched != single).any(axis=1))
                assert differ.size == 0, f"sign {sign} n={n}: columns {differ.tolist()} differ from one-column products"


# With AVX-512 VNNI, batches (2 or more columns) of Q4_K and Q6_K weights run from a copy of
# the weights packed at their first such product and found again by the weights' address
# (ggml-weights-packed-small-batches.patch): freeing their buffer must drop the copy, or the
# next weights at that address would be multiplied as the old ones were. Each round quantizes
# other weights into a new buffer over the same memory, as a model loaded again from another
# file may land where the last one was mapped.
@pytest.mark.parametrize("wtype", [GGML_K_QUANTS["Q4_K"], GGML_K_QUANTS["Q6_K"]], ids=["Q4_K", "Q6_K"])
def test_small_batches_follow_new_weights_at_a_freed_address(ggml, wtype):
    if not health.exact_batches_requested():
        pytest.skip(f"{health.EXACT_BATCHES_ENV}=0: llama.cpp's stock K-quant kernels are not exact")
    if health.K_QUANT_EXACT not in health.build_patches():
        pytest.skip("this build lacks lookahead's K-quant patch (scripts/setup.sh applies it)")
    rng = np.random.default_rng(wtype)
    m, k = 64, 512
    memory = np.zeros(m * k + 64, dtype=np.uint8)  # more than either format's m x k weights take
    for round_ in range(4):
        weights = rng.normal(0.01, 0.05, size=(m, k))
        xs = rng.normal(0, 1, size=(4, k))
        raw, batched, single = _products(ggml, wtype, weights, xs, memory=memory)
        differ = np.flatnonzero((batched != single).any(axis=1))
        assert differ.size == 0, f"round {round_}: columns {differ.tolist()} differ from one-column products"
        exact = xs @ _dequantize_with_ggml(ggml, wtype, raw, m, k).T
        assert np.abs(batched - exact).max() < 0.02 * np.abs(exact).max(), f"round {round_}: off the true product"


# ggml's tiled kernel takes batches of 8 or more rows of these formats (in exact mode every
# batch, and Q4_K, Q5_K and Q6_K below 12 rows take lookahead's small-batch kernel instead);
# the set-up's AVX2 microtile (adapters/patches/ggml-tiled-same-results.patch) rearranges its
# integer sums, and a wrong one (a lost mins term, a column's sum in another's lane) shows
# as a product far from the true one.
GGML_TILED_FORMATS = {"Q2_K": 10, "Q3_K": 11, **GGML_K_QUANTS, "IQ4_XS": 23}


@pytest.mark.parametrize("wtype", list(GGML_TILED_FORMATS.values()), ids=list(GGML_TILED_FORMATS))
def test_tiled_formats_give_the_true_product(ggml, wtype):
    rng = np.random.default_rng(100 + wtype)
    m, k = 40, 1024  # rows no multiple of 16: ragged microtiles
    weights = rng.normal(0.01, 0.05, size=(m, k))
    for n in (8, 13, 16, 17, 40):  # the narrow path (up to 16 rows) and the standard one
        xs = rng.normal(0, 1, size=(n, k))
        raw, batched, single = _products(ggml, wtype, weights, xs)
        exact = xs @ _dequantize_with_ggml(ggml, wtype, raw, m, k).T
        scale = np.abs(exact).max()
        assert np.abs(batched - exact).max() < 0.02 * scale, f"n={n}: off the true product"
        if health.exact_batches_requested() and health.K_QUANT_EXACT in health.build_patches():
            differ = np.flatnonzero((batched != single).any(axis=1))
            assert differ.size == 0, f"n={n}: columns {differ.tolist()} differ from one-column products"


Q8_K_BLOCK_BYTES = 4 + 256 + 2 * 16  # block_q8_K: float d, 256 codes, 16 int16 sums of 16 codes


def _q8_K_inputs(rng: np.random.Generator) -> np.ndarray:
    """Blocks of 256 activations that probe quantize_row_q8_K's every choice: magnitudes over 60
    binary orders, values on the code grid and half-way between codes (the rounding), ties in
    magnitude with both signs (which element sets the scale), zeros, subnormals, NaNs and
    infinities (the reference's own path)."""
    blocks = []
    for kind in range(8):
        for _ in range(64):
            scale = 2.0 ** rng.integers(-30, 30)
            x = rng.uniform(-1, 1, 256) * scale
            if kind == 1:
                x = rng.integers(-127, 128, 256) / 127 * scale
            elif kind == 2:
                x = (rng.integers(-127, 127, 256) + 0.5) / 127 * scale
            elif kind == 3:
                x[rng.random(256) < 0.75] = 0
            elif kind == 4:
                x = np.where(rng.random(256) < 0.3, rng.choice([-scale, scale], 256), x)
            elif kind == 5:
                x = rng.uniform(-1, 1, 256) * 1e-39
            elif kind == 6:
                x[rng.integers(0, 256, 3)] = np.nan
            elif kind == 7:
                x[rng.integers(0, 256)] = rng.choice([-np.inf, np.inf])
            blocks.append(x)
    blocks.append(np.zeros(256))
    return np.concatenate(blocks).astype(np.float32)


def test_q8_K_activation_quantizer_writes_the_reference_bytes(ggml):
    """Every K-quant product first quantizes its activations with the CPU library's
    quantize_row_q8_K; the set-up's AVX2 version (adapters/patches/ggml-q8_K-quantize.patch)
    must write exactly what ggml's scalar reference writes, or every K-quant result changes."""
    base, cpu = ggml
    p = ctypes.c_void_p
    for f in (base.quantize_row_q8_K_ref, cpu.quantize_row_q8_K):
        f.argtypes, f.restype = [p, p, ctypes.c_int64], None
    x = _q8_K_inputs(np.random.default_rng(8))
    n_blocks = x.size // 256
    outputs = []
    for f in (base.quantize_row_q8_K_ref, cpu.quantize_row_q8_K):
        out = np.full(n_blocks * Q8_K_BLOCK_BYTES, 0x5A, dtype=np.uint8)  # an all-zero block leaves the sums as found
        f(x.ctypes.data, out.ctypes.data, x.size)
        outputs.append(out.reshape(n_blocks, Q8_K_BLOCK_BYTES))
    ref, ours = outputs
    differ = np.flatnonzero((ref != ours).any(axis=1))
    assert differ.size == 0, f"blocks {differ[:10].tolist()} (of {n_blocks}) differ from quantize_row_q8_K_ref"
    assert len({bytes(b[:4]) for b in ref}) > n_blocks // 2  # the inputs do reach many scales


@pytest.mark.parametrize("wtype", list(GGML_OTHER_FORMATS.values()), ids=list(GGML_OTHER_FORMATS))
def test_other_formats_are_exact_in_exact_mode(ggml, wtype):
    """Formats without a batch kernel the exact mode keeps (stock llama.cpp repacks Q4_0 or
    hands it and F16 to llamafile): their batches take the one-token kernels there."""
    if not health.exact_batches_requested():
        pytest.skip(f"{health.EXACT_BATCHES_ENV}=0: llama.cpp's stock kernels are not exact")
    if health.Q4_1_KERNEL not in health.build_patches():
        pytest.skip("this build lacks lookahead's patches (scripts/setup.sh applies them)")
    rng = np.random.default_rng(wtype)
    weights = rng.normal(0.01, 0.05, size=(576, 1536))
    for n in (2, 5, 16, 64):
        _, batched, single = _products(ggml, wtype, weights, rng.normal(0, 1, size=(n, 1536)))
        differ = np.flatnonzero((batched != single).any(axis=1))
        assert differ.size == 0, f"n={n}: columns {differ.tolist()} differ from one-column products"


def test_setup_compiled_in_the_q4_1_batch_kernel():
    """scripts/setup.sh applies adapters/patches; on x86 with AVX2 and llamafile's kernels
    (llama.cpp's default) the Q4_1 kernel must be in the CPU library."""
    info = health.system_info()
    if os.environ.get("LOOKAHEAD_NO_PATCHES", "0") != "0":
        pytest.skip("LOOKAHEAD_NO_PATCHES is set: a stock build was asked for")
    if info.get("AVX2") != "1" or info.get("LLAMAFILE") != "1":
        pytest.skip("the kernel is for x86 with AVX2, in llamafile's sgemm (not in this build)")
    assert all(p in health.build_patches() for p in health.EXACT_PATCHES), (
        "llama-cpp-python was not built by scripts/setup.sh with adapters/patches applied")


def test_setup_compiled_in_the_speed_patches():
    """On x86 with AVX2 the set-up's build also holds the patches that change no result (the
    Q8_K quantizer, the tiled microtile, on Linux the huge-page buffers, with AVX-512 VNNI the
    packed batches, without it the rows-in-lanes batches): a build without them is slower, not
    wrong."""
    if os.environ.get("LOOKAHEAD_NO_PATCHES", "0") != "0":
        pytest.skip("LOOKAHEAD_NO_PATCHES is set: a stock build was asked for")
    if health.system_info().get("AVX2") != "1":
        pytest.skip("they are for x86 with AVX2")
    wanted = {health.Q8_K_QUANTIZER, health.TILED_SAME_RESULTS}
    if sys.platform.startswith("linux"):
        wanted.add(health.HUGE_PAGES)
    if health.system_info().get("AVX512_VNNI") == "1":
        wanted.add(health.PACKED_WEIGHTS)  # its kernel needs AVX-512 VNNI
    else:
        wanted.add(health.ROWS_IN_LANES)  # compiled in where VNNI is not
    missing = wanted - set(health.build_patches())
    assert not missing, f"llama-cpp-python was built without {sorted(missing)}: run scripts/setup.sh"


def test_build_patches_reads_the_marker(tmp_path):
    (tmp_path / "libggml-cpu.so").write_bytes(b"\0ELF..." + health.PATCH_MARKERS[health.Q4_1_KERNEL] + b"...")
    assert health.build_patches(tmp_path) == [health.Q4_1_KERNEL]
    (tmp_path / "libggml-cpu.so").write_bytes(b"\0ELF..." + b"..".join(health.PATCH_MARKERS.values()))
    # RPC's and the huge pages' are in their own libraries
    own = (health.RPC_LOST, health.HUGE_PAGES)
    assert health.build_patches(tmp_path) == [p for p in health.PATCH_MARKERS if p not in own]
    (tmp_path / "libggml-rpc.so").write_bytes(b"\0ELF..." + health.PATCH_MARKERS[health.RPC_LOST])
    (tmp_path / "libggml-base.so").write_bytes(b"\0ELF..." + health.PATCH_MARKERS[health.HUGE_PAGES])
    assert health.build_patches(tmp_path) == list(health.PATCH_MARKERS)
    for name in ("libggml-cpu.so", "libggml-rpc.so", "libggml-base.so"):
        (tmp_path / name).write_bytes(b"\0ELF stock")
    assert health.build_patches(tmp_path) == []
    assert health.build_patches(tmp_path / "missing") == []


def test_build_patches_reads_each_library_once(tmp_path, monkeypatch):
    (tmp_path / "libggml-cpu.so").write_bytes(b"\0ELF..." + b"..".join(health.PATCH_MARKERS.values()))
    reads = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda self: reads.append(self.name) or real(self))
    first = health.build_patches(tmp_path)
    assert health.build_patches(tmp_path) == first and reads == ["libggml-cpu.so"]
    (tmp_path / "libggml-cpu.so").write_bytes(b"\0ELF stock, a new build")  # a new version is read again
    assert health.build_patches(tmp_path) == [] and reads == ["libggml-cpu.so"] * 2


_HUGE_PAGES_AFTER_LOAD = """
import sys
import lookahead

def anon_huge_kb():
    with open("/proc/self/smaps_rollup") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:"))

before = anon_huge_kb()
model = lookahead.load(sys.argv[1], n_ctx=256)
print(anon_huge_kb() - before)
"""


def test_loaded_weights_ask_for_huge_pages(model_path):
    """lookahead.load reads the weights into ggml's buffers, which the set-up's build asks to
    have on 2 MiB pages: where the kernel's transparent huge pages are on, most of the weights
    get them (a decode streams them all). In a fresh process: in this one, memory that earlier
    tests freed may hold them, its pages counted before."""
    import subprocess

    if not sys.platform.startswith("linux") or health.transparent_huge_pages() in (None, "never"):
        pytest.skip("transparent huge pages are off, or not Linux's")
    if health.HUGE_PAGES not in health.build_patches():
        pytest.skip("a build without lookahead's patches")
    child = subprocess.run([sys.executable, "-c", _HUGE_PAGES_AFTER_LOAD, str(model_path)],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-2000:]
    gained = int(child.stdout.split()[-1])
    size_kb = model_path.stat().st_size // 1024
    assert gained >= size_kb // 2, f"{gained} KiB on huge pages for a {size_kb} KiB model"


def test_transparent_huge_pages_reads_the_chosen_mode(tmp_path):
    setting = tmp_path / "enabled"
    setting.write_text("always [madvise] never\n")
    assert health.transparent_huge_pages(str(setting)) == "madvise"
    setting.write_text("always madvise [never]\n")
    assert health.transparent_huge_pages(str(setting)) == "never"
    assert health.transparent_huge_pages(str(tmp_path / "missing")) is None
