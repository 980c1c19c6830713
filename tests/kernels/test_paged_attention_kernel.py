"""The Pallas ragged paged attention kernel against the jnp reference (its specification).

CPU: the kernel body runs in Pallas interpret mode (`interpret=True`) on small shapes. GPU (`pytest -m gpu`): the
compiled Triton kernel at the Llama-3-8B attention shape.
"""
import numpy as np
import pytest
import jax
import jax.numpy as jnp

from jaxinfer.runner.batch import pack
from pallas_kernels.paged_attention import kernel as pk
from pallas_kernels.paged_attention.kernel import ragged_paged_attention
from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference
from tests.kernels.paged_cases import build, cases, kernel_args, rel_err, unreferenced


# (heads, kv_heads, head_dim, page_size, window, soft_cap, pages_per_block, kv_splits)
_CONFIGS = [
    (4, 4, 64, 16, None, None, 1, 1),     # MHA
    (8, 2, 64, 32, 20, None, 1, 2),       # GQA 4, page 32, sliding window, split-K
    (8, 1, 128, 16, None, None, 2, 1),    # GQA 8 (MQA), head_dim 128, two pages per step
    (8, 2, 128, 16, 37, 30.0, 4, 3),      # window + soft cap, 4 pages per step, 3 splits
]


@pytest.mark.parametrize("heads,kv_heads,head_dim,ps,window,soft_cap,ppb,splits", _CONFIGS)
def test_matches_reference(heads, kv_heads, head_dim, ps, window, soft_cap, ppb, splits):
    rng = np.random.default_rng(heads * 1000 + head_dim + ps + (window or 0) + ppb)
    d = build(rng, cases(ps), heads, kv_heads, head_dim, ps)
    assert d["batch"].bucket.num_tiles > int((d["a"]["tile_kv_len"] > 0).sum())  # some tiles are empty
    args = kernel_args(d)
    kw = dict(sm_scale=head_dim ** -0.5, sliding_window=window, soft_cap=soft_cap)
    ref = np.asarray(ragged_paged_attention_reference(*args, kv_chunk_pages=2, **kw))
    out = np.asarray(ragged_paged_attention(*args, pages_per_block=ppb, kv_splits=splits, interpret=True, **kw))
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)
    assert np.all(out[unreferenced(d)] == 0)


@pytest.mark.parametrize("heads,kv_heads,ppb,splits,window", [(4, 4, 1, 4, None), (8, 2, 2, 2, 5)])
def test_decode_bucket(heads, kv_heads, ppb, splits, window):
    """Decode-only step: the small-bucket query tile (Bq = 4, one token per tile), padded rows up to 16."""
    ps, D = 16, 64
    rng = np.random.default_rng(heads + ppb)
    d = build(rng, [(c, 1) for c in (0, 14, 15, 16, 17, 40, 70, 99)], heads, kv_heads, D, ps)
    assert d["batch"].bucket.query_tile == 4
    args = kernel_args(d)
    kw = dict(sm_scale=D ** -0.5, sliding_window=window)
    ref = np.asarray(ragged_paged_attention_reference(*args, kv_chunk_pages=2, **kw))
    out = np.asarray(ragged_paged_attention(*args, pages_per_block=ppb, kv_splits=splits, interpret=True, **kw))
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)
    assert np.all(out[unreferenced(d)] == 0)


@pytest.mark.parametrize("heads,kv_heads,head_dim,ps,window,ppb,splits", [
    (4, 4, 64, 16, None, 1, 4), (8, 2, 64, 32, 20, 1, 2), (8, 2, 128, 16, None, 2, 8)])
def test_kernel_merge_matches_reference(heads, kv_heads, head_dim, ps, window, ppb, splits):
    """merge='kernel': idle splits write nothing and the Pallas merge reads only the busy ones; mixed prefill +
    decode tiles, empty tiles, a sliding window."""
    rng = np.random.default_rng(heads * 100 + splits)
    d = build(rng, cases(ps), heads, kv_heads, head_dim, ps)
    args = kernel_args(d)
    kw = dict(sm_scale=head_dim ** -0.5, sliding_window=window)
    ref = np.asarray(ragged_paged_attention_reference(*args, kv_chunk_pages=2, **kw))
    out = np.asarray(ragged_paged_attention(*args, pages_per_block=ppb, kv_splits=splits, merge="kernel",
                                            interpret=True, **kw))
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)
    assert np.all(out[unreferenced(d)] == 0)


def test_merge_kernel_never_reads_unused_partials():
    """The Pallas merge against the jnp merge on the same partials, with NaN in every partial past a tile's used
    splits (what an unwritten buffer may hold): the result equals the jnp merge of the used splits alone."""
    S, NT, KVH, R, D = 4, 5, 2, 16, 32
    rng = np.random.default_rng(0)
    o = rng.normal(size=(S, NT, KVH, R, D)).astype(np.float32)
    m = rng.normal(size=(S, NT, KVH, R)).astype(np.float32)
    l = rng.uniform(0.5, 2.0, size=(S, NT, KVH, R)).astype(np.float32)
    used = np.array([4, 1, 0, 3, 2], np.int32)
    unused = np.arange(S)[:, None] >= used[None, :]                         # [S, NT]
    clean = (np.where(unused[..., None, None, None], 0.0, o), np.where(unused[..., None, None], -1e30, m),
             np.where(unused[..., None, None], 0.0, l))
    poisoned = [np.where(unused[..., None, None, None], np.nan, o)] + [
        np.where(unused[..., None, None], np.nan, x) for x in (m, l)]
    want = np.asarray(pk.merge_splits(*map(jnp.asarray, clean), jnp.float32))
    got = np.asarray(pk.merge_splits_kernel(*map(jnp.asarray, poisoned), jnp.asarray(used), jnp.float32,
                                            interpret=True))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert np.all(got[2] == 0)  # a tile without work


def test_splits_used_is_the_kernels_split_arithmetic():
    """splits_used counts the split programs whose block range [start, end) is non-empty in the kernel."""
    P, ps, S, W = 2, 16, 4, 8
    kv_len = np.array([0, 1, 32, 33, 100, 256, 256, 300], np.int32)
    lo = np.array([0, 0, 0, 0, 1, 3, 8, 0], np.int32)
    got = np.asarray(pk.splits_used(jnp.asarray(kv_len), jnp.asarray(lo), page_size=ps, pages_per_block=P,
                                    table_width=W, kv_splits=S))
    want = []
    for n, lo_ in zip(kv_len, lo):
        n_blocks = -(-min(-(-n // ps), W) // P)
        lo_ = min(lo_, n_blocks)
        per = -(-(n_blocks - lo_) // S)
        want.append(sum(min(lo_ + s * per + per, n_blocks) > lo_ + s * per for s in range(S)))
    np.testing.assert_array_equal(got, want)


def test_bf16_within_tolerance():
    rng = np.random.default_rng(7)
    H, KVH, D, ps = 8, 2, 64, 16
    d = build(rng, cases(ps)[3:], H, KVH, D, ps)
    kw = dict(sm_scale=D ** -0.5)
    ref32 = np.asarray(ragged_paged_attention_reference(*kernel_args(d, jnp.float32), kv_chunk_pages=2, **kw))
    ref16 = np.asarray(ragged_paged_attention_reference(*kernel_args(d, jnp.bfloat16), kv_chunk_pages=2, **kw),
                       np.float32)
    out = ragged_paged_attention(*kernel_args(d, jnp.bfloat16), pages_per_block=2, kv_splits=2, interpret=True, **kw)
    assert out.dtype == jnp.bfloat16
    n = d["n_tok"]
    assert rel_err(out[:n], ref16[:n]) < 1e-2
    assert rel_err(out[:n], ref32[:n]) < 1e-2


def test_poisoned_padding_and_unused_pages():
    """Large garbage in unused pages, page 0, the tail of each last page, unused page-table entries and the
    padding rows of q / positions: referenced rows still match the reference, the rest come back exactly zero.
    NaN in the same places (the reference would turn 0 * NaN into NaN) changes nothing in the kernel's output."""
    H, KVH, D, ps = 8, 2, 64, 16
    kw = dict(sm_scale=D ** -0.5, pages_per_block=2, kv_splits=2, interpret=True)
    steps = cases(ps)[1:]  # 127 tokens in a 128-token bucket: one padding row
    d = build(np.random.default_rng(3), steps, H, KVH, D, ps, garbage=1e4)
    args = kernel_args(d)
    ref = np.asarray(ragged_paged_attention_reference(*args, sm_scale=D ** -0.5, kv_chunk_pages=2))
    out = np.asarray(ragged_paged_attention(*args, **kw))
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)
    unref = unreferenced(d)
    assert unref.sum() > 0 and np.all(out[unref] == 0)

    nan = build(np.random.default_rng(3), steps, H, KVH, D, ps, garbage=np.nan)
    out_nan = np.asarray(ragged_paged_attention(*kernel_args(nan), **kw))
    n = d["n_tok"]
    assert np.all(np.isfinite(out_nan[:n]))
    np.testing.assert_allclose(out_nan[:n], out[:n], rtol=2e-5, atol=2e-5)
    assert np.all(out_nan[unref] == 0)  # NaN q / positions of padding rows are never read

    # A step with no sequence at all (every tile empty, same bucket): all zeros.
    empty = pack([], d["batch"].bucket, ps).arrays
    q = jnp.full(d["q"].shape, 1e4, jnp.float32)
    out = np.asarray(ragged_paged_attention(
        q, args[1], args[2], jnp.asarray(empty["positions"]), jnp.asarray(empty["tile_tokens"]),
        jnp.asarray(empty["tile_seq"]), jnp.asarray(empty["tile_kv_len"]), jnp.asarray(empty["page_tables"]), **kw))
    assert np.all(out == 0)


def test_validation_errors_name_the_values():
    T, H, KVH, D, ps = 8, 8, 2, 64, 16
    q = jnp.zeros((T, H, D), jnp.float32)
    kp = jnp.zeros((4, ps, KVH, D), jnp.float32)
    i32 = lambda *s: jnp.zeros(s, jnp.int32)  # noqa: E731
    good = (q, kp, kp, i32(T), i32(3, 4), i32(3), i32(3), i32(2, 4))
    kw = dict(sm_scale=1.0, interpret=True)

    def call(*args, **extra):
        return ragged_paged_attention(*args, **{**kw, **extra})

    with pytest.raises(ValueError, match="num_heads 8 must be a multiple of kv_heads 3"):
        call(good[0], jnp.zeros((4, ps, 3, D)), jnp.zeros((4, ps, 3, D)), *good[3:])
    with pytest.raises(ValueError, match=r"head_dim of q \(64\) != head_dim of the KV pages \(128\)"):
        call(good[0], jnp.zeros((4, ps, KVH, 128)), jnp.zeros((4, ps, KVH, 128)), *good[3:])
    with pytest.raises(ValueError, match="head_dim must be a power of two >= 16.*96"):
        call(jnp.zeros((T, H, 96)), jnp.zeros((4, ps, KVH, 96)), jnp.zeros((4, ps, KVH, 96)), *good[3:])
    with pytest.raises(TypeError, match="tile_tokens must be int32, got float32"):
        call(*good[:4], jnp.zeros((3, 4), jnp.float32), *good[5:])
    with pytest.raises(ValueError, match="tile_tokens has 3 tiles but tile_seq has 5"):
        call(*good[:5], i32(5), *good[6:])
    with pytest.raises(ValueError, match="positions has 7 entries but q has 8 tokens"):
        call(*good[:3], i32(7), *good[4:])
    with pytest.raises(ValueError, match=r"v_pages shape \(4, 16, 2, 32\) != k_pages shape \(4, 16, 2, 64\)"):
        call(good[0], kp, jnp.zeros((4, ps, KVH, 32)), *good[3:])
    with pytest.raises(ValueError, match="pages_per_block must be a power of two, got 3"):
        call(*good, pages_per_block=3)
    with pytest.raises(ValueError, match="page_size must be a power of two.*page_size 8, pages_per_block 1"):
        call(good[0], jnp.zeros((4, 8, KVH, D)), jnp.zeros((4, 8, KVH, D)), *good[3:])
    with pytest.raises(ValueError, match="kv_splits must be a positive int, got 0"):
        call(*good, kv_splits=0)
    with pytest.raises(ValueError, match="merge must be 'xla' or 'kernel', got 'pallas'"):
        call(*good, kv_splits=2, merge="pallas")
    with pytest.raises(ValueError, match="merge='kernel' needs kv_splits to be a power of two.*got 3; use merge='xla'"):
        call(*good, kv_splits=3, merge="kernel")


# ------------------------------------------------------------------------------------------------------------
# GPU: the compiled Triton kernel at the Llama-3-8B attention shape (32 q heads / 8 KV heads / D 128, page 16).
# ------------------------------------------------------------------------------------------------------------
def _check_8b_shape(kind, interpret=False):
    ps, H, KVH, D = 16, 32, 8, 128
    rng = np.random.default_rng(11)
    if kind == "decode":  # 24 decodes, contexts from 1 to ~2000 tokens
        ctx = [0, 14, 15, 16, 17, 31, 100, 255, 256, 511, 777, 1024, 1500, 2000] + rng.integers(1, 2000, 10).tolist()
        steps = [(int(c), 1) for c in ctx]
        max_tokens = 64
    else:  # prefill chunks on top of cached context, fresh prompts and decodes in one step
        steps = [(0, 37), (300, 100), (1000, 16), (2 * 16 - 1, 50), (0, 1), (900, 1), (1999, 1), (64, 200)]
        max_tokens = 512
    for dtype, tol in ((jnp.bfloat16, 1e-2), (jnp.float32, 1e-4)):
        d = build(rng, steps, H, KVH, D, ps, max_tokens=max_tokens, max_seqs=32, query_tile=16,
                  max_model_len=4096)
        args = kernel_args(d, dtype)
        n = d["n_tok"]
        with jax.default_matmul_precision("highest"):
            ref = np.asarray(ragged_paged_attention_reference(*args, sm_scale=D ** -0.5, kv_chunk_pages=16),
                             np.float32)
        # f32 with 8 pages of 16 x 128 per step needs ~290 KB of shared memory with 2 pipeline stages (> 227 KB)
        variants = ((1, 1), (4, 1), (4, 4), (8, 2)) if dtype == jnp.bfloat16 else ((1, 1), (4, 4))
        # + the engine's decode split (8 splits, no pipelining), with the XLA and the Pallas merge
        variants = [(p, k, {}) for p, k in variants] + [(4, 8, dict(num_stages=1)),
                                                         (4, 8, dict(num_stages=1, merge="kernel"))]
        for ppb, splits, kw in variants:
            out = np.asarray(ragged_paged_attention(*args, sm_scale=D ** -0.5, pages_per_block=ppb,
                                                    kv_splits=splits, interpret=interpret, **kw), np.float32)
            rel = rel_err(out[:n], ref[:n])
            assert rel < tol, (kind, dtype, ppb, splits, kw, rel)
            assert np.all(out[unreferenced(d)] == 0)


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("kind", ["decode", "mixed"])
def test_gpu_compiled_matches_reference(kind):
    """The compiled Triton kernel (interpret=False) at 32 q heads / 8 KV heads / D 128, page 16."""
    _check_8b_shape(kind)


@pytest.mark.parametrize("H,KVH,Bq,R", [(8, 2, 4, 16), (32, 8, 16, 64), (4, 4, 3, 16)])
def test_tiles_to_tokens_is_the_inverse_of_the_tile_layout(H, KVH, Bq, R):
    """tiles_to_tokens (a gather of each token's slot) against a loop over the slots: row b * g + h of tile i, KV
    head k is token tile_tokens[i, b]'s head k * g + h; empty slots (token T) and the padding rows past Bq * g are
    ignored, tokens no tile holds are zeros."""
    rng = np.random.default_rng(H + Bq)
    T, NT, D, g = 21, 9, 8, H // KVH
    slots = rng.permutation(NT * Bq)
    held = rng.permutation(T)[:T - 3]                     # three tokens in no tile
    tiles = np.full(NT * Bq, T, np.int32)
    tiles[slots[:held.size]] = held
    tiles = tiles.reshape(NT, Bq)
    o = rng.normal(size=(NT, KVH, R, D)).astype(np.float32)
    expected = np.zeros((T, H, D), np.float32)
    for i in range(NT):
        for b in range(Bq):
            if tiles[i, b] < T:
                for k in range(KVH):
                    expected[tiles[i, b], k * g:(k + 1) * g] = o[i, k, b * g:(b + 1) * g]
    got = jax.jit(pk.tiles_to_tokens, static_argnums=(2, 3))(jnp.asarray(o), jnp.asarray(tiles), T, H)
    np.testing.assert_array_equal(np.asarray(got), expected)
    assert not np.asarray(got)[np.setdiff1d(np.arange(T), held)].any()


@pytest.mark.parametrize("heads,kv_heads,head_dim,ps,query_tile,ppb,splits", [
    (8, 2, 64, 16, 8, 1, 1), (8, 2, 64, 16, 16, 2, 1), (4, 4, 32, 8, 16, 4, 1), (8, 2, 64, 16, 8, 1, 3)])
def test_split_causal_matches_reference(heads, kv_heads, head_dim, ps, query_tile, ppb, splits):
    """split_causal: the blocks below each tile's smallest position without masks, then the rest masked (within
    each split's range with kv_splits); prefill chunks on cached context (unmasked blocks run), decodes, empty
    tiles, NaN past each sequence's end and in page 0 (where padding writes)."""
    rng = np.random.default_rng(heads + query_tile + ppb)
    step = cases(ps) + [(3 * ps, 2 * ps + 3), (0, 5 * ps)]
    d = build(rng, step, heads, kv_heads, head_dim, ps, query_tile=query_tile, max_tokens=512)
    args = list(kernel_args(d))
    ref = np.asarray(ragged_paged_attention_reference(*args, sm_scale=head_dim ** -0.5, kv_chunk_pages=2))
    kp, vp = np.array(args[1]), np.array(args[2])
    for (ctx, n), s in zip(step, d["seqs"]):
        if (ctx + n) % ps:
            kp[s.page_table[-1], (ctx + n) % ps:] = np.nan
            vp[s.page_table[-1], (ctx + n) % ps:] = np.nan
    kp[0], vp[0] = np.nan, np.nan
    args[1], args[2] = jnp.asarray(kp), jnp.asarray(vp)
    out = np.asarray(ragged_paged_attention(*args, sm_scale=head_dim ** -0.5, pages_per_block=ppb,
                                            kv_splits=splits, split_causal=True, interpret=True))
    n = d["n_tok"]
    np.testing.assert_allclose(out[:n], ref[:n], rtol=2e-5, atol=2e-5)
    assert np.all(out[unreferenced(d)] == 0)


def test_split_causal_refuses_what_it_does_not_mask():
    rng = np.random.default_rng(0)
    args = kernel_args(build(rng, [(0, 5)], 4, 2, 32, 16))
    for kw in (dict(sliding_window=4), dict(soft_cap=20.0)):
        with pytest.raises(ValueError, match="split_causal"):
            ragged_paged_attention(*args, sm_scale=0.2, split_causal=True, interpret=True, **kw)
