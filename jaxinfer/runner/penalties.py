"""Presence / frequency / repetition penalties fed from a device-resident token-count table.

Why a table on the device: the penalty of a sequence's next token depends on every token it generated so far,
including the one the previous step (still in flight, see runner/step.py) is sampling; that token is unknown on
the host when the next step is packed. So the counts live on the device and each step adds its own sampled
tokens to them; the host never has to know the in-flight token.

State: `seen` i32[num_slots, V], one row ("slot") per sequence that uses penalties, value per token
    2 * (times generated) + (1 if in the prompt else 0)
so `seen >> 1` is the output count (frequency, presence) and `seen > 0` is "in prompt or output" (repetition,
vLLM semantics). The host (engine/penalty_slots.py) gives a slot to a penalised sequence when it is scheduled
without one (new, or re-admitted after preemption, when no token of it is in flight) and writes the row from
its known tokens (`host_row` + `write_row`, one compiled program); it frees the slot when the sequence
finishes, is aborted or is preempted. A batch row's `penalty_slot` is -1 for every row that does not sample
a penalised sequence.

Cost when no row of a step uses penalties: the [S, V] gather and penalty math sit under a lax.cond that is
skipped; the count update is a scatter of S elements whose indices are all out of range (dropped).

Semantics (vLLM v1, applied to the raw logits before temperature; logprobs stay those of the raw logits):
  repetition r: for tokens in prompt or output, logit / r if logit > 0 else logit * r
  frequency f, presence p: logit -= f * count + p * (count > 0)      (count: generated tokens only)
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxinfer.runner.branches import cond


def host_row(prompt_ids, output_ids, vocab_size: int) -> np.ndarray:
    """i32[V] row of the `seen` table for a sequence with these known tokens (numpy, host side)."""
    row = 2 * np.bincount(np.asarray(output_ids, np.int64), minlength=vocab_size).astype(np.int32)
    row[np.asarray(prompt_ids, np.int64)] |= 1
    return row


def write_row(seen: jax.Array, slot: jax.Array, row: jax.Array) -> jax.Array:
    """seen with row `slot` replaced by `row` (i32[V]); jit with seen donated: an in-place row update."""
    return lax.dynamic_update_slice(seen, row[None, :], (slot, jnp.int32(0)))


def apply_dense_penalties(logits: jax.Array, seen: jax.Array, presence: jax.Array, frequency: jax.Array,
                          repetition: jax.Array) -> jax.Array:
    """logits f32[S, V]; seen i32[S, V] (the table rows of the batch rows); penalties f32[S]."""
    count = (seen >> 1).astype(jnp.float32)
    rep = repetition.astype(jnp.float32)[:, None]
    x = jnp.where(seen > 0, jnp.where(logits > 0, logits / rep, logits * rep), logits)
    return x - frequency.astype(jnp.float32)[:, None] * count - presence.astype(jnp.float32)[:, None] * (
        count > 0).astype(jnp.float32)


def penalize(logits: jax.Array, seen_table: jax.Array, slot: jax.Array, presence: jax.Array,
             frequency: jax.Array, repetition: jax.Array) -> jax.Array:
    """Penalised logits f32[S, V]; rows with slot < 0 are returned unchanged (bit for bit). The whole
    computation is skipped (lax.cond) when no row has a slot."""
    active = slot >= 0  # [S]

    def on():
        seen = seen_table[jnp.maximum(slot, 0)]  # [S, V]
        pen = apply_dense_penalties(logits, seen, presence, frequency, repetition)
        return jnp.where(active[:, None], pen, logits)

    return cond(jnp.any(active), on, lambda: logits)


def count_sampled(seen_table: jax.Array, slot: jax.Array, tokens: jax.Array) -> jax.Array:
    """Add the tokens just sampled (i32[S]) to their rows' output counts; rows with slot < 0 are dropped."""
    n = seen_table.shape[0]
    rows = jnp.where(slot >= 0, slot, n)  # n: out of range -> dropped
    return seen_table.at[rows, tokens].add(2, mode="drop")
