"""The k autoregressive draft steps of a draft model as ONE compiled program (one pack, one host->device copy, one
launch, one device->host copy per proposal instead of k of each).

The draft proposer (runner/draft_proposer.py) used to dispatch k decode steps back to back, each packed on the
host (runner/batch.pack), copied and launched separately: on the tiny CPU model ~0.6 ms of host time per draft
step, k of them per speculative step, none of it overlapped with the target (a speculative step is not
pipelined). Here the batch of step 1 is packed once; the program runs the runner's own step function k times
(unrolled: straight-line code, the KV cache updated in place) and between steps advances the packed fields on the
device, which is possible because a draft step is decode-only: sequence i is token i, tile i and sampled row i.
Between step j-1 and step j, for every row i with j < k_i (its own number of drafts):
  positions[i] += 1; slot_mapping[i] = its page * page_size + offset of the new position;
  tile_kv_len[i] += 1; prev_src[i] = i (its input is step j-1's sampled token i, as the per-step path's prev_row).
Rows with j >= k_i (a sequence that wants fewer drafts than the longest) stop advancing and write no K/V (slot -1,
as padding tokens): their cache past their own k drafts is never touched and their extra outputs are dropped.
Greedy (temperature 0) like the per-step path; the tokens are identical to it (tests/numerics/test_draft_steps.py
compares both paths over several propose / rollback rounds).

Programs: one per decode bucket (T >= n tokens of n sequences) for exactly `num_steps` = k_max steps, compiled at
warm-up; a proposal whose longest request wants fewer drafts takes the per-step path (no extra programs).
Single-device runners only (a sharded draft would need the step's shardings on this program too).
"""
from __future__ import annotations

import math
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.outputs import SeqInput
from jaxinfer.runner.batch import INT_FIELDS, field_shapes, pack
from jaxinfer.runner.buckets import Bucket
from jaxinfer.runner.compile_options import compile_lowered, step_compiler_options
from jaxinfer.runner.step import stage_inputs


def _int_offsets(bucket: Bucket) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Field -> (offset, shape) in the int32 transfer buffer (runner/batch.py INT_FIELDS order)."""
    shapes, out, off = field_shapes(bucket), {}, 0
    for name in INT_FIELDS:
        out[name] = (off, shapes[name])
        off += math.prod(shapes[name])
    return out


def advance(ints: jax.Array, k_row: jax.Array, j: int, bucket: Bucket, page_size: int) -> jax.Array:
    """The packed int32 buffer of draft step j from that of step j - 1 (decode-only batch; k_row: i32[S] drafts
    wanted per row, 0 for padding rows)."""
    off = _int_offsets(bucket)
    T, S = bucket.num_tokens, bucket.num_seqs

    def get(name):
        o, shape = off[name]
        return ints[o:o + math.prod(shape)].reshape(shape)

    def put(buf, name, value):
        o, shape = off[name]
        return buf.at[o:o + math.prod(shape)].set(value.reshape(-1).astype(jnp.int32))

    t = jnp.arange(T)
    row = jnp.minimum(t, S - 1)
    go = (t < S) & (j < k_row[row])  # [T] tokens that take draft step j (token t is sequence t)
    pos = get("positions") + go  # [T]
    page = get("page_tables")[jnp.minimum(t, S), pos // page_size]  # [T] (row S is all zeros: page 0)
    slot = jnp.where(go, page * page_size + pos % page_size, -1)  # -1: written nowhere (write_kv_pages)
    tile_seq = get("tile_seq")  # [NT] (S = empty tile)
    tile_go = (tile_seq < S) & (j < k_row[jnp.minimum(tile_seq, S - 1)])
    ints = put(ints, "positions", pos)
    ints = put(ints, "slot_mapping", slot)
    ints = put(ints, "prev_src", jnp.where(go, t, -1))
    return put(ints, "tile_kv_len", get("tile_kv_len") + tile_go)


class FusedDraftSteps:
    """k greedy decode steps of a ModelRunner's model in one dispatch (the runner's step function, its KV cache
    and its buckets; single-device runners only)."""

    def __init__(self, runner, num_steps: int):
        if num_steps < 1:
            raise ValueError(f"num_steps={num_steps} must be >= 1")
        self.runner = runner
        self.num_steps = num_steps
        self.max_seqs = runner.config.scheduler.max_num_seqs
        step_fn, ps, max_seqs = runner._step, runner.page_size, self.max_seqs

        def draft_steps(params, kv_caches, ints_ext, floats, penalty_table, bucket):
            S = bucket.num_seqs
            ints, k_row = ints_ext[:-S], ints_ext[-S:]  # k_row: i32[S] drafts of each row (0 = padding)
            prev = jnp.zeros((max_seqs,), jnp.int32)
            tokens = []
            for j in range(num_steps):  # unrolled: k is small, and straight-line code updates the cache in place
                with jax.named_scope(f"draft_step_{j}"):
                    if j:
                        ints = advance(ints, k_row, j, bucket, ps)
                    kv_caches, out, _, penalty_table = step_fn(params, kv_caches, ints, floats, prev, penalty_table,
                                                               bucket=bucket, greedy_only=True)
                prev = out.tokens  # i32[max_num_seqs]: row i = sequence i's greedy token
                tokens.append(out.tokens)
            return kv_caches, jnp.stack(tokens), penalty_table  # [num_steps, max_num_seqs]

        def staged_draft_steps(params, kv_caches, ints_ext, floats, penalty_table, stage, bucket):
            ints_ext, floats, stage = stage_inputs(ints_ext, floats, stage)  # (runner/step.stage_inputs)
            return (*draft_steps(params, kv_caches, ints_ext, floats, penalty_table, bucket), stage)

        self.staged = runner.staged
        self._fn = (jax.jit(staged_draft_steps, donate_argnums=(1, 4, 5), static_argnames=("bucket",))
                    if self.staged else jax.jit(draft_steps, donate_argnums=(1, 4), static_argnames=("bucket",)))
        self._compiled: dict[Bucket, object] = {}

    def buckets(self) -> list[Bucket]:
        """The decode buckets a proposal of 1 .. max_num_seqs sequences can pick."""
        ladder = self.runner.ladder
        return sorted({ladder.pick(n, n) for n in range(1, self.max_seqs + 1)}, key=lambda b: b.num_tokens)

    def _program(self, bucket: Bucket):
        prog = self._compiled.get(bucket)
        if prog is None:
            r = self.runner
            ints, floats = r.placeholder_batch(bucket)
            spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype)  # noqa: E731
            n = ints.size + bucket.num_seqs
            stage = (r.stage_specs(n, floats.size),) if self.staged else ()
            lowered = self._fn.lower(r.step_params, r.kv_caches, spec((n,), np.int32),
                                     spec(floats.shape, np.float32), r.penalty_table, *stage, bucket=bucket)
            # the XLA options of the runner's own step of this bucket
            prog = self._compiled[bucket] = compile_lowered(lowered, step_compiler_options(bucket))
        return prog

    def warmup(self) -> None:
        for b in self.buckets():
            self._program(b)

    def dispatch(self, seqs: Sequence[SeqInput], ks: Sequence[int]) -> jax.Array:
        """Launch the steps for decode-only `seqs` (one token each: the last known token at its position),
        sequence i drafting ks[i] <= num_steps tokens. Returns the device array i32[num_steps, max_num_seqs]
        without waiting (row j, column i: sequence i's draft j + 1; columns past ks[i] rows are garbage)."""
        r, n = self.runner, len(seqs)
        if any(len(s.token_ids) != 1 for s in seqs) or not all(1 <= k <= self.num_steps for k in ks) or len(ks) != n:
            raise ValueError(f"fused draft steps take one token per sequence and 1..{self.num_steps} drafts each; "
                             f"got token counts {[len(s.token_ids) for s in seqs]}, drafts {list(ks)}")
        bucket = r.ladder.pick(n, n)
        batch = pack(seqs, bucket, r.page_size)
        ints, floats = batch.flat()
        k_row = np.zeros(bucket.num_seqs, np.int32)
        k_row[:n] = ks
        ints_ext = np.concatenate([ints, k_row])  # (numpy into the call: see ModelRunner.dispatch)
        prog, args = self._program(bucket), (r.step_params, r.kv_caches, ints_ext, floats, r.penalty_table)
        r.kv_caches, tokens, r.penalty_table = (r.call_staged(prog, ints_ext, floats, *args) if self.staged
                                                else prog(*args))
        return tokens

    @staticmethod
    def fetch(tokens: jax.Array) -> np.ndarray:
        """Wait for dispatch's tokens and copy them to the host: i32[num_steps, max_num_seqs]."""
        return np.asarray(jax.device_get(tokens))
