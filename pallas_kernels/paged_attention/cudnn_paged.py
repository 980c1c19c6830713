"""Ragged paged attention through cuDNN's fused attention with a paged KV cache (GPU only): the same contract as
`reference.ragged_paged_attention_reference`, another backend for the engine's attention (issue 17: the
Pallas-Triton kernel streams 2.15-3.13 TB/s of KV at batch >= 64, short of 3.2 after two rounds of tuning).

Each query tile becomes one cuDNN "batch" row:
  q       [NT, Bq, H, D]     the tile's tokens (tile_tokens; empty slots zero), their count q_len[NT]
  K / V   the engine's pools [num_pages, page_size, KVH, D] as cuDNN's paged containers (blocks of page_size)
  table   [NT, 1, W, 1]      page_tables[tile_seq]
  kv_len  [NT]               tile_kv_len
  mask    padding + causal, aligned bottom-right: slot i of a tile with L tokens sees keys < kv_len - L + 1 + i,
          i.e. keys <= its own position, when a tile's tokens are consecutive positions ending at kv_len - 1 (how
          runner/batch.pack fills tiles); GQA inside cuDNN (H query heads on KVH KV heads)
then the tiles' rows are scattered back to the flat tokens. Empty tiles run with q_len = kv_len = 1 on page 0 and
their rows are dropped.

The cuDNN call is jax's private `_dot_product_attention_fwd` (the public `jax.nn.dot_product_attention` passes no
page tables); `sdpa` replaces it (tests: a jnp stand-in with the same contract, since cuDNN needs the GPU).
"""
from __future__ import annotations

import inspect

import jax.numpy as jnp

from pallas_kernels.paged_attention.scatter import set_rows


def cudnn_sdpa(q, k_pages, v_pages, q_len, kv_len, table, *, scale: float, causal: bool):
    """cuDNN paged attention. q [B, L, H, D]; pools [num_pages, page_size, KVH, D]; table i32[B, 1, W, 1] (None:
    dense K / V [B, S, KVH, D], for comparisons); q_len / kv_len i32[B]. Causal: bottom-right aligned (query i of
    q_len sees keys <= kv_len - q_len + i). -> [B, L, H, D]."""
    from jax._src.cudnn import fused_attention_stablehlo as fa

    none = jnp.zeros(0, q.dtype)
    kw = dict(query=q, key=k_pages, value=v_pages, bias=none, q_seqlen=q_len, kv_seqlen=kv_len, q_offsets=none,
              kv_offsets=none, page_table_k=none if table is None else table,
              page_table_v=none if table is None else table, scale=scale, seed=42, dropout_rate=0.0,
              variadic_args=(False, False),
              mask_type=fa.MaskType.PADDING_CAUSAL if causal else fa.MaskType.PADDING,
              layout=fa.AttentionLayout.BTNH.value, sliding_window_length=None,
              cudnn_version=fa.check_cudnn_version(), return_residual=False)
    params = inspect.signature(fa._dot_product_attention_fwd).parameters
    missing = [p for p in params if p not in kw]
    if missing:  # a jax whose private signature moved on
        raise NotImplementedError(f"jax {__import__('jax').__version__}'s cuDNN attention wants {missing}")
    return fa._dot_product_attention_fwd(**{p: kw[p] for p in params})


def cudnn_paged_attention(q, k_pages, v_pages, positions, tile_tokens, tile_seq, tile_kv_len, page_tables, *,
                          sm_scale: float, sdpa=cudnn_sdpa):
    """q [T, H, D] -> [T, H, D]; arguments as ragged_paged_attention_reference (positions unused: a tile's
    positions follow from its KV length and token count)."""
    del positions
    T, H, D = q.shape
    NT, Bq = tile_tokens.shape
    q_pad = jnp.concatenate([q, jnp.zeros((1, H, D), q.dtype)], axis=0)
    qt = q_pad[tile_tokens]                                           # [NT, Bq, H, D]
    q_len = jnp.sum(tile_tokens < T, axis=1).astype(jnp.int32)        # [NT]
    empty = (q_len == 0) | (tile_kv_len <= 0)
    q_len = jnp.where(empty, 1, q_len)
    kv_len = jnp.where(empty, 1, tile_kv_len).astype(jnp.int32)
    table = page_tables[tile_seq][:, None, :, None]                   # [NT, 1, W, 1]
    out = sdpa(qt, k_pages, v_pages, q_len, kv_len, table, scale=sm_scale, causal=Bq > 1)
    idx = jnp.where(empty[:, None], T, tile_tokens).reshape(-1)
    return set_rows(jnp.zeros((T, H, D), q.dtype), idx, out.reshape(NT * Bq, H, D).astype(q.dtype), idx >= T)
