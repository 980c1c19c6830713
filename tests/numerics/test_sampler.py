"""Numerics of the device sampler (jaxinfer/runner/sampler.py) against independent float64 numpy references.

Distribution tests draw ~20k tokens (one row per draw, each row its own seed) and run a chi-square
goodness-of-fit test at significance 1e-3; seeds are fixed, so the outcome is deterministic. A deliberately wrong
reference must fail the same test (the test has power).
"""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from jaxinfer.runner.sampler import (
    MAX_LOGPROBS,
    MAX_TOP_K_FAST,
    SamplingTensors,
    _top_k,
    apply_penalties,
    sample,
)

ALPHA = 1e-3
sample_jit = jax.jit(sample)


# ----------------------------------------------------------------------------------------------- references
def ref_probs(logits, T=1.0, top_k=-1, top_p=1.0, min_p=0.0, extra=0, margin=1e-4):
    """float64 target distribution over V: min-p, then top-k, then top-p on the renormalised remainder.

    extra != 0 deliberately moves the top-p cutoff by `extra` tokens (a wrong reference, for the power test).
    Asserts that no kept/dropped decision is within `margin` of its threshold (so float32 rounding on the device
    cannot flip it and the test stays meaningful).
    """
    l = np.asarray(logits, np.float64) / T
    V = l.shape[0]
    p = np.exp(l - l.max())
    p /= p.sum()
    order = np.argsort(-l, kind="stable")
    ps = p[order]
    keep = np.ones(V, bool)
    if min_p > 0:
        rel = ps / ps[0]
        assert np.all(np.abs(rel - min_p) > margin), "min_p threshold too close to a token; change the test logits"
        keep &= rel >= min_p
    if 0 < top_k < V:
        keep &= np.arange(V) < top_k
    if top_p < 1:
        q = np.where(keep, ps, 0.0)
        q /= q.sum()
        excl = np.concatenate([[0.0], np.cumsum(q)[:-1]])
        assert np.all(np.abs(excl[keep] - top_p) > margin), "top_p cutoff too close to a token; change the logits"
        keep_p = keep & (excl < top_p)
        n = int(keep_p.sum()) + extra
        keep &= np.arange(V) < n
    q = np.where(keep, ps, 0.0)
    q /= q.sum()
    out = np.zeros(V)
    out[order] = q
    return out


def ref_for(logits, params, **kw):
    """ref_probs for a SamplingParams-style dict (temperature / top_k / top_p / min_p)."""
    return ref_probs(logits, T=params.get("temperature", 1.0), top_k=params.get("top_k", -1),
                     top_p=params.get("top_p", 1.0), min_p=params.get("min_p", 0.0), **kw)


def gof_pvalue(tokens, probs, groups=None):
    """Chi-square goodness-of-fit p-value of sampled `tokens` against `probs` (float64 [V]).

    Returns 0.0 when a token of probability 0 was drawn. groups (int[V], optional) pools tokens into bins first;
    bins with expected count < 5 are pooled together (and into the smallest bin if still < 5).
    """
    V = probs.shape[0]
    counts = np.bincount(np.asarray(tokens), minlength=V).astype(np.float64)
    if np.any(counts[probs == 0] > 0):
        return 0.0
    support = probs > 0
    if groups is None:
        groups = np.arange(V)
    g = groups[support]
    _, gi = np.unique(g, return_inverse=True)
    obs = np.bincount(gi, weights=counts[support])
    exp = np.bincount(gi, weights=probs[support]) * counts.sum()
    small = exp < 5
    if small.any():
        obs = np.concatenate([obs[~small], [obs[small].sum()]])
        exp = np.concatenate([exp[~small], [exp[small].sum()]])
        if exp[-1] < 5 and len(exp) > 1:
            j = int(np.argmin(exp[:-1]))
            obs[j] += obs[-1]
            exp[j] += exp[-1]
            obs, exp = obs[:-1], exp[:-1]
    if len(obs) < 2:
        return 1.0
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def np_penalties(logits, ids, counts, pres, freq, rep):
    out = np.asarray(logits, np.float64).copy()
    for s in range(out.shape[0]):
        for tok, c in zip(ids[s], counts[s]):
            if tok < 0:
                continue
            v = out[s, tok]
            v = v / rep[s] if v > 0 else v * rep[s]
            v -= freq[s] * c + pres[s] * (c > 0)
            out[s, tok] = v
    return out


def np_log_softmax(x):
    x = np.asarray(x, np.float64)
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def draw(logits_row, n, seed0=0, **params):
    """n draws from one logits row: n rows with seeds seed0 .. seed0+n-1, step 0."""
    rows = [dict(params, seed=seed0 + i, step=0) for i in range(n)]
    t = SamplingTensors.from_rows(rows, n)
    logits = jnp.broadcast_to(jnp.asarray(logits_row, jnp.float32), (n, len(logits_row)))
    return np.asarray(sample_jit(logits, t).tokens)


# ------------------------------------------------------------------------------------------------- fixtures
V_SMALL = 50
N_DRAWS = 20000


@pytest.fixture(scope="module")
def small_logits():
    # Geometric-ish decay (so top-p cutoffs fall on tokens of ~1-3% mass), noise, and shuffled token ids.
    rng = np.random.default_rng(0)
    l = np.linspace(4.0, -4.0, V_SMALL) + rng.normal(0, 0.3, V_SMALL)
    return rng.permutation(l).astype(np.float32)


SETTINGS = [
    dict(temperature=0.7, top_k=5),
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=1.0, min_p=0.1),
    dict(temperature=1.0, top_k=3, top_p=0.9),
    dict(temperature=1.3),
    dict(temperature=0.9, top_k=10, top_p=0.7, min_p=0.15),
    dict(temperature=1.1, top_p=0.6, min_p=0.2),
]


# ---------------------------------------------------------------------------------------------------- tests
def test_greedy_is_argmax():
    rng = np.random.default_rng(1)
    S, V = 12, 300
    logits = rng.normal(0, 3, (S, V)).astype(np.float32)
    logits[3, :] = -np.inf
    logits[3, 17] = 0.5  # a row with -inf everywhere but one token
    rows = [dict(temperature=0.0, seed=i, top_k=5, top_p=0.5) for i in range(6)] + [dict(temperature=1e-7, seed=9)]
    t = SamplingTensors.from_rows(rows, S)  # 5 padded rows: greedy too
    out = sample_jit(logits, t)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.argmax(logits, -1))
    assert np.asarray(out.tokens)[3] == 17


@pytest.mark.parametrize("params", SETTINGS, ids=lambda p: ",".join(f"{k}={v}" for k, v in p.items()))
def test_distribution_matches_reference(small_logits, params):
    tokens = draw(small_logits, N_DRAWS, seed0=1000, **params)
    ref = ref_for(small_logits, params)
    outside = np.setdiff1d(np.unique(tokens), np.flatnonzero(ref > 0))
    assert outside.size == 0, f"tokens {outside} are outside the allowed set {np.flatnonzero(ref > 0)}"
    p = gof_pvalue(tokens, ref)
    assert p > ALPHA, f"chi-square p={p:.3g} for {params}"


@pytest.mark.parametrize("params,extra", [
    (dict(temperature=1.0, top_p=0.8), 1),
    (dict(temperature=1.0, top_p=0.8), -1),
    (dict(temperature=1.0, top_k=3, top_p=0.9), -1),
])
def test_wrong_reference_fails(small_logits, params, extra):
    """Power: a top-p cutoff off by one token must be rejected by the same test."""
    tokens = draw(small_logits, N_DRAWS, seed0=1000, **params)
    good = ref_for(small_logits, params)
    bad = ref_for(small_logits, params, extra=extra)
    assert not np.allclose(good, bad)
    assert gof_pvalue(tokens, good) > ALPHA
    assert gof_pvalue(tokens, bad) < 1e-6


def test_wrong_temperature_fails(small_logits):
    tokens = draw(small_logits, N_DRAWS, seed0=1000, temperature=0.7, top_k=5)
    assert gof_pvalue(tokens, ref_probs(small_logits, T=1.0, top_k=5)) < 1e-6


def _flat_logits(V, seed):
    rng = np.random.default_rng(seed)
    return rng.uniform(-0.05, 0.05, V).astype(np.float32)


def test_exact_fallback_flat_distribution():
    """top_p over a flat V=600 distribution (top-256 mass < top_p), top_k > 256, and min-p reaching past 256
    tokens: all must be exact; rank >= 256 tokens must appear (the candidates alone cannot produce them)."""
    V, n = 600, 3000
    logits = _flat_logits(V, 2)
    cases = [dict(temperature=1.0, top_p=0.6), dict(temperature=0.8, top_k=400), dict(temperature=1.0, min_p=0.95),
             dict(temperature=1.0, top_p=0.7, min_p=0.93)]
    rows = [dict(c, seed=50_000 + i, step=3) for c in cases for i in range(n)]
    t = SamplingTensors.from_rows(rows, len(rows))
    tokens = np.asarray(sample_jit(jnp.broadcast_to(jnp.asarray(logits), (len(rows), V)), t).tokens)
    rank = np.empty(V, int)
    rank[np.argsort(-logits.astype(np.float64), kind="stable")] = np.arange(V)
    for ci, c in enumerate(cases):
        tok = tokens[ci * n:(ci + 1) * n]
        ref = ref_for(logits, c, margin=1e-6)
        assert (ref > 0).sum() > MAX_TOP_K_FAST, "setup: the kept set must reach past the candidates"
        assert np.all(ref[tok] > 0), f"{c}: sampled a token outside the allowed set"
        assert (rank[tok] >= MAX_TOP_K_FAST).mean() > 0.05, f"{c}: tokens past rank 256 missing"
        groups = rank // 20  # 30 rank bins of 20 tokens
        p = gof_pvalue(tok, ref, groups=groups)
        assert p > ALPHA, f"{c}: chi-square p={p:.3g}"
        # power: a reference truncated to the 256 candidates must be rejected
        trunc = np.where(rank < MAX_TOP_K_FAST, ref, 0.0)
        assert gof_pvalue(tok, trunc / trunc.sum(), groups=groups) < 1e-6


def test_fast_top_p_normalises_over_full_vocabulary():
    """Fast path (cutoff inside the 256 candidates) with a heavy tail past them: the top-p cutoff must use the
    full distribution's mass, not the candidates' (which would keep fewer tokens)."""
    V, n = 600, 20000
    rng = np.random.default_rng(8)
    logits = np.concatenate([np.linspace(5.0, 2.0, 20), rng.uniform(-0.05, 0.05, V - 20)])
    logits = rng.permutation(logits).astype(np.float32)
    params = dict(temperature=1.0, top_p=0.5)
    tokens = draw(logits, n, seed0=7, **params)
    ref = ref_for(logits, params)
    assert 1 < (ref > 0).sum() < 20
    assert gof_pvalue(tokens, ref) > ALPHA
    # wrong: renormalised over the top-256 candidates only
    l = logits.astype(np.float64)
    cand = np.argsort(-l, kind="stable")[:MAX_TOP_K_FAST]
    masked = np.full(V, -np.inf)
    masked[cand] = l[cand]
    wrong = ref_probs(masked, top_p=0.5)
    assert not np.allclose(wrong, ref)
    assert gof_pvalue(tokens, wrong) < 1e-6


def test_reproducible_across_rows_and_batch_mates():
    V, S = 300, 64  # one shape for the whole test: a single compile
    rng = np.random.default_rng(3)
    flat = _flat_logits(V, 4)
    peaky = rng.normal(0, 3, V).astype(np.float32)
    targets = [  # (logits, params): one per path
        (peaky, dict(temperature=1.0)),  # full-vocabulary Gumbel
        (peaky, dict(temperature=0.8, top_k=50, top_p=0.9)),  # fast candidates
        (flat, dict(temperature=1.0, top_p=0.95)),  # exact fallback (top-p past the candidates)
        (peaky, dict(temperature=1.0, top_k=280)),  # exact fallback (top_k > 256)
        (peaky, dict(temperature=1.0, min_p=0.01)),  # full path with min-p mask
    ]
    # batch A mates: greedy, a fallback row, a full-path row; batch B mates: fast-path rows only
    mates_a = [dict(temperature=0.0), dict(temperature=1.0, top_p=0.97, seed=1), dict(temperature=0.5, seed=2)]
    mates_b = [dict(temperature=1.0, top_k=2, seed=7)] * 40
    for tl, tp in targets:
        for step in (0, 17):
            target = dict(tp, seed=1234, step=step)
            la = rng.normal(0, 1, (S, V)).astype(np.float32)
            la[1] = flat
            lb = rng.normal(0, 2, (S, V)).astype(np.float32)
            la[2] = lb[40] = tl
            ta = sample_jit(la, SamplingTensors.from_rows([mates_a[0], mates_a[1], target, mates_a[2]], S)).tokens[2]
            tb = sample_jit(lb, SamplingTensors.from_rows(mates_b + [target], S)).tokens[40]
            alone = sample_jit(lb[40:41].repeat(S, 0), SamplingTensors.from_rows([target], S)).tokens[0]
            assert int(ta) == int(tb) == int(alone), f"{tp} step {step}: {ta} {tb} {alone}"

    # different steps -> different streams; different seeds -> different streams
    n = S
    logits = jnp.broadcast_to(jnp.asarray(flat), (n, V))
    by_step = np.asarray(sample_jit(logits, SamplingTensors.from_rows(
        [dict(seed=5, step=i) for i in range(n)], n)).tokens)
    by_step2 = np.asarray(sample_jit(logits, SamplingTensors.from_rows(
        [dict(seed=6, step=i) for i in range(n)], n)).tokens)
    by_seed = np.asarray(sample_jit(logits, SamplingTensors.from_rows(
        [dict(seed=i, step=0) for i in range(n)], n)).tokens)
    assert len(set(by_step.tolist())) > n // 2
    assert len(set(by_seed.tolist())) > n // 2
    assert (by_step != by_step2).mean() > 0.5
    # same (seed, step) twice in one batch -> same token
    same = np.asarray(sample_jit(logits, SamplingTensors.from_rows([dict(seed=5, step=3)] * n, n)).tokens)
    assert np.all(same == by_step[3])


def test_logprobs_are_raw_log_softmax():
    rng = np.random.default_rng(5)
    S, V, P = 16, 1000, 8
    logits = rng.normal(0, 3, (S, V)).astype(np.float32)
    rows = [dict(temperature=[0.0, 0.5, 1.0, 1.5][i % 4], top_k=[-1, 7][i % 2], seed=i, step=i,
                 presence_penalty=0.5, frequency_penalty=0.3, repetition_penalty=1.3) for i in range(S)]
    t = SamplingTensors.from_rows(rows, S)
    ids = np.stack([rng.choice(V, P, replace=False) for _ in range(S)]).astype(np.int32)
    counts = rng.integers(0, 4, (S, P)).astype(np.int32)
    out = sample_jit(logits, t, penalty_ids=ids, penalty_counts=counts)
    ref = np_log_softmax(logits)  # logprobs ignore penalties and temperature
    tok = np.asarray(out.tokens)
    np.testing.assert_allclose(np.asarray(out.logprobs), ref[np.arange(S), tok], atol=1e-5, rtol=0)
    top = np.argsort(-ref, axis=-1, kind="stable")[:, :MAX_LOGPROBS]
    np.testing.assert_array_equal(np.asarray(out.top_ids), top)
    np.testing.assert_allclose(np.asarray(out.top_logprobs), np.take_along_axis(ref, top, -1), atol=1e-5, rtol=0)


def test_logprobs_tiny_vocab_padded():
    V = 10
    logits = np.random.default_rng(6).normal(size=(2, V)).astype(np.float32)
    out = sample_jit(logits, SamplingTensors.from_rows([dict(seed=1)], 2))
    assert out.top_ids.shape == (2, MAX_LOGPROBS)
    np.testing.assert_array_equal(np.asarray(out.top_ids)[:, V:], -1)
    assert np.all(np.isneginf(np.asarray(out.top_logprobs)[:, V:]))
    np.testing.assert_allclose(np.asarray(out.top_logprobs)[:, :V],
                               np.sort(np_log_softmax(logits), -1)[:, ::-1], atol=1e-5)


def _primitives(jaxpr, inside_cond=False, acc=None):
    """(primitive name, inside a cond branch?) for every equation, recursing into sub-jaxprs."""
    acc = [] if acc is None else acc
    for eqn in jaxpr.eqns:
        acc.append((eqn.primitive.name, inside_cond))
        for v in eqn.params.values():
            for sub in v if isinstance(v, (tuple, list)) else (v,):
                j = getattr(sub, "jaxpr", sub)
                if hasattr(j, "eqns"):
                    _primitives(j, inside_cond or eqn.primitive.name == "cond", acc)
    return acc


@pytest.mark.parametrize("with_penalties", [False, True])
def test_common_path_has_no_sort(with_penalties):
    S, V, P = 4, 1000, 8
    t = SamplingTensors.from_rows([dict(seed=1, top_p=0.9)], S)
    kw = dict(penalty_ids=jnp.zeros((S, P), jnp.int32), penalty_counts=jnp.zeros((S, P), jnp.int32)) \
        if with_penalties else {}
    closed = jax.make_jaxpr(lambda l, t: sample(l, t, **kw))(jnp.zeros((S, V), jnp.float32), t)
    prims = _primitives(closed.jaxpr)
    assert ("sort", False) not in prims, "a sort runs outside the lax.cond fallback"
    assert ("sort", True) in prims, "the exact fallback (sort under cond) is missing"
    assert ("top_k", False) in prims


@pytest.mark.parametrize("V,k", [(8192, 256), (5003, 256), (5003, 20), (128, 20)])
def test_chunked_top_k_is_exact(V, k):
    """_top_k (chunk maxima, then the best chunks) returns the exact top-k values, descending, at distinct ids
    holding those values; rows with ties, -inf entries and fewer than k finite values included."""
    rng = np.random.default_rng(9)
    x = rng.normal(0, 2, (6, V)).astype(np.float32)
    x[1] = np.round(x[1])  # many ties
    x[2, rng.choice(V, V // 2, replace=False)] = -np.inf
    x[3, :] = -np.inf
    x[3, :5] = [1, 2, 3, 4, 5]  # fewer than k finite values
    vals, ids = jax.jit(_top_k, static_argnums=1)(jnp.asarray(x), k)
    vals, ids = np.asarray(vals), np.asarray(ids)
    np.testing.assert_array_equal(vals, -np.sort(-x, axis=-1)[:, :k])
    assert ids.min() >= 0 and ids.max() < V
    np.testing.assert_array_equal(np.take_along_axis(x, ids, -1)[np.isfinite(vals)], vals[np.isfinite(vals)])
    for r in range(6):
        fin = np.isfinite(vals[r])
        assert len(set(ids[r][fin].tolist())) == fin.sum()


def test_penalties_match_numpy():
    rng = np.random.default_rng(7)
    S, V, P = 6, 100, 8
    logits = rng.normal(0, 2, (S, V)).astype(np.float32)
    ids = np.full((S, P), -1, np.int32)
    counts = np.zeros((S, P), np.int32)
    for s in range(S):
        n = rng.integers(0, P + 1)
        ids[s, :n] = rng.choice(V, n, replace=False)
        counts[s, :n] = rng.integers(0, 5, n)  # count 0: listed (repetition applies), never generated
    pres = np.array([0.0, 0.5, -0.7, 0.0, 1.2, 0.3], np.float32)
    freq = np.array([0.0, 0.2, 0.0, -0.4, 0.6, 0.1], np.float32)
    rep = np.array([1.0, 1.0, 1.5, 0.8, 1.2, 1.9], np.float32)
    rows = [dict(presence_penalty=pres[s], frequency_penalty=freq[s], repetition_penalty=rep[s], seed=s,
                 temperature=0.0) for s in range(S)]
    t = SamplingTensors.from_rows(rows, S)
    got = np.asarray(jax.jit(apply_penalties)(jnp.asarray(logits), t, ids, counts))
    want = np_penalties(logits, ids, counts, pres, freq, rep)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(got[0], logits[0])  # neutral row: bit-for-bit unchanged
    assert not np.array_equal(got[4], logits[4])
    # greedy picks the penalised argmax; the reported logprob stays the raw model's
    out = sample_jit(logits, t, penalty_ids=ids, penalty_counts=counts)
    np.testing.assert_array_equal(np.asarray(out.tokens), np.argmax(want, -1))
    ref = np_log_softmax(logits)
    np.testing.assert_allclose(np.asarray(out.logprobs), ref[np.arange(S), np.argmax(want, -1)], atol=1e-5)


def test_penalty_changes_greedy_choice():
    logits = np.array([[2.0, 1.9, -1.0, 0.5]], np.float32)
    t = SamplingTensors.from_rows([dict(temperature=0.0, repetition_penalty=1.2)], 1)
    out = sample_jit(logits, t, penalty_ids=np.array([[0, -1]], np.int32), penalty_counts=np.array([[1, 0]], np.int32))
    assert int(out.tokens[0]) == 1  # 2.0 / 1.2 < 1.9
    t = SamplingTensors.from_rows([dict(temperature=0.0, frequency_penalty=0.05)], 1)
    out = sample_jit(logits, t, penalty_ids=np.array([[0, -1]], np.int32), penalty_counts=np.array([[3, 0]], np.int32))
    assert int(out.tokens[0]) == 1  # 2.0 - 0.15 < 1.9
    # a boosted (negative frequency) token wins; its reported logprob is still the raw model's
    t = SamplingTensors.from_rows([dict(temperature=0.0, frequency_penalty=-0.5)], 1)
    out = sample_jit(logits, t, penalty_ids=np.array([[2, -1]], np.int32), penalty_counts=np.array([[7, 0]], np.int32))
    assert int(out.tokens[0]) == 2  # -1.0 + 3.5 > 2.0
    np.testing.assert_allclose(float(out.logprobs[0]), np_log_softmax(logits)[0, 2], atol=1e-6)


def test_from_rows_host_side():
    sp = SimpleNamespace(temperature=0.5, top_k=None, top_p=0.9, min_p=0.0, seed=None, presence_penalty=0.1,
                         frequency_penalty=0.0, repetition_penalty=1.1)
    t = SamplingTensors.from_rows([sp, dict(seed=-1, step=4, top_k=3)], 4)
    assert all(isinstance(a, np.ndarray) and a.shape == (4,) for a in t)
    assert t.seed.dtype == np.uint32 and t.top_k.dtype == np.int32 and t.temperature.dtype == np.float32
    assert t.top_k.tolist() == [-1, 3, -1, -1] and t.step.tolist() == [0, 4, 0, 0]
    assert t.seed[1] == 2**32 - 1 and t.temperature.tolist()[2:] == [0.0, 0.0]  # pad rows are greedy
    assert np.isclose(t.temperature[1], 1.0)  # missing fields take SamplingParams defaults
    with pytest.raises(ValueError, match="S=1"):
        SamplingTensors.from_rows([sp, sp], 1)
