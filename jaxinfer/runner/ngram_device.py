"""N-gram (prompt lookup) drafts made on the device, so that n-gram speculation pipelines
(engine/spec_pipeline.py): the drafts of step n+1 are computed from step n's device carry (runner/spec_carry.py)
right after schedule(), with no host sync.

The same lookup as the host proposer (engine/ngram_proposer.ngram_propose): match the last n tokens (n from max_n
down to min_n, n <= length - 1) against every earlier window inside the last LOOKBACK tokens, take the most recent
match and propose the up to k tokens that followed it (fewer when the history ends first, none without a match).
Tested equal to the host function on random histories (tests/test_ngram_device.py).

History buffer hist i32[max_num_seqs, max_model_len]: one slot per live request (slot -> request id on the host).
Invariant at a propose_device call for a request (row r of the step n in flight, host's worst-case count `base`
before the new drafts, k_n = drafts step n verifies, L = base - 1 - k_n tokens known on the host, s = carry[r, SHIFT],
b = base - s the actual count): after the call, hist[slot, :b] is the request's true token sequence, because
  [synced, L)   the host's known tokens not yet written (the prompt on a request's first call), a small host write;
  [L, b - 1)    step n's accepted drafts: written at [L, L + k_n) by the call that proposed them (this program,
                or the host proposer's `propose` for a step without one in flight, written here from the host);
  b - 1         step n's last token, carry[r, LAST], written on the device.
The new drafts go into carry[r, DRAFT:] and into hist[slot, b : b + k] (accepted ones become history next step).
A row with fewer than k drafts found still verifies k: the missing drafts are 0 (verification is exact whatever the
drafts, so outputs are unaffected; the k positions are computed anyway, as a pipelined step's shape is fixed by
the host before the drafts exist).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.runner.spec_carry import DRAFT, LAST, SHIFT

LOOKBACK = 4096  # = ngram_propose's default max_lookback (the host proposer's window)


def ngram_lookup(hist: jax.Array, length: jax.Array, num_drafts: int, min_n: int, max_n: int,
                 lookback: int = LOOKBACK) -> tuple[jax.Array, jax.Array]:
    """hist i32[P, L] (row p's tokens are hist[p, :length[p]]; the rest is ignored), length i32[P] ->
    (drafts i32[P, num_drafts], found i32[P]): row p's drafts are drafts[p, :found[p]] (0 after them), equal to
    ngram_propose(hist[p, :length[p]], num_drafts, min_n, max_n, lookback)."""
    P, L = hist.shape
    s = jnp.arange(L, dtype=jnp.int32)[None, :]  # [1, L] candidate window starts
    N = jnp.minimum(length, lookback)  # [P] tokens searched
    lo = (length - N)[:, None]  # [P, 1] first searched position
    found = jnp.zeros((P,), bool)
    start = jnp.zeros((P,), jnp.int32)
    for n in range(max_n, min_n - 1, -1):  # longest first
        match = jnp.ones((P, L), bool)
        for j in range(n):
            tail_j = jnp.take_along_axis(hist, jnp.clip(length - n + j, 0, L - 1)[:, None], axis=1)  # [P, 1]
            shifted = jnp.pad(hist[:, j:], ((0, 0), (0, j)), constant_values=-1)  # [P, L]: hist[p, s + j]
            match = match & (shifted == tail_j)
        # windows inside the searched tokens, ending before the last token (the tail itself is excluded)
        ok = match & (s >= lo) & (s <= (length - n - 1)[:, None])
        last = jnp.max(jnp.where(ok, s, -1), axis=1)  # [P] most recent match
        hit = ~found & (n <= N - 1) & (last >= 0)
        start = jnp.where(hit, last + n, start)
        found = found | hit
    pos = start[:, None] + jnp.arange(num_drafts, dtype=jnp.int32)[None, :]  # [P, K]
    avail = found[:, None] & (pos < length[:, None])
    drafts = jnp.where(avail, jnp.take_along_axis(hist, jnp.minimum(pos, L - 1), axis=1), 0)
    return drafts, avail.sum(axis=1).astype(jnp.int32)


@jax.jit
def _write(hist, slots, pos, toks):
    """hist with hist[slots[i], pos[i]] = toks[i] (slots[i] = hist rows: padding, dropped). i32[W] each."""
    return hist.at[slots, pos].set(toks, mode="drop")


def _cycle(hist, carry, rows, slots, base, ks, *, min_n, max_n, lookback):
    """One pipelined proposal: rows i32[P] (carry rows; M = padding), slots i32[P] (hist rows), base i32[P]
    (worst-case tokens before the drafts), ks i32[P] (drafts wanted) -> (hist, carry)."""
    M, K = carry.shape[0], carry.shape[1] - DRAFT
    H, L = hist.shape
    live = rows < M
    r = jnp.minimum(rows, M - 1)
    b = base - jnp.where(live, carry[r, SHIFT], 0)  # [P] actual tokens before the drafts
    slot = jnp.where(live, slots, H)  # H: dropped
    hist = hist.at[slot, b - 1].set(carry[r, LAST], mode="drop")
    d, _ = ngram_lookup(hist[jnp.minimum(slot, H - 1)], b, K, min_n, max_n, lookback)  # [P, K]
    j = jnp.arange(K, dtype=jnp.int32)[None, :]
    use = live[:, None] & (j < ks[:, None])
    d = jnp.where(use, d, 0)
    carry = carry.at[jnp.where(live, rows, M), DRAFT:].set(d, mode="drop")
    hist = hist.at[jnp.where(use, slot[:, None], H), b[:, None] + j].set(d, mode="drop")
    return hist, carry


def _pad_len(n: int) -> int:
    return max(64, 1 << (n - 1).bit_length())


class DeviceNgramProposer:
    """The proposer protocol (engine/spec_control.py) for method "ngram" with a device draft source: host `propose`
    (the injected host proposer, for steps with nothing in flight) and `propose_device` (pipelined steps)."""

    needs_model = False

    def __init__(self, host: Any, max_num_seqs: int, max_model_len: int, num_speculative_tokens: int):
        """host: engine/ngram_proposer.NgramProposer (its min_n / max_n are used here too)."""
        self.host = host
        self.min_n, self.max_n, self.K = host.min_n, host.max_n, num_speculative_tokens
        # committed to the device like the runner's carry (single-device runners), so warm-up compiles the same
        # program as the steps use
        self._device = jax.devices()[0]
        self.hist = jax.device_put(np.zeros((max_num_seqs, max_model_len), np.int32), self._device)
        self._free_slots = list(range(max_num_seqs - 1, -1, -1))
        self._slot: dict[str, int] = {}
        self._synced: dict[str, int] = {}  # request id -> hist[slot, :synced] holds its known tokens
        self._pending: dict[str, tuple[int, list[int]]] = {}  # host drafts (first position, tokens) to write
        self._fn = jax.jit(_cycle, donate_argnums=(0,), static_argnames=("min_n", "max_n", "lookback"))

    def warmup(self, progress=None) -> None:
        """Compile the proposal program (the target's carry shape) and every host-write size (64 .. all slots
        full), running them on padding (no effect)."""
        M, L = self.hist.shape
        carry = jax.device_put(np.zeros((M, DRAFT + self.K), np.int32), self._device)
        pad = np.full(M, M, np.int32)
        self.hist, _ = self._fn(self.hist, carry, pad, pad, np.ones(M, np.int32), np.zeros(M, np.int32),
                                min_n=self.min_n, max_n=self.max_n, lookback=LOOKBACK)
        W = 64
        while W <= _pad_len(M * L):
            self.hist = _write(self.hist, np.full(W, M, np.int32), np.zeros(W, np.int32), np.zeros(W, np.int32))
            W *= 2

    def propose(self, seqs: Sequence[tuple[str, Sequence[int], int]]) -> dict[str, list[int]]:
        out = self.host.propose(seqs)
        for rid, toks, _ in seqs:
            if out.get(rid):
                self._pending[rid] = (len(toks), list(out[rid]))
        return out

    def propose_device(self, flight, todo):
        """todo: engine/spec_pipeline.device_drafts' rows (request id, carry row, base, k, k_n, known tokens fn) ->
        the flight with its carry's draft columns filled (nothing waited for)."""
        M = self.hist.shape[0]
        wr_s: list[int] = []
        wr_p: list[int] = []
        wr_t: list[int] = []
        rows, slots, base, ks = [], [], [], []
        for rid, row, n, k, k_n, tokens in todo:
            slot = self._slot.get(rid)
            if slot is None:
                if not self._free_slots:
                    continue  # (cannot happen: at most max_num_seqs requests run) no drafts: zeros verified
                slot = self._slot[rid] = self._free_slots.pop()
            known = n - 1 - k_n
            syn = self._synced.get(rid, 0)
            if syn < known:
                toks = tokens()[syn:known]
                wr_s += [slot] * len(toks)
                wr_p += range(syn, syn + len(toks))
                wr_t += toks
                self._synced[rid] = known
            pend = self._pending.pop(rid, None)
            if pend is not None and k_n and pend[0] == known and len(pend[1]) >= k_n:
                wr_s += [slot] * k_n
                wr_p += range(known, known + k_n)
                wr_t += pend[1][:k_n]
            rows.append(row)
            slots.append(slot)
            base.append(n)
            ks.append(k)
        if wr_s:
            W = _pad_len(len(wr_s))
            pad = lambda xs, v: np.asarray(list(xs) + [v] * (W - len(xs)), np.int32)  # noqa: E731
            self.hist = _write(self.hist, pad(wr_s, M), pad(wr_p, 0), pad(wr_t, 0))
        if not rows:
            return flight
        carry = flight.carry if flight.carry is not None else flight.out.carry
        P = carry.shape[0]
        pad = lambda xs, v: np.asarray(list(xs) + [v] * (P - len(xs)), np.int32)  # noqa: E731
        self.hist, carry = self._fn(self.hist, carry, pad(rows, P), pad(slots, M), pad(base, 1), pad(ks, 0),
                                    min_n=self.min_n, max_n=self.max_n, lookback=LOOKBACK)
        return dataclasses.replace(flight, carry=carry)

    def rollback(self, request_id: str, num_valid_tokens: int) -> None:
        pass  # hist past a request's length is ignored; the host's known tokens never shrink while it runs

    def free(self, request_id: str) -> None:
        slot = self._slot.pop(request_id, None)
        if slot is not None:
            self._free_slots.append(slot)
        self._synced.pop(request_id, None)
        self._pending.pop(request_id, None)
