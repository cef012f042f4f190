"""Flash attention in the installed llama.cpp, called through ggml's C API (ctypes).

In the exact mode (LOOKAHEAD_EXACT_BATCHES=1, adapters/patches/ggml-exact-flash-attn.patch)
every query row of a batch must equal that row computed alone, bit for bit, whatever else the
batch holds and however far the cache view reaches past the row's last key: that is what makes
a verified draft's logits the one-token logits. And each row must be the true attention of its
inputs (float64 softmax over the F16 keys and values) to F32 rounding, which the patch's row
kernel keeps by scoring in F32 and accumulating the values in F32.
"""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from lookahead.adapters import health
from test_kernel import _InitParams, ggml  # noqa: F401  (the fixture)

GGML_TYPE_F32 = 0
GGML_TYPE_F16 = 1


@pytest.fixture(scope="module")
def attn(ggml):
    """ggml's libraries with the C signatures of 3-d tensors and flash attention added."""
    base, cpu = ggml
    p, i64 = ctypes.c_void_p, ctypes.c_int64
    base.ggml_new_tensor_3d.argtypes, base.ggml_new_tensor_3d.restype = [p, ctypes.c_int, i64, i64, i64], p
    base.ggml_flash_attn_ext.argtypes = [p, p, p, p, p, ctypes.c_float, ctypes.c_float, ctypes.c_float]
    base.ggml_flash_attn_ext.restype = p
    return base, cpu


def _attention(attn, q, k, v, mask, scale, threads=2):
    """ggml's flash attention. q [n_head, n_q, D] F32; k, v [n_head_kv, n_kv, D] F16; mask
    [n_q, n_kv] F16 (0 or -inf). Returns [n_q, n_head, D]."""
    base, cpu = attn
    n_head, n_q, d = q.shape
    n_head_kv, n_kv, _ = k.shape
    ctx = base.ggml_init(_InitParams(64 << 20, None, False))
    assert ctx, "ggml_init failed"
    try:
        def tensor(kind, array, *ne):
            t = base.ggml_new_tensor_3d(ctx, kind, *ne)
            array = np.ascontiguousarray(array)
            ctypes.memmove(base.ggml_get_data(t), array.ctypes.data, array.nbytes)
            return t

        tq = tensor(GGML_TYPE_F32, q.astype(np.float32), d, n_q, n_head)
        tk = tensor(GGML_TYPE_F16, k.astype(np.float16), d, n_kv, n_head_kv)
        tv = tensor(GGML_TYPE_F16, v.astype(np.float16), d, n_kv, n_head_kv)
        tm = tensor(GGML_TYPE_F16, mask.astype(np.float16), n_kv, n_q, 1)
        out = base.ggml_flash_attn_ext(ctx, tq, tk, tv, tm, scale, 0.0, 0.0)
        graph = base.ggml_new_graph(ctx)
        base.ggml_build_forward_expand(graph, out)
        assert cpu.ggml_graph_compute_with_ctx(ctx, graph, threads) == 0
        result = np.empty((n_q, n_head, d), dtype=np.float32)
        ctypes.memmove(result.ctypes.data, base.ggml_get_data(out), result.nbytes)
        return result
    finally:
        base.ggml_free(ctx)


def _causal(first_pos: int, n_q: int, n_kv: int) -> np.ndarray:
    """Row i sees cells 0..first_pos+i, as a decode of positions first_pos.. does."""
    cells = np.arange(n_kv)[None, :]
    rows = first_pos + np.arange(n_q)[:, None]
    return np.where(cells <= rows, 0.0, -np.inf)


def _true_attention(q, k, v, mask, scale):
    """float64 softmax attention of the F16-rounded keys and values, [n_q, n_head, D]."""
    group = q.shape[0] // k.shape[0]
    kk = np.repeat(k.astype(np.float16).astype(np.float64), group, axis=0)
    vv = np.repeat(v.astype(np.float16).astype(np.float64), group, axis=0)
    s = np.einsum("hqd,hkd->hqk", q.astype(np.float32).astype(np.float64), kk) * scale + mask[None]
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hqk,hkd->qhd", p, vv)


def _skip_unless_exact():
    if not health.exact_batches_requested():
        pytest.skip(f"{health.EXACT_BATCHES_ENV}=0: llama.cpp's stock flash attention is not exact")
    if health.FLASH_ATTN_EXACT not in health.build_patches():
        pytest.skip("this build lacks lookahead's flash attention patch (scripts/setup.sh applies it)")


# Head sizes 64, 128 (Qwen2.5's; 12 query heads over 2 KV heads) and 256 take the row kernel, 80
# the one-chunk kernel it stands in for; both must give each row what it gives alone. Cache
# lengths around the kernel's 16-cell blocks, and past the 512 cells where stock llama.cpp
# splits a one-token decode's cache between threads.
@pytest.mark.parametrize("d,n_head,n_head_kv", [(64, 9, 3), (128, 12, 2), (256, 4, 4), (80, 4, 2)])
@pytest.mark.parametrize("first_pos,n_q", [(0, 1), (5, 16), (250, 50), (600, 20)])
def test_attention_rows_are_the_rows_alone_in_exact_mode(attn, d, n_head, n_head_kv, first_pos, n_q):
    _skip_unless_exact()
    rng = np.random.default_rng(d * 1000 + first_pos + n_q)
    n_kv = first_pos + n_q + 37  # cells past the batch are masked, as a padded cache view's are
    q = rng.normal(0, 1, size=(n_head, n_q, d))
    k = rng.normal(0, 1, size=(n_head_kv, n_kv, d))
    v = rng.normal(0, 1, size=(n_head_kv, n_kv, d))
    scale = 1.0 / np.sqrt(d)
    mask = _causal(first_pos, n_q, n_kv)
    for threads in (1, 2):
        batched = _attention(attn, q, k, v, mask, scale, threads)
        for i in range(n_q):
            pos = first_pos + i
            for view in (n_kv, pos + 1, min(n_kv, pos + 17)):  # the whole view, then views ending at the row's last key or a bit past it
                alone = _attention(attn, q[:, i : i + 1, :], k[:, :view], v[:, :view], mask[i : i + 1, :view], scale, threads)
                assert np.array_equal(alone[0], batched[i]), f"row {i} (position {pos}), view {view}, {threads} threads"
    true = _true_attention(q, k, v, mask, scale)
    assert np.abs(batched - true).max() < 0.05, "far off the true attention"


@pytest.mark.parametrize("d,n_head,n_head_kv", [(64, 9, 3), (128, 12, 2), (256, 4, 4)])
def test_the_row_kernel_is_the_true_attention_to_f32_rounding(attn, d, n_head, n_head_kv):
    """Scores in F32 and an F32 accumulator: about 3e-6 from float64 attention here, where the
    one-chunk kernel (Q rounded to F16, an F16 accumulator) is off by 7e-3 to 1.3e-2."""
    _skip_unless_exact()
    rng = np.random.default_rng(d)
    n_q, first_pos = 24, 700
    n_kv = first_pos + n_q
    q = rng.normal(0, 1, size=(n_head, n_q, d)) * 2.0  # peakier softmax: more rescaling steps
    k = rng.normal(0, 1, size=(n_head_kv, n_kv, d))
    v = rng.normal(0, 1, size=(n_head_kv, n_kv, d))
    scale = 1.0 / np.sqrt(d)
    mask = _causal(first_pos, n_q, n_kv)
    got = _attention(attn, q, k, v, mask, scale)
    err = np.abs(got - _true_attention(q, k, v, mask, scale)).max()
    assert err < 2e-5, f"max error {err:.3g}"
