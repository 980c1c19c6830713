"""Pack one step's ragged mix of sequences into fixed-shape numpy arrays (host side, no jax).

Input: a list of `SeqInput` (the tokens to compute for each sequence this step, where they start, the pages of
the sequence, sampling settings). Output: `HostBatch`, numpy arrays padded to a `Bucket`, copied to the device
in one transfer. Padding tokens write their K/V into page 0 (never handed out) and are never attended to.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import numpy as np

from jaxinfer.runner.buckets import Bucket


@dataclasses.dataclass
class SeqInput:
    token_ids: Sequence[int]   # tokens computed this step (prefill chunk, or the one decode token)
    start_pos: int             # position of token_ids[0]
    page_table: Sequence[int]  # all pages of the sequence (cover start_pos + len(token_ids) tokens)
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    step: int = 0              # index of the token being sampled (number generated so far)
    prev_row: int = -1         # >= 0: the last token is a placeholder (-1), sampled by the previous step (still in
                               # flight) in its output row `prev_row`; the device fills it in
    num_spec: int = 0          # speculative decoding: the last num_spec tokens are drafts to verify (needs a
                               # verify row: bucket.spec_rows > 0)


# Fields of a packed batch, in transfer order. All integer fields travel in one int32 buffer and all float fields
# in one float32 buffer: two host->device copies per step instead of fifteen (each copy costs ~0.1-0.4 ms of
# host time). `seed` is uint32 and travels bit-cast to int32.
INT_FIELDS = ("input_ids", "prev_src", "positions", "slot_mapping", "page_tables", "tile_tokens", "tile_seq",
              "tile_kv_len", "sample_idx", "top_k", "seed", "step", "verify_idx", "verify_row", "draft_tokens",
              "num_draft")
FLOAT_FIELDS = ("temperature", "top_p", "min_p")


@dataclasses.dataclass
class HostBatch:
    bucket: Bucket
    arrays: dict[str, np.ndarray]
    num_tokens: int
    num_seqs: int
    token_offsets: np.ndarray  # [num_seqs + 1] start of each sequence in the flat tokens

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        """(int32 buffer, float32 buffer) holding every field, laid out as `layout(bucket)` says."""
        ints = np.concatenate([self.arrays[n].reshape(-1).view(np.int32) for n in INT_FIELDS])
        floats = np.concatenate([self.arrays[n].reshape(-1) for n in FLOAT_FIELDS])
        return ints, floats


def field_shapes(bucket: Bucket) -> dict[str, tuple[int, ...]]:
    T, S, NT, Bq, W = bucket.num_tokens, bucket.num_seqs, bucket.num_tiles, bucket.query_tile, bucket.table_width
    R, K = bucket.spec_rows, bucket.spec_len
    return dict(input_ids=(T,), prev_src=(T,), positions=(T,), slot_mapping=(T,), page_tables=(S + 1, W),
                tile_tokens=(NT, Bq), tile_seq=(NT,), tile_kv_len=(NT,), sample_idx=(S,), top_k=(S,), seed=(S,),
                step=(S,), temperature=(S,), top_p=(S,), min_p=(S,), verify_idx=(R, K + 1), verify_row=(R,),
                draft_tokens=(R, K), num_draft=(R,))


def pack(seqs: Sequence[SeqInput], bucket: Bucket, page_size: int) -> HostBatch:
    T, S, NT, Bq, W = bucket.num_tokens, bucket.num_seqs, bucket.num_tiles, bucket.query_tile, bucket.table_width
    n_seqs = len(seqs)
    if n_seqs > S:
        raise ValueError(f"{n_seqs} sequences do not fit bucket {bucket}")
    lens = np.fromiter((len(s.token_ids) for s in seqs), np.int64, n_seqs)
    offsets = np.zeros(n_seqs + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    n_tok = int(offsets[-1])
    if n_tok > T:
        raise ValueError(f"{n_tok} tokens do not fit bucket {bucket}")

    input_ids = np.zeros(T, np.int32)
    prev_src = np.full(T, -1, np.int32)  # row of the previous step's tokens that fills a placeholder
    positions = np.zeros(T, np.int32)
    slot_mapping = np.zeros(T, np.int32)  # padding -> slot 0 of the reserved page 0
    # Row S stays all zeros: empty tiles point at it, so they gather only the reserved page 0 (L2-resident)
    # instead of re-reading a real sequence's pages.
    page_tables = np.zeros((S + 1, W), np.int32)
    tile_tokens = np.full((NT, Bq), T, np.int32)
    tile_seq = np.full(NT, S, np.int32)
    tile_kv_len = np.zeros(NT, np.int32)
    sample_idx = np.zeros(S, np.int32)
    temperature = np.zeros(S, np.float32)
    top_k = np.full(S, -1, np.int32)
    top_p = np.ones(S, np.float32)
    min_p = np.zeros(S, np.float32)
    seed = np.zeros(S, np.uint32)
    step = np.zeros(S, np.int32)
    # Verify rows (speculative decoding): flat token indices of the K + 1 scored positions, the sequence (sampled
    # row) they belong to (S = padding), the drafts and their count (0 = padding row).
    R, K = bucket.spec_rows, bucket.spec_len
    verify_idx = np.zeros((R, K + 1), np.int32)
    verify_row = np.full(R, S, np.int32)
    draft_tokens = np.zeros((R, K), np.int32)
    num_draft = np.zeros(R, np.int32)
    n_verify = 0

    tile = 0
    for i, s in enumerate(seqs):
        a, b = int(offsets[i]), int(offsets[i + 1])
        n = b - a
        input_ids[a:b] = s.token_ids
        if s.prev_row >= 0:
            input_ids[b - 1] = 0
            prev_src[b - 1] = s.prev_row
        pos = np.arange(s.start_pos, s.start_pos + n, dtype=np.int32)
        positions[a:b] = pos
        pt = np.asarray(s.page_table, np.int32)
        if len(pt) > W:
            raise ValueError(f"sequence has {len(pt)} pages but the page-table width is {W}")
        if len(pt) * page_size < s.start_pos + n:
            raise ValueError(
                f"page table of {len(pt)} pages cannot hold {s.start_pos + n} tokens (page_size {page_size})")
        page_tables[i, :len(pt)] = pt
        slot_mapping[a:b] = pt[pos // page_size] * page_size + pos % page_size
        for t0 in range(0, n, Bq):
            t1 = min(t0 + Bq, n)
            tile_tokens[tile, : t1 - t0] = np.arange(a + t0, a + t1)
            tile_seq[tile] = i
            tile_kv_len[tile] = s.start_pos + t1
            tile += 1
        sample_idx[i] = b - 1
        if s.num_spec:
            k = s.num_spec
            if n_verify == R or k > K or k >= n:
                raise ValueError(f"sequence {i} verifies {k} drafts of {n} tokens but bucket {bucket} has "
                                 f"{R} verify rows of {K} drafts ({n_verify} used)")
            verify_idx[n_verify, :k + 1] = np.arange(b - 1 - k, b)
            verify_idx[n_verify, k + 1:] = b - 1
            verify_row[n_verify] = i
            draft_tokens[n_verify, :k] = s.token_ids[n - k:]
            num_draft[n_verify] = k
            n_verify += 1
        temperature[i] = s.temperature
        top_k[i] = s.top_k
        top_p[i] = s.top_p
        min_p[i] = s.min_p
        seed[i] = s.seed & 0xFFFFFFFF
        step[i] = s.step
    if tile > NT:
        raise AssertionError(f"{tile} query tiles exceed the bucket's {NT}")  # impossible by construction
    arrays: dict[str, Any] = dict(
        input_ids=input_ids, prev_src=prev_src, positions=positions, slot_mapping=slot_mapping, page_tables=page_tables,
        tile_tokens=tile_tokens, tile_seq=tile_seq, tile_kv_len=tile_kv_len, sample_idx=sample_idx,
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, step=step,
        verify_idx=verify_idx, verify_row=verify_row, draft_tokens=draft_tokens, num_draft=num_draft,
    )
    return HostBatch(bucket, arrays, n_tok, n_seqs, offsets)
