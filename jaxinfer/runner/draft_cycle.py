"""A draft model's whole proposal for a pipelined verification as ONE compiled program, launched between target step
n and target step n+1 without a host sync: its inputs come from step n's device carry (runner/spec_carry.py).

For each sequence i (its row r_i in target step n, the host's worst-case token count `base` before the drafts, and
its drafts k_i; s = carry[r_i, SHIFT] rejected drafts, so the actual count is b = base - s):
  step 1      two tokens [carry[r_i, PREV], carry[r_i, LAST]] at positions b-2, b-1: the catch-up of the one token
              a fully accepted verification leaves uncomputed (else an idempotent recompute of position b-2) folded
              into the first draft step; samples d_1 greedily at b-1;
  steps 2..k  one token each (d_{j-1} at position b+j-2), as runner/draft_steps.py; rows with j >= k_i write no
              K/V (slot -1) and their tokens are dropped;
then d_1..d_{k_i} go into carry[r_i, DRAFT:], the carry target step n+1 reads. Afterwards the draft has KV for
positions < b + k_i - 1, which covers the b' - 2 the next cycle needs (b' <= b + k_i + 1): no other catch-up is
needed while a request stays in consecutive cycles (runner/draft_proposer.py does the rest from the host).

Packing: both batches are packed on the host at the worst-case positions (runner/batch.pack: step 1 in bucket
pick(2n, n), steps 2..k in pick(n, n); at n = 1 under DraftCycle.small_pair from the runner's decode_ladder, whose
2- and 1-token buckets the draft runner's own ladder lacks on a GPU) and corrected on the device by s: positions,
slots (from the page table) and query-tile KV lengths. They travel as one int32 and one float32 array ([step 1's |
steps 2..k's + rows + k]), copied into the runner's donated stage buffers first when it stages its inputs
(runner/step.stage_inputs: the cycle's k steps are one CUDA graph, whose commands then keep their input addresses
from call to call).
Programs: one per n-bucket pair for exactly num_steps = k_max steps, compiled at warm-up.
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.outputs import SeqInput
from jaxinfer.runner.batch import FLOAT_FIELDS, INT_FIELDS, field_shapes, pack
from jaxinfer.runner.buckets import Bucket
from jaxinfer.runner.compile_options import compile_lowered, step_compiler_options
from jaxinfer.runner.spec_carry import DRAFT, LAST, PREV, SHIFT
from jaxinfer.runner.step import stage_inputs


class _Fields:
    """Named views/updates of a packed int32 buffer (runner/batch.py INT_FIELDS order)."""

    def __init__(self, bucket: Bucket):
        shapes, self.off, off = field_shapes(bucket), {}, 0
        for name in INT_FIELDS:
            self.off[name] = (off, shapes[name])
            off += math.prod(shapes[name])

    def get(self, ints, name):
        o, shape = self.off[name]
        return ints[o:o + math.prod(shape)].reshape(shape)

    def put(self, ints, name, value):
        o, shape = self.off[name]
        return ints.at[o:o + math.prod(shape)].set(value.reshape(-1).astype(jnp.int32))


def _flat_lengths(bucket: Bucket) -> tuple[int, int]:
    """Lengths of a bucket's packed (ints, floats) (runner/batch.py HostBatch.flat)."""
    shapes = field_shapes(bucket)
    return (sum(math.prod(shapes[n]) for n in INT_FIELDS), sum(math.prod(shapes[n]) for n in FLOAT_FIELDS))


def _shifted(ints, f: _Fields, bucket: Bucket, tok_seq, tok_delta, go, ps: int):
    """positions += tok_delta for tokens with go (else slot -1), slots from the page table, tile KV lengths moved
    by their sequence's delta (tiles of sequence i: tile_seq == i). tok_seq/tok_delta/go: [T]."""
    S = bucket.num_seqs
    pos = f.get(ints, "positions") + tok_delta
    page = f.get(ints, "page_tables")[jnp.minimum(tok_seq, S), pos // ps]
    slot = jnp.where(go, page * ps + pos % ps, -1)
    ints = f.put(ints, "positions", pos)
    ints = f.put(ints, "slot_mapping", slot)
    return ints


class DraftCycle:
    """k greedy draft steps (the first with the catch-up token folded in) of a ModelRunner's model, reading the
    target's carry, in one dispatch. Single-device runners only."""

    # A/B switch (off): batch 1's cycle in the draft runner's decode_ladder pair, a 2-token step 1 and 1-token steps
    # 2..k, instead of its ladder's (16, 16). Its one GPU measurement went the wrong way: H100, 8B target, int8 1B
    # draft, k = 4, a = 0.7, spec_speed.py at afe74e6 (the 8B's verify bucket on in both), 236.8 tok/s with the pair
    # against 272.1 without (results/spec-speed-draft-int8-onetok{,-off}-afe74e6-2026-12-06.json; one timed run a
    # row, in two processes). The in-process A/B (spec_speed.py --ab-min16, 12-06 g, 65dcd08, H100, median of 3, run
    # twice), after the int8 kernel stopped padding x below 16 rows (d1c89d6): 286.0 tok/s with the pair against
    # 290.8 without (results/spec-speed-draft-int8-onetok-ab-65dcd08-2026-12-06.json). The reason: the int8 1B step
    # takes 1.044 ms in its 1-token bucket and 1.052 ms in its 16-token one (step-profile-draft1b-t{1,16}-int8-*),
    # so a smaller bucket saves the draft nothing.
    small_pair = False

    def __init__(self, runner, num_steps: int):
        if num_steps < 1:
            raise ValueError(f"num_steps={num_steps} must be >= 1")
        self.runner, self.num_steps = runner, num_steps
        self.max_seqs = runner.config.scheduler.max_num_seqs
        step_fn, ps, K = runner._step, runner.page_size, num_steps

        def cycle(params, kv_caches, ints, floats, carry, penalty_table, b1, b2):
            """ints i32[n1 + n2 + 2 S2] = [step 1's | steps 2..k's | carry rows | k per sequence]; floats
            f32[m1 + m2] = [step 1's | steps 2..k's] (runner/batch.py's flat layouts of b1 and b2)."""
            n1, m1 = _flat_lengths(b1)
            ints1, ints2_ext, floats1, floats2 = ints[:n1], ints[n1:], floats[:m1], floats[m1:]
            S2, S1, T1, T2 = b2.num_seqs, b1.num_seqs, b1.num_tokens, b2.num_tokens
            ints2, rows, k_row = ints2_ext[:-2 * S2], ints2_ext[-2 * S2:-S2], ints2_ext[-S2:]
            M = carry.shape[0]
            live = rows < M  # [S2] real sequences
            rc = carry[jnp.minimum(rows, M - 1)]  # [S2, 3 + K]
            shift = jnp.where(live, rc[:, SHIFT], 0)
            # step 1: sequence i = tokens 2i, 2i+1
            f1, f2 = _Fields(b1), _Fields(b2)
            t = jnp.arange(T1)
            seq1 = jnp.minimum(t // 2, S2 - 1)
            go1 = (t < 2 * S2) & live[seq1] & (f1.get(ints1, "slot_mapping") >= 0)
            ints1 = _shifted(ints1, f1, b1, jnp.where(go1, t // 2, S1), -jnp.where(go1, shift[seq1], 0), go1, ps)
            ts1 = f1.get(ints1, "tile_seq")
            tile_live = ts1 < jnp.minimum(S1, S2)
            ints1 = f1.put(ints1, "tile_kv_len", f1.get(ints1, "tile_kv_len")
                           - jnp.where(tile_live, shift[jnp.minimum(ts1, S2 - 1)], 0))
            ids1 = jnp.where(go1, jnp.where(t % 2 == 0, rc[seq1, PREV], rc[seq1, LAST]), 0)
            ints1 = f1.put(ints1, "input_ids", ids1)
            no_prev = jnp.zeros((self.max_seqs,), jnp.int32)
            with jax.named_scope("draft_cycle_step_0"):
                kv_caches, out, _, penalty_table = step_fn(params, kv_caches, ints1, floats1, no_prev, penalty_table,
                                                           bucket=b1, greedy_only=True)
            tokens = [out.tokens]
            # steps 2..k: sequence i = token i, from the shifted base positions (packed at draft 1's worst position)
            t2 = jnp.arange(T2)
            seq2 = jnp.minimum(t2, S2 - 1)
            base_pos = f2.get(ints2, "positions") - jnp.where(t2 < S2, shift[seq2], 0)
            base_kv = f2.get(ints2, "tile_kv_len")
            ts2 = f2.get(ints2, "tile_seq")
            tseq2 = jnp.minimum(ts2, S2 - 1)
            for j in range(1, K):
                go = (t2 < S2) & live[seq2] & (j < k_row[seq2])
                x = f2.put(ints2, "positions", base_pos + (j - 1))
                x = _shifted(x, f2, b2, jnp.where(go, t2, S2), jnp.zeros_like(t2), go, ps)
                x = f2.put(x, "prev_src", jnp.where(go, t2, -1))
                tgo = (ts2 < S2) & live[tseq2] & (j < k_row[tseq2])
                x = f2.put(x, "tile_kv_len", jnp.where(tgo, base_kv - shift[tseq2] + (j - 1), 0))
                with jax.named_scope(f"draft_cycle_step_{j}"):
                    kv_caches, out, _, penalty_table = step_fn(params, kv_caches, x, floats2, out.tokens,
                                                               penalty_table, bucket=b2, greedy_only=True)
                tokens.append(out.tokens)
            d = jnp.stack(tokens, axis=1)[:S2]  # [S2, K]: sequence i's drafts
            d = jnp.where(jnp.arange(K)[None, :] < k_row[:, None], d, 0)
            carry = carry.at[jnp.where(live, rows, M), DRAFT:DRAFT + K].set(d, mode="drop")
            return kv_caches, carry, penalty_table

        def staged_cycle(params, kv_caches, ints, floats, carry, penalty_table, stage, b1, b2):
            ints, floats, stage = stage_inputs(ints, floats, stage)
            return (*cycle(params, kv_caches, ints, floats, carry, penalty_table, b1, b2), stage)

        self.staged = runner.staged
        self._fn = (jax.jit(staged_cycle, donate_argnums=(1, 5, 6), static_argnames=("b1", "b2")) if self.staged
                    else jax.jit(cycle, donate_argnums=(1, 5), static_argnames=("b1", "b2")))
        self._compiled: dict = {}

    def _buckets(self, n: int) -> tuple[Bucket, Bucket]:
        # batch 1 with small_pair: ModelRunner.decode_ladder (on a GPU its 2- and 1-token buckets for step 1 and
        # steps 2..k, below the draft runner's 16-token one); otherwise the runner's own ladder (no programs added)
        ladder = self.runner.decode_ladder if n == 1 and self.small_pair else self.runner.ladder
        return ladder.pick(2 * n, n), ladder.pick(n, n)

    def buckets(self) -> list[tuple[Bucket, Bucket]]:
        return sorted({self._buckets(n) for n in range(1, self.max_seqs + 1)}, key=lambda b: b[0].num_tokens)

    def _program(self, b1: Bucket, b2: Bucket, carry_shape):
        key = (b1, b2, carry_shape)
        prog = self._compiled.get(key)
        if prog is None:
            r = self.runner
            n, m = self._input_lengths(b1, b2)
            spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
            stage = (r.stage_specs(n, m),) if self.staged else ()
            lowered = self._fn.lower(r.step_params, r.kv_caches, spec((n,), np.int32), spec((m,), np.float32),
                                     spec(carry_shape, np.int32), r.penalty_table, *stage, b1=b1, b2=b2)
            prog = self._compiled[key] = compile_lowered(lowered, step_compiler_options(b1))
        return prog

    def warmup(self, carry_shape) -> None:
        for b1, b2 in self.buckets():
            self._program(b1, b2, tuple(carry_shape))

    def dispatch(self, carry, seqs: Sequence[tuple[int, int, Sequence[int], int]]):
        """seqs: (carry row, worst-case tokens before the drafts `base` >= 2, draft page table, k). Returns the
        carry with the drafts filled in (a device array; nothing waited for)."""
        r, n = self.runner, len(seqs)
        b1, b2 = self._buckets(n)
        first = [SeqInput([0, 0], base - 2, pt, 0.0) for _, base, pt, _ in seqs]
        rest = [SeqInput([0], base, pt, 0.0) for _, base, pt, _ in seqs]
        i1, f1 = pack(first, b1, r.page_size).flat()
        i2, f2 = pack(rest, b2, r.page_size).flat()
        M = carry.shape[0]
        rows = np.full(b2.num_seqs, M, np.int32)
        ks = np.zeros(b2.num_seqs, np.int32)
        rows[:n] = [row for row, _, _, _ in seqs]
        ks[:n] = [k for _, _, _, k in seqs]
        ints, floats = np.concatenate([i1, i2, rows, ks]), np.concatenate([f1, f2])  # (numpy into the call:
        prog = self._program(b1, b2, tuple(carry.shape))                             # see ModelRunner.dispatch)
        args = (r.step_params, r.kv_caches, ints, floats, carry, r.penalty_table)
        r.kv_caches, carry, r.penalty_table = r.call_staged(prog, ints, floats, *args) if self.staged else prog(*args)
        return carry

    @staticmethod
    def _input_lengths(b1: Bucket, b2: Bucket) -> tuple[int, int]:
        """Lengths of the cycle's two packed inputs: ints [b1's | b2's + 2 x b2's sequences], floats [b1's | b2's]."""
        (n1, m1), (n2, m2) = _flat_lengths(b1), _flat_lengths(b2)
        return n1 + n2 + 2 * b2.num_seqs, m1 + m2
