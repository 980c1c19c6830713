"""Prefill attention through cuDNN: two forms measured against the Pallas kernel, NOT used by the engine.

Issue 17 asks for the prefill attention path within 1.5x of cuDNN's attention on the equivalent dense problem (a
causal chunk, context 0); the Pallas kernel (kernel.py) is 1.47-2.91x (benchmarks/kernels/prefill_attention.py).
jax's cuDNN binding has only a top-left causal mask (measured: benchmarks/probes/cudnn_paged_attention.py), and a
chunk after cached context needs bottom-right, so both forms split a query row's keys in two, its context without a
mask and its own keys with a causal mask, and merge the parts by the log-sum-exp cuDNN returns (FlashAttention-2's
L). Both pass the reference on CPU (tests/kernels/test_cudnn_paged.py, through a jnp stand-in of cuDNN's contract,
with flawed stand-ins caught) and with the real cuDNN on an H100. Per op (H100, 12-06 h, chunk 512 / 2048 / 4096,
x cuDNN's dense attention of the same run; results/kernel-prefill-attention-{ctiles-aa8b598,cseq-3a65b74}-*.json):

  the Pallas kernel                       1.67 / 2.14 / 2.91x  (1.47 / 2.08 / 2.66x in the second run)
  cudnn_tile_attention, 16-token tiles    3.29 / 2.95 / 3.25x  (a tile's rows re-read its context per tile)
  cudnn_tile_attention, 64-token tiles    6.59 / 3.68 / 3.58x
  cudnn_sequence_attention, whole chunk   2.38 / 1.87 / 1.77x  (context part empty here: the merge, the gathers,
                                                                the scatter and a second call cost the rest)
  cudnn_sequence_attention, 512-token rows 2.38 / 1.82 / 1.79x

Neither meets 1.5x, so the engine keeps the Pallas kernel for prefill-shaped buckets (the tile form was an engine
A/B switch, JAXINFER_CUDNN_PREFILL, until it measured slower than the kernel; removed). The sequence form beats
the kernel from 2048-token chunks (1.14x / 1.48x faster at 2048 / 4096) and loses at 512; in the engine it would
need a static row layout a bucket (rows of L tokens, a cap on the prefill chunks a step), which is not built.
What 1.5x needs is one attention kernel with a bottom-right causal mask that reads the pages itself: cuDNN has
the alignment (cudnn-frontend's set_diagonal_alignment, since v1.10) but jax's binding does not pass it; jax's
Mosaic GPU flash attention (attention_mgpu, FA3-style) takes dense K / V and a top-left mask only.
"""
from __future__ import annotations

import jax.numpy as jnp

from .cudnn_paged import cudnn_sdpa

FOLD_MAX_ROWS = 64   # cudnn_tile_attention folds a tile's heads into its rows up to this many rows (Bq x G)


def cudnn_tile_attention(q, k_pages, v_pages, positions, tile_tokens, tile_seq, tile_kv_len, page_tables, *,
                         sm_scale: float, sdpa=cudnn_sdpa):
    """Prefill-shaped buckets through cuDNN, one batch row a query TILE. q [T, H, D] -> [T, H, D]; arguments as
    ragged_paged_attention_reference. A tile holds n <= Bq consecutive tokens of one sequence at positions
    p0 .. p0 + n - 1, p0 = tile_kv_len - n (the context cached before the tile). Its attention is split in two and
    merged by log-sum-exp (FlashAttention-2's L, which cuDNN returns), because cuDNN's causal mask is top-left
    (a chunk after its context needs bottom-right):
      context  cuDNN paged, no mask: the tile's query rows see keys [0, p0) of the sequence's pages. Up to
               FOLD_MAX_ROWS rows (Bq 16, G 4) the G = H / KVH heads of a KV head are folded into the row axis,
               [NT, Bq G, KVH, D], so one cuDNN block of rows holds 64 and each KV head's context is read once a
               tile, as by the Pallas kernel; bigger tiles go in as they are, [NT, Bq, H, D] (cuDNN's GQA)
      tile     jnp: the tile's own n keys (gathered from the pages: written before attention), causal, f32
    Costs beyond the cuDNN call, each a pass over [T, H, D] or less: the query gather (and, folded, a transpose each
    way), the tile part (its [NT, KVH, G, Bq, Bq] scores are small), the merge and the scatter back to tokens."""
    T, H, D = q.shape
    NT, Bq = tile_tokens.shape
    KVH, ps = k_pages.shape[2], k_pages.shape[1]
    G = H // KVH
    valid = tile_tokens < T                                                    # [NT, Bq]
    tok = jnp.minimum(tile_tokens, T - 1)
    n = valid.sum(axis=1).astype(jnp.int32)
    p0 = jnp.maximum(tile_kv_len.astype(jnp.int32) - n, 0)                     # context before each tile
    qt = q[tok]                                                                # [NT, Bq, H, D]
    q5 = qt.reshape(NT, Bq, KVH, G, D)                                         # head h = kvh G + g
    tables = page_tables[tile_seq]                                             # [NT, W]
    table = tables[:, None, :, None]                                           # [NT, 1, W, 1] (cuDNN's form)
    kv_len = jnp.maximum(p0, 1)
    if Bq * G <= FOLD_MAX_ROWS:
        # context part, folded: [NT, Bq, KVH, G, D] -> [NT, Bq G, KVH, D] (row i G + g: token i, head kvh G + g)
        qf = q5.transpose(0, 1, 3, 2, 4).reshape(NT, Bq * G, KVH, D)
        oc, lc = sdpa(qf, k_pages, v_pages, jnp.full((NT,), Bq * G, jnp.int32), kv_len, table, scale=sm_scale,
                      return_lse=True)                                         # [NT, Bq G, KVH, D], [NT, KVH, Bq G]
        oc = oc.reshape(NT, Bq, G, KVH, D).transpose(0, 1, 3, 2, 4).reshape(NT, Bq, H, D)
        lc = lc.reshape(NT, KVH, Bq, G).transpose(0, 2, 1, 3).reshape(NT, Bq, H)
    else:   # tiles of >= FOLD_MAX_ROWS / G tokens fill cuDNN's row blocks alone: its own GQA, no transposes
        oc, lc = sdpa(qt, k_pages, v_pages, jnp.full((NT,), Bq, jnp.int32), kv_len, table, scale=sm_scale,
                      return_lse=True)                                         # [NT, Bq, H, D], [NT, H, Bq]
        lc = lc.transpose(0, 2, 1)
    lc = jnp.where((p0 > 0)[:, None, None], lc, -jnp.inf)                      # no context: weight 0
    # tile part: keys at positions p0 + j (j < n), gathered from the sequence's pages
    pos = jnp.where(valid, positions[tok], p0[:, None])                        # [NT, Bq] (slots: a real key)
    pages = jnp.take_along_axis(tables, pos // ps, axis=1)                     # [NT, Bq]
    kt = k_pages[pages, pos % ps].astype(jnp.float32)                          # [NT, Bq, KVH, D]
    vt = v_pages[pages, pos % ps].astype(jnp.float32)
    s = jnp.einsum("nikgd,njkd->nkgij", q5.astype(jnp.float32), kt) * sm_scale  # [NT, KVH, G, Bq, Bq]
    i, j = jnp.arange(Bq)[:, None], jnp.arange(Bq)[None, :]
    vis = (j <= i)[None] & valid[:, None, :]                                   # [NT, Bq(i), Bq(j)]
    s = jnp.where(vis[:, None, None], s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(s - m)
    den = e.sum(axis=-1)                                                       # [NT, KVH, G, Bq]
    ot = jnp.einsum("nkgij,njkd->nikgd", e, vt) / jnp.maximum(den, 1e-30).transpose(0, 3, 1, 2)[..., None]
    ot = ot.reshape(NT, Bq, H, D)
    lt = jnp.where(den > 0, jnp.log(jnp.maximum(den, 1e-30)) + m[..., 0], -jnp.inf)
    lt = lt.transpose(0, 3, 1, 2).reshape(NT, Bq, H)
    return _to_tokens(_merge(oc, lc, ot, lt), tile_tokens, T, q.dtype)


def _merge(oc, lc, ot, lt):
    """Softmax attention over two disjoint key sets from the two parts: outputs o [R, L, H, D], log-sum-exps lse
    [R, L, H] (-inf: no keys), each part weighted by its sum exp(lse). -> f32 [R, L, H, D]."""
    mx = jnp.maximum(lc, lt)
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    wc, wt = jnp.exp(lc - mx)[..., None], jnp.exp(lt - mx)[..., None]
    return (wc * oc.astype(jnp.float32) + wt * ot.astype(jnp.float32)) / jnp.maximum(wc + wt, 1e-30)


def _to_tokens(out, row_tokens, T: int, dtype):
    """Rows [R, L, H, D] back to the step's tokens [T, H, D] (row slots holding T are dropped; tokens in no row:
    zeros)."""
    H, D = out.shape[-2:]
    flat = jnp.where(row_tokens < T, row_tokens, T).reshape(-1)
    return jnp.zeros((T + 1, H, D), dtype).at[flat].set(out.reshape(-1, H, D).astype(dtype))[:T]


def cudnn_sequence_attention(q, k_pages, v_pages, row_tokens, row_seq, row_p0, page_tables, *, sm_scale: float,
                             sdpa=cudnn_sdpa):
    """Prefill chunks through cuDNN, one batch row a SEQUENCE's chunk (or a part of it: a row's context is then
    the rows before it). q [T, H, D] -> [T, H, D]. Row r holds the n_r <= L tokens row_tokens[r] (flat indices
    into q, T = empty slot, in position order) of sequence row_seq[r], at positions p0 .. p0 + n_r - 1
    (p0 = row_p0[r], the context cached before the row; its K / V already written to the pages). Two cuDNN calls,
    merged by log-sum-exp:
      context  paged, no mask: the row's queries see keys [0, p0) (q [P, L, H, D], q_len n_r,
               kv_len max(p0, 1))
      chunk    dense, causal: its own n_r keys gathered from the pages to [P, L, KVH, D]; q_len = kv_len = n_r, so
               cuDNN's top-left causal mask is the right one (a chunk after context alone would need bottom-right)
    Tokens of q in no row come back as zeros."""
    T = q.shape[0]
    L = row_tokens.shape[1]
    ps = k_pages.shape[1]
    valid = row_tokens < T                                                     # [P, L]
    n = valid.sum(axis=1).astype(jnp.int32)
    p0 = row_p0.astype(jnp.int32)
    qs = q[jnp.minimum(row_tokens, T - 1)]                                     # [P, L, H, D]
    tables = page_tables[row_seq]                                              # [P, W]
    oc, lc = sdpa(qs, k_pages, v_pages, jnp.maximum(n, 1), jnp.maximum(p0, 1), tables[:, None, :, None],
                  scale=sm_scale, return_lse=True)                             # [P, L, H, D], [P, H, L]
    lc = jnp.where((p0 > 0)[:, None, None], lc.transpose(0, 2, 1), -jnp.inf)  # [P, L, H]; no context: weight 0
    pos = p0[:, None] + jnp.arange(L)[None, :]                                 # [P, L] (slots past n: any key)
    pages = jnp.take_along_axis(tables, jnp.minimum(pos // ps, tables.shape[1] - 1), axis=1)
    kt, vt = k_pages[pages, pos % ps], v_pages[pages, pos % ps]                # [P, L, KVH, D]
    ot, lt = sdpa(qs, kt, vt, jnp.maximum(n, 1), jnp.maximum(n, 1), None, scale=sm_scale, causal=True,
                  return_lse=True)
    return _to_tokens(_merge(oc, lc, ot, lt.transpose(0, 2, 1)), row_tokens, T, q.dtype)
