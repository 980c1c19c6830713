"""On-device token sampling: penalties, greedy, temperature, top-k / top-p / min-p, logprobs.

Everything here is pure jnp / lax, jittable with static S (rows, a bucket size) and V (vocabulary size), and
has no Python branching on traced values. One row = one sampled sequence.

Order of operations per row (vLLM v1 semantics):
  raw logits  --> logprobs / top-20 logprobs  (of log_softmax(raw): before penalties and temperature, as vLLM's
                                               default "raw_logprobs")
  raw logits  --> penalties (repetition, then frequency, then presence)
              --> temperature < GREEDY_EPS: argmax (greedy)
              --> else logits / T, then min-p, top-k, top-p filtering, then a draw with the row's own PRNG key.

Filtering semantics (p = softmax(logits / T) over the full vocabulary, ranks by descending p):
  min-p : keep i iff p_i >= min_p * max(p)                   (min_p == 0 -> off)
  top-k : keep the top_k highest-ranked tokens               (top_k <= 0 or top_k >= V -> off; ties at the
                                                              boundary: one of them, as lax.top_k picks)
  top-p : over A = tokens kept by min-p and top-k, renormalised (q_i = p_i / sum_A p), keep i iff the mass of
          the tokens ranked above it is < top_p (the smallest prefix whose mass reaches top_p; the top token is
          always kept)                                       (top_p >= 1 -> off)
This matches vLLM (min-p on the full distribution, then top-k, then top-p on the renormalised remainder).

Three sampling paths, all EXACT (they draw from exactly the distribution above, up to float32 rounding):
  * "full"  : top-k off and top-p off. Gumbel-max over all V tokens (min-p is a mask there). No sort.
              Runs under lax.cond only when some row needs it.
  * "fast"  : every other row, using the MAX_TOP_K_FAST = 256 candidates from _top_k (no sort). It is exact
              whenever the kept set lies inside the candidates, i.e. top_k <= 256, or (top-k off) the candidates
              in A carry at least top_p of A's mass. The normaliser sum_A p is computed over the full vocabulary,
              so the top-p cutoff is exact.
  * "exact" : rows the fast path cannot serve exactly (top_k > 256, or top-k off with top-p needing more than
              256 tokens): full-vocabulary sort (lax.sort) under lax.cond, which runs only when some row needs it.

Randomness: row key = jax.random.fold_in(jax.random.key(seed), step), so the same (seed, step) gives the same
token whatever the row index or the batch mates. The host must give every sequence its own seed (a request
with n > 1 needs distinct seeds per sequence, else its sequences are identical).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxinfer.runner.branches import cond
from jaxinfer.runner.penalties import penalize

MAX_TOP_K_FAST = 256  # candidates taken by lax.top_k on the fast path
MAX_LOGPROBS = 20  # top logprobs always returned per row (so asking for logprobs never recompiles)
GREEDY_EPS = 1e-5  # temperature below this is greedy (vLLM's _SAMPLING_EPS)

# Field defaults for a real request (SamplingParams defaults) and for padded rows (greedy, cheap, no penalty).
_ROW_DEFAULTS: dict[str, Any] = dict(
    temperature=1.0, top_k=-1, top_p=1.0, min_p=0.0, seed=None, step=0,
    presence_penalty=0.0, frequency_penalty=0.0, repetition_penalty=1.0,
)
_PAD_ROW: dict[str, Any] = dict(_ROW_DEFAULTS, temperature=0.0, seed=0)
_DTYPES: dict[str, Any] = dict(
    temperature=np.float32, top_k=np.int32, top_p=np.float32, min_p=np.float32, seed=np.uint32, step=np.int32,
    presence_penalty=np.float32, frequency_penalty=np.float32, repetition_penalty=np.float32,
)
_host_rng = np.random.default_rng()  # seeds for requests that have none (non-reproducible, as in vLLM)


def _row_get(row: Any, name: str) -> Any:
    """A field of a row given as a Mapping or as an object with attributes (e.g. SamplingParams)."""
    value = row.get(name, None) if isinstance(row, Mapping) else getattr(row, name, None)
    return _ROW_DEFAULTS[name] if value is None and name != "seed" else value


class SamplingTensors(NamedTuple):
    """Per-row sampling parameters, S rows (a pytree; pass it straight into a jitted function)."""

    temperature: Any  # f32[S]; < GREEDY_EPS means greedy (padded rows: 0)
    top_k: Any  # i32[S]; <= 0 (or >= V) means off
    top_p: Any  # f32[S]; >= 1 means off
    min_p: Any  # f32[S]; 0 means off
    seed: Any  # u32[S]; Python seeds are taken modulo 2**32
    step: Any  # i32[S]; the sequence's number of generated tokens so far (the key is fold_in(key(seed), step))
    presence_penalty: Any  # f32[S]; 0 = off
    frequency_penalty: Any  # f32[S]; 0 = off
    repetition_penalty: Any  # f32[S]; 1 = off

    @classmethod
    def from_rows(cls, rows: Sequence[Any], S: int) -> "SamplingTensors":
        """Host-side (numpy only, never compiles): build S-row tensors from `rows`, padded with greedy rows.

        Each row is a Mapping or an object with the field names above (e.g. a SamplingParams plus `step`);
        missing or None fields take the SamplingParams defaults (step 0). seed None draws a fresh random seed
        (non-reproducible, as vLLM does without a seed).
        """
        if len(rows) > S:
            raise ValueError(f"SamplingTensors.from_rows got {len(rows)} rows for S={S}; use a larger bucket S")
        cols: dict[str, list] = {name: [] for name in cls._fields}
        for row in rows:
            for name in cls._fields:
                cols[name].append(_row_get(row, name))
            seed = cols["seed"][-1]
            cols["seed"][-1] = int(_host_rng.integers(0, 2**32)) if seed is None else int(seed) & 0xFFFFFFFF
            if not 0 <= int(cols["step"][-1]) < 2**31:
                raise ValueError(f"step={cols['step'][-1]} out of range [0, 2**31)")
        for name in cls._fields:
            cols[name].extend([_PAD_ROW[name]] * (S - len(rows)))
        return cls(**{name: np.asarray(cols[name], dtype=_DTYPES[name]) for name in cls._fields})


class SamplerOutput(NamedTuple):
    tokens: jax.Array  # i32[S] sampled token per row
    logprobs: jax.Array  # f32[S] log_softmax(raw logits)[token]
    top_ids: jax.Array  # i32[S, MAX_LOGPROBS] most likely tokens of the raw distribution, best first (-1 pad if V<20)
    top_logprobs: jax.Array  # f32[S, MAX_LOGPROBS] their log-probabilities (-inf pad if V < 20)


def apply_penalties(logits: jax.Array, t: SamplingTensors, penalty_ids: jax.Array,
                    penalty_counts: jax.Array) -> jax.Array:
    """Repetition (HF), frequency and presence (OpenAI) penalties, without a [S, V] count matrix.

    logits f32[S, V]; penalty_ids i32[S, P]: distinct token ids per row, padded with -1 (P static);
    penalty_counts i32[S, P]: how many times each was generated.
      repetition (HF/vLLM): for every listed id, logit / r if logit > 0 else logit * r. It applies to every listed
        id, count 0 included, so the host decides what "seen" means: generated tokens only (list just those), or
        vLLM's prompt + generated (also list the prompt tokens with count 0).
      then logit -= frequency * count + presence * (count > 0)   (OpenAI; count 0 -> no effect).
    Ids must be distinct within a row (padding -1 may repeat). Rows with all-neutral penalties are unchanged
    bit for bit (the same values are written back).
    """
    S, V = logits.shape
    ids = penalty_ids.astype(jnp.int32)
    counts = penalty_counts.astype(jnp.int32)
    valid = (ids >= 0) & (ids < V)
    seen = jnp.take_along_axis(logits, jnp.where(valid, ids, 0), axis=1)  # [S, P]
    rep = t.repetition_penalty.astype(jnp.float32)[:, None]
    seen = jnp.where(seen > 0, seen / rep, seen * rep)
    seen = (seen - t.frequency_penalty.astype(jnp.float32)[:, None] * counts.astype(jnp.float32)
            - t.presence_penalty.astype(jnp.float32)[:, None] * (counts > 0).astype(jnp.float32))
    rows = jnp.arange(S, dtype=jnp.int32)[:, None]
    return logits.at[rows, jnp.where(valid, ids, V)].set(seen, mode="drop")  # id V (padding) is dropped


def _chunk_size(V: int, k: int) -> int:
    """Chunk width for _top_k: the power of two nearest below sqrt(V / k) (balances the two small top-k's);
    1 means "call lax.top_k directly" (small V)."""
    c = 1
    while (2 * c) ** 2 * k <= V:
        c *= 2
    return c if c >= 4 else 1


def _top_k(x: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """Exact top-k along the last axis, as lax.top_k(x, k) (same values, descending; among equal values the
    index chosen may differ), but without a top_k over the whole row.

    Why: XLA on GPU lowers lax.top_k to a full segmented sort (cub) even for small k: measured on an H200 (jax 0.11.2)
    at S=256, V=128256: top_k(k=20 or 256) 2.3 ms, the same as a full sort. Here: the row is cut into chunks of C;
    the k chunks with the largest maxima hold the k largest values (any chunk outside them has k chunks whose
    maxima, k distinct elements, are >= all of its elements), so top_k runs on the [S, V/C] chunk maxima and on
    the [S, k*C] gathered chunks only.
    """
    S, V = x.shape
    C = _chunk_size(V, k)
    n = -(-V // C)
    if C == 1 or n <= k:
        return lax.top_k(x, k)
    if n * C != V:  # pad with -inf to whole chunks; padded ids are clamped below (they only win with -inf value)
        x = jnp.pad(x, ((0, 0), (0, n * C - V)), constant_values=-jnp.inf)
    xr = x.reshape(S, n, C)
    _, chunk = lax.top_k(jnp.max(xr, axis=-1), k)  # [S, k] chunk ids
    gathered = jnp.take_along_axis(xr, chunk[:, :, None], axis=1).reshape(S, k * C)
    vals, pos = lax.top_k(gathered, k)  # [S, k]
    idx = jnp.take_along_axis(chunk, pos // C, axis=1) * C + pos % C
    return vals, jnp.minimum(idx, V - 1).astype(jnp.int32)


def _row_keys(seed: jax.Array, step: jax.Array) -> jax.Array:
    """Typed PRNG key per row: fold_in(key(seed), step). key[S]."""
    return jax.vmap(lambda s, n: jax.random.fold_in(jax.random.key(s), n))(
        seed.astype(jnp.uint32), step.astype(jnp.uint32))


def _gumbel(keys: jax.Array, n: int) -> jax.Array:
    """f32[S, n] standard Gumbel noise, row i drawn from keys[i] only."""
    return jax.vmap(lambda k: jax.random.gumbel(k, (n,), jnp.float32))(keys)


def _excl_cumsum(q: jax.Array) -> jax.Array:
    """Mass strictly before each position along the last axis (exclusive cumsum)."""
    c = jnp.cumsum(q, axis=-1)
    return jnp.concatenate([jnp.zeros_like(c[:, :1]), c[:, :-1]], axis=-1)


def _filter_sorted(vals: jax.Array, t: SamplingTensors, thr: jax.Array, k_on: jax.Array, p_on: jax.Array,
                   lse_full_a: jax.Array | None) -> tuple[jax.Array, jax.Array]:
    """Min-p / top-k / top-p keep-mask for logits sorted descending, vals f32[S, W] (W = K candidates or V).

    thr f32[S]: min-p threshold in logit space. A = tokens kept by min-p and top-k. lse_full_a f32[S]: log of A's
    mass over the whole vocabulary for top-k-off rows (A may reach past the candidates), or None when vals is the
    whole vocabulary. With top-k on (top_k <= W) A lies inside vals and its mass is summed here.
    Returns (keep bool[S, W], mass of A's part inside vals relative to A's total, f32[S]).
    """
    rank = jnp.arange(vals.shape[1], dtype=jnp.int32)[None, :]
    in_a = (vals >= thr[:, None]) & (~k_on[:, None] | (rank < t.top_k[:, None]))
    lse_in = jax.nn.logsumexp(jnp.where(in_a, vals, -jnp.inf), axis=-1)
    log_norm = lse_in if lse_full_a is None else jnp.where(k_on, lse_in, lse_full_a)
    q = jnp.where(in_a, jnp.exp(vals - log_norm[:, None]), 0.0)
    keep = in_a & (~p_on[:, None] | (_excl_cumsum(q) < t.top_p[:, None]))
    return keep, jnp.sum(q, axis=-1)


def _sample_random(x: jax.Array, t: SamplingTensors, greedy: jax.Array) -> jax.Array:
    """i32[S] tokens for the non-greedy rows (greedy rows get an arbitrary value). x: penalised logits [S, V]."""
    S, V = x.shape
    K = min(MAX_TOP_K_FAST, V)
    temp = jnp.where(greedy, 1.0, t.temperature.astype(jnp.float32))
    scaled = x / temp[:, None]
    keys = _row_keys(t.seed, t.step)
    k_on = (t.top_k > 0) & (t.top_k < V)
    p_on = t.top_p < 1.0
    cand_l, cand_i = _top_k(scaled, K)  # [S, K] descending
    # min-p: p_i >= min_p * p_max  <=>  l_i >= l_max + log(min_p); -inf (keep all) when min_p <= 0.
    min_p = t.min_p.astype(jnp.float32)
    thr = jnp.where(min_p > 0, cand_l[:, 0] + jnp.log(jnp.maximum(min_p, 1e-30)), -jnp.inf)

    # Fast path. A = min-p set (∩ top-k). With top-k on (<= K) A is inside the candidates; otherwise A's mass
    # is taken over the whole vocabulary so the top-p cutoff is exact.
    lse_full_a = jax.nn.logsumexp(jnp.where(scaled >= thr[:, None], scaled, -jnp.inf), axis=-1)
    keep, cand_mass = _filter_sorted(cand_l, t, thr, k_on, p_on, lse_full_a)
    choice = jnp.argmax(jnp.where(keep, cand_l + _gumbel(keys, K), -jnp.inf), axis=-1)
    tokens = jnp.take_along_axis(cand_i, choice[:, None], axis=1)[:, 0]

    # Full path: top-k and top-p off -> Gumbel-max over the whole vocabulary (min-p as a mask). Exact, no sort.
    full_row = ~greedy & ~k_on & ~p_on

    def full_fn() -> jax.Array:
        z = jnp.where(scaled >= thr[:, None], scaled + _gumbel(keys, V), -jnp.inf)
        return jnp.argmax(z, axis=-1).astype(jnp.int32)

    full_tok = cond(jnp.any(full_row), full_fn, lambda: jnp.zeros((S,), jnp.int32))
    tokens = jnp.where(full_row, full_tok, tokens)

    # Exact path: top_k > K, or top-k off and the candidates hold less than top_p of A's mass (the top-p set
    # reaches past the candidates). Full sort, only when some row needs it.
    exact_row = ~greedy & ((k_on & (t.top_k > K)) | (~k_on & p_on & (cand_mass < t.top_p)))

    def exact_fn() -> jax.Array:
        iota = lax.broadcasted_iota(jnp.int32, (S, V), 1)
        neg, idx = lax.sort((-scaled, iota), dimension=1, num_keys=1)  # descending by logit
        vals = -neg
        keep_e, _ = _filter_sorted(vals, t, thr, k_on, p_on, None)
        pos = jnp.argmax(jnp.where(keep_e, vals + _gumbel(keys, V), -jnp.inf), axis=-1)
        return jnp.take_along_axis(idx, pos[:, None], axis=1)[:, 0]

    exact_tok = cond(jnp.any(exact_row), exact_fn, lambda: jnp.zeros((S,), jnp.int32))
    return jnp.where(exact_row, exact_tok, tokens).astype(jnp.int32)


def sample(logits: jax.Array, t: SamplingTensors, *, penalty_ids: jax.Array | None = None,
           penalty_counts: jax.Array | None = None, penalty_table: jax.Array | None = None,
           penalty_slot: jax.Array | None = None,
           want_top_logprobs: jax.Array | None = None, greedy_only: bool = False) -> SamplerOutput:
    """Sample one token per row. logits f32[S, V] (any float dtype; computed in f32), t: S-row SamplingTensors.

    penalty_ids / penalty_counts i32[S, P] (see apply_penalties), or None to skip penalties at trace time.
    penalty_table i32[num_slots, V] / penalty_slot i32[S]: the engine's device-resident counts (runner/penalties.py);
    rows with slot -1 are not penalised, and the penalty math is skipped (lax.cond) when no row has a slot.
    want_top_logprobs: bool scalar (traced): False skips the top-20 logprobs (returned as zeros) — they cost a
    chunked top-k over the vocabulary (~0.1-0.3 ms on an H200 at 128k vocab) that most steps do not need.
    The random path (top-k candidates, Gumbel noise) likewise runs only when some row samples. These skips are
    runner/branches.cond: lax.cond on the CPU, both branches + select on GPU (a GPU conditional makes the host wait
    for the device at dispatch). greedy_only (static): every row greedy, no penalties, no top logprobs.
    """
    S, V = logits.shape
    raw = logits.astype(jnp.float32)
    lse_raw = jax.nn.logsumexp(raw, axis=-1)  # [S]
    n_lp = min(MAX_LOGPROBS, V)
    if greedy_only:
        # Static: the host promises every row is greedy, unpenalised and asks no top logprobs (runner/step.py
        # compiles this variant beside the general one on GPU): argmax and its logprob, nothing else.
        tokens = jnp.argmax(raw, axis=-1).astype(jnp.int32)
        logprobs = jnp.take_along_axis(raw, tokens[:, None], axis=1)[:, 0] - lse_raw
        return SamplerOutput(tokens=tokens, logprobs=logprobs, top_ids=jnp.zeros((S, MAX_LOGPROBS), jnp.int32),
                             top_logprobs=jnp.zeros((S, MAX_LOGPROBS), jnp.float32))

    def top_fn():
        top_vals, top_ids = _top_k(raw, n_lp)
        top_logprobs = top_vals - lse_raw[:, None]
        if n_lp < MAX_LOGPROBS:  # static: tiny vocabularies only
            top_ids = jnp.pad(top_ids, ((0, 0), (0, MAX_LOGPROBS - n_lp)), constant_values=-1)
            top_logprobs = jnp.pad(top_logprobs, ((0, 0), (0, MAX_LOGPROBS - n_lp)), constant_values=-jnp.inf)
        return top_ids.astype(jnp.int32), top_logprobs

    if want_top_logprobs is None:
        top_ids, top_logprobs = top_fn()
    else:
        top_ids, top_logprobs = cond(
            want_top_logprobs, top_fn,
            lambda: (jnp.zeros((S, MAX_LOGPROBS), jnp.int32), jnp.zeros((S, MAX_LOGPROBS), jnp.float32)))

    x = raw
    if penalty_ids is not None:
        if penalty_counts is None:
            raise ValueError("penalty_ids given without penalty_counts; pass both (i32[S, P]) or neither")
        x = apply_penalties(x, t, penalty_ids, penalty_counts)
    if penalty_table is not None:
        x = penalize(x, penalty_table, penalty_slot, t.presence_penalty, t.frequency_penalty,
                     t.repetition_penalty)

    greedy = t.temperature < GREEDY_EPS
    random_tokens = cond(jnp.all(greedy), lambda: jnp.zeros((S,), jnp.int32),
                             lambda: _sample_random(x, t, greedy))
    tokens = jnp.where(greedy, jnp.argmax(x, axis=-1).astype(jnp.int32), random_tokens)
    logprobs = jnp.take_along_axis(raw, tokens[:, None], axis=1)[:, 0] - lse_raw
    return SamplerOutput(tokens=tokens, logprobs=logprobs, top_ids=top_ids, top_logprobs=top_logprobs)
