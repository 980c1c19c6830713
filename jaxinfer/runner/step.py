"""The jitted step: (params, kv_caches, ints, floats, prev_tokens, penalty_table)
    -> (kv_caches, sampled tokens + logprobs, hidden, penalty_table).

One program per bucket (on GPU two: `greedy_only=True` for steps whose rows are all greedy, unpenalised and ask
no top logprobs, and the general one; runner/sampler.py). The KV cache (a list of per-layer (k_pages, v_pages))
and the penalty token-count table (runner/penalties.py) are donated and updated in place; nothing else is donated.
Only small arrays (token ids, logprobs) are meant to travel back to the host; the
final hidden states stay on the device for the (rare) prompt-logprob pass.

Pipelining: decode tokens sampled by the previous step (still in flight when this step was packed) are taken
from that step's device output `prev_tokens` (i32[max_num_seqs]) through `batch["prev_src"]`, so the host never
waits for step n before dispatching step n+1. Sampled tokens are padded to max_num_seqs rows for that reason. With `carry_width` > 0 (speculation on)
`prev_tokens` is instead the previous step's carry i32[max_num_seqs, carry_width] (runner/spec_carry.py): a
speculative step n+1 is then dispatched before step n's accepted counts are known, and corrects its positions and
takes its input tokens and drafts from it.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.models.attention import AttentionMetadata, AttentionOptions
from jaxinfer.runner import param_arena
from jaxinfer.runner.batch import FLOAT_FIELDS, INT_FIELDS, field_shapes
from jaxinfer.runner.penalties import count_sampled
from jaxinfer.runner.sampler import MAX_LOGPROBS, SamplingTensors, sample
from jaxinfer.runner.spec_carry import apply_carry, make_carry
from jaxinfer.runner.spec_decode import verify


class StepOutput(NamedTuple):
    tokens: jax.Array        # i32[max_num_seqs] (rows >= S are padding)
    logprobs: jax.Array      # f32[S]   log-prob of the sampled token (raw model distribution)
    top_ids: jax.Array       # i32[S, MAX_LOGPROBS]
    top_logprobs: jax.Array  # f32[S, MAX_LOGPROBS]
    # speculative decoding (R = bucket.spec_rows verify rows; R = 0 when off): runner/spec_decode.py
    spec_tokens: jax.Array   # i32[R, K+1]
    num_accepted: jax.Array  # i32[R]
    spec_logprobs: jax.Array  # f32[R, K+1]
    # What the host reads back after every step, in ONE int32 array (one device->host copy, not up to five):
    # [tokens (max_num_seqs) | logprobs' bits (S) | num_accepted (R) | spec_tokens (R*(K+1)) | spec_logprobs' bits]
    # (float32 bit patterns travel as int32; unpack_host_outputs reads it back)
    host: jax.Array
    # Pipelined speculation (runner/spec_carry.py): what the next step reads instead of `tokens`, i32[M, 3 + K]
    # (carry_width > 0), else `tokens` itself.
    carry: jax.Array


def _metadata(b: dict) -> AttentionMetadata:
    return AttentionMetadata(b["positions"], b["slot_mapping"], b["tile_tokens"], b["tile_seq"], b["tile_kv_len"],
                             b["page_tables"])


def _sampling(b: dict) -> SamplingTensors:
    return SamplingTensors(
        temperature=b["temperature"], top_k=b["top_k"], top_p=b["top_p"], min_p=b["min_p"], seed=b["seed"],
        step=b["step"], presence_penalty=b["presence_penalty"], frequency_penalty=b["frequency_penalty"],
        repetition_penalty=b["repetition_penalty"])


def unflatten_batch(ints, floats, bucket) -> dict:
    """Split the two transfer buffers (runner/batch.py) back into named fields; static slices, free in XLA."""
    shapes = field_shapes(bucket)
    out, off = {}, 0
    for name in INT_FIELDS:
        size = math.prod(shapes[name])
        out[name] = ints[off:off + size].reshape(shapes[name])
        off += size
    out["seed"] = jax.lax.bitcast_convert_type(out["seed"], jnp.uint32)
    off = 0
    for name in FLOAT_FIELDS:
        size = math.prod(shapes[name])
        out[name] = floats[off:off + size].reshape(shapes[name])
        off += size
    return out


def stage_inputs(ints, floats, stage):
    """Copy this step's packed inputs into the donated stage buffers and read them from there: (ints, floats,
    stage'). ints i32[n], floats f32[m]; stage (i32[n + 1], f32[m + 1]), one element longer than the inputs, so
    XLA keeps the write an in-place update of the donated buffer (a write of the whole buffer is replaced by the
    new array, which the consumers would then read: XLA:CPU's optimized HLO, benchmarks/README.md 2026-12-04 d),
    and behind an optimization barrier, so the slices below are not simplified back to the inputs.

    Why (H200, probes/call_trace.py, 2026-12-04 d): the step runs as a CUDA graph (XLA command buffers), and
    every command whose buffers moved since the last call is updated before the launch. The inputs are a fresh
    transfer every step, and the commands reading them (every layer's attention and KV writes) cost 0.5-0.8 ms
    of `command_buffer::update` a call; the same inputs at fixed addresses made the call 1.2-1.35 ms instead of
    2.6-2.9. Read from the stage, only this copy's command moves."""
    si = jax.lax.dynamic_update_slice(stage[0], ints, (0,))
    sf = jax.lax.dynamic_update_slice(stage[1], floats, (0,))
    si, sf = jax.lax.optimization_barrier((si, sf))
    return si[: ints.shape[0]], sf[: floats.shape[0]], (si, sf)


def stage_shapes(num_ints: int, num_floats: int):
    """The stage buffers' (shape, dtype) pairs for packed inputs of these lengths (stage_inputs)."""
    return ((num_ints + 1,), jnp.int32), ((num_floats + 1,), jnp.float32)


def make_step_fn(loaded, opts: AttentionOptions, max_num_seqs: int, kv_shardings=None, donate: bool = True,
                 carry_width: int = 0, page_size: int = 0, arena=None, staged: bool = False):
    """Build the jitted step for a LoadedModel. The graphdef/treedef are closed over (static); so is the bucket,
    which fixes the layout of the two transfer buffers. carry_width > 0 (speculation): steps pass each other the
    carry of runner/spec_carry.py (tokens per KV page: page_size). arena: the runner's param_arena.Arena (the step
    then takes its params packed: param_arena.pack), or None (the flat list). staged (single device only): the
    jitted function takes one more donated argument after penalty_table, the stage buffers (stage_inputs), and
    returns their next value last; the unstaged form is the one other programs inline (runner/draft_*.py).

    With a sharding plan (loaded.plan) the shardings are fixed once: weights keep the shardings they were loaded
    with, the KV cache `kv_shardings` (list of (k, v) per layer), and the batch, sampled tokens and final hidden
    states are replicated over the replica's devices."""

    if carry_width and page_size < 1:
        raise ValueError(f"carry_width={carry_width} needs page_size >= 1, got {page_size}")

    def step(params, kv_caches, ints, floats, prev_tokens, penalty_table, bucket, greedy_only=False):
        batch = unflatten_batch(ints, floats, bucket)
        model = loaded.module(param_arena.unpack(params, arena))
        batch, input_ids = apply_carry(batch, prev_tokens, bucket, page_size)
        hidden, kv_caches = model(input_ids, kv_caches, _metadata(batch), opts)
        S, R, K = bucket.num_seqs, bucket.spec_rows, bucket.spec_len
        # Sampled rows and verified positions share one head matmul (one read of the vocabulary weights).
        rows = batch["sample_idx"] if not R else jnp.concatenate([batch["sample_idx"], batch["verify_idx"].reshape(-1)])
        all_logits = model.logits(hidden[rows])  # [S + R*(K+1), V] f32
        if loaded.plan is not None:
            # Vocab-parallel LM head: each device computes its vocab columns, then the logits are gathered once
            # ([S, V] f32) and sampled replicated. Unconstrained, the sampler's sorts become all-to-alls; with
            # only the replicated constraint XLA may all-gather the LM-head weight instead.
            all_logits = jax.lax.with_sharding_constraint(
                all_logits, loaded.plan.sharding((None, "vocab"), all_logits.shape))
            all_logits = jax.lax.with_sharding_constraint(all_logits, loaded.plan.replicated)
        slot = batch["penalty_slot"]
        out = sample(all_logits[:S], _sampling(batch), penalty_table=penalty_table, penalty_slot=slot,
                     want_top_logprobs=jnp.any(batch["want_logprobs"] > 0), greedy_only=greedy_only)
        # The sampled tokens count for the next step's penalties, even before the host sees them (pipelining).
        # (Penalised requests never speculate: engine/spec_control.py.)
        penalty_table = count_sampled(penalty_table, slot, out.tokens)
        tokens = jnp.zeros((max_num_seqs,), jnp.int32).at[: out.tokens.shape[0]].set(out.tokens)
        spec = _verify(all_logits[S:].reshape(R, K + 1, -1) if R else None, batch, bucket)
        if bucket.spec_rows:
            # A verified row's last emitted token stands in for its sampled token (a pipelined next step reads it).
            spec_tokens, num_accepted, _ = spec
            last = jnp.take_along_axis(spec_tokens, num_accepted[:, None], axis=1)[:, 0]
            tokens = tokens.at[batch["verify_row"]].set(last, mode="drop")  # padding rows (S) are dropped
        bits = lambda x: jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.int32).reshape(-1)  # noqa: E731
        host = jnp.concatenate([tokens, bits(out.logprobs), spec[1], spec[0].reshape(-1), bits(spec[2])])
        carry = make_carry(tokens, input_ids, batch, spec, bucket, carry_width) if carry_width else tokens
        return (kv_caches, StepOutput(tokens, out.logprobs, out.top_ids, out.top_logprobs, *spec, host, carry),
                hidden, penalty_table)

    donated = (1, 5) if donate else ()  # donate=False: probes only (the KV cache is then copied every step)
    if staged:
        if loaded.plan is not None:
            raise ValueError("staged step inputs are for single-device runners")

        def staged_step(params, kv_caches, ints, floats, prev_tokens, penalty_table, stage, bucket,
                        greedy_only=False):
            ints, floats, stage = stage_inputs(ints, floats, stage)
            return (*step(params, kv_caches, ints, floats, prev_tokens, penalty_table, bucket, greedy_only), stage)

        return jax.jit(staged_step, donate_argnums=donated + (6,), static_argnames=("bucket", "greedy_only"))
    if loaded.plan is None:
        return jax.jit(step, donate_argnums=donated, static_argnames=("bucket", "greedy_only"))
    # Input shardings are those of the arguments (weights as loaded, the cache as allocated, the batch placed
    # replicated by the runner); the AOT-compiled program of a bucket then rejects anything else.
    rep = loaded.plan.replicated
    return jax.jit(step, donate_argnums=donated, static_argnames=("bucket", "greedy_only"),
                   out_shardings=(kv_shardings, StepOutput(*([rep] * len(StepOutput._fields))), rep, rep))


def unpack_host_outputs(host: np.ndarray, max_num_seqs: int, num_seqs: int, spec_rows: int, spec_width: int):
    """StepOutput.host (copied to the host) -> tokens i32[max_num_seqs], logprobs f32[S], num_accepted i32[R],
    spec_tokens i32[R, W], spec_logprobs f32[R, W] (views, no copies; W = K+1, or 1 when R = 0)."""
    M, S, R, K1 = max_num_seqs, num_seqs, spec_rows, spec_width
    a, b = M + S, M + S + R
    return (host[:M], host[M:a].view(np.float32), host[a:b], host[b:b + R * K1].reshape(R, K1),
            host[b + R * K1:].view(np.float32).reshape(R, K1))


def _verify(logits, batch, bucket):
    """The acceptance rule on the target's logits at the K + 1 positions of each verify row, [R, K+1, V]
    (empty outputs when R = 0)."""
    if not bucket.spec_rows:
        return jnp.zeros((0, 1), jnp.int32), jnp.zeros((0,), jnp.int32), jnp.zeros((0, 1), jnp.float32)
    S = bucket.num_seqs
    row = jnp.minimum(batch["verify_row"], S - 1)  # padding rows borrow row S-1's settings; their result is unused
    return tuple(verify(logits, batch["draft_tokens"], batch["num_draft"], batch["temperature"][row],
                        batch["seed"][row], batch["step"][row]))


def make_prompt_logprobs_fn(loaded):
    """(params, hidden [T, H], targets i32[T]) -> (logprob of each target f32[T], top ids/logprobs [T, 20]).

    Run only for steps that hold a request asking for prompt_logprobs; compiled per bucket at warm-up.
    """

    def fn(params, hidden, targets):
        model = loaded.module(params)
        logp = jax.nn.log_softmax(model.logits(hidden), axis=-1)  # [T, V]
        chosen = jnp.take_along_axis(logp, targets[:, None], axis=-1)[:, 0]
        top_lp, top_ids = jax.lax.top_k(logp, MAX_LOGPROBS)
        return chosen, top_ids.astype(jnp.int32), top_lp

    if loaded.plan is None:
        return jax.jit(fn)
    rep = loaded.plan.replicated
    return jax.jit(fn, in_shardings=([p.sharding for p in loaded.params], rep, rep), out_shardings=rep)
