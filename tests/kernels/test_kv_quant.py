"""Quantized KV cache (fp8 e4m3 / int8 pages with per-(token, KV head) float32 scales): quantize-on-write, the
jnp reference and the Pallas kernel (interpret mode) against float attention on the same ragged problems."""
import jax
import ml_dtypes
import numpy as np
import pytest
import jax.numpy as jnp

from pallas_kernels.paged_attention.kernel import ragged_paged_attention
from pallas_kernels.paged_attention.kv_quant import QuantizedPages, dequantize_pages, empty_pages, quantize_kv
from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference, write_kv_pages
from tests.kernels.paged_cases import build, cases

DTYPES = {"fp8": jnp.float8_e4m3fn, "int8": jnp.int8}
# Relative-norm error of the attention output with quantized vs float KV (random normal K/V, measured ~0.03 for
# fp8 and ~0.007 for int8: e4m3 keeps 3 mantissa bits, int8 per-token steps of amax / 127).
ATTN_BOUND = {"fp8": 0.05, "int8": 0.01}


def _rel(x, y):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))


def _quantize_pool(pages, dtype):
    """Quantize every slot of a float page pool, as write_kv_pages would have when each token was written."""
    n, ps, kvh, d = pages.shape
    q, s = quantize_kv(jnp.asarray(pages).reshape(n * ps, kvh, d), dtype)
    return QuantizedPages(q.reshape(n, ps, kvh, d), s.reshape(n, ps, kvh))


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_quantize_error_bound(kind):
    """Per element: int8 within half a step (amax / 254); fp8 within half an ulp of e4m3 (2^-4 relative, or the
    subnormal step 2^-9 * scale near zero). Outlier tokens do not cost other tokens precision; zero rows stay 0."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((64, 3, 32)).astype(np.float32) * rng.uniform(0.01, 100, (64, 3, 1)).astype(np.float32)
    x[5, 1] = 0.0
    q, s = quantize_kv(jnp.asarray(x), DTYPES[kind])
    assert q.dtype == DTYPES[kind] and s.shape == (64, 3)
    deq = np.asarray(q, np.float32) * np.asarray(s)[..., None]
    amax = np.abs(x).max(-1, keepdims=True)
    err = np.abs(deq - x)
    if kind == "int8":
        assert np.all(err <= amax / 254 * (1 + 1e-5) + 1e-30)
    else:
        scale = amax / 448
        assert np.all(err <= np.maximum(2.0 ** -4 * np.abs(x), 2.0 ** -10 * scale) * (1 + 1e-5) + 1e-30)
        # the largest element of each row maps to the e4m3 maximum exactly
        assert np.all(np.abs(np.asarray(q, np.float32)).max(-1)[amax[..., 0] > 0] == float(
            ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max))
    assert np.all(deq[5, 1] == 0) and np.all(np.isfinite(deq))


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_write_kv_pages_quantized(kind):
    """Written slots dequantize to the token's K/V (within the format's error); every other slot is untouched."""
    rng = np.random.default_rng(1)
    N, ps, kvh, D, T = 6, 4, 2, 16, 7
    kp, vp = empty_pages(kind, (N, ps, kvh, D), jnp.float32), empty_pages(kind, (N, ps, kvh, D), jnp.float32)
    k = rng.standard_normal((T, kvh, D)).astype(np.float32)
    v = rng.standard_normal((T, kvh, D)).astype(np.float32)
    slots = np.array([5, 6, 7, 8, 13, 22, 1], np.int32)
    kp, vp = write_kv_pages(kp, vp, jnp.asarray(k), jnp.asarray(v), jnp.asarray(slots))
    assert isinstance(kp, QuantizedPages) and kp.data.dtype == DTYPES[kind]
    for pages, x in ((kp, k), (vp, v)):
        flat = np.asarray(dequantize_pages(pages)).reshape(N * ps, kvh, D)
        assert _rel(flat[slots], x) < ATTN_BOUND[kind]
        untouched = np.setdiff1d(np.arange(N * ps), slots)
        assert np.all(flat[untouched] == 0)


def _args(d, kp, vp):
    a = d["a"]
    return (d["q"], kp, vp, jnp.asarray(a["positions"]), jnp.asarray(a["tile_tokens"]), jnp.asarray(a["tile_seq"]),
            jnp.asarray(a["tile_kv_len"]), jnp.asarray(a["page_tables"]))


@pytest.mark.parametrize("kind,heads,kv_heads,head_dim,ps,window,ppb,splits", [
    ("int8", 4, 4, 64, 16, None, 1, 1),     # MHA
    ("int8", 8, 2, 64, 32, 20, 1, 2),       # GQA 4, page 32, sliding window, split-K
    ("fp8", 8, 2, 64, 32, 20, 1, 2),
    ("fp8", 8, 1, 128, 16, None, 2, 3),     # GQA 8, head_dim 128, two pages per kernel step, 3 splits
])
def test_attention_quantized_kv(kind, heads, kv_heads, head_dim, ps, window, ppb, splits):
    """Ragged mix (lengths 1, page-1, page, page+1, long; shuffled pages):
    1. reference on quantized pages == reference on their float dequantization (the scales fold exactly);
    2. kernel (interpret) on quantized pages == reference on quantized pages (tight);
    3. both within the format's bound of float attention on the unquantized KV."""
    rng = np.random.default_rng(heads * 10 + head_dim + ps)
    d = build(rng, cases(ps), heads, kv_heads, head_dim, ps)
    kq, vq = _quantize_pool(d["kp"], DTYPES[kind]), _quantize_pool(d["vp"], DTYPES[kind])
    kw = dict(sm_scale=head_dim ** -0.5, sliding_window=window)
    scales = dict(k_scales=kq.scale, v_scales=vq.scale)
    n = d["n_tok"]

    ref_q = np.asarray(ragged_paged_attention_reference(*_args(d, kq.data, vq.data), kv_chunk_pages=2, **kw,
                                                        **scales))
    ref_deq = np.asarray(ragged_paged_attention_reference(*_args(d, dequantize_pages(kq), dequantize_pages(vq)),
                                                          kv_chunk_pages=2, **kw))
    np.testing.assert_allclose(ref_q, ref_deq, rtol=1e-5, atol=1e-5)

    out = np.asarray(ragged_paged_attention(*_args(d, kq.data, vq.data), pages_per_block=ppb, kv_splits=splits,
                                            interpret=True, **kw, **scales))
    np.testing.assert_allclose(out, ref_q, rtol=2e-5, atol=2e-5)

    ref_f = np.asarray(ragged_paged_attention_reference(*_args(d, d["kp"], d["vp"]), kv_chunk_pages=2, **kw))
    assert _rel(ref_q[:n], ref_f[:n]) < ATTN_BOUND[kind]
    assert _rel(out[:n], ref_f[:n]) < ATTN_BOUND[kind]


def test_kernel_quantized_ignores_poisoned_scales():
    """NaN / huge scales in slots past each sequence's length, in page 0 and in unused pages never reach the
    output of the kernel (masked by value, like its float K/V)."""
    H, KVH, D, ps = 8, 2, 64, 16
    rng = np.random.default_rng(3)
    steps = cases(ps)[1:]
    d = build(rng, steps, H, KVH, D, ps)
    kq, vq = _quantize_pool(d["kp"], jnp.int8), _quantize_pool(d["vp"], jnp.int8)
    kw = dict(sm_scale=D ** -0.5, pages_per_block=2, kv_splits=2, interpret=True)
    clean = np.asarray(ragged_paged_attention(*_args(d, kq.data, vq.data), k_scales=kq.scale, v_scales=vq.scale,
                                              **kw))
    used = np.zeros(kq.scale.shape[:2], bool)  # [num_pages, ps]: slots some sequence owns
    for (ctx, n), s in zip(steps, d["seqs"]):
        for p in range(ctx + n):
            used[s.page_table[p // ps], p % ps] = True
    ks, vs = np.array(kq.scale), np.array(vq.scale)
    ks[~used], vs[~used] = np.nan, np.nan
    out = np.asarray(ragged_paged_attention(*_args(d, kq.data, vq.data), k_scales=jnp.asarray(ks),
                                            v_scales=jnp.asarray(vs), **kw))
    n = d["n_tok"]
    assert np.all(np.isfinite(out[:n]))
    np.testing.assert_allclose(out[:n], clean[:n], rtol=1e-6, atol=1e-6)


def test_kernel_scale_validation():
    T, H, KVH, D, ps = 8, 8, 2, 64, 16
    q = jnp.zeros((T, H, D), jnp.float32)
    kp = jnp.zeros((4, ps, KVH, D), jnp.int8)
    i32 = lambda *s: jnp.zeros(s, jnp.int32)  # noqa: E731
    meta = (i32(T), i32(3, 4), i32(3), i32(3), i32(2, 4))
    kw = dict(sm_scale=1.0, interpret=True)
    with pytest.raises(ValueError, match="KV pages of dtype int8 are quantized: pass k_scales and v_scales"):
        ragged_paged_attention(q, kp, kp, *meta, **kw)
    with pytest.raises(ValueError, match="pass both k_scales and v_scales"):
        ragged_paged_attention(q, kp, kp, *meta, k_scales=jnp.zeros((4, ps, KVH)), **kw)
    with pytest.raises(ValueError, match=r"k_scales shape \(4, 16\) != \(num_pages, page_size, kv_heads\)"):
        ragged_paged_attention(q, kp, kp, *meta, k_scales=jnp.zeros((4, ps)), v_scales=jnp.zeros((4, ps)), **kw)
    kf = jnp.zeros((4, ps, KVH, D), jnp.float32)
    with pytest.raises(TypeError, match="for float8_e4m3fn or int8 KV pages, got float32"):
        ragged_paged_attention(q, kf, kf, *meta, k_scales=jnp.zeros((4, ps, KVH)), v_scales=jnp.zeros((4, ps, KVH)),
                               **kw)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_gpu_compiled_quantized_kv_matches_reference(kind):
    """The compiled Triton kernel reading fp8 / int8 pages + scales, bf16 queries, at the Llama-3-8B attention
    shape (32 q heads / 8 KV heads / D 128, page 16), against the reference on the same quantized pages."""
    ps, H, KVH, D = 16, 32, 8, 128
    rng = np.random.default_rng(12)
    steps = [(0, 37), (300, 100), (1000, 16), (31, 50), (0, 1), (900, 1), (1999, 1), (64, 200)]
    d = build(rng, steps, H, KVH, D, ps, max_tokens=512, max_seqs=32, query_tile=16, max_model_len=4096)
    kq, vq = _quantize_pool(d["kp"], DTYPES[kind]), _quantize_pool(d["vp"], DTYPES[kind])
    d = dict(d, q=d["q"].astype(jnp.bfloat16))
    kw = dict(sm_scale=D ** -0.5, k_scales=kq.scale, v_scales=vq.scale)
    n = d["n_tok"]
    with jax.default_matmul_precision("highest"):
        ref = np.asarray(ragged_paged_attention_reference(*_args(d, kq.data, vq.data), kv_chunk_pages=16, **kw),
                         np.float32)
    for ppb, splits in ((1, 1), (4, 1), (4, 4), (8, 2)):
        out = np.asarray(ragged_paged_attention(*_args(d, kq.data, vq.data), pages_per_block=ppb, kv_splits=splits,
                                                **kw), np.float32)
        assert _rel(out[:n], ref[:n]) < 1e-2, (kind, ppb, splits)
