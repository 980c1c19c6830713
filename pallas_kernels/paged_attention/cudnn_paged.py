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
and the Pallas kernel for the rest, measured no offline gain on an H100: 8,682 vs 8,790 output tok/s, removed.
Two forms for prefill chunks, measured short of the kernel or of 1.5x cuDNN dense: cudnn_prefill_forms.py.)

The cuDNN call is jax's private `_dot_product_attention_fwd` (the public `jax.nn.dot_product_attention` passes no
page tables); `sdpa` replaces it (tests: a jnp stand-in with the same contract, since cuDNN needs the GPU).
"""
from __future__ import annotations

import inspect

import jax.numpy as jnp


def cudnn_sdpa(q, k_pages, v_pages, q_len, kv_len, table, *, scale: float, causal: bool = False,
               return_lse: bool = False, layout: str = "BTNH"):
    """cuDNN paged attention. q [B, L, N, D]; pools [num_pages, page_size, KVH, D] (N a multiple of KVH); table
    i32[B, 1, W, 1] (None: dense K / V [B, S, KVH, D], for comparisons); q_len / kv_len i32[B]: query row i < q_len
    of batch row b sees keys < kv_len[b] (causal: also cuDNN's causal mask, whose alignment when q_len < kv_len is
    the probe's question, benchmarks/probes/cudnn_paged_attention.py). -> [B, L, N, D]; return_lse: also the
    rows' log-sum-exp of the scaled scores, f32 [B, N, L] (jax's `return_residual`, FlashAttention-2's L).
    layout "BNTH": heads before tokens everywhere instead (q [B, N, L, D], pools [num_pages, KVH, page_size, D],
    out [B, N, L, D]; the probe's head-major pool question, not the engine's layout)."""
    from jax._src.cudnn import fused_attention_stablehlo as fa

    none = jnp.zeros(0, q.dtype)
    kw = dict(query=q, key=k_pages, value=v_pages, bias=none, q_seqlen=q_len, kv_seqlen=kv_len, q_offsets=none,
              kv_offsets=none, page_table_k=none if table is None else table,
              page_table_v=none if table is None else table, scale=scale, seed=42, dropout_rate=0.0,
              variadic_args=(False, False),
              mask_type=fa.MaskType.PADDING_CAUSAL if causal else fa.MaskType.PADDING,
              layout=fa.AttentionLayout[layout].value, sliding_window_length=None,
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
