"""Pack one step's ragged mix of sequences into fixed-shape numpy arrays (host side, no jax).

Input: a `StepBatch` (`pack_step`: the engine's columns, gathered from its persistent slot tables) or a list of
`SeqInput` (`pack`, the reference and the draft model's path: the tokens to compute for each sequence this step,
where they start, the pages of the sequence, sampling settings). Output: `HostBatch`, numpy arrays padded to a
`Bucket`, copied to the device in one transfer. pack_step and pack give equal arrays for equal inputs
(tests/engine/test_input_batch.py drives random schedules through both). Padding tokens have slot -1 (their K/V are not written) and are never attended to; padding
rows of the page tables point at the reserved page 0.
"""
from __future__ import annotations

import dataclasses
import itertools
import threading
from operator import attrgetter
from typing import Any, Sequence

import numpy as np

from jaxinfer.outputs import SeqInput, StepBatch
from jaxinfer.runner.buckets import Bucket


_TOKEN_IDS, _PAGE_TABLE, _NUM_SPEC = attrgetter("token_ids"), attrgetter("page_table"), attrgetter("num_spec")

# Fields of a packed batch, in transfer order. All integer fields travel in one int32 buffer and all float fields
# in one float32 buffer: two host->device copies per step instead of fifteen (each copy costs ~0.1-0.4 ms of
# host time). `seed` is uint32 and travels bit-cast to int32.
INT_FIELDS = ("input_ids", "prev_src", "positions", "slot_mapping", "page_tables", "tile_tokens", "tile_seq",
              "tile_kv_len", "sample_idx", "top_k", "seed", "step", "want_logprobs", "penalty_slot", "verify_idx",
              "verify_row", "draft_tokens", "num_draft")
FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")


@dataclasses.dataclass
class HostBatch:
    bucket: Bucket
    arrays: dict[str, np.ndarray]
    num_tokens: int
    num_seqs: int
    token_offsets: np.ndarray  # [num_seqs + 1] start of each sequence in the flat tokens
    buffers: tuple[np.ndarray, np.ndarray] | None = None  # pack_step: the (ints, floats) the arrays are views of
    # pack_step of a line of continuations (StepBatch.root): (bucket, root) and the page columns written (columns
    # w: of page_tables are 0), for release(); None: never reused
    line: tuple | None = None
    w: int = 0
    released: bool = False

    def flat(self) -> tuple[np.ndarray, np.ndarray]:
        """(int32 buffer, float32 buffer) holding every field, laid out as `layout(bucket)` says."""
        if self.buffers is not None:
            return self.buffers
        ints = np.concatenate([self.arrays[n].reshape(-1).view(np.int32) for n in INT_FIELDS])
        floats = np.concatenate([self.arrays[n].reshape(-1) for n in FLOAT_FIELDS])
        return ints, floats


def field_shapes(bucket: Bucket) -> dict[str, tuple[int, ...]]:
    T, S, NT, Bq, W = bucket.num_tokens, bucket.num_seqs, bucket.num_tiles, bucket.query_tile, bucket.table_width
    R, K = bucket.spec_rows, bucket.spec_len
    return dict(input_ids=(T,), prev_src=(T,), positions=(T,), slot_mapping=(T,), page_tables=(S + 1, W),
                tile_tokens=(NT, Bq), tile_seq=(NT,), tile_kv_len=(NT,), sample_idx=(S,), top_k=(S,), seed=(S,),
                step=(S,), want_logprobs=(S,), penalty_slot=(S,), temperature=(S,), top_p=(S,), min_p=(S,),
                presence_penalty=(S,), frequency_penalty=(S,), repetition_penalty=(S,), verify_idx=(R, K + 1),
                verify_row=(R,), draft_tokens=(R, K), num_draft=(R,))


def _check_fits(bucket: Bucket, lens, starts, n_pages, page_size: int):
    """The sequences' token counts, start positions and page counts (i64[n]) fit the bucket and their page tables:
    ValueError naming the fault if not. Returns (offsets i64[n + 1]: start of each sequence in the flat tokens,
    total tokens)."""
    offsets = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    n_tok = int(offsets[-1])
    if n_tok > bucket.num_tokens:
        raise ValueError(f"{n_tok} tokens do not fit bucket {bucket}")
    W = bucket.table_width
    if len(n_pages) and n_pages.max() > W:
        i = int(n_pages.argmax())
        raise ValueError(f"sequence has {n_pages[i]} pages but the page-table width is {W}")
    short = n_pages * page_size < starts + lens
    if short.any():
        i = int(short.argmax())
        raise ValueError(f"page table of {n_pages[i]} pages cannot hold {starts[i] + lens[i]} tokens "
                         f"(page_size {page_size})")
    return offsets, n_tok


def pack(seqs: Sequence[SeqInput], bucket: Bucket, page_size: int) -> HostBatch:
    """The reference packing of a list of SeqInput (also the draft model's path); see pack_step."""
    return pack_reference(seqs, bucket, page_size)


def pack_reference(seqs: Sequence[SeqInput], bucket: Bucket, page_size: int) -> HostBatch:
    """Vectorised over sequences and tokens (numpy): at batch 256 a per-sequence Python loop here cost more host
    time than the device step. tests/engine/test_batch_pack.py checks it against a plain per-sequence loop."""
    T, S, NT, Bq, W = bucket.num_tokens, bucket.num_seqs, bucket.num_tiles, bucket.query_tile, bucket.table_width
    n_seqs = len(seqs)
    if n_seqs > S:
        raise ValueError(f"{n_seqs} sequences do not fit bucket {bucket}")
    # Per-sequence fields are read with map(attrgetter) rather than generator expressions: ~1.5x faster, and pack
    # reads ~17 fields of every sequence every step.
    lens = np.fromiter(map(len, map(_TOKEN_IDS, seqs)), np.int64, n_seqs)
    starts = np.fromiter(map(attrgetter("start_pos"), seqs), np.int64, n_seqs)
    n_pages = np.fromiter(map(len, map(_PAGE_TABLE, seqs)), np.int64, n_seqs)
    offsets, n_tok = _check_fits(bucket, lens, starts, n_pages, page_size)

    # Row S stays all zeros: empty tiles point at it, so they gather only the reserved page 0 (L2-resident)
    # instead of re-reading a real sequence's pages.
    page_tables = np.zeros((S + 1, W), np.int32)
    if n_seqs:
        rows = np.repeat(np.arange(n_seqs), n_pages)
        cols = np.arange(len(rows)) - np.repeat(np.cumsum(n_pages) - n_pages, n_pages)
        page_tables[rows, cols] = np.fromiter(itertools.chain.from_iterable(map(_PAGE_TABLE, seqs)), np.int32,
                                              len(rows))

    tok_seq = np.repeat(np.arange(n_seqs), lens)  # [n_tok] sequence of each token
    pos = np.arange(n_tok) - offsets[:-1][tok_seq] + starts[tok_seq]
    input_ids = np.zeros(T, np.int32)
    flat_ids = np.fromiter(itertools.chain.from_iterable(map(_TOKEN_IDS, seqs)), np.int64, n_tok)
    input_ids[:n_tok] = flat_ids
    prev_src = np.full(T, -1, np.int32)  # row of the previous step's tokens that fills a placeholder
    prev_rows = np.fromiter(map(attrgetter("prev_row"), seqs), np.int64, n_seqs)
    has_prev = prev_rows >= 0
    last = offsets[1:] - 1
    input_ids[last[has_prev]] = 0
    prev_src[last[has_prev]] = prev_rows[has_prev]
    positions = np.zeros(T, np.int32)
    positions[:n_tok] = pos
    slot_mapping = np.full(T, -1, np.int32)  # padding: no slot (write_kv_pages drops it)
    slot_mapping[:n_tok] = page_tables[tok_seq, pos // page_size] * page_size + pos % page_size

    # Query tiles: sequence i gets ceil(len_i / Bq) tiles of up to Bq consecutive tokens.
    n_tiles = -(-lens // Bq)
    total_tiles = int(n_tiles.sum())
    if total_tiles > NT:
        raise AssertionError(f"{total_tiles} query tiles exceed the bucket's {NT}")  # impossible by construction
    tile_s = np.repeat(np.arange(n_seqs), n_tiles)  # [tiles] sequence of each tile
    tile_j = np.arange(total_tiles) - np.repeat(np.cumsum(n_tiles) - n_tiles, n_tiles)  # tile index in its seq
    first = tile_j * Bq  # first token of the tile within its sequence
    r = np.arange(Bq)[None, :]
    in_seq = first[:, None] + r < lens[tile_s][:, None]
    tile_tokens = np.full((NT, Bq), T, np.int32)
    tile_tokens[:total_tiles] = np.where(in_seq, offsets[:-1][tile_s][:, None] + first[:, None] + r, T)
    tile_seq = np.full(NT, S, np.int32)
    tile_seq[:total_tiles] = tile_s
    tile_kv_len = np.zeros(NT, np.int32)
    tile_kv_len[:total_tiles] = starts[tile_s] + np.minimum(first + Bq, lens[tile_s])

    def col(name, dtype, fill):
        out = np.full(S, fill, dtype)
        out[:n_seqs] = np.fromiter(map(attrgetter(name), seqs), dtype, n_seqs)
        return out

    sample_idx = np.zeros(S, np.int32)
    sample_idx[:n_seqs] = last
    seed = np.zeros(S, np.uint32)
    seed[:n_seqs] = np.fromiter((s.seed & 0xFFFFFFFF for s in seqs), np.uint32, n_seqs)
    arrays: dict[str, Any] = dict(
        input_ids=input_ids, prev_src=prev_src, positions=positions, slot_mapping=slot_mapping, page_tables=page_tables,
        tile_tokens=tile_tokens, tile_seq=tile_seq, tile_kv_len=tile_kv_len, sample_idx=sample_idx,
        temperature=col("temperature", np.float32, 0.0), top_k=col("top_k", np.int32, -1),
        top_p=col("top_p", np.float32, 1.0), min_p=col("min_p", np.float32, 0.0), seed=seed,
        step=col("step", np.int32, 0), want_logprobs=col("want_logprobs", np.int32, 0),
        penalty_slot=col("penalty_slot", np.int32, -1),
        presence_penalty=col("presence_penalty", np.float32, 0.0),
        frequency_penalty=col("frequency_penalty", np.float32, 0.0),
        repetition_penalty=col("repetition_penalty", np.float32, 1.0),
        **_verify_rows(seqs, bucket, offsets, lens, flat_ids),
    )
    return HostBatch(bucket, arrays, n_tok, n_seqs, offsets)


def _verify_rows(seqs: Sequence[SeqInput], bucket: Bucket, offsets: np.ndarray, lens: np.ndarray,
                 flat_ids: np.ndarray) -> dict:
    """_verify_arrays of a SeqInput list."""
    return _verify_arrays(np.fromiter(map(_NUM_SPEC, seqs), np.int64, len(seqs)), bucket, offsets, lens, flat_ids)


def _verify_arrays(ks: np.ndarray, bucket: Bucket, offsets: np.ndarray, lens: np.ndarray,
                   flat_ids: np.ndarray) -> dict:
    """Verify rows (speculative decoding): flat token indices of the K + 1 scored positions, the sequence (sampled
    row) they belong to (S = padding), the drafts and their count (0 = padding row). Vectorised over the
    speculating sequences (a per-sequence loop here cost ~5 µs a sequence, on the critical path of every
    speculative step: those steps are not pipelined). flat_ids: i64[num tokens] the sequences' token ids."""
    S, R, K = bucket.num_seqs, bucket.spec_rows, bucket.spec_len
    verify_idx = np.zeros((R, K + 1), np.int32)
    verify_row = np.full(R, S, np.int32)
    draft_tokens = np.zeros((R, K), np.int32)
    num_draft = np.zeros(R, np.int32)
    rows = np.flatnonzero(ks)  # sequence index of each verify row
    if rows.size:
        k, end = ks[rows], offsets[rows + 1]  # drafts and flat end of each speculating sequence
        if rows.size > R or k.max() > K or (k >= lens[rows]).any():
            bad = (k > K) | (k >= lens[rows]) | (np.arange(rows.size) >= R)
            r = int(bad.argmax())
            raise ValueError(f"sequence {int(rows[r])} verifies {int(k[r])} drafts of {int(lens[rows[r]])} tokens but "
                             f"bucket {bucket} has {R} verify rows of {K} drafts ({min(rows.size, R)} used)")
        nv = rows.size
        # flat positions end-1-k .. end-1 (the last known token, then the k drafts), then end-1 repeated: [nv, K+1]
        idx = (end - 1 - k)[:, None] + np.minimum(np.arange(K + 1)[None, :], k[:, None])
        verify_idx[:nv] = idx
        verify_row[:nv] = rows
        draft_tokens[:nv] = np.where(np.arange(K)[None, :] < k[:, None], flat_ids[idx[:, 1:]], 0)
        num_draft[:nv] = k
    return dict(verify_idx=verify_idx, verify_row=verify_row, draft_tokens=draft_tokens, num_draft=num_draft)


# ---- pack_step: from the engine's columns, into per-bucket templates --------------------------------------------

_PAD = dict(prev_src=-1, slot_mapping=-1, top_k=-1, penalty_slot=-1, top_p=1.0, repetition_penalty=1.0)
_TEMPLATES: dict = {}  # Bucket -> (ints, floats, {field: (buffer index, offset, shape)})


def _template(bucket: Bucket):
    """The bucket's two flat buffers filled with every field's padding value (tile_tokens T, tile_seq and
    verify_row S, the fills above, zeros elsewhere), and where each field lies in them (HostBatch.flat's layout)."""
    t = _TEMPLATES.get(bucket)
    if t is None:
        shapes = field_shapes(bucket)
        pad = dict(_PAD, tile_tokens=bucket.num_tokens, tile_seq=bucket.num_seqs, verify_row=bucket.num_seqs)
        where, bufs = {}, []
        for b, names in enumerate((INT_FIELDS, FLOAT_FIELDS)):
            parts, off = [], 0
            for name in names:
                size = int(np.prod(shapes[name]))
                parts.append(np.full(size, pad.get(name, 0), np.int32 if b == 0 else np.float32))
                where[name] = (b, off, off + size, shapes[name] if len(shapes[name]) > 1 else None)
                off += size
            bufs.append(np.concatenate(parts))
        t = _TEMPLATES[bucket] = (bufs[0], bufs[1], where)
    return t


def pack_step(sb: StepBatch, bucket: Bucket, page_size: int) -> HostBatch:
    """Pack a StepBatch: copies of the bucket's padded template buffers, then only the live prefix of each field is
    written (gathers from the slot tables, numpy over sequences and tokens; no Python loop over sequences).
    A continuation (StepBatch.base, engine/input_batch.py) patches its base's packing instead: in a copy of it,
    or in place in the buffers of a packing of its line that the runner has released (release(): a pipelined
    runner's step before the one in flight), which skips the ~300 KB copy at batch 256 (probes/engine_host_steps.py:
    1.89 -> 1.58 M instructions a step, the copy counted one instruction a byte).
    The result equals pack() of the same sequences as SeqInputs (same errors for the same faults)."""
    T, S, NT, Bq, W = bucket.num_tokens, bucket.num_seqs, bucket.num_tiles, bucket.query_tile, bucket.table_width
    n_seqs = sb.num_seqs
    if n_seqs > S:
        raise ValueError(f"{n_seqs} sequences do not fit bucket {bucket}")
    lens, starts, rows = sb.lens, sb.starts, sb.rows
    n_pages = sb.num_pages[rows].astype(np.int64)
    if sb.base:
        last = _LAST.get(sb.base)
        # (_check_fits of one token a sequence, as many as the base's: a fault goes the full way, which raises)
        if (last is not None and last[0] == bucket and not last[1].released and n_pages.max() <= W
                and not (n_pages * page_size <= starts).any()):
            return _pack_continuation(sb, bucket, page_size, last, n_pages)
    offsets, n_tok = _check_fits(bucket, lens, starts, n_pages, page_size)
    ints_t, floats_t, where = _template(bucket)
    bufs = (ints_t.copy(), floats_t.copy())
    arrays = _views(bufs, where)
    view = arrays.__getitem__

    page_tables = view("page_tables")  # [S + 1, W]; row S and the rows past n_seqs stay 0 (reserved page)
    # columns past a row's pages are 0 (StepBatch invariant) as in the template: only the widest row's are copied
    # (at batch 256 and 4k context ~20 of 256 columns, and the gather and its copy were most of pack_step's bytes)
    w = min(W, sb.page_table.shape[1], int(n_pages.max()) if n_seqs else 0)
    page_tables[:n_seqs, :w] = sb.page_table[rows, :w]

    tok_seq = np.repeat(np.arange(n_seqs), lens)  # [n_tok] sequence of each token
    pos = np.arange(n_tok) - offsets[:-1][tok_seq] + starts[tok_seq]
    input_ids, prev_src = view("input_ids"), view("prev_src")
    input_ids[:n_tok] = sb.token_ids
    has_prev = sb.prev_row >= 0
    last = offsets[1:] - 1
    input_ids[last[has_prev]] = 0
    prev_src[last[has_prev]] = sb.prev_row[has_prev]
    view("positions")[:n_tok] = pos
    view("slot_mapping")[:n_tok] = page_tables[tok_seq, pos // page_size] * page_size + pos % page_size

    n_tiles = -(-lens // Bq)
    total_tiles = int(n_tiles.sum())
    if total_tiles > NT:
        raise AssertionError(f"{total_tiles} query tiles exceed the bucket's {NT}")  # impossible by construction
    if n_tok == n_seqs:  # every sequence one token (decodes): one tile each, its token in column 0
        tile_s = np.arange(n_seqs)
        view("tile_tokens")[:n_seqs, 0] = np.arange(n_seqs)
        view("tile_kv_len")[:n_seqs] = starts + 1
    else:
        tile_s = np.repeat(np.arange(n_seqs), n_tiles)  # [tiles] sequence of each tile
        tile_j = np.arange(total_tiles) - np.repeat(np.cumsum(n_tiles) - n_tiles, n_tiles)
        first = tile_j * Bq
        r = np.arange(Bq)[None, :]
        in_seq = first[:, None] + r < lens[tile_s][:, None]
        view("tile_tokens")[:total_tiles] = np.where(in_seq, offsets[:-1][tile_s][:, None] + first[:, None] + r, T)
        view("tile_kv_len")[:total_tiles] = starts[tile_s] + np.minimum(first + Bq, lens[tile_s])
    view("tile_seq")[:total_tiles] = tile_s

    view("sample_idx")[:n_seqs] = last
    view("step")[:n_seqs] = sb.step
    view("penalty_slot")[:n_seqs] = sb.penalty_slot
    cols = sb.sampling
    for name in ("temperature", "top_k", "top_p", "min_p", "want_logprobs", "presence_penalty", "frequency_penalty",
                 "repetition_penalty"):
        view(name)[:n_seqs] = cols[name][rows]
    arrays["seed"].view(np.uint32)[:n_seqs] = cols["seed"][rows]
    arrays["seed"] = arrays["seed"].view(np.uint32)
    ks = sb.num_spec
    if ks.any():  # (no drafts: the template's padding is what _verify_arrays gives)
        for name, a in _verify_arrays(ks, bucket, offsets, lens, sb.token_ids).items():
            arrays[name][...] = a
    hb = HostBatch(bucket, arrays, n_tok, n_seqs, offsets, bufs)
    if sb.serial:
        _remember(sb.serial, bucket, hb, w)
        if sb.root:
            hb.line, hb.w = (bucket, sb.root), w
    return hb


def _views(bufs, where) -> dict:
    """The fields as views into the two buffers (`seed` still int32: its caller views it as uint32)."""
    return {name: bufs[b][lo:hi] if shape is None else bufs[b][lo:hi].reshape(shape)
            for name, (b, lo, hi, shape) in where.items()}


# StepBatch.serial -> (bucket, HostBatch, w) of the latest few StepBatches with a serial packed (a few: engines
# sharing the process each find their own): the HostBatch's buffers are not written after packing until released
# (they may still be on their way to the device: only copied from here), and columns w: of its page_tables are 0.
_LAST: dict = {}
_LAST_SIZE = 4


# (_LAST's and _FREE's evictions under one lock: engines on two threads of a process would otherwise race on "the
# oldest" key; the lookups are single dict reads, and a line's list is only touched by its own engine's thread)
_LOCK = threading.Lock()


def _remember(serial: int, bucket: Bucket, hb: HostBatch, w: int) -> None:
    with _LOCK:
        _LAST.pop(serial, None)
        _LAST[serial] = (bucket, hb, w)
        while len(_LAST) > _LAST_SIZE:
            del _LAST[next(iter(_LAST))]  # the oldest (dicts keep insertion order)


def _pack_continuation(sb: StepBatch, bucket: Bucket, page_size: int, last: tuple, n_pages: np.ndarray) -> HostBatch:
    """pack_step of a continuation (StepBatch.base: the same sequences in the same slot rows as the step packed
    in `last`, one placeholder token each, no drafts, the same slot columns): a copy of that step's buffers with
    what changed rewritten: the changed page rows, the positions and what follows from them (slot_mapping,
    tile_kv_len), prev_src, step, penalty_slot. Everything else (input_ids, tiles, sample_idx, the sampling
    columns, the verify rows' padding) is equal by construction. Same result as the full packing (test:
    tests/engine/test_step_continuation.py); the fit checks ran before."""
    _, base, w_base = last
    n = sb.num_seqs
    line = (bucket, sb.root) if sb.root else None
    free = _FREE.get(line) if line is not None else None
    changed, rows = sb.changed, sb.rows
    if free:  # a released packing of this line: its page rows rewritten whole, no copy
        old = free.pop()
        bufs, arrays = old.buffers, old.arrays
        page_tables = arrays["page_tables"]
        w = min(bucket.table_width, sb.page_table.shape[1], max(old.w, int(n_pages.max())))
        page_tables[:n, :w] = sb.page_table[rows, :w]
    else:
        bufs = (base.buffers[0].copy(), base.buffers[1].copy())
        arrays = _views(bufs, _template(bucket)[2])
        arrays["seed"] = arrays["seed"].view(np.uint32)
        page_tables = arrays["page_tables"]
        w = w_base
        if changed is not None and changed.size:
            w = min(bucket.table_width, sb.page_table.shape[1], max(w_base, int(n_pages[changed].max())))
            # (a changed row's columns up to w: its new pages, then the zeros past them; w covers its old pages)
            page_tables[changed, :w] = sb.page_table[rows[changed], :w]
    starts = sb.starts
    arrays["positions"][:n] = starts
    arrays["tile_kv_len"][:n] = starts + 1
    ps = page_size
    if ps & (ps - 1) == 0:  # (a power of two: shift and mask, not numpy's integer division)
        shift = ps.bit_length() - 1
        arrays["slot_mapping"][:n] = (page_tables[:n][np.arange(n), starts >> shift] << shift) + (starts & (ps - 1))
    else:
        arrays["slot_mapping"][:n] = page_tables[:n][np.arange(n), starts // ps] * ps + starts % ps
    arrays["prev_src"][:n] = sb.prev_row
    arrays["step"][:n] = sb.step
    arrays["penalty_slot"][:n] = sb.penalty_slot
    hb = HostBatch(bucket, arrays, n, n, base.token_offsets, bufs, line, w)
    _remember(sb.serial, bucket, hb, w)
    return hb


# (bucket, root) -> HostBatches of that line of continuations whose runner released them (a few lines, two each:
# a pipelined engine has one step in flight, so the step before that one's buffers come back in time)
_FREE: dict = {}
_FREE_LINES, _FREE_EACH = 4, 2


def release(hb: HostBatch) -> None:
    """The runner is done with hb: the step it was packed for has run and its results were fetched, so nothing
    reads its buffers any more (the transfer to the device completed before the step could run; the arrays are
    not read after dispatch). A later continuation of the same line (pack_step) may then rewrite its buffers in
    place instead of copying 300 KB (batch 256: the page tables are most of it). Packings of no line, and
    packings released twice, are ignored; a HostBatch never released is never reused."""
    line = hb.line
    if line is None or hb.released:
        return
    hb.released = True
    with _LOCK:
        free = _FREE.pop(line, None) or []  # (re-inserted: the most recent line last, the oldest evicted first)
        if len(free) < _FREE_EACH:
            free.append(hb)
        _FREE[line] = free
        while len(_FREE) > _FREE_LINES:
            del _FREE[next(iter(_FREE))]
