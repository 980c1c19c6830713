"""Speculative-decoding verification on the device: the target scores k + 1 positions of a request in one step.

A speculating request's chunk is [last token, d_1 .. d_k] (positions N-1 .. N-1+k). The target's logits at chunk
position j give p_j, its distribution of the token after d_j (p_0: after the last real token). Verification
(standard speculative sampling, Leviathan et al. 2023 / Chen et al. 2023):
  for j = 0 .. k-1: accept d_{j+1} with probability min(1, p_j(d_{j+1}) / q_j(d_{j+1}));
  at the first rejection j: emit a token from normalize(max(0, p_j - q_j)) and stop;
  if all k are accepted: emit a bonus token from p_k.
The emitted tokens are distributed exactly as k + 1 tokens sampled from the target one by one (lossless).

Greedy rows use p_j = one_hot(argmax logits_j): the rule then reduces to "accept the longest prefix of drafts equal
to the target's argmax, then the target's next argmax", with no randomness.

Drafts here are deterministic (n-gram lookup, a draft model's argmax): the proposal distribution q_j is the point
mass at d_{j+1}, so acceptance is p_j(d_{j+1}) and the residual is p_j with d_{j+1} removed, renormalised. That is
the same rule (rejection_sample takes a general q; the chi-square test drives it with a dense q).

Static shapes: R verify rows (a function of the bucket), K = num_speculative_tokens, V vocabulary.
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

from jaxinfer.runner.sampler import GREEDY_EPS

# Mixed into the key data so verification never draws the sampler's stream of the same (seed, step).
_STREAM_TAG = 0x5EC0DE00


class VerifyOutput(NamedTuple):
    tokens: jax.Array        # i32[R, K+1]: the first num_accepted + 1 are emitted
    num_accepted: jax.Array  # i32[R]: accepted drafts (0 .. num_draft)
    logprobs: jax.Array      # f32[R, K+1]: log-prob of each token under log_softmax(raw logits) (as the sampler)


def standard_accept(p_draft: jax.Array, q_draft: jax.Array, uniform: jax.Array) -> jax.Array:
    """Accept with probability min(1, p/q): u < p / q  <=>  u * q < p for u ~ U[0, 1). bool, shape of the inputs."""
    return uniform * q_draft < p_draft


def rejection_sample(p: jax.Array, q: jax.Array, draft: jax.Array, num_draft: jax.Array, uniform: jax.Array,
                     gumbel: jax.Array,
                     accept_rule: Callable[[jax.Array, jax.Array, jax.Array], jax.Array] = standard_accept,
                     ) -> tuple[jax.Array, jax.Array]:
    """The verification rule on probabilities.

    p f32[R, K+1, V]: target distributions at the k + 1 positions; q f32[R, K, V]: the distributions the drafts
    were drawn from; draft i32[R, K] (entries at j >= num_draft ignored); num_draft i32[R] in [0, K];
    uniform f32[R, K] in [0, 1); gumbel f32[R, K+1, V] standard Gumbel noise.
    accept_rule(p(d), q(d), u) -> accept mask; exposed so the statistical test can show that a biased rule fails.
    Returns (tokens i32[R, K+1], num_accepted i32[R]); tokens[:, :num_accepted + 1] are emitted.
    """
    R, K1, V = p.shape
    K = K1 - 1
    j = jnp.arange(K, dtype=jnp.int32)[None, :]
    valid = j < num_draft[:, None]                                                   # [R, K]
    d = jnp.clip(draft, 0, V - 1)
    p_d = jnp.take_along_axis(p[:, :K], d[..., None], axis=-1)[..., 0]              # [R, K]
    q_d = jnp.take_along_axis(q, d[..., None], axis=-1)[..., 0]
    accept = accept_rule(p_d, q_d, uniform) & valid
    num_accepted = jnp.sum(jnp.cumprod(accept.astype(jnp.int32), axis=1), axis=1)  # leading run of accepts

    # Replacement distribution at every position: the residual where a draft was checked, p at the bonus slot.
    j1 = jnp.arange(K1, dtype=jnp.int32)[None, :, None]
    q_pad = jnp.concatenate([q, jnp.zeros_like(q[:, :1])], axis=1)                  # [R, K+1, V]
    resid = jnp.where(j1 < num_draft[:, None, None], jnp.maximum(p - q_pad, 0.0), p)
    # A zero residual means p <= q everywhere, i.e. p == q: acceptance was certain; fall back to p (never used).
    resid = jnp.where(jnp.sum(resid, axis=-1, keepdims=True) > 0, resid, p)
    # Gumbel-max sampling from resid (log(0) = -inf is never picked)
    replacement = jnp.argmax(jnp.log(resid) + gumbel, axis=-1).astype(jnp.int32)  # [R, K+1]
    draft_pad = jnp.concatenate([d, jnp.zeros_like(d[:, :1])], axis=1)
    tokens = jnp.where(j1[..., 0] < num_accepted[:, None], draft_pad, replacement)
    return tokens.astype(jnp.int32), num_accepted.astype(jnp.int32)


def target_probs(logits: jax.Array, temperature: jax.Array) -> jax.Array:
    """f32[R, K+1, V] from raw logits: one_hot(argmax) for greedy rows, softmax(logits / T) otherwise."""
    V = logits.shape[-1]
    greedy = temperature < GREEDY_EPS
    t = jnp.where(greedy, 1.0, temperature)[:, None, None]
    soft = jax.nn.softmax(logits / t, axis=-1)
    hard = jax.nn.one_hot(jnp.argmax(logits, axis=-1), V, dtype=jnp.float32)
    return jnp.where(greedy[:, None, None], hard, soft)


def verify(logits: jax.Array, draft: jax.Array, num_draft: jax.Array, temperature: jax.Array, seed: jax.Array,
           step: jax.Array) -> VerifyOutput:
    """Verify deterministic drafts. logits f32[R, K+1, V] (raw target logits at the chunk's positions),
    draft i32[R, K], num_draft i32[R], temperature f32[R], seed u32[R], step i32[R] (index of the first token
    emitted): a row's randomness depends only on (seed, step), not on its row or its batch mates.
    Rows with top-k / top-p / min-p must not speculate (the engine does not send them here)."""
    R, K1, V = logits.shape
    logits = logits.astype(jnp.float32)
    p = target_probs(logits, temperature)
    q = jax.nn.one_hot(draft, V, dtype=jnp.float32)                                  # point masses [R, K, V]
    # One threefry key per row whose raw data is (seed, step) and one uniform draw per row for everything (the
    # uniforms of the acceptance tests and the Gumbel noise): far cheaper to compile than per-stream fold_ins.
    data = jnp.stack([seed.astype(jnp.uint32), step.astype(jnp.uint32) ^ jnp.uint32(_STREAM_TAG)], axis=-1)
    keys = jax.random.wrap_key_data(data, impl="threefry2x32")
    n_u = K1 - 1
    u = jax.vmap(lambda k: jax.random.uniform(k, (n_u + K1 * V,), minval=jnp.finfo(jnp.float32).tiny))(keys)
    uniform = u[:, :n_u]                                                             # [R, K] in (0, 1)
    gumbel = -jnp.log(-jnp.log(u[:, n_u:].reshape(R, K1, V)))                        # [R, K+1, V]
    tokens, num_accepted = rejection_sample(p, q, draft, num_draft, uniform, gumbel)
    logp = jax.nn.log_softmax(logits, axis=-1)
    logprobs = jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]
    return VerifyOutput(tokens, num_accepted, logprobs)
