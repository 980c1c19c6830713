"""Ragged paged attention through cuDNN's fused attention with a paged KV cache (GPU only): the same contract as
`reference.ragged_paged_attention_reference`, another backend for the engine's decode steps (issue 17: the
Pallas-Triton kernel streams 2.15-3.13 TB/s of KV at batch >= 64, short of 3.2 after two rounds of tuning).

Every query TOKEN is one cuDNN batch row, so no causal mask is needed (and none of cuDNN's causal-alignment
conventions matters; jax's causal mask is top-left, measured: results/cudnn-paged-attention-probe-ad42735-*.json):
token t of sequence s at position p sees keys [0, p] of s, i.e. kv_len = p + 1 with a padding mask. cuDNN maps the
H query heads onto the KV heads itself (GQA: query head h reads KV head h // G, the engine's fused-QKV order):
  q       [T, 1, H, D]       (q_len = 1 for every row)
  K / V   the engine's pools [num_pages, page_size, KVH, D] as cuDNN's paged containers (blocks of page_size)
  table   [T, 1, W, 1]       page_tables[sequence of the token]
  kv_len  [T]                positions + 1 (1 for padding tokens, whose rows are dropped: zeros)
On an H100 (probe above, per layer of the 8B shape) this GQA form took 227.6 us at 256 sequences x 512 (82.5% of the
measured HBM bandwidth; the Pallas kernel 262.8 us, 71.5%) and 407.5 us at 64 x 4k (92.0%; Pallas 414.9, 90.4%);
folding the G query heads of a KV head into the row's query length (q [T, G, KVH, D]) took 255.0 / 408.0 us.
This suits decode steps (one token a sequence: each row streams its sequence's KV once). A prefill chunk of L tokens
would read its sequence's KV L times, so the engine uses it only in buckets with no more tokens than sequences
(models/attention.py) and the Pallas kernel elsewhere. (Splitting mixed steps, cuDNN rows for the decodes only
and the Pallas kernel for the rest, measured no offline gain on an H100: 8,682 vs 8,790 output tok/s, removed.)

The cuDNN call is jax's private `_dot_product_attention_fwd` (the public `jax.nn.dot_product_attention` passes no
page tables); `sdpa` replaces it (tests: a jnp stand-in with the same contract, since cuDNN needs the GPU).
"""
from __future__ import annotations

import inspect

import jax.numpy as jnp


def cudnn_sdpa(q, k_pages, v_pages, q_len, kv_len, table, *, scale: float, causal: bool = False,
               return_lse: bool = False):
    """cuDNN paged attention. q [B, L, N, D]; pools [num_pages, page_size, KVH, D] (N a multiple of KVH); table
    i32[B, 1, W, 1] (None: dense K / V [B, S, KVH, D], for comparisons); q_len / kv_len i32[B]: query row i < q_len
    of batch row b sees keys < kv_len[b] (causal: also cuDNN's causal mask, whose alignment when q_len < kv_len is
    the probe's question, benchmarks/probes/cudnn_paged_attention.py). -> [B, L, N, D]; return_lse: also the
    rows' log-sum-exp of the scaled scores, f32 [B, N, L] (jax's `return_residual`, FlashAttention-2's L)."""
    from jax._src.cudnn import fused_attention_stablehlo as fa

    none = jnp.zeros(0, q.dtype)
    kw = dict(query=q, key=k_pages, value=v_pages, bias=none, q_seqlen=q_len, kv_seqlen=kv_len, q_offsets=none,
              kv_offsets=none, page_table_k=none if table is None else table,
              page_table_v=none if table is None else table, scale=scale, seed=42, dropout_rate=0.0,
              variadic_args=(False, False),
              mask_type=fa.MaskType.PADDING_CAUSAL if causal else fa.MaskType.PADDING,
              layout=fa.AttentionLayout.BTNH.value, sliding_window_length=None,
              cudnn_version=fa.check_cudnn_version(), return_residual=return_lse)
    assert set(kw) == set(_OUR_KEYWORDS)  # (available() checks this jax against the same names)
    params = inspect.signature(fa._dot_product_attention_fwd).parameters
    missing = _missing_parameters(params, kw)
    if missing:  # a jax whose private signature moved on (parameters with defaults keep them)
        raise NotImplementedError(f"jax {__import__('jax').__version__}'s cuDNN attention wants {missing}; use "
                                  "attention_backend='pallas'")
    out = fa._dot_product_attention_fwd(**{p: kw[p] for p in params if p in kw})
    return tuple(out[:2]) if return_lse else out


_OUR_KEYWORDS = ("query", "key", "value", "bias", "q_seqlen", "kv_seqlen", "q_offsets", "kv_offsets", "page_table_k",
                 "page_table_v", "scale", "seed", "dropout_rate", "variadic_args", "mask_type", "layout",
                 "sliding_window_length", "cudnn_version", "return_residual")


def _missing_parameters(params, kw) -> list[str]:
    return [p for p, v in params.items() if p not in kw and v.default is inspect.Parameter.empty]


# cuDNN's SDPA takes paged K / V from cuDNN 9.5.0 (cudnn-frontend 1.8 release notes) on SM 8.0+ GPUs; decode
# head dims up to 128 on Ampere / Ada (256 on Hopper; 128 is what every Llama-family model here uses).
MIN_CUDNN_VERSION = 90500
MAX_HEAD_DIM = 128


def runtime_problem(head_dim: int, cudnn_version=None, compute_capability=None) -> str | None:
    """What keeps this machine's cuDNN from the paged call (None: nothing): no cuDNN, one older than 9.5, a GPU
    before SM 8.0, a head dim above 128. cudnn_version / compute_capability: as jax reports them (default: ask)."""
    try:
        if cudnn_version is None:
            from jax._src.cudnn import fused_attention_stablehlo as fa
            cudnn_version = fa.check_cudnn_version()
        if compute_capability is None:
            import jax
            compute_capability = jax.devices()[0].compute_capability
    except Exception as e:  # (no cuDNN, or a device without a compute capability)
        return f"cuDNN's attention is not usable here ({type(e).__name__}: {e})"
    if int(cudnn_version) < MIN_CUDNN_VERSION:
        return f"cuDNN {cudnn_version} has no paged attention (needs >= {MIN_CUDNN_VERSION}, cuDNN 9.5)"
    if tuple(int(x) for x in str(compute_capability).split(".")[:2]) < (8, 0):
        return f"cuDNN's paged attention needs an SM 8.0+ GPU (this one: {compute_capability})"
    if head_dim > MAX_HEAD_DIM:
        return f"head dim {head_dim} is above the {MAX_HEAD_DIM} the engine takes cuDNN's decode attention for"
    return None


def available() -> bool:
    """Whether this jax's private cuDNN attention takes the call cudnn_sdpa makes (the 'auto' backend asks before
    choosing cuDNN; an explicit attention_backend='cudnn' gets cudnn_sdpa's error instead)."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo as fa
        params = inspect.signature(fa._dot_product_attention_fwd).parameters
    except (ImportError, AttributeError, ValueError, TypeError):
        return False
    return not _missing_parameters(params, dict.fromkeys(_OUR_KEYWORDS))


def cudnn_paged_attention(q, k_pages, v_pages, positions, tile_tokens, tile_seq, tile_kv_len, page_tables, *,
                          sm_scale: float, sdpa=cudnn_sdpa):
    """q [T, H, D] -> [T, H, D]; arguments as ragged_paged_attention_reference (tile_kv_len unused: a token's
    visible keys follow from its position)."""
    del tile_kv_len
    S = page_tables.shape[0] - 1                                      # row S: the all-zero row (no sequence)
    seq_of = token_sequences(tile_tokens, tile_seq, q.shape[0], S)
    valid = seq_of < S
    out = cudnn_rows(q, k_pages, v_pages, jnp.where(valid, positions + 1, 1), seq_of, page_tables,
                     sm_scale=sm_scale, sdpa=sdpa)
    return jnp.where(valid[:, None, None], out, jnp.zeros((), q.dtype))


def token_sequences(tile_tokens, tile_seq, T: int, S: int):
    """i32[T]: each token's sequence (row of the page tables) from the query tiles; S for tokens in no tile (empty
    tile slots point at T and are dropped)."""
    Bq = tile_tokens.shape[1]
    return jnp.full((T + 1,), S, jnp.int32).at[tile_tokens.reshape(-1)].set(
        jnp.repeat(tile_seq.astype(jnp.int32), Bq))[:T]


def cudnn_rows(q, k_pages, v_pages, kv_len, seq, page_tables, *, sm_scale: float, sdpa=cudnn_sdpa):
    """One cuDNN batch row per query row: q [R, H, D] sees keys [0, kv_len[r]) of sequence seq[r]'s pages (kv_len
    >= 1; a dead row: 1 key of the all-zero row S). -> [R, H, D] (dead rows: whatever one key gives)."""
    R, H, D = q.shape
    table = page_tables[seq][:, None, :, None]                        # [R, 1, W, 1]
    out = sdpa(q[:, None], k_pages, v_pages, jnp.ones((R,), jnp.int32), kv_len.astype(jnp.int32), table,
               scale=sm_scale)
    return out.reshape(R, H, D).astype(q.dtype)                       # [R, 1, H, D] -> [R, H, D]


FOLD_MAX_ROWS = 64   # cudnn_tile_attention folds a tile's heads into its rows up to this many rows (Bq x G)


def cudnn_tile_attention(q, k_pages, v_pages, positions, tile_tokens, tile_seq, tile_kv_len, page_tables, *,
                         sm_scale: float, sdpa=cudnn_sdpa):
    """Prefill-shaped buckets through cuDNN, one batch row a query TILE (an A/B form, off by default:
    models/attention.py, JAXINFER_CUDNN_PREFILL). q [T, H, D] -> [T, H, D]; arguments as
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
    oc = oc.astype(jnp.float32)
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
    # merge: softmax over both key sets = the two partial softmaxes weighted by their sums exp(L)
    mx = jnp.maximum(lc, lt)
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    wc, wt = jnp.exp(lc - mx)[..., None], jnp.exp(lt - mx)[..., None]
    out = (wc * oc + wt * ot) / jnp.maximum(wc + wt, 1e-30)                   # [NT, Bq, H, D]
    flat = jnp.where(valid, tile_tokens, T).reshape(-1)
    res = jnp.zeros((T + 1, H, D), q.dtype).at[flat].set(out.reshape(-1, H, D).astype(q.dtype))
    return res[:T]


def cudnn_sequence_attention(q, k_pages, v_pages, row_tokens, row_seq, row_p0, page_tables, *, sm_scale: float,
                             sdpa=cudnn_sdpa):
    """Prefill chunks through cuDNN, one batch row a SEQUENCE's chunk (a per-op probe form: the tile form above
    re-reads the context once a 16- or 64-token tile and measured 3.0-3.3x cuDNN's dense attention, 12-06 h).
    q [T, H, D] -> [T, H, D]. Row r holds the n_r <= L tokens row_tokens[r] (flat indices into q, T = empty slot, in
    position order) of sequence row_seq[r], at positions p0 .. p0 + n_r - 1 (p0 = row_p0[r], the context cached
    before the chunk; the chunk's K / V already written to the pages). Two cuDNN calls, merged by log-sum-exp:
      context  paged, no mask: the chunk's rows see keys [0, p0) (q [P, L, H, D], q_len n_r, kv_len max(p0, 1))
      chunk    dense, causal: its own n_r keys gathered from the pages to [P, L, KVH, D]; q_len = kv_len = n_r, so
               cuDNN's top-left causal mask is the right one (a chunk after context alone would need bottom-right)
    Tokens of q in no row come back as zeros."""
    T, H, D = q.shape
    P, L = row_tokens.shape
    ps = k_pages.shape[1]
    valid = row_tokens < T                                                     # [P, L]
    n = valid.sum(axis=1).astype(jnp.int32)
    p0 = row_p0.astype(jnp.int32)
    qs = q[jnp.minimum(row_tokens, T - 1)]                                     # [P, L, H, D]
    tables = page_tables[row_seq]                                              # [P, W]
    oc, lc = sdpa(qs, k_pages, v_pages, jnp.maximum(n, 1), jnp.maximum(p0, 1), tables[:, None, :, None],
                  scale=sm_scale, return_lse=True)                             # [P, L, H, D], [P, H, L]
    lc = jnp.where((p0 > 0)[:, None, None], lc, -jnp.inf)                     # no context: weight 0
    pos = p0[:, None] + jnp.arange(L)[None, :]                                 # [P, L] (slots past n: any key)
    pages = jnp.take_along_axis(tables, jnp.minimum(pos // ps, tables.shape[1] - 1), axis=1)
    kt, vt = k_pages[pages, pos % ps], v_pages[pages, pos % ps]                # [P, L, KVH, D]
    ot, lt = sdpa(qs, kt, vt, jnp.maximum(n, 1), jnp.maximum(n, 1), None, scale=sm_scale, causal=True,
                  return_lse=True)
    mx = jnp.maximum(lc, lt)
    mx = jnp.where(jnp.isfinite(mx), mx, 0.0)
    wc = jnp.exp(lc - mx).transpose(0, 2, 1)[..., None]                        # [P, L, H, 1]
    wt = jnp.exp(lt - mx).transpose(0, 2, 1)[..., None]
    out = (wc * oc.astype(jnp.float32) + wt * ot.astype(jnp.float32)) / jnp.maximum(wc + wt, 1e-30)
    flat = jnp.where(valid, row_tokens, T).reshape(-1)
    res = jnp.zeros((T + 1, H, D), q.dtype).at[flat].set(out.reshape(-1, H, D).astype(q.dtype))
    return res[:T]
