"""The jnp ragged paged attention (the kernel's specification) against dense float64 attention in numpy."""
import numpy as np
import pytest
import jax
import jax.numpy as jnp

from jaxinfer.outputs import SeqInput
from jaxinfer.runner.batch import pack
from jaxinfer.runner.buckets import BucketLadder
from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference, write_kv_pages
from tests.kernels.paged_cases import build, cases


def _dense_reference(q, k_all, v_all, q_pos, scale, window):
    """q: [n, H, D]; k_all/v_all: [ctx, KVH, D] of one sequence; causal (+ window) by absolute position."""
    H, KVH = q.shape[1], k_all.shape[1]
    g = H // KVH
    out = np.zeros(q.shape, np.float64)
    for h in range(H):
        s = q[:, h, :] @ k_all[:, h // g, :].T * scale  # [n, ctx]
        kv_pos = np.arange(k_all.shape[0])
        mask = kv_pos[None, :] <= q_pos[:, None]
        if window is not None:
            mask &= kv_pos[None, :] > q_pos[:, None] - window
        s = np.where(mask, s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        out[:, h, :] = p @ v_all[:, h // g, :]
    return out


@pytest.mark.parametrize("heads,kv_heads,head_dim,page_size", [
    (4, 4, 64, 16),    # MHA
    (8, 2, 64, 32),    # GQA 4
    (8, 1, 128, 16),   # MQA / GQA 8
])
@pytest.mark.parametrize("window,static_loop", [(None, False), (20, False), (None, True)])
def test_ragged_mix_matches_dense(heads, kv_heads, head_dim, page_size, window, static_loop):
    rng = np.random.default_rng(heads * 100 + head_dim + page_size + (window or 0))
    ps = page_size
    steps = cases(ps)
    d = build(rng, steps, heads, kv_heads, head_dim, ps, num_pages=64, max_model_len=32 * ps)
    q, kp, vp, a, batch, n_tok = np.asarray(d["q"]), d["kp"], d["vp"], d["a"], d["batch"], d["n_tok"]
    full_k, full_v, before = d["full_k"], d["full_v"], d["k_before"]
    scale = head_dim ** -0.5
    out = np.asarray(ragged_paged_attention_reference(
        jnp.asarray(q), kp, vp, a["positions"], a["tile_tokens"], a["tile_seq"], a["tile_kv_len"],
        a["page_tables"], sm_scale=scale, kv_chunk_pages=2, sliding_window=window,
        static_loop=static_loop))
    for i, (ctx, n) in enumerate(steps):
        s0 = batch.token_offsets[i]
        ref = _dense_reference(q[s0:s0 + n].astype(np.float64), full_k[i].astype(np.float64),
                               full_v[i].astype(np.float64), np.arange(ctx, ctx + n), scale, window)
        np.testing.assert_allclose(out[s0:s0 + n], ref, rtol=2e-5, atol=2e-5, err_msg=f"sequence {i} {ctx, n}")
    # Only the step's slots changed: padding tokens (slot -1) write nothing, not even into the reserved page 0.
    changed = np.argwhere(np.any(np.asarray(kp) != before, axis=(2, 3)))
    written = {(int(s) // ps, int(s) % ps) for s in a["slot_mapping"][:n_tok]}
    assert {(int(p), int(o)) for p, o in changed} <= written
    assert np.all(np.asarray(a["slot_mapping"][n_tok:]) == -1)


def test_bf16_within_tolerance():
    rng = np.random.default_rng(1)
    ps, H, KVH, D = 16, 8, 2, 64
    k_pages = rng.standard_normal((8, ps, KVH, D)).astype(np.float32)
    v_pages = rng.standard_normal((8, ps, KVH, D)).astype(np.float32)
    n = 40
    seqs = [SeqInput(token_ids=[0] * n, start_pos=0, page_table=[5, 2, 7])]
    ladder = BucketLadder.build(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=128, page_size=ps,
                                query_tile=16, kv_chunk_pages=2)
    a = pack(seqs, ladder.pick(n, 1), ps).arrays
    T = a["input_ids"].shape[0]
    q = rng.standard_normal((T, H, D)).astype(np.float32)
    kn = rng.standard_normal((T, KVH, D)).astype(np.float32)
    vn = rng.standard_normal((T, KVH, D)).astype(np.float32)
    outs = []
    for dt in (jnp.float32, jnp.bfloat16):
        kp, vp = write_kv_pages(jnp.asarray(k_pages, dt), jnp.asarray(v_pages, dt), jnp.asarray(kn, dt),
                                jnp.asarray(vn, dt), a["slot_mapping"])
        outs.append(np.asarray(ragged_paged_attention_reference(
            jnp.asarray(q, dt), kp, vp, a["positions"], a["tile_tokens"], a["tile_seq"], a["tile_kv_len"],
            a["page_tables"], sm_scale=D ** -0.5, kv_chunk_pages=2), np.float32)[:n])
    rel = np.linalg.norm(outs[1] - outs[0]) / np.linalg.norm(outs[0])
    assert rel < 1e-2, rel


@pytest.mark.parametrize("slot", [-1, 0, 37, 63])
@pytest.mark.parametrize("kind", ["auto", "int8"])
def test_one_token_write(slot, kind):
    """A one-token step (T = 1) writes with a dynamic-update-slice: the same pages as the scatter path of a
    two-token step whose second token is padding, except that a padding token lands in the reserved slot 0."""
    from pallas_kernels.paged_attention import kv_quant

    rng = np.random.default_rng(slot + 2)
    shape = (4, 16, 2, 8)
    base = kv_quant.empty_pages(kind, shape, jnp.float32)
    k = jnp.asarray(rng.standard_normal((2, 2, 8)), jnp.float32)
    one, _ = write_kv_pages(base, base, k[:1], k[:1], jnp.asarray([slot], jnp.int32))
    two, _ = write_kv_pages(base, base, k, k, jnp.asarray([slot, -1], jnp.int32))  # scatter path
    if slot < 0:  # padding: only slot 0 of the reserved page 0 may change
        two, _ = write_kv_pages(base, base, k, k, jnp.asarray([0, -1], jnp.int32))
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(two)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("ps", [8, 16])
def test_tile_blocks_match_dense(ps):
    """The dynamic loop's blocks of TILE_BLOCK tiles: a step whose used tiles span three blocks (short contexts in
    the first, the longest context in the last, so each block's chunk count differs) in a bucket of many more tiles,
    against dense float64 attention; the unused tiles past the last block are never read (their rows stay zero)."""
    from pallas_kernels.paged_attention.reference import TILE_BLOCK

    rng = np.random.default_rng(ps)
    steps = [(int(c), 1) for c in rng.integers(0, 2 * ps, 2 * TILE_BLOCK)] + [(3 * ps, ps + 3), (9 * ps + 1, 1)]
    d = build(rng, steps, 4, 2, 32, ps, max_tokens=128, max_seqs=128, max_model_len=16 * ps)
    q, a, batch = np.asarray(d["q"]), d["a"], d["batch"]
    NT = a["tile_kv_len"].shape[0]
    used = int(np.flatnonzero(a["tile_kv_len"] > 0)[-1]) + 1
    assert 2 * TILE_BLOCK < used <= 3 * TILE_BLOCK < NT, (used, NT)
    out = np.asarray(ragged_paged_attention_reference(
        jnp.asarray(q), d["kp"], d["vp"], a["positions"], a["tile_tokens"], a["tile_seq"], a["tile_kv_len"],
        a["page_tables"], sm_scale=0.2, kv_chunk_pages=2))
    for i, (ctx, n) in enumerate(steps):
        s0 = batch.token_offsets[i]
        ref = _dense_reference(q[s0:s0 + n].astype(np.float64), d["full_k"][i].astype(np.float64),
                               d["full_v"][i].astype(np.float64), np.arange(ctx, ctx + n), 0.2, None)
        np.testing.assert_allclose(out[s0:s0 + n], ref, rtol=2e-5, atol=2e-5, err_msg=f"sequence {i} {ctx, n}")
    assert not out[d["n_tok"]:].any()
