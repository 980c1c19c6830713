"""Pure-jnp ragged paged attention: the specification of the Pallas kernel and the CPU / fallback path.

The step's query tokens are flat (`q: [T, num_heads, head_dim]`, any mix of prefill chunks and decode tokens).
For attention they are viewed as *query tiles*: each tile holds up to `Bq` tokens of ONE sequence
(`tile_tokens[i, j]` is an index into the flat tokens, `T` marks an empty slot). A tile reads its sequence's
KV through that sequence's page table, so K/V are gathered once per tile, not once per token, and all query
heads of a KV head are processed together (GQA).

KV is visited in chunks of `kv_chunk_pages` pages with an online softmax (float32 accumulation). The loop
runs only as far as the longest context in the step (a dynamic trip count), so the cost follows the real
lengths, not the page-table width.

Cache layout: k_pages, v_pages: [num_pages, page_size, num_kv_heads, head_dim]. The caller writes this
step's K/V into the pages first (`write_kv_pages`); attention then reads everything from the pages.
Unwritten pages must hold finite values (the pool is zero-initialised): a masked score contributes
exp(-inf) = 0, but 0 * NaN is NaN.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from pallas_kernels.paged_attention.kv_quant import QuantizedPages, quantize_kv
from pallas_kernels.paged_attention.scatter import set_rows

_MASKED = -1e30  # finite, so fully-masked (padding) rows never produce inf - inf = NaN
TILE_BLOCK = 16  # query tiles a block of the dynamic loop (static_loop=False)


def write_kv_pages(k_pages, v_pages, k, v, slot_mapping):
    """Scatter this step's k, v: [T, kv_heads, head_dim] into flat slots (page * page_size + offset).

    Padding tokens carry slot -1 and write nothing (`scatter.set_rows`: unique indices, plain stores on the
    GPU). In-place on a donated cache.
    A one-token step (T = 1: the CPU decode bucket) writes with one dynamic-update-slice of the 4-D pool instead:
    XLA turns a one-row scatter into a dynamic-update-slice on the flattened pool plus a select for the
    out-of-range padding index, and that form copied the whole pool twice per layer on XLA:CPU. A padding token
    there (slot -1) writes into slot 0 of the reserved page 0, which no sequence reads.
    Quantized pages (`kv_quant.QuantizedPages`): each token / head is quantized here, its scale written to the
    parallel scale pool at the same slot.
    """
    return _write(k_pages, k, slot_mapping), _write(v_pages, v, slot_mapping)


def _write(pages, x, slot_mapping):
    if isinstance(pages, QuantizedPages):
        xq, scale = quantize_kv(x, pages.data.dtype)  # [T, kvh, D], f32[T, kvh]
        return QuantizedPages(_write(pages.data, xq, slot_mapping), _write(pages.scale, scale, slot_mapping))
    if slot_mapping.shape[0] == 1:  # [pages, page_size, ...] <- x[0] at (slot // page_size, slot % page_size)
        slot = jnp.maximum(slot_mapping[0], 0)
        start = (slot // pages.shape[1], slot % pages.shape[1]) + (0,) * (pages.ndim - 2)
        return jax.lax.dynamic_update_slice(pages, x.astype(pages.dtype)[None], start)
    flat = (pages.shape[0] * pages.shape[1],) + pages.shape[2:]
    return set_rows(pages.reshape(flat), slot_mapping, x, slot_mapping < 0).reshape(pages.shape)


def ragged_paged_attention_reference(
    q,            # [T, num_heads, head_dim]
    k_pages,      # [num_pages, page_size, kv_heads, head_dim]
    v_pages,      # [num_pages, page_size, kv_heads, head_dim]
    positions,    # i32[T]   absolute position of each query token
    tile_tokens,  # i32[NT, Bq]  flat token index per tile slot; T = empty
    tile_seq,     # i32[NT]  row of page_tables for the tile
    tile_kv_len,  # i32[NT]  KV tokens visible to the tile (last query position + 1); 0 = empty tile
    page_tables,  # i32[S, W]  pages of each sequence; W must be a multiple of kv_chunk_pages
    *,
    sm_scale: float,
    kv_chunk_pages: int,
    sliding_window: int | None = None,
    soft_cap: float | None = None,
    static_loop: bool = False,
    k_scales=None,  # f32[num_pages, page_size, kv_heads] when the pages are quantized (fp8 / int8), else None
    v_scales=None,
):
    """static_loop=False: a while loop that stops after the longest context (cheapest on CPU). True: a Python
    loop over every chunk of the page-table width — no data-dependent control flow, which on GPU would force
    a device-to-host sync per layer (measured on the H200: 83 vs 222 tok/s at batch 1)."""
    T, num_heads, head_dim = q.shape
    _, page_size, kv_heads, _ = k_pages.shape
    NT = tile_tokens.shape[0]
    W = page_tables.shape[1]
    chunk = kv_chunk_pages * page_size
    if W % kv_chunk_pages:
        raise ValueError(f"page table width {W} must be a multiple of kv_chunk_pages {kv_chunk_pages}")

    page_tables = jnp.asarray(page_tables)  # (callers may pass numpy metadata; it is indexed by traced tiles)
    # Query tiles: [NT, Bq, kv_heads, group, head_dim]; an extra zero row serves empty slots.
    q_pad = jnp.concatenate([q, jnp.zeros((1, num_heads, head_dim), q.dtype)], axis=0)
    pos_pad = jnp.concatenate([positions, jnp.full((1,), -1, positions.dtype)])
    attend = functools.partial(_attend_tiles, q_pad=q_pad, pos_pad=pos_pad, k_pages=k_pages, v_pages=v_pages,
                               page_tables=page_tables, sm_scale=sm_scale, kv_chunk_pages=kv_chunk_pages,
                               sliding_window=sliding_window, soft_cap=soft_cap, k_scales=k_scales,
                               v_scales=v_scales)
    out = jnp.zeros((T, num_heads, head_dim), q.dtype)
    if static_loop:
        return attend(out, tile_tokens, tile_seq, tile_kv_len, num_chunks=W // kv_chunk_pages)
    # Dynamic loop (the CPU): blocks of TILE_BLOCK tiles, as many as reach the last non-empty tile, each with the
    # chunk loop of its own longest context. A bucket's tile count is its worst case (a tile for every sequence
    # beside the tokens' own: ceil(T / Bq) + S); a step uses a prefix of it (runner/batch.pack), e.g. 58 of the
    # 256-token bucket's 320 tiles for a 230-token prompt, and every tile of the one-block form gathered its KV.
    if NT <= TILE_BLOCK:  # (the decode buckets of a few sequences: one block, as before)
        return attend(out, tile_tokens, tile_seq, tile_kv_len, num_chunks=(jnp.max(tile_kv_len) + chunk - 1) // chunk)
    nb = -(-NT // TILE_BLOCK)
    pad = nb * TILE_BLOCK - NT
    tiles = (jnp.pad(tile_tokens, ((0, pad), (0, 0)), constant_values=T), jnp.pad(tile_seq, (0, pad)),
             jnp.pad(tile_kv_len, (0, pad)))
    used = jnp.max(jnp.where(tiles[2] > 0, jnp.arange(nb * TILE_BLOCK) + 1, 0))  # past the last non-empty tile

    def block(carry):
        b, out = carry
        tt, ts, tk = (jax.lax.dynamic_slice_in_dim(x, b * TILE_BLOCK, TILE_BLOCK, axis=0) for x in tiles)
        return b + 1, attend(out, tt, ts, tk, num_chunks=(jnp.max(tk) + chunk - 1) // chunk)

    return jax.lax.while_loop(lambda c: c[0] * TILE_BLOCK < used, block, (jnp.zeros((), jnp.int32), out))[1]


def _attend_tiles(out, tile_tokens, tile_seq, tile_kv_len, *, num_chunks, q_pad, pos_pad, k_pages, v_pages,
                  page_tables, sm_scale, kv_chunk_pages, sliding_window, soft_cap, k_scales, v_scales):
    """Attention of n query tiles (tile_tokens [n, Bq], tile_seq / tile_kv_len [n]) written into out [T, H, D]
    (empty slots write nothing). num_chunks: a Python int, the chunks of a static loop over the page-table width;
    else a traced count, the chunks of a while loop (the tiles' longest context)."""
    T, num_heads, head_dim = out.shape
    _, page_size, kv_heads, _ = k_pages.shape
    NT, Bq = tile_tokens.shape
    group = num_heads // kv_heads
    chunk = kv_chunk_pages * page_size
    qt = q_pad[tile_tokens].reshape(NT, Bq, kv_heads, group, head_dim)
    q_pos = pos_pad[tile_tokens]  # [NT, Bq]; -1 for empty slots (sees nothing)
    tile_pages = page_tables[tile_seq]  # [NT, W]

    def body(carry):
        j, m, l, acc = carry
        pages = jax.lax.dynamic_slice_in_dim(tile_pages, j * kv_chunk_pages, kv_chunk_pages, axis=1)
        kc = k_pages[pages].reshape(NT, chunk, kv_heads, head_dim).astype(qt.dtype)  # [NT, C, kvh, D]
        vc = v_pages[pages].reshape(NT, chunk, kv_heads, head_dim).astype(qt.dtype)
        s = jnp.einsum("tbkgd,tckd->tkgbc", qt, kc, preferred_element_type=jnp.float32) * sm_scale
        if k_scales is not None:  # per (token, kv head) scales -> [NT, kvh, 1, 1, C]
            s = s * k_scales[pages].reshape(NT, chunk, kv_heads).transpose(0, 2, 1)[:, :, None, None, :]
        if soft_cap is not None:
            s = soft_cap * jnp.tanh(s / soft_cap)
        kv_pos = j * chunk + jnp.arange(chunk)  # [C]
        visible = (kv_pos[None, None, :] <= q_pos[:, :, None]) & (
            kv_pos[None, None, :] < tile_kv_len[:, None, None])  # [NT, Bq, C]
        if sliding_window is not None:
            visible &= kv_pos[None, None, :] > q_pos[:, :, None] - sliding_window
        s = jnp.where(visible[:, None, None, :, :], s, _MASKED)  # [NT, kvh, g, Bq, C]
        m_new = jnp.maximum(m, jnp.max(s, axis=-1))
        alpha = jnp.exp(m - m_new)
        p = jnp.exp(s - m_new[..., None])
        l_new = alpha * l + jnp.sum(p, axis=-1)
        if v_scales is not None:
            p = p * v_scales[pages].reshape(NT, chunk, kv_heads).transpose(0, 2, 1)[:, :, None, None, :]
        pv = jnp.einsum("tkgbc,tckd->tkgbd", p.astype(vc.dtype), vc, preferred_element_type=jnp.float32)
        acc_new = alpha[..., None] * acc + pv
        return j + 1, m_new, l_new, acc_new

    init = (
        jnp.zeros((), jnp.int32),
        jnp.full((NT, kv_heads, group, Bq), _MASKED, jnp.float32),
        jnp.zeros((NT, kv_heads, group, Bq), jnp.float32),
        jnp.zeros((NT, kv_heads, group, Bq, head_dim), jnp.float32),
    )
    if isinstance(num_chunks, int):
        carry = init
        for _ in range(num_chunks):
            carry = body(carry)
        _, _, l, acc = carry
    else:
        _, _, l, acc = jax.lax.while_loop(lambda c: c[0] < num_chunks, body, init)
    o = acc / jnp.maximum(l, 1e-30)[..., None]  # [NT, kvh, g, Bq, D]
    o = o.transpose(0, 3, 1, 2, 4).reshape(NT * Bq, num_heads, head_dim)
    # Scatter tiles back to flat tokens; empty slots (token T) write nothing.
    idx = tile_tokens.reshape(-1)
    return set_rows(out, idx, o, idx >= T)
