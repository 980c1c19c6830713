"""The device penalty table (runner/penalties.py) against a float64 numpy reference of vLLM's penalties."""
import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.runner.penalties import count_sampled, host_row, penalize, write_row
from jaxinfer.runner.sampler import SamplingTensors, sample


def np_penalised(logits, prompt, outputs, pres, freq, rep):
    """vLLM semantics, written directly: repetition over prompt + outputs, then frequency / presence over outputs."""
    x = np.asarray(logits, np.float64).copy()
    for tok in set(prompt) | set(outputs):
        x[tok] = x[tok] / rep if x[tok] > 0 else x[tok] * rep
    for tok in set(outputs):
        c = outputs.count(tok)
        x[tok] -= freq * c + pres
    return x


def _case(seed=0, S=6, V=97, slots=8):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2, (S, V)).astype(np.float32)
    table = np.zeros((slots, V), np.int32)
    seqs = []
    for s in range(S):
        prompt = rng.integers(0, V, int(rng.integers(1, 30))).tolist()
        outputs = rng.integers(0, V // 3, int(rng.integers(0, 40))).tolist()  # repeats: counts > 1
        seqs.append((prompt, outputs))
    slot = np.array([3, -1, 0, 7, 5, -1], np.int32)[:S]
    for s in range(S):
        if slot[s] >= 0:
            table[slot[s]] = host_row(*seqs[s], V)
    pres = np.array([0.5, 0.9, -0.7, 0.0, 1.2, 0.0], np.float32)[:S]
    freq = np.array([0.2, 0.3, 0.0, -0.4, 0.6, 0.0], np.float32)[:S]
    rep = np.array([1.0, 1.5, 1.5, 0.8, 1.2, 1.0], np.float32)[:S]
    return logits, table, seqs, slot, pres, freq, rep


def test_penalize_matches_numpy_reference():
    logits, table, seqs, slot, pres, freq, rep = _case()
    got = np.asarray(jax.jit(penalize)(logits, table, slot, pres, freq, rep))
    for s in range(len(seqs)):
        if slot[s] < 0:  # no slot: untouched, bit for bit (row 1 has non-neutral values that must be ignored)
            np.testing.assert_array_equal(got[s], logits[s])
        else:
            want = np_penalised(logits[s], *seqs[s], float(pres[s]), float(freq[s]), float(rep[s]))
            np.testing.assert_allclose(got[s], want, rtol=1e-6, atol=1e-6)
            assert not np.allclose(got[s], logits[s])


def test_no_slot_in_batch_is_identity():
    logits, table, _, _, pres, freq, rep = _case()
    got = jax.jit(penalize)(logits, table, np.full(len(logits), -1, np.int32), pres, freq, rep)
    np.testing.assert_array_equal(np.asarray(got), logits)


def test_sample_greedy_uses_penalised_logits_and_raw_logprobs():
    logits, table, seqs, slot, pres, freq, rep = _case(seed=1)
    S, V = logits.shape
    t = SamplingTensors.from_rows([dict(temperature=0.0, presence_penalty=pres[s], frequency_penalty=freq[s],
                                        repetition_penalty=rep[s]) for s in range(S)], S)
    out = jax.jit(sample)(logits, t, penalty_table=table, penalty_slot=slot)
    want = [np.argmax(np_penalised(logits[s], *seqs[s], float(pres[s]), float(freq[s]), float(rep[s])))
            if slot[s] >= 0 else np.argmax(logits[s]) for s in range(S)]
    np.testing.assert_array_equal(np.asarray(out.tokens), want)
    raw = logits.astype(np.float64)
    lse = np.log(np.exp(raw - raw.max(-1, keepdims=True)).sum(-1)) + raw.max(-1)
    np.testing.assert_allclose(np.asarray(out.logprobs), raw[np.arange(S), want] - lse, atol=1e-5)


def test_host_row_count_sampled_and_write_row():
    V = 11
    row = host_row([1, 1, 4], [4, 7, 7, 7], V)
    assert row.tolist() == [0, 1, 0, 0, 3, 0, 0, 6, 0, 0, 0]  # 2 * count + in_prompt
    table = jnp.zeros((3, V), jnp.int32)
    table = jax.jit(write_row, donate_argnums=0)(table, jnp.int32(2), jnp.asarray(row))
    table = jax.jit(count_sampled)(table, jnp.array([2, -1, 0], jnp.int32), jnp.array([7, 5, 1], jnp.int32))
    t = np.asarray(table)
    assert t[2].tolist() == (row + 2 * (np.arange(V) == 7)).tolist()
    assert t[0].tolist() == [0, 2] + [0] * 9 and t[1].sum() == 0  # slot -1: dropped


def _top_level_shapes(jaxpr):
    return [tuple(v.aval.shape) for e in jaxpr.eqns if e.primitive.name != "cond" for v in e.outvars]


def test_penalty_math_runs_only_under_cond():
    """No [S, V] work outside the lax.cond: a batch without penalised rows pays a predicate and an S-element
    scatter (count_sampled), not a table gather."""
    logits, table, _, slot, pres, freq, rep = _case()
    S, V = logits.shape
    jaxpr = jax.make_jaxpr(penalize)(logits, table, slot, pres, freq, rep).jaxpr
    assert (S, V) not in _top_level_shapes(jaxpr)
    assert any(e.primitive.name == "cond" for e in jaxpr.eqns)
    jaxpr = jax.make_jaxpr(count_sampled)(table, slot, jnp.zeros(S, jnp.int32)).jaxpr
    assert (S, V) not in _top_level_shapes(jaxpr)
