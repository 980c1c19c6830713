"""Attention metadata of one step and the dispatch to the paged-attention implementation.

`AttentionMetadata` is built on the host (runner/batch.py) as numpy arrays and copied to the device once per
step. Its array shapes are fixed by the step's bucket, so a new mix of requests never recompiles.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
from jax.sharding import PartitionSpec as P

from jaxinfer.env_switch import switch
from pallas_kernels.paged_attention import triton_prefill
from pallas_kernels.paged_attention.cudnn_paged import cudnn_paged_attention
from pallas_kernels.paged_attention.kernel import ragged_paged_attention
from pallas_kernels.paged_attention.kv_quant import QuantizedPages
from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference, write_kv_pages


def _pages_per_block(page_size: int) -> int:
    """KV pages per kernel loop step: 64 tokens (best or near-best in the H200 sweep of
    benchmarks/kernels/paged_attention.py at page 16)."""
    return max(1, 64 // page_size)


def device_num_sms() -> int:
    """Streaming multiprocessors of the first device (132 where the backend does not say: H100 / H200)."""
    return int(getattr(jax.devices()[0], "core_count", 0) or 132)


def decode_kv_splits(num_seqs: int, kv_heads: int, num_sms: int) -> int:
    """Split-K programs per query tile for a bucket of num_seqs sequences and kv_heads (local) KV heads.

    One split gives num_seqs * kv_heads programs. While those fit in one wave of the GPU (<= num_sms) the KV of a
    sequence is split 8 ways (flash decoding); a tile with fewer KV blocks than splits leaves the rest idle.
    H200, per layer, bucket of 16 sequences / 20 tiles, 8 KV heads (benchmarks/probes/decode_attention_cost.py,
    2026-12-01): no split / 16 splits / 8 splits (no pipelining): 1 x 512 30.0 / 22.8 / 17.5 us, 1 x 4k
    133.9 / 36.6 / 36.3 us, 16 x 4k 219.3 / 113.9 / 103.0 us. Fewer splits write and merge fewer float32 partials
    (every tile of the bucket has them, busy or not); 8 vs 16 is not measured beyond 4k, where 16 may win again
    (more KV per split: 1 x 32k took 154 us with 16 splits in the kernel benchmark). With more programs than SMs
    the split did not pay (batch 64 x 4k: 384 us unsplit, 389 us with 2 splits in
    benchmarks/kernels/paged_attention.py)."""
    return 8 if num_seqs * kv_heads <= num_sms else 1


def kernel_num_stages(kv_splits: int) -> int:
    """Triton software-pipelining depth: a split program walks only a few KV blocks, where the smaller shared-memory
    footprint of no pipelining (more programs resident per SM) wins (H200: 1 x 4k with 16 splits 49 -> 33 us;
    16 x 4k with 3 splits 131 -> 113 us)."""
    return 1 if kv_splits > 1 else 2


def kernel_split_options(num_seqs: int, kv_heads: int, num_sms: int) -> dict:
    """The Pallas kernel's split-K keywords for a bucket: kv_splits (decode_kv_splits) and its num_stages."""
    splits = decode_kv_splits(num_seqs, kv_heads, num_sms)
    return dict(kv_splits=splits, num_stages=kernel_num_stages(splits))


def split_causal_for(sliding_window, scales) -> bool:
    """Whether the Pallas kernel runs its blocks below each tile's diagonal unmasked (kernel.py split_causal): opt-in
    JAXINFER_SPLIT_CAUSAL=1 (read at trace time, part of the program cache key) until measured in the engine, and
    only where the kernel takes it (no sliding window or quantized KV)."""
    return switch("JAXINFER_SPLIT_CAUSAL", default=False) and sliding_window is None and not scales


# the Triton prefill kernel's smallest bucket: above runner/compile_options.COMMAND_BUFFER_MAX_TOKENS (tested)
TRITON_PREFILL_MIN_TOKENS = 257


def triton_prefill_for(num_tokens: int, md, sliding_window, scales) -> bool:
    """Whether a bucket's attention runs the plain Triton prefill kernel (triton_prefill.py, jax-triton) instead of
    the Pallas kernel: opt-in JAXINFER_TRITON_PREFILL=1 (trace time, in the program cache key) until measured in the
    engine; prefill-shaped buckets (more tokens than sequences) of TRITON_PREFILL_MIN_TOKENS or more only, which run
    without command buffers (a jax-triton call splits a step's CUDA graph: benchmarks/README.md, 12-03); no sliding
    window or quantized KV."""
    return (switch("JAXINFER_TRITON_PREFILL", default=False) and num_tokens >= TRITON_PREFILL_MIN_TOKENS
            and num_tokens > md.page_tables.shape[0] - 1 and sliding_window is None and not scales
            and triton_prefill.usable())


class AttentionOptions(NamedTuple):
    """Static (compile-time) attention settings."""

    kv_chunk_pages: int       # reference: KV pages per loop iteration
    static_kv_loop: bool      # reference: unrolled loop over the whole page-table width (GPU) vs while loop (CPU)
    backend: str = "reference"  # "reference" (jnp), "pallas" (pallas_kernels/paged_attention/kernel.py) or "cudnn"
                                # (cudnn_paged.py in buckets of no more tokens than sequences and at
                                # least cudnn_min_tokens, pallas in the others)
    interpret: bool = False   # pallas on CPU: run the kernel body in interpret mode (tests)
    mesh: Any = None          # tensor parallelism: a Mesh with a "model" axis; attention runs per KV-head shard
    num_sms: int = 132        # pallas: streaming multiprocessors of the GPU (decode_kv_splits); H100 / H200: 132
    cudnn_min_tokens: int = 1  # cudnn: the fewest tokens a bucket needs to run (its decodes) through cuDNN


class AttentionMetadata(NamedTuple):
    positions: jax.Array     # i32[T]       absolute position of each token
    slot_mapping: jax.Array  # i32[T]       page * page_size + offset where its K/V are written
    tile_tokens: jax.Array   # i32[NT, Bq]  flat token indices of each query tile (T = empty slot)
    tile_seq: jax.Array      # i32[NT]      sequence (row of page_tables) of each tile
    tile_kv_len: jax.Array   # i32[NT]      KV tokens visible to each tile
    page_tables: jax.Array   # i32[S + 1, W] KV pages of each sequence; row S is all zeros (empty tiles)


def paged_attention(q, k, v, k_pages, v_pages, md: AttentionMetadata, opts: AttentionOptions, *,
                    sm_scale: float, sliding_window: int | None = None):
    """q: [T, H, D]; k, v: [T, KVH, D] (this step's new tokens). Returns (out [T, H, D], k_pages, v_pages).

    With opts.mesh (tensor parallelism) the heads and the cache are split over the "model" axis and each device
    runs the whole function on its own q heads [T, H/tp, D] and KV heads [.., KVH/tp, D] (shard_map): attention
    needs no communication, and the Pallas kernel only ever sees one device's shard.

    k_pages / v_pages: page arrays, or kv_quant.QuantizedPages (fp8 / int8 data + per-token scales)."""
    if opts.mesh is None:
        return _paged_attention_local(q, k, v, k_pages, v_pages, md, opts, sm_scale, sliding_window)
    heads, pages = P(None, "model", None), P(None, None, "model", None)
    if isinstance(k_pages, QuantizedPages):  # data [pages, page, kv_heads, head_dim], scale [pages, page, kv_heads]
        pages = QuantizedPages(pages, P(None, None, "model"))
    local = lambda *a: _paged_attention_local(*a, opts._replace(mesh=None), sm_scale, sliding_window)  # noqa: E731
    return jax.shard_map(local, mesh=opts.mesh, in_specs=(heads, heads, heads, pages, pages, P()),
                         out_specs=(heads, pages, pages), check_vma=False)(q, k, v, k_pages, v_pages, md)


def _paged_attention_local(q, k, v, k_pages, v_pages, md, opts, sm_scale, sliding_window):
    k_pages, v_pages = write_kv_pages(k_pages, v_pages, k, v, md.slot_mapping)
    kd, vd, scales = k_pages, v_pages, {}
    if isinstance(k_pages, QuantizedPages):
        kd, vd, scales = k_pages.data, v_pages.data, dict(k_scales=k_pages.scale, v_scales=v_pages.scale)
    if opts.backend == "cudnn":
        if scales or sliding_window is not None:
            raise ValueError("attention_backend='cudnn' takes bf16 / fp16 KV pages without a sliding window; use "
                             "attention_backend='pallas' for quantized KV caches and sliding-window models")
        T, S = q.shape[0], md.page_tables.shape[0] - 1
        # a decode-shaped bucket (tokens <= sequences) of at least cudnn_min_tokens: cuDNN
        if opts.cudnn_min_tokens <= T <= S:
            out = cudnn_paged_attention(q, kd, vd, md.positions, md.tile_tokens, md.tile_seq, md.tile_kv_len,
                                        md.page_tables, sm_scale=sm_scale)
            return out, k_pages, v_pages
        # prefill-shaped buckets: the Pallas kernel (cuDNN's one row a token would re-read a chunk's KV per token;
        # the two cuDNN prefill forms of cudnn_prefill_forms.py measured slower than the kernel or short of 1.5x;
        # the decodes of mixed steps through cuDNN rows, "the split", measured and removed twice: docs/architecture.md)
    if opts.backend in ("pallas", "cudnn") and triton_prefill_for(q.shape[0], md, sliding_window, scales):
        out = triton_prefill.prefill_attention(q, kd, vd, md.positions, md.tile_tokens, md.tile_seq, md.tile_kv_len,
                                               md.page_tables, sm_scale=sm_scale)
        return out, k_pages, v_pages
    if opts.backend in ("pallas", "cudnn"):
        splits = kernel_split_options(md.page_tables.shape[0] - 1, kd.shape[2], opts.num_sms)  # rows: S + 1
        out = ragged_paged_attention(
            q, kd, vd, md.positions, md.tile_tokens, md.tile_seq, md.tile_kv_len, md.page_tables,
            sm_scale=sm_scale, sliding_window=sliding_window, pages_per_block=_pages_per_block(kd.shape[1]),
            interpret=opts.interpret, split_causal=split_causal_for(sliding_window, scales),
            **splits, **scales)
        return out, k_pages, v_pages
    out = ragged_paged_attention_reference(
        q, kd, vd, md.positions, md.tile_tokens, md.tile_seq, md.tile_kv_len, md.page_tables,
        sm_scale=sm_scale, kv_chunk_pages=opts.kv_chunk_pages, sliding_window=sliding_window,
        static_loop=opts.static_kv_loop, **scales)
    return out, k_pages, v_pages
