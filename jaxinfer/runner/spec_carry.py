"""The device carry of pipelined speculative steps: what step n leaves on the device so that step n+1 can be packed
and dispatched before the host has read how many of step n's drafts were accepted.

Carry layout, i32[max_num_seqs, 3 + K] (K = num_speculative_tokens), row r = step n's sequence r:
  [:, LAST]   the last token row r emitted (its sampled token, or a verification's last accepted/bonus token)
  [:, PREV]   the token before it (the draft model's catch-up needs both)
  [:, SHIFT]  rejected drafts of row r (num_draft - num_accepted; 0 for rows that did not verify)
  [:, DRAFT:] draft tokens for row r's next verification, written by a device draft source (TableDrafts here, the
              draft model's cycle program) between step n and step n+1; zeros otherwise
Without speculation the step's carry is its tokens i32[max_num_seqs] (the plain pipelining of step.py).

Optimistic scheduling (engine/spec_pipeline.py): the host schedules step n+1 as if every draft of step n were
accepted: positions, slots and pages for the worst case, and the sampling step index (RNG) of the worst case.
Step n+1's program then corrects on the device, for every sequence whose last token is a placeholder of step n's
row r (prev_src >= 0 at its sampled token), by s = carry[r, SHIFT]:
  positions -= s (every token of the sequence), slot_mapping recomputed from its page table at the new positions,
  tile_kv_len -= s for its query tiles, step -= s;
and for a verify row of such a sequence: its chunk [last, d_1 .. d_k] gets last = carry[r, LAST] and
d_j = carry[r, DRAFT + j - 1] as input ids and as the drafts verified. The host's pages cover the worst case, so
the shifted writes land in pages the sequence owns; the host rolls its own counters back one step late.
Invariant: a sequence continued this way is a decode (one placeholder token) or a verification chunk (placeholder
+ k device drafts); the host never continues a multi-token prefill chunk from a carry with a shift.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

LAST, PREV, SHIFT, DRAFT = 0, 1, 2, 3


def carry_width(num_spec_tokens: int) -> int:
    return DRAFT + num_spec_tokens


def _seq_of_token(b: dict, T: int) -> jax.Array:
    """i32[T] sequence of each token (from the query tiles; padding tokens map to 0 and are masked by the caller)."""
    tt = b["tile_tokens"]  # [NT, Bq], padding = T
    seqs = jnp.broadcast_to(b["tile_seq"][:, None], tt.shape)
    return jnp.zeros((T,), jnp.int32).at[tt.reshape(-1)].set(seqs.reshape(-1), mode="drop")


def apply_carry(b: dict, carry: jax.Array, bucket, page_size: int) -> tuple[dict, jax.Array]:
    """(corrected batch fields, input ids) of step n+1 from its packed fields `b` and step n's carry.
    carry: i32[M] (plain pipelining: tokens only) or i32[M, 3 + K] (speculative)."""
    src = b["prev_src"]
    if carry.ndim == 1:
        return b, jnp.where(src >= 0, carry[jnp.maximum(src, 0)], b["input_ids"])
    T, S, R = bucket.num_tokens, bucket.num_seqs, bucket.spec_rows
    input_ids = jnp.where(src >= 0, carry[jnp.maximum(src, 0), LAST], b["input_ids"])
    r_seq = src[b["sample_idx"]]  # [S] step-n row each sequence continues (-1: none)
    shift = jnp.where(r_seq >= 0, carry[jnp.maximum(r_seq, 0), SHIFT], 0)  # [S]
    b = dict(b)
    valid = b["slot_mapping"] >= 0  # [T] real tokens
    tok_seq = _seq_of_token(b, T)
    tok_shift = jnp.where(valid, shift[tok_seq], 0)
    pos = b["positions"] - tok_shift
    page = b["page_tables"][tok_seq, pos // page_size]
    b["slot_mapping"] = jnp.where(tok_shift > 0, page * page_size + pos % page_size, b["slot_mapping"])
    b["positions"] = pos
    ts = b["tile_seq"]
    b["tile_kv_len"] = b["tile_kv_len"] - jnp.where(ts < S, shift[jnp.minimum(ts, S - 1)], 0)
    b["step"] = b["step"] - shift
    if R:
        K = bucket.spec_len
        vrow = b["verify_row"]  # [R] (S = padding)
        r_v = jnp.where(vrow < S, r_seq[jnp.minimum(vrow, S - 1)], -1)  # [R] carry row of each verify row
        piped = r_v >= 0
        row_c = carry[jnp.maximum(r_v, 0)]  # [R, 3 + K]
        drafts = row_c[:, DRAFT:DRAFT + K]  # [R, K]
        j = jnp.arange(K)[None, :]
        use = piped[:, None] & (j < b["num_draft"][:, None])
        b["draft_tokens"] = jnp.where(use, drafts, b["draft_tokens"])
        idx = b["verify_idx"]  # [R, K+1]
        first = jnp.where(piped, idx[:, 0], T)  # T: dropped
        input_ids = input_ids.at[first].set(row_c[:, LAST], mode="drop")
        input_ids = input_ids.at[jnp.where(use, idx[:, 1:], T)].set(drafts, mode="drop")
    return b, input_ids


def make_carry(tokens: jax.Array, input_ids: jax.Array, b: dict, spec, bucket, width: int) -> jax.Array:
    """Step n's carry i32[M, width]: tokens i32[M] (verified rows' last emitted token already in place), the step's
    input ids (after apply_carry), its batch fields and verification outputs (spec_tokens [R, K+1], num_accepted
    [R], _)."""
    M, S, R = tokens.shape[0], bucket.num_seqs, bucket.spec_rows
    carry = jnp.zeros((M, width), jnp.int32).at[:, LAST].set(tokens)
    prev = jnp.zeros((M,), jnp.int32).at[:S].set(input_ids[b["sample_idx"]])
    shift = jnp.zeros((M,), jnp.int32)
    if R:
        spec_tokens, num_acc = spec[0], spec[1]
        before = jnp.take_along_axis(spec_tokens, jnp.maximum(num_acc - 1, 0)[:, None], axis=1)[:, 0]
        p = jnp.where(num_acc > 0, before, input_ids[b["verify_idx"][:, 0]])
        vrow = b["verify_row"]  # padding rows (S) are dropped below when S == M; masked to M otherwise
        vrow = jnp.where(vrow < S, vrow, M)
        prev = prev.at[vrow].set(p, mode="drop")
        shift = shift.at[vrow].set(b["num_draft"] - num_acc, mode="drop")
    return carry.at[:, PREV].set(prev).at[:, SHIFT].set(shift)


@jax.jit
def _fill_from_table(carry, table, rows, slots, base, ks):
    """carry with row rows[p]'s draft columns = table[slots[p], n : n + ks[p]], n = base[p] - its shift (rows[p] = M:
    padding, dropped). rows/slots/base/ks: i32[P]."""
    M, K = carry.shape[0], carry.shape[1] - DRAFT
    r = jnp.minimum(rows, M - 1)
    n = base - carry[r, SHIFT]  # [P] actual tokens before the drafts
    j = jnp.arange(K)[None, :]
    pos = jnp.minimum(n[:, None] + j, table.shape[1] - 1)
    d = jnp.where(j < ks[:, None], table[slots[:, None], pos], 0)
    return carry.at[rows, DRAFT:].set(d, mode="drop")


class TableDrafts:
    """A device draft source reading drafts from a per-request token table on the device: the benchmark's oracle
    (benchmarks/spec_speed.py) and the tests. table i32[slots, L]: slot i's full token sequence (prompt +
    continuation); a row's drafts are table[slot, n : n + k] where n is its actual token count (the host's
    worst-case count minus the carry's shift). One small program per call (one compile per carry shape and table
    shape: the rows are padded to the carry's), no host sync."""

    def __init__(self, table, num_spec_tokens: int):
        self.table = jnp.asarray(table, jnp.int32)
        self.K = num_spec_tokens

    def fill(self, carry: jax.Array, rows, slots, base, ks) -> jax.Array:
        import numpy as np

        M = carry.shape[0]
        P = M  # every call the same shapes: one program
        pad = lambda xs, v: np.asarray(list(xs) + [v] * (P - len(xs)), np.int32)  # noqa: E731
        return _fill_from_table(carry, self.table, pad(rows, M), pad(slots, 0), pad(base, 0), pad(ks, 0))


class TableProposer:
    """The proposer protocol (engine/spec_control.py) over TableDrafts, device drafts only (`propose_device`; no
    host `propose`): tables[request_id] = that request's token sequence (prompt + the continuation to draft from).
    Drafts past the end of a sequence are 0."""

    def __init__(self, tables: dict, num_spec_tokens: int, width: int | None = None):
        import numpy as np

        self.slots = {rid: i for i, rid in enumerate(tables)}
        L = width or max(len(t) for t in tables.values()) + num_spec_tokens
        table = np.zeros((max(1, len(tables)), L), np.int32)
        for rid, i in self.slots.items():
            t = list(tables[rid])[:L]
            table[i, :len(t)] = t
        self.drafts = TableDrafts(table, num_spec_tokens)

    def propose_device(self, flight, todo):
        """todo: [(request id, its row in the step in flight, worst-case tokens before the drafts, k, ...)] -> the flight
        with a carry whose draft columns are filled (no host sync)."""
        import dataclasses

        rows, slots, base, ks = [], [], [], []
        for rid, row, n, k, *_ in todo:
            rows.append(row)
            slots.append(self.slots.get(rid, 0))
            base.append(n)
            ks.append(k if rid in self.slots else 0)
        carry = flight.carry if flight.carry is not None else flight.out.carry
        return dataclasses.replace(flight, carry=self.drafts.fill(carry, rows, slots, base, ks))

    def rollback(self, request_id: str, num_valid_tokens: int) -> None:
        pass

    def free(self, request_id: str) -> None:
        pass
