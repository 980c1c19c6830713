"""The bucket ladder: the few static shapes the jitted step is compiled for.

A step with n tokens of m sequences runs in the smallest bucket whose token count T >= n; its other shapes
follow from T, so the ladder is one list of ints and warm-up compiles exactly len(ladder) step programs:
  S  = min(T, max_num_seqs)           sampled rows / page-table rows (every sequence has >= 1 token)
  Bq = 4 if T <= max_num_seqs or T <= min_tokens (the smallest buckets), else query_tile
                                      query tile: small buckets are mostly decodes (one query per sequence),
                                      where a wide tile only multiplies padding work
  NT = ceil(T / Bq) + S               query tiles (a sequence of n tokens needs ceil(n / Bq) tiles)
  W  = pages of max_model_len, rounded up to a multiple of kv_chunk_pages (page-table width)
  R  = min(S, max_spec_seqs)          speculative decoding: verify rows (sequences scoring K + 1 positions);
                                      0 when speculation is off, so the step carries no verification at all
verify_bucket adds one bucket off this rule below the ladder: T = K + 1, S = 1, R = 1, a single sequence's
verification (or decode) without the 16-token bucket's padding rows, tiles and verify rows (runner/ladders.py).
prefill_buckets adds a twin before each decode-shaped bucket (query_tile <= T <= max_num_seqs): the same T with
  S' = T // query_tile sequences and query_tile-token tiles, for the steps of few sequences that land there (a short
  prompt alone, a chunk beside a few decodes). Their decode-shaped sibling samples T rows (a 230-token prompt: 256
  rows of logits for one), gives each sequence 4-token tiles (each re-reads its context) and on a GPU sends every
  token to cuDNN as a row of its own (models/attention.py). pick() takes the twin when the step's sequences fit.
  Where the ladder grows faster than x2 (the CPU's 1, 4, 16, 64, ...), twins of their own sit at the doublings in
  between (32, 128, 512, ...), so a lone prompt pads to at most twice its tokens.
"""
from __future__ import annotations

import dataclasses
import math


_DECODE_TILE = 4


@dataclasses.dataclass(frozen=True)
class Bucket:
    num_tokens: int   # T
    num_seqs: int     # S
    num_tiles: int    # NT
    query_tile: int   # Bq
    table_width: int  # W
    spec_rows: int = 0  # R
    spec_len: int = 0   # K (draft tokens per verify row)


def _doublings(a: int, b: int) -> list[int]:
    """2a, 4a, ... below b."""
    out, u = [], 2 * a
    while u < b:
        out.append(u)
        u *= 2
    return out


@dataclasses.dataclass(frozen=True)
class BucketLadder:
    buckets: tuple[Bucket, ...]
    twins: frozenset = frozenset()  # the prefill twins among them (prefill_buckets)

    @classmethod
    def build(cls, *, max_num_batched_tokens: int, max_num_seqs: int, max_model_len: int, page_size: int,
              query_tile: int, kv_chunk_pages: int, min_tokens: int = 16, max_spec_seqs: int = 0,
              num_spec_tokens: int = 0, growth: int = 2, small_buckets: tuple[int, ...] = (),
              verify_bucket: bool = False, prefill_buckets: bool = False) -> "BucketLadder":
        """Token counts small_buckets (those below min_tokens), then min_tokens, min_tokens * growth, ... below
        max_num_batched_tokens, then max_num_batched_tokens itself (runner/cpu_defaults.py: CPU min_tokens 1,
        growth 4; GPU small_buckets (1,), the batch-1 decode). verify_bucket (with speculation): first a bucket of
        one sequence and K + 1 tokens (one verification), where that is below the first bucket. prefill_buckets:
        the decode-shaped buckets' prefill twins (module docstring), each just before its sibling."""
        if growth < 2:
            raise ValueError(f"bucket growth must be >= 2, got {growth}")
        small = sorted({t for t in small_buckets if 1 <= t < min(min_tokens, max_num_batched_tokens)})
        grown, t = [], max(min_tokens, 1)
        while t < max_num_batched_tokens:
            grown.append(t)
            t *= growth
        grown.append(max_num_batched_tokens)
        sizes = small + grown
        pages = math.ceil(max_model_len / page_size)
        width = math.ceil(pages / kv_chunk_pages) * kv_chunk_pages
        # prefill twins of their own where the ladder grows faster than x2 (the CPU's x4): between a and b = 4a
        # a twin of 2a tokens, so a lone prompt pads to at most twice its length (a 100-token one: 128, not 256)
        between = {u for a, b in zip(grown, grown[1:]) for u in _doublings(a, b)} if prefill_buckets else set()

        def twin_of(t: int) -> Bucket | None:  # T / query_tile sequences (at least one) in query_tile-token tiles
            n = min(t // query_tile, max_num_seqs)
            if not prefill_buckets or n < 1:
                return None
            rt = min(n, max_spec_seqs) if num_spec_tokens else 0
            return Bucket(t, n, math.ceil(t / query_tile) + n, query_tile, width, rt, num_spec_tokens if rt else 0)

        buckets, twins = [], []
        for t in sorted({*sizes, *between}):
            twin = twin_of(t)
            if t in between:  # (a twin of its own: no bucket of its size beside it)
                if twin:
                    buckets.append(twin)
                    twins.append(twin)
                continue
            s = min(t, max_num_seqs)
            # Decode-sized tiles where the bucket is mostly decodes; the smallest buckets always, because a
            # single-sequence decode (max_num_seqs 1..15) runs there: with 16-token tiles its one query token
            # padded a 64-row attention tile (H200, 8B at 4k context, max_num_seqs 1: 99 us per layer vs 36 us
            # with 4-token tiles; step_breakdown / decode_attention_cost 2026-12-01).
            bq = min(query_tile, _DECODE_TILE) if t <= max_num_seqs or t <= max(min_tokens, 1) else query_tile
            r = min(s, max_spec_seqs) if num_spec_tokens else 0
            if twin and bq != query_tile and t <= max_num_seqs:  # (a decode-shaped bucket: its twin first)
                buckets.append(twin)
                twins.append(twin)
            buckets.append(Bucket(t, s, math.ceil(t / bq) + s, bq, width, r, num_spec_tokens if r else 0))
        t = num_spec_tokens + 1
        if verify_bucket and num_spec_tokens and max_spec_seqs and t < buckets[0].num_tokens:
            bq = min(query_tile, _DECODE_TILE)
            buckets.insert(0, Bucket(t, 1, math.ceil(t / bq) + 1, bq, width, 1, num_spec_tokens))
        return cls(tuple(buckets), frozenset(twins))

    def pick(self, num_tokens: int, num_seqs: int) -> Bucket:
        """The first bucket (ladder order: by tokens, a prefill twin before its sibling) that holds the step."""
        for b in self.buckets:
            if b.num_tokens >= num_tokens and b.num_seqs >= num_seqs:
                return b
        raise ValueError(
            f"a step of {num_tokens} tokens / {num_seqs} sequences exceeds the largest bucket "
            f"({self.buckets[-1].num_tokens} tokens / {self.buckets[-1].num_seqs} sequences)")

    @property
    def max_tokens(self) -> int:
        return self.buckets[-1].num_tokens
