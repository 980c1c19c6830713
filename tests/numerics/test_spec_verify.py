"""Speculative verification rule (runner/spec_decode.py): greedy against a brute-force loop, and losslessness
checked statistically: the tokens it emits are distributed as the target's p. A deliberately wrong acceptance
rule must fail the same test, so the test is known to have the power to see a biased implementation.

Chi-square tests use significance ALPHA = 1e-3 with fixed PRNG keys (deterministic). With N = 40,000 draws over
6 tokens the biased rules below are off by several percent of probability mass, far beyond what the test
tolerates (their p-values are < 1e-30)."""
import jax
import jax.numpy as jnp
import numpy as np
from scipy import stats

from jaxinfer.runner.spec_decode import rejection_sample, standard_accept, verify

ALPHA = 1e-3
N = 40_000

# Target p at the k + 1 = 3 positions and a dense draft q at the k = 2 drafted positions (V = 6).
P = np.array([[0.40, 0.25, 0.15, 0.10, 0.06, 0.04],
              [0.05, 0.10, 0.50, 0.20, 0.10, 0.05],
              [0.30, 0.30, 0.10, 0.10, 0.10, 0.10]])
Q = np.array([[0.10, 0.50, 0.10, 0.10, 0.10, 0.10],
              [0.30, 0.10, 0.10, 0.10, 0.20, 0.20]])


def _draws(accept_rule, n=N, seed=0):
    """n independent verifications: drafts drawn from Q (each row its own), the rule applied with fresh noise."""
    rng = np.random.default_rng(seed)
    K, V = Q.shape
    draft = np.stack([rng.choice(V, size=n, p=Q[j]) for j in range(K)], axis=1).astype(np.int32)
    p = jnp.broadcast_to(jnp.asarray(P, jnp.float32), (n, K + 1, V))
    q = jnp.broadcast_to(jnp.asarray(Q, jnp.float32), (n, K, V))
    u = rng.random((n, K), dtype=np.float32)
    g = rng.gumbel(size=(n, K + 1, V)).astype(np.float32)
    tokens, m = jax.jit(lambda *a: rejection_sample(*a, accept_rule=accept_rule))(
        p, q, draft, jnp.full((n,), K, jnp.int32), u, g)
    return np.asarray(tokens), np.asarray(m), np.asarray(draft)


def _pvalue(samples, probs):
    counts = np.bincount(samples, minlength=len(probs))
    return stats.chisquare(counts, probs * counts.sum()).pvalue


def _first_and_second(accept_rule):
    """p-values of: the first emitted token ~ p_0; the second (emitted iff draft 1 accepted, i.e. the first token
    is d_1) ~ p_1 (the target's distribution after that prefix; p_1 does not depend on the prefix here)."""
    tokens, m, _ = _draws(accept_rule)
    first = _pvalue(tokens[:, 0], P[0])
    second = _pvalue(tokens[m >= 1, 1], P[1])
    return first, second


def test_rejection_sampling_is_lossless():
    first, second = _first_and_second(standard_accept)
    assert first > ALPHA and second > ALPHA, (first, second)


def test_wrong_acceptance_rules_fail():
    # accept with p(d) instead of min(1, p(d)/q(d)); and always accept
    for wrong in (lambda pd, qd, u: u < pd, lambda pd, qd, u: jnp.ones_like(u, bool)):
        first, _ = _first_and_second(wrong)
        assert first < 1e-30, first


def test_point_mass_drafts_through_verify():
    """verify() as the step calls it: deterministic drafts (q = one hot), temperature-scaled target logits. The
    first token must follow softmax(logits_0 / T); greedy rows must not depend on the noise."""
    rng = np.random.default_rng(0)
    V, K, T = 7, 3, 0.8
    base = rng.normal(size=(K + 1, V)).astype(np.float32) * 1.5
    draft = np.argsort(-base[:K], axis=1)[:, 1].astype(np.int32)  # each draft is the target's 2nd choice
    n = 20_000
    logits = jnp.broadcast_to(jnp.asarray(base), (n, K + 1, V))
    out = jax.jit(verify)(logits, jnp.broadcast_to(jnp.asarray(draft), (n, K)), jnp.full((n,), K, jnp.int32),
                          jnp.full((n,), T, jnp.float32), jnp.arange(n, dtype=jnp.uint32), jnp.zeros((n,), jnp.int32))
    z = base[0].astype(np.float64) / T
    p0 = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
    assert _pvalue(np.asarray(out.tokens[:, 0]), p0) > ALPHA
    # acceptance of the first draft happens with probability p_0(d_1)
    acc = np.asarray(out.num_accepted) >= 1
    assert abs(acc.mean() - p0[draft[0]]) < 4 * np.sqrt(p0[draft[0]] * (1 - p0[draft[0]]) / n)
    greedy = jax.jit(verify)(logits[:64], jnp.broadcast_to(jnp.asarray(draft), (64, K)), jnp.full((64,), K, jnp.int32),
                             jnp.zeros((64,), jnp.float32), jnp.arange(64, dtype=jnp.uint32), jnp.zeros((64,), jnp.int32))
    assert (np.asarray(greedy.num_accepted) == 0).all()            # a 2nd choice never matches the argmax
    assert (np.asarray(greedy.tokens[:, 0]) == base[0].argmax()).all()


def _greedy_brute(logits, draft, num_draft):
    """Reference: accept drafts while they equal the argmax, then emit the argmax at the first mismatch (or the
    bonus position)."""
    a = logits.argmax(-1)
    out = []
    for j in range(num_draft):
        if draft[j] != a[j]:
            return out + [int(a[j])], j
        out.append(int(draft[j]))
    return out + [int(a[num_draft])], num_draft


def test_greedy_verification_matches_brute_force():
    rng = np.random.default_rng(1)
    R, K, V = 200, 4, 11
    logits = rng.normal(size=(R, K + 1, V)).astype(np.float32)
    a = logits.argmax(-1)
    num_draft = rng.integers(0, K + 1, size=R).astype(np.int32)
    match = rng.integers(0, K + 1, size=R)  # drafts agree with the argmax for `match` positions, then differ
    draft = np.where(np.arange(K)[None] < match[:, None], a[:, :K], (a[:, :K] + 1) % V).astype(np.int32)
    out = jax.jit(verify)(jnp.asarray(logits), jnp.asarray(draft), jnp.asarray(num_draft),
                          jnp.zeros((R,), jnp.float32), jnp.arange(R, dtype=jnp.uint32), jnp.zeros((R,), jnp.int32))
    toks, m = np.asarray(out.tokens), np.asarray(out.num_accepted)
    lp = np.asarray(jax.nn.log_softmax(jnp.asarray(logits), axis=-1))
    for i in range(R):
        ref, ref_m = _greedy_brute(logits[i], draft[i], int(num_draft[i]))
        assert m[i] == ref_m and toks[i, :m[i] + 1].tolist() == ref, i
        np.testing.assert_allclose(np.asarray(out.logprobs)[i, :m[i] + 1], lp[i, np.arange(m[i] + 1), ref], rtol=1e-6)
