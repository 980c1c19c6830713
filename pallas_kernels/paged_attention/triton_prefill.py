"""Prefill attention on the paged KV cache as a plain Triton kernel (called from JAX through jax-triton): issue 17's
fourth design for "prefill attention within 1.5x of cuDNN on the dense problem".

Why another kernel: the Pallas kernel (kernel.py, Triton backend) is 1.5-2.9x cuDNN on prefill chunks (12-01, 12-02,
12-06 h: 1.67x at 512, 2.14x at 2048, 2.91x at 4096 tokens); wider query tiles made it slower, and two cuDNN forms
(tile rows, sequence rows) were 1.8-3.3x. Its design masks every KV block by value (iota compares and selects on
the [R, C] scores of every block) and reads pages of 16 keys a step unless told otherwise. This kernel is the
FlashAttention-2 decomposition as Triton's own fused-attention tutorial lays it out, on pages:
  * the causal loop is split in two: the blocks every row of the tile sees whole run without any mask; only the
    last ones (the tile's own diagonal, the sequence's ragged end) are masked;
  * scores in the log2 domain (sm_scale * log2(e) folded into one multiply, exp2);
  * a KV block of BLOCK_N keys spans BLOCK_N / page_size pages: each key's page comes from the page table (one
    int32 gather a key, from L1), so the K / V loads are plain pointer gathers that Triton pipelines
    (num_stages) like any other loop load.

Same contract and metadata as `ragged_paged_attention` (the engine's packer builds them): queries in tiles of Bq
tokens of one sequence (`tile_queries`: all g = H / KVH heads of a KV head in one block of R = Bq * g rows), causal
by absolute position, keys j < tile_kv_len. Not supported (the caller uses the Pallas kernel): sliding windows,
soft caps, quantized KV, kv splits.

Block shapes of one program (grid = (NT, KVH)):
  q       [R, D]          the tile's rows (token r // g, head r % g), R a power of two >= 16
  qpos    [R] int32       -1 = padding row (its output is never read)
  K, V    [BLOCK_N, D]    keys b * BLOCK_N + [0, BLOCK_N) of the tile's sequence, gathered through its page table
  acc     [R, D] f32      online-softmax accumulator; m, l [R] f32
  out     [R, D]          q's dtype, into o [NT, KVH, R, D] (tiles_to_tokens turns it back into [T, H, D])
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from pallas_kernels.paged_attention.kernel import tile_queries, tiles_to_tokens

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU machines without triton
    triton = None
    tl = None

LOG2E = 1.4426950408889634
MASKED = -1.0e30  # finite: a row whose keys are all masked keeps m = MASKED and gets l = 0 (its output is zero)


if triton is not None:
    _MASKED = tl.constexpr(MASKED)  # (a jitted body may read only constexpr globals)

    @triton.jit
    def _kv_block(k_ptr, v_ptr, pt_row_ptr, h, kk, kv_len, d, PS: tl.constexpr, KVH: tl.constexpr,
                  D: tl.constexpr, MASK_KEYS: tl.constexpr):
        """K^T [D, BLOCK_N] and V [BLOCK_N, D] of keys kk [BLOCK_N] of KV head h (keys >= kv_len read as zeros
        when MASK_KEYS: the unused part of the last page may hold stale values, even NaN)."""
        if MASK_KEYS:
            live = kk < kv_len
            page = tl.load(pt_row_ptr + kk // PS, mask=live, other=0)
            row = (page.to(tl.int64) * PS + kk % PS) * (KVH * D) + h * D              # [BLOCK_N] element offsets
            kt = tl.load(k_ptr + row[None, :] + d[:, None], mask=live[None, :], other=0.0)
            v = tl.load(v_ptr + row[:, None] + d[None, :], mask=live[:, None], other=0.0)
        else:
            page = tl.load(pt_row_ptr + kk // PS)
            row = (page.to(tl.int64) * PS + kk % PS) * (KVH * D) + h * D
            kt = tl.load(k_ptr + row[None, :] + d[:, None])
            v = tl.load(v_ptr + row[:, None] + d[None, :])
        return kt, v

    @triton.jit
    def _online_step(q, kt, v, acc, m_i, l_i, qk_scale, keep, MASK: tl.constexpr, F32_DOT: tl.constexpr):
        """One KV block of the online softmax (log2 domain). keep [R, BLOCK_N] is used only when MASK."""
        if F32_DOT:  # Triton's CPU interpreter computes bf16 dots wrongly (numpy has no bf16): f32 operands there
            s = tl.dot(q.to(tl.float32), kt.to(tl.float32), input_precision="ieee")
        else:
            s = tl.dot(q, kt)
        s = s * qk_scale
        if MASK:
            s = tl.where(keep, s, _MASKED)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.math.exp2(s - m_new[:, None])
        if MASK:
            p = tl.where(keep, p, 0.0)
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if F32_DOT:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        return acc, m_new, l_i

    @triton.jit
    def prefill_attention_kernel(q_ptr, qpos_ptr, k_ptr, v_ptr, tile_seq_ptr, tile_kv_len_ptr, pt_ptr, qk_scale,
                                 o_ptr, W: tl.constexpr, KVH: tl.constexpr, R: tl.constexpr, D: tl.constexpr,
                                 PS: tl.constexpr, BLOCK_N: tl.constexpr, F32_DOT: tl.constexpr):
        """q [NT, KVH, R, D], qpos i32 [NT, R], K / V pages [P, PS, KVH, D], tile_seq / tile_kv_len i32 [NT],
        page tables i32 [S + 1, W], qk_scale = sm_scale * log2(e) -> o [NT, KVH, R, D] (the output comes after
        the scalars: jax-triton passes outputs after all positional arguments)."""
        t = tl.program_id(0)
        h = tl.program_id(1)
        r = tl.arange(0, R)
        d = tl.arange(0, D)
        n = tl.arange(0, BLOCK_N)
        kv_len = tl.load(tile_kv_len_ptr + t)
        pt_row_ptr = pt_ptr + tl.load(tile_seq_ptr + t).to(tl.int64) * W
        base = (t.to(tl.int64) * KVH + h) * (R * D)
        q = tl.load(q_ptr + base + r[:, None] * D + d[None, :])
        qpos = tl.load(qpos_ptr + t.to(tl.int64) * R + r)
        # keys every real row sees (j <= min position, j < kv_len) in whole blocks: no mask
        lo_pos = tl.min(tl.where(qpos >= 0, qpos, 2147483647), 0)
        hi = tl.minimum(tl.max(qpos, 0) + 1, kv_len)                           # keys any row sees: [0, hi)
        n_all = tl.cdiv(tl.maximum(hi, 0), BLOCK_N)
        n_full = tl.minimum((tl.minimum(lo_pos, kv_len - 1) + 1) // BLOCK_N, n_all)   # (an empty tile: 0)
        acc = tl.zeros([R, D], dtype=tl.float32)
        m_i = tl.zeros([R], dtype=tl.float32) + _MASKED
        l_i = tl.zeros([R], dtype=tl.float32)
        for b in range(0, n_full):
            kk = b * BLOCK_N + n
            kt, v = _kv_block(k_ptr, v_ptr, pt_row_ptr, h, kk, kv_len, d, PS, KVH, D, False)
            acc, m_i, l_i = _online_step(q, kt, v, acc, m_i, l_i, qk_scale, None, False, F32_DOT)
        for b in range(n_full, n_all):
            kk = b * BLOCK_N + n
            kt, v = _kv_block(k_ptr, v_ptr, pt_row_ptr, h, kk, kv_len, d, PS, KVH, D, True)
            keep = (kk[None, :] <= qpos[:, None]) & (kk[None, :] < kv_len)
            acc, m_i, l_i = _online_step(q, kt, v, acc, m_i, l_i, qk_scale, keep, True, F32_DOT)
        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(o_ptr + base + r[:, None] * D + d[None, :], out.to(o_ptr.dtype.element_ty))


def usable() -> bool:
    """Whether the JAX entry point runs here: a GPU backend, triton and jax-triton importable."""
    if triton is None or jax.default_backend() != "gpu":
        return False
    try:
        import jax_triton  # noqa: F401
    except ImportError:
        return False
    return True


def launch_params(qt_shape, k_pages_shape, table_width: int, *, block_n: int):
    """(grid, constexpr arguments) of one call; shared by the jax-triton entry point and the CPU tests (which
    launch the kernel with torch tensors under TRITON_INTERPRET)."""
    NT, KVH, R, D = qt_shape
    PS = k_pages_shape[1]
    return (NT, KVH), dict(W=table_width, KVH=KVH, R=R, D=D, PS=PS, BLOCK_N=block_n)


@functools.partial(jax.jit, static_argnames=("sm_scale", "block_n", "num_warps", "num_stages"))
def _prefill_attention(q, k_pages, v_pages, positions, tile_tokens, tile_seq, tile_kv_len, page_tables, *,
                       sm_scale, block_n, num_warps, num_stages):
    import jax_triton

    T, H, _ = q.shape
    KVH = k_pages.shape[2]
    qt, qpos_rows = tile_queries(q, positions, tile_tokens, KVH)
    grid, meta = launch_params(qt.shape, k_pages.shape, page_tables.shape[1], block_n=block_n)
    o = jax_triton.triton_call(
        qt, qpos_rows, k_pages, v_pages, tile_seq.astype(jnp.int32), tile_kv_len.astype(jnp.int32),
        page_tables.astype(jnp.int32), float(sm_scale) * LOG2E, kernel=prefill_attention_kernel,
        out_shape=jax.ShapeDtypeStruct(qt.shape, q.dtype), grid=grid, num_warps=num_warps, num_stages=num_stages,
        F32_DOT=False, name=f"prefill_attention_R{qt.shape[2]}_N{block_n}", **meta)
    return tiles_to_tokens(o, tile_tokens, T, H)


def prefill_attention(q, k_pages, v_pages, positions, tile_tokens, tile_seq, tile_kv_len, page_tables, *,
                      sm_scale: float, block_n: int = 64, num_warps: int = 8, num_stages: int = 2):
    """ragged_paged_attention's contract (no window, soft cap or quantized KV) through the Triton kernel above.
    q [T, H, D]; k_pages / v_pages [P, page_size, KVH, D]; positions i32[T]; tile_tokens i32[NT, Bq];
    tile_seq / tile_kv_len i32[NT]; page_tables i32[S + 1, W] -> [T, H, D] in q's dtype."""
    D = q.shape[-1]
    if D & (D - 1) or D < 16:
        raise ValueError(f"head_dim must be a power of two >= 16 (Triton block shapes), got {D}")
    if block_n & (block_n - 1) or block_n < 16:
        raise ValueError(f"block_n must be a power of two >= 16, got {block_n}")
    if not math.isfinite(sm_scale):
        raise ValueError(f"sm_scale must be finite, got {sm_scale}")
    return _prefill_attention(q, k_pages, v_pages, positions, tile_tokens, tile_seq, tile_kv_len, page_tables,
                              sm_scale=float(sm_scale), block_n=int(block_n), num_warps=int(num_warps),
                              num_stages=int(num_stages))
