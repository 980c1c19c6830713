"""Ragged paged attention as a Pallas GPU kernel (Triton backend): a drop-in for
`reference.ragged_paged_attention_reference`. Same arguments, same metadata (built by `jaxinfer.runner.batch.pack`),
same semantics: causal by absolute position, optional sliding window and soft cap, rows that no tile references come
back as zeros.

Why the Triton backend of Pallas (not Mosaic GPU, not a TPU-style kernel):
  * `interpret=True` runs the very same kernel body on CPU, so the kernel is tested against the reference in CI
    without a GPU.
  * The kernel reads the page table itself with dynamic indices (`page_tables_ref[tile_seq[i], j]`): the Triton
    backend has no scalar prefetch, but any ref can be loaded at a dynamic scalar / vector index, which lowers to
    plain pointer arithmetic. The K/V page of the loop iteration is then loaded at that dynamic page index.
  * Mosaic GPU (warp-specialised TMA pipelines) is the follow-up if this version wins against the jnp reference
    and is then limited by latency rather than bandwidth.

Work decomposition:
  grid = (NT, KVH, kv_splits): one program per (query tile, KV head, KV split).
  The wrapper (plain jnp, outside the kernel) gathers the tile's queries into tile order:
      qt = q_pad[tile_tokens]  [NT, Bq, KVH, g, D]  ->  [NT, KVH, R, D],  R = Bq * g padded to a power of two >= 16
  so one program owns all g = H / KVH query heads of its KV head for the Bq tokens of its tile (GQA: K/V are read
  once for the g heads). Row r of the block is token r // g, head r % g; padding rows have position -1.

Block shapes seen by one program:
  q block           [R, D]                 (R = next_pow2(max(16, Bq * g)); Triton dots need every dim >= 16)
  query positions   [R] int32
  K / V pool        [num_pages, page_size, D] of its KV head (KV-head dim squeezed by the BlockSpec; the page axis
                    stays whole and is indexed dynamically)
  K / V per step    [C, D] with C = pages_per_block * page_size (pages_per_block pages gathered by a vector of page
                    ids, as in jax's own Triton paged_attention kernel)
  output            [R, D] (kv_splits == 1), else float32 partials [R, D] + row max / row sum [R]
All of R, C and D must be powers of two (Triton tensor sizes) and >= 16 (tl.dot operands).

The KV loop is a `fori_loop` over ceil(tile_kv_len / C) blocks (dynamic trip count: cost follows the real
lengths); with a sliding window it starts at the first block any query of the tile can see. Scores are float32
(`dot_general(..., preferred_element_type=float32)`), masked BY VALUE with `jnp.where` (causal, window, kv_len);
the probabilities are masked again before the PV dot, and V rows at or past tile_kv_len are zeroed, so stale or
garbage (even NaN) contents of the unused part of the last page never reach the output. Online softmax with
float32 running max / sum / accumulator, identical in structure to the reference (mask value -1e30).

Quantized KV (fp8 / int8 pages + float32 per-(token, KV head) scales, see kv_quant.py; opt-in through k_scales /
v_scales): the kernel also gets the scale pools of its KV head [num_pages, page_size], casts each loaded K / V block
to q's dtype (exact for e4m3 and int8) and multiplies the scores by the K scales and the probabilities by the V
scales, so no dequantized copy of a page exists anywhere. Without scales the kernel is unchanged.

With kv_splits > 1 the blocks of a tile are divided between kv_splits programs (split-K / flash-decoding), each
writing unnormalised float32 partials that the wrapper merges in jnp: this fills the GPU when there are few
sequences (decode at small batch), at the cost of a small float32 round trip through HBM.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from pallas_kernels.paged_attention.scatter import set_rows

try:  # Triton backend of Pallas: present in jax 0.4.3x ... 0.11.
    from jax.experimental.pallas import triton as plgpu
except ImportError:  # pragma: no cover - a jax without the Triton backend module
    plgpu = None

# jax 0.10 / 0.11 name it `CompilerParams`; older releases called it `TritonCompilerParams`.
_TritonCompilerParams = None
if plgpu is not None:
    _TritonCompilerParams = getattr(plgpu, "CompilerParams", None) or getattr(plgpu, "TritonCompilerParams", None)

# float32 inputs: full-precision dots (Triton otherwise uses TF32, ~3e-4 relative error measured on the H200);
# bf16 inputs are unaffected.
# float32 inputs: full-precision dots (TF32 missed the f32 reference by 3.5e-4 on the H200). bf16 inputs: the
# default (tensor cores, f32 accumulation); HIGHEST there made the bf16 kernel slower in the engine
# (66 us vs 41 us per layer at batch 1 x 512 on the H200) for no accuracy gain.
def _precision(dtype) -> lax.Precision:
    return lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else lax.Precision.DEFAULT
_MASKED = -1e30  # same finite mask value as the reference: fully-masked rows never compute inf - inf


def _is_pow2(n: int) -> bool:
    return n > 0 and (n & (n - 1)) == 0


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


# --------------------------------------------------------------------------------------------------------------
# Kernel body
# --------------------------------------------------------------------------------------------------------------
def _attention_kernel(
    tile_seq_ref,     # i32[NT]          whole array
    tile_kv_len_ref,  # i32[NT]          whole array
    tile_lo_ref,      # i32[NT]          whole array: first KV block a query of the tile can see (window)
    page_tables_ref,  # i32[S + 1, W']   whole array (W' a multiple of pages_per_block)
    qpos_ref,         # i32[R]           position of each query row; -1 = padding
    q_ref,            # [R, D]
    k_ref,            # [num_pages, page_size, D]  (KV head squeezed)
    v_ref,            # [num_pages, page_size, D]
    *refs,            # (k_scale [num_pages, page_size], v_scale [...] when quantized), then
                      # o [R, D] (+ m [R], l [R] when split)
    sm_scale: float,
    sliding_window: int | None,
    soft_cap: float | None,
    pages_per_block: int,
    kv_splits: int,
    quantized: bool = False,
    busy_stores_only: bool = False,
    split_causal: bool = False,
):
    if quantized:
        ks_ref, vs_ref, *out_refs = refs
    else:
        out_refs = refs
    i = pl.program_id(0)
    _, page_size, head_dim = k_ref.shape
    num_rows = q_ref.shape[0]
    width = page_tables_ref.shape[1]
    P = pages_per_block
    C = P * page_size

    seq = tile_seq_ref[i]
    kv_len = tile_kv_len_ref[i]
    q = q_ref[...]                      # [R, D]
    q_pos = qpos_ref[...]               # [R]

    n_pages = jnp.minimum(lax.div(kv_len + (page_size - 1), page_size), width)
    n_blocks = lax.div(n_pages + (P - 1), P)
    lo = jnp.minimum(tile_lo_ref[i], n_blocks)
    if kv_splits > 1:
        s = pl.program_id(2)
        per_split = lax.div(n_blocks - lo + (kv_splits - 1), kv_splits)  # short tiles leave some splits idle
        start = lo + s * per_split
        end = jnp.minimum(start + per_split, n_blocks)
    else:
        start, end = lo, n_blocks

    def body(j, carry, masked: bool = True):
        m, l, acc = carry
        if P == 1:
            page = page_tables_ref[seq, j]                   # scalar load at a dynamic index
            k = k_ref[page]                                  # [page_size, D]
            v = v_ref[page]
            if quantized:
                ks, vs = ks_ref[page], vs_ref[page]          # f32[page_size]
        else:
            pages = page_tables_ref[seq, pl.ds(j * P, P)]    # [P] page ids
            k = k_ref[pages].reshape(C, head_dim)            # gather P pages -> [C, D]
            v = v_ref[pages].reshape(C, head_dim)
            if quantized:
                ks, vs = ks_ref[pages].reshape(C), vs_ref[pages].reshape(C)
        if quantized:  # fp8 / int8 values are exact in q's dtype; their scales multiply scores / probabilities
            k, v = k.astype(q.dtype), v.astype(q.dtype)
        kv_pos = j * C + lax.broadcasted_iota(jnp.int32, (C,), 0)           # [C]
        s_ = lax.dot_general(q, k, (((1,), (1,)), ((), ())), precision=_precision(k.dtype),
                             preferred_element_type=jnp.float32) * sm_scale  # [R, C]
        if quantized:
            s_ = s_ * ks[None, :]
        if soft_cap is not None:
            s_ = soft_cap * jnp.tanh(s_ / soft_cap)
        if not masked:  # split_causal's blocks below the tile's diagonal: every row sees every key
            m_new = jnp.maximum(m, jnp.max(s_, axis=1))
            alpha = jnp.exp(m - m_new)
            p = jnp.exp(s_ - m_new[:, None])
            pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), precision=_precision(v.dtype),
                                 preferred_element_type=jnp.float32)
            return m_new, alpha * l + jnp.sum(p, axis=1), alpha[:, None] * acc + pv
        kv_ok = kv_pos < kv_len                                              # [C]
        visible = (kv_pos[None, :] <= q_pos[:, None]) & kv_ok[None, :]       # [R, C]
        if sliding_window is not None:
            visible = visible & (kv_pos[None, :] > q_pos[:, None] - sliding_window)
        s_ = jnp.where(visible, s_, _MASKED)
        m_new = jnp.maximum(m, jnp.max(s_, axis=1))
        alpha = jnp.exp(m - m_new)
        p = jnp.where(visible, jnp.exp(s_ - m_new[:, None]), 0.0)
        l_new = alpha * l + jnp.sum(p, axis=1)
        v = jnp.where(kv_ok[:, None], v, jnp.zeros_like(v))  # garbage/NaN past kv_len must not meet p = 0
        if quantized:
            p = p * jnp.where(kv_ok, vs, 0.0)[None, :]
        pv = lax.dot_general(p.astype(v.dtype), v, (((1,), (0,)), ((), ())), precision=_precision(v.dtype),
                             preferred_element_type=jnp.float32)             # [R, D]
        return m_new, l_new, alpha[:, None] * acc + pv

    init = (jnp.full((num_rows,), _MASKED, jnp.float32), jnp.zeros((num_rows,), jnp.float32),
            jnp.zeros((num_rows, head_dim), jnp.float32))
    if split_causal:  # (no window, soft cap or quantized KV: the wrapper checks) the blocks of this program's
        # range that every real row of the tile sees whole first, without the iota / compare / select on every score
        lo_pos = jnp.min(jnp.where(q_pos >= 0, q_pos, jnp.iinfo(jnp.int32).max))
        n_full = jnp.clip(lax.div(jnp.minimum(lo_pos, kv_len - 1) + 1, C), start, end)
        carry = lax.fori_loop(start, n_full, functools.partial(body, masked=False), init)
        m, l, acc = lax.fori_loop(n_full, end, body, carry)
    else:
        m, l, acc = lax.fori_loop(start, end, body, init)
    if kv_splits == 1:
        (o_ref,) = out_refs
        o_ref[...] = (acc / jnp.maximum(l, 1e-30)[:, None]).astype(o_ref.dtype)
    else:
        o_ref, m_ref, l_ref = out_refs

        def store():
            o_ref[...] = acc
            m_ref[...] = m
            l_ref[...] = l
        if busy_stores_only:  # a split without KV blocks writes nothing; merge_splits_kernel never reads it
            pl.when(end > start)(store)
        else:
            store()


def _merge_kernel(used_ref, m_ref, l_ref, o_ref, out_ref):
    """One (tile, KV head): the flash-decoding merge of its first used_ref[tile] split partials, the only ones the
    attention kernel wrote (busy_stores_only). Blocks: m, l [S, R]; o [S, R, D]; out [R, D]. Masked loads read
    nothing for the other splits (and for a tile without work: its output is zeros)."""
    S, R, D = o_ref.shape
    used = used_ref[pl.program_id(0)]
    split = lax.broadcasted_iota(jnp.int32, (S, R), 0)
    valid = split < used                                                   # [S, R]
    m_s = plgpu.load(m_ref, mask=valid, other=_MASKED)
    l_s = plgpu.load(l_ref, mask=valid, other=0.0)
    o_s = plgpu.load(o_ref, mask=jnp.broadcast_to(valid[:, :, None], (S, R, D)), other=0.0)
    m = jnp.max(m_s, axis=0)                                               # [R]
    w = jnp.where(valid, jnp.exp(m_s - m[None, :]), 0.0)                   # [S, R]
    l = jnp.sum(w * l_s, axis=0)
    out_ref[...] = (jnp.sum(w[:, :, None] * o_s, axis=0) / jnp.maximum(l, 1e-30)[:, None]).astype(out_ref.dtype)


# --------------------------------------------------------------------------------------------------------------
# jitted implementation (no validation)
# --------------------------------------------------------------------------------------------------------------
def tile_queries(q, positions, tile_tokens, num_kv_heads: int):
    """Queries in tile order, all g = H / KVH heads of a KV head together.

    q [T, H, D], positions i32[T], tile_tokens i32[NT, Bq] -> (qt [NT, KVH, R, D], qpos_rows i32[NT, R]) with
    R = next_pow2(max(16, Bq * g)); row r is token r // g, head r % g; padding rows are zero with position -1."""
    T, H, D = q.shape
    NT, Bq = tile_tokens.shape
    g = H // num_kv_heads
    R0 = Bq * g
    R = _next_pow2(max(16, R0))
    q_pad = jnp.concatenate([q, jnp.zeros((1, H, D), q.dtype)], axis=0)
    qt = q_pad[tile_tokens].reshape(NT, Bq, num_kv_heads, g, D).transpose(0, 2, 1, 3, 4).reshape(
        NT, num_kv_heads, R0, D)
    pos_pad = jnp.concatenate([positions.astype(jnp.int32), jnp.full((1,), -1, jnp.int32)])
    qpos_rows = jnp.repeat(pos_pad[tile_tokens], g, axis=1)  # [NT, R0]: row b * g + h -> token b; -1 = empty
    if R != R0:
        qt = jnp.pad(qt, ((0, 0), (0, 0), (0, R - R0), (0, 0)))
        qpos_rows = jnp.pad(qpos_rows, ((0, 0), (0, R - R0)), constant_values=-1)
    return qt, qpos_rows


def first_blocks(qpos_rows, tile_kv_len, sliding_window: int | None, block_tokens: int):
    """i32[NT]: the first KV block (of block_tokens keys) any query of a tile can see (0 without a window)."""
    if sliding_window is None:
        return jnp.zeros(tile_kv_len.shape, jnp.int32)
    min_pos = jnp.min(jnp.where(qpos_rows >= 0, qpos_rows, jnp.iinfo(jnp.int32).max), axis=1)
    first = jnp.maximum(min_pos - (sliding_window - 1), 0)
    return jnp.where(tile_kv_len > 0, first // block_tokens, 0).astype(jnp.int32)


def attention_call(qt, qpos_rows, k_pages, v_pages, tile_seq, tile_kv_len, tile_lo, page_tables, *,
                   sm_scale, sliding_window, soft_cap, pages_per_block, kv_splits, num_warps, num_stages,
                   interpret, k_scales=None, v_scales=None, busy_stores_only=False, split_causal=False):
    """The pallas_call alone, on tiled queries (tile_queries). Returns o [NT, KVH, R, D] in q's dtype, or with
    kv_splits > 1 the float32 partials (o [S, NT, KVH, R, D], row max m [S, NT, KVH, R], row sum l [same]);
    busy_stores_only: splits without KV blocks leave their partials unwritten (merge with merge_splits_kernel)."""
    NT, KVH, R, D = qt.shape
    num_pages, page_size = k_pages.shape[:2]
    P = pages_per_block
    page_tables = page_tables.astype(jnp.int32)
    W = page_tables.shape[1]
    if W % P:  # every block of P page ids must be readable
        page_tables = jnp.pad(page_tables, ((0, 0), (0, P - W % P)))

    S = kv_splits
    whole = pl.BlockSpec()  # the whole array, indexed dynamically inside the kernel
    in_specs = [
        whole, whole, whole, whole,
        pl.BlockSpec((None, R), lambda i, h, s: (i, 0)),
        pl.BlockSpec((None, None, R, D), lambda i, h, s: (i, h, 0, 0)),
        pl.BlockSpec((num_pages, page_size, None, D), lambda i, h, s: (0, 0, h, 0)),
        pl.BlockSpec((num_pages, page_size, None, D), lambda i, h, s: (0, 0, h, 0)),
    ]
    quantized = k_scales is not None
    scale_args = ()
    if quantized:  # f32 [num_pages, page_size, KVH] -> the program's KV head: [num_pages, page_size]
        in_specs += [pl.BlockSpec((num_pages, page_size, None), lambda i, h, s: (0, 0, h))] * 2
        scale_args = (k_scales.astype(jnp.float32), v_scales.astype(jnp.float32))
    if S == 1:
        out_shape = jax.ShapeDtypeStruct((NT, KVH, R, D), qt.dtype)
        out_specs = pl.BlockSpec((None, None, R, D), lambda i, h, s: (i, h, 0, 0))
    else:
        out_shape = (jax.ShapeDtypeStruct((S, NT, KVH, R, D), jnp.float32),
                     jax.ShapeDtypeStruct((S, NT, KVH, R), jnp.float32),
                     jax.ShapeDtypeStruct((S, NT, KVH, R), jnp.float32))
        out_specs = (pl.BlockSpec((None, None, None, R, D), lambda i, h, s: (s, i, h, 0, 0)),
                     pl.BlockSpec((None, None, None, R), lambda i, h, s: (s, i, h, 0)),
                     pl.BlockSpec((None, None, None, R), lambda i, h, s: (s, i, h, 0)))
    kernel = functools.partial(_attention_kernel, sm_scale=float(sm_scale), sliding_window=sliding_window,
                               soft_cap=None if soft_cap is None else float(soft_cap), pages_per_block=P,
                               kv_splits=S, quantized=quantized, busy_stores_only=busy_stores_only,
                               split_causal=split_causal)
    compiler_params = None
    if not interpret and _TritonCompilerParams is not None:
        compiler_params = _TritonCompilerParams(num_warps=num_warps, num_stages=num_stages)
    return pl.pallas_call(
        kernel,
        grid=(NT, KVH, S),
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        compiler_params=compiler_params,
        interpret=interpret,
        name=f"ragged_paged_attention_R{R}_C{P * page_size}_S{S}{'_split' if split_causal else ''}",
    )(tile_seq.astype(jnp.int32), tile_kv_len.astype(jnp.int32), tile_lo, page_tables, qpos_rows, qt, k_pages,
      v_pages, *scale_args)


def merge_splits(o_s, m_s, l_s, dtype):
    """Flash-decoding merge of split partials [S, NT, KVH, R(, D)] -> [NT, KVH, R, D]. A split without work has
    m = -1e30, l = 0, o = 0 and gets weight 0 (a tile without any work comes out as zeros)."""
    m = jnp.max(m_s, axis=0)
    w = jnp.exp(m_s - m[None])
    l = jnp.sum(w * l_s, axis=0)
    return (jnp.sum(w[..., None] * o_s, axis=0) / jnp.maximum(l, 1e-30)[..., None]).astype(dtype)


def splits_used(tile_kv_len, tile_lo, *, page_size: int, pages_per_block: int, table_width: int, kv_splits: int):
    """i32[NT]: how many of a tile's kv_splits split programs get KV blocks (the kernel's own split arithmetic: the
    blocks [lo, n_blocks) in chunks of ceil((n_blocks - lo) / kv_splits)). table_width: page-table width after the
    kernel's padding to a multiple of pages_per_block."""
    n_pages = jnp.minimum((tile_kv_len + page_size - 1) // page_size, table_width)
    n_blocks = (n_pages + pages_per_block - 1) // pages_per_block
    span = n_blocks - jnp.minimum(tile_lo, n_blocks)
    per_split = jnp.maximum((span + kv_splits - 1) // kv_splits, 1)
    return ((span + per_split - 1) // per_split).astype(jnp.int32)


def merge_splits_kernel(o_s, m_s, l_s, used, dtype, *, num_warps: int = 4, interpret: bool = False):
    """merge_splits as a Pallas kernel that reads only the first used[tile] partials of each tile (the ones a
    busy_stores_only attention call wrote): partials of idle splits and tiles cost no memory traffic. One program
    per (tile, KV head); S (kv_splits) must be a power of two (Triton block shapes)."""
    S, NT, KVH, R, D = o_s.shape
    compiler_params = None
    if not interpret and _TritonCompilerParams is not None:
        compiler_params = _TritonCompilerParams(num_warps=num_warps, num_stages=1)
    return pl.pallas_call(
        _merge_kernel,
        grid=(NT, KVH),
        in_specs=[pl.BlockSpec(),
                  pl.BlockSpec((S, None, None, R), lambda i, h: (0, i, h, 0)),
                  pl.BlockSpec((S, None, None, R), lambda i, h: (0, i, h, 0)),
                  pl.BlockSpec((S, None, None, R, D), lambda i, h: (0, i, h, 0, 0))],
        out_specs=pl.BlockSpec((None, None, R, D), lambda i, h: (i, h, 0, 0)),
        out_shape=jax.ShapeDtypeStruct((NT, KVH, R, D), dtype),
        compiler_params=compiler_params,
        interpret=interpret,
        name=f"ragged_paged_attention_merge_S{S}",
    )(used, m_s, l_s, o_s)


def tiles_to_tokens(o, tile_tokens, num_tokens: int, num_heads: int):
    """o [NT, KVH, R, D] (tile order) -> [T, H, D] in the reference's (token, kv head, group) head order; tokens
    no tile holds are zeros.

    A gather of each token's rows (its slot: the inverse of tile_tokens, a scatter of NT * Bq ints), not a
    transpose of the whole tile array scattered back: the offline run's mixed bucket holds 10,240 query slots for
    2,048 tokens (each decode a 16-token tile of its own), and the transpose + scatter took 1.6 ms of its 67.8 ms
    step on an H100 (benchmarks/probes/step_profile.py --shapes mixed-2048, 2026-12-07 f: input_scatter_fusion);
    the gather reads only the T tokens' rows."""
    NT, KVH, _, D = o.shape
    Bq = tile_tokens.shape[1]
    g = num_heads // KVH
    n_slots = NT * Bq
    flat = tile_tokens.reshape(-1)                                   # [NT * Bq] token of each slot; T: empty
    slot = set_rows(jnp.full((num_tokens,), n_slots, jnp.int32), flat, jnp.arange(n_slots, dtype=jnp.int32),
                    flat >= num_tokens)                              # [T] slot of each token; n_slots: none
    held = slot < n_slots
    slot = jnp.minimum(slot, n_slots - 1)
    rows = o[:, :, :Bq * g].reshape(NT, KVH, Bq, g, D)[slot // Bq, :, slot % Bq]   # [T, KVH, g, D]
    return jnp.where(held[:, None, None], rows.reshape(num_tokens, num_heads, D), jnp.zeros((), o.dtype))


@functools.partial(jax.jit, static_argnames=(
    "sm_scale", "sliding_window", "soft_cap", "pages_per_block", "kv_splits", "merge", "num_warps", "num_stages",
    "interpret", "split_causal"))
def _ragged_paged_attention(q, k_pages, v_pages, positions, tile_tokens, tile_seq, tile_kv_len, page_tables, *,
                            sm_scale, sliding_window, soft_cap, pages_per_block, kv_splits, merge, num_warps,
                            num_stages, interpret, k_scales=None, v_scales=None, split_causal=False):
    T, H, _ = q.shape
    KVH, page_size = k_pages.shape[2], k_pages.shape[1]
    qt, qpos_rows = tile_queries(q, positions, tile_tokens, KVH)
    tile_lo = first_blocks(qpos_rows, tile_kv_len, sliding_window, pages_per_block * page_size)
    out = attention_call(qt, qpos_rows, k_pages, v_pages, tile_seq, tile_kv_len, tile_lo, page_tables,
                         sm_scale=sm_scale, sliding_window=sliding_window, soft_cap=soft_cap,
                         pages_per_block=pages_per_block, kv_splits=kv_splits, num_warps=num_warps,
                         num_stages=num_stages, interpret=interpret, k_scales=k_scales, v_scales=v_scales,
                         busy_stores_only=kv_splits > 1 and merge == "kernel", split_causal=split_causal)
    if kv_splits == 1:
        o = out
    elif merge == "kernel":
        W = page_tables.shape[1]
        used = splits_used(tile_kv_len.astype(jnp.int32), tile_lo, page_size=page_size,
                           pages_per_block=pages_per_block, table_width=-(-W // pages_per_block) * pages_per_block,
                           kv_splits=kv_splits)
        o_s, m_s, l_s = out
        o = merge_splits_kernel(o_s, m_s, l_s, used, q.dtype, interpret=interpret)
    else:
        o = merge_splits(*out, q.dtype)
    return tiles_to_tokens(o, tile_tokens, T, H)


# --------------------------------------------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------------------------------------------
def _check_int32(name, x, ndim):
    if jnp.dtype(x.dtype) != jnp.int32:
        raise TypeError(f"{name} must be int32, got {x.dtype}")
    if x.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {tuple(x.shape)}")


def _check_kv_scales(k_pages, k_scales, v_scales):
    if (k_scales is None) != (v_scales is None):
        raise ValueError("pass both k_scales and v_scales (quantized KV) or neither")
    quant = jnp.dtype(k_pages.dtype) in (jnp.dtype(jnp.float8_e4m3fn), jnp.dtype(jnp.int8))
    if k_scales is None:
        if quant:
            raise ValueError(f"KV pages of dtype {k_pages.dtype} are quantized: pass k_scales and v_scales "
                             "[num_pages, page_size, kv_heads]")
        return
    if not quant:
        raise TypeError(f"k_scales / v_scales are for float8_e4m3fn or int8 KV pages, got {k_pages.dtype}")
    for name, sc in (("k_scales", k_scales), ("v_scales", v_scales)):
        if tuple(sc.shape) != tuple(k_pages.shape[:3]):
            raise ValueError(f"{name} shape {tuple(sc.shape)} != (num_pages, page_size, kv_heads) "
                             f"{tuple(k_pages.shape[:3])} of the KV pages")


def ragged_paged_attention(
    q,            # [T, num_heads, head_dim]
    k_pages,      # [num_pages, page_size, kv_heads, head_dim]
    v_pages,      # [num_pages, page_size, kv_heads, head_dim]
    positions,    # i32[T]
    tile_tokens,  # i32[NT, Bq]  flat token index per tile slot; T = empty
    tile_seq,     # i32[NT]      row of page_tables for the tile
    tile_kv_len,  # i32[NT]      KV tokens visible to the tile; 0 = empty tile
    page_tables,  # i32[S + 1, W]
    *,
    sm_scale: float,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    pages_per_block: int = 1,
    kv_splits: int = 1,
    merge: str = "xla",
    num_warps: int = 4,
    num_stages: int = 2,
    interpret: bool = False,
    k_scales=None,  # f32[num_pages, page_size, kv_heads] for fp8 / int8 pages (kv_quant.py), else None
    v_scales=None,
    split_causal: bool = False,
):
    """Pallas (Triton) ragged paged attention; same contract as `ragged_paged_attention_reference`.

    pages_per_block: KV pages loaded per loop iteration (power of two; C = pages_per_block * page_size keys).
    kv_splits: programs sharing one tile's KV range (split-K), merged in jnp; 1 = no split.
    merge: with kv_splits > 1, "xla": every split program writes its float32 partials and XLA merges all of them;
      "kernel": only splits with KV blocks write, and a Pallas merge kernel reads only those (no traffic for the
      idle tiles of a bucket; kv_splits must be a power of two).
    num_warps / num_stages: Triton compiler parameters (ignored in interpret mode). The pipelined K/V blocks
      take about num_stages * 2 * C * D * itemsize bytes of shared memory (227 KB per block on H100/H200): with
      D = 128 and page 16, bf16 fits up to pages_per_block 8, float32 up to 4 (measured from the compiled
      kernels: 147 KB and 164 KB at R = 64; float32 with 8 pages needs ~290 KB and cannot launch).
    interpret: run the kernel body with the Pallas interpreter (CPU tests).
    split_causal: run the KV blocks every real row of a tile sees whole (below its smallest position) in a loop
      of their own without masks, then the rest masked (the decomposition of triton_prefill.py; no window, soft
      cap or quantized KV). With kv_splits each split does so within its own range of blocks.
    k_scales / v_scales: quantized KV (float8_e4m3fn or int8 pages): k = k_pages * k_scales[..., None]; the
      kernel casts each loaded block to q's dtype (exact) and multiplies scores / probabilities by the scales.
    """
    if q.ndim != 3:
        raise ValueError(f"q must be [T, num_heads, head_dim], got shape {tuple(q.shape)}")
    if k_pages.ndim != 4:
        raise ValueError(f"k_pages must be [num_pages, page_size, kv_heads, head_dim], got shape "
                         f"{tuple(k_pages.shape)}")
    if tuple(v_pages.shape) != tuple(k_pages.shape):
        raise ValueError(f"v_pages shape {tuple(v_pages.shape)} != k_pages shape {tuple(k_pages.shape)}")
    if jnp.dtype(v_pages.dtype) != jnp.dtype(k_pages.dtype):
        raise TypeError(f"v_pages dtype {v_pages.dtype} != k_pages dtype {k_pages.dtype}")
    _check_kv_scales(k_pages, k_scales, v_scales)
    if not jnp.issubdtype(q.dtype, jnp.floating) or not (
            jnp.issubdtype(k_pages.dtype, jnp.floating) or k_scales is not None):
        raise TypeError(f"q and the KV pages must be floating point, got {q.dtype} and {k_pages.dtype}")
    T, H, D = q.shape
    num_pages, page_size, KVH, Dk = k_pages.shape
    if Dk != D:
        raise ValueError(f"head_dim of q ({D}) != head_dim of the KV pages ({Dk})")
    if H % KVH:
        raise ValueError(f"num_heads {H} must be a multiple of kv_heads {KVH}")
    if not (_is_pow2(D) and D >= 16):
        raise ValueError(f"head_dim must be a power of two >= 16 (Triton block shapes), got {D}")
    if not _is_pow2(pages_per_block):
        raise ValueError(f"pages_per_block must be a power of two, got {pages_per_block}")
    if not _is_pow2(page_size) or page_size * pages_per_block < 16:
        raise ValueError(f"page_size must be a power of two and page_size * pages_per_block >= 16, got "
                         f"page_size {page_size}, pages_per_block {pages_per_block}")
    if not isinstance(kv_splits, int) or kv_splits < 1:
        raise ValueError(f"kv_splits must be a positive int, got {kv_splits!r}")
    if merge not in ("xla", "kernel"):
        raise ValueError(f"merge must be 'xla' or 'kernel', got {merge!r}")
    if merge == "kernel" and kv_splits > 1 and not _is_pow2(kv_splits):
        raise ValueError(f"merge='kernel' needs kv_splits to be a power of two (Triton block shapes), got "
                         f"{kv_splits}; use merge='xla'")
    _check_int32("positions", positions, 1)
    _check_int32("tile_tokens", tile_tokens, 2)
    _check_int32("tile_seq", tile_seq, 1)
    _check_int32("tile_kv_len", tile_kv_len, 1)
    _check_int32("page_tables", page_tables, 2)
    if positions.shape[0] != T:
        raise ValueError(f"positions has {positions.shape[0]} entries but q has {T} tokens")
    NT = tile_tokens.shape[0]
    if tile_seq.shape[0] != NT or tile_kv_len.shape[0] != NT:
        raise ValueError(f"tile_tokens has {NT} tiles but tile_seq has {tile_seq.shape[0]} and tile_kv_len has "
                         f"{tile_kv_len.shape[0]}")
    if sliding_window is not None and (int(sliding_window) != sliding_window or sliding_window < 1):
        raise ValueError(f"sliding_window must be a positive int or None, got {sliding_window!r}")
    if soft_cap is not None and not soft_cap > 0:
        raise ValueError(f"soft_cap must be positive or None, got {soft_cap!r}")
    if split_causal and (sliding_window is not None or soft_cap is not None or k_scales is not None):
        raise ValueError("split_causal takes no sliding window, soft cap or quantized KV")
    if not interpret and _TritonCompilerParams is None:
        raise RuntimeError("this jax has no Pallas Triton backend (jax.experimental.pallas.triton); "
                           "use interpret=True or the jnp reference")
    return _ragged_paged_attention(
        q, k_pages, v_pages, positions, tile_tokens, tile_seq, tile_kv_len, page_tables,
        sm_scale=float(sm_scale), sliding_window=None if sliding_window is None else int(sliding_window),
        soft_cap=None if soft_cap is None else float(soft_cap), pages_per_block=int(pages_per_block),
        kv_splits=kv_splits, merge=merge, num_warps=int(num_warps), num_stages=int(num_stages),
        interpret=bool(interpret),
        k_scales=k_scales, v_scales=v_scales, split_causal=bool(split_causal))
