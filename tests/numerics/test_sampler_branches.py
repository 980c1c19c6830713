"""The GPU form of the sampler (runner/branches.py: its lax.conds traced as selects of both branches) and the
greedy-only step program compute exactly what the CPU form computes.

The GPU engine runs the select form (a GPU conditional makes the step's dispatch wait for the device) and, for
all-greedy steps, the greedy-only program; CPU tests otherwise only ever trace lax.cond, so these tests force
each form on the CPU and compare them bit for bit on the same inputs.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.runner.branches import select_branches
from jaxinfer.runner.sampler import SamplingTensors, sample

S, V, SLOTS = 8, 1000, 4


def _run(logits, t, table, slot, want_top, *, select, greedy_only=False):
    with select_branches(select):  # a fresh jit object, traced inside the block
        fn = jax.jit(lambda l, t, tab, s, w: sample(l, t, penalty_table=tab, penalty_slot=s, want_top_logprobs=w,
                                                    greedy_only=greedy_only))
        return jax.device_get(fn(logits, t, table, slot, want_top))


ROW_MIXES = {
    "greedy": [dict(temperature=0.0, seed=i) for i in range(S)],
    "top_p+greedy": [dict(temperature=0.8, top_p=0.9, seed=1), dict(temperature=0.0, seed=2)],
    "exact(top_k>256)": [dict(temperature=1.0, top_k=300, seed=3), dict(temperature=1.0, seed=4)],
    "full(min_p)": [dict(temperature=1.2, min_p=0.05, seed=5), dict(temperature=0.7, top_k=40, seed=6)],
    "penalised": [dict(temperature=0.0, repetition_penalty=1.3, frequency_penalty=0.5, seed=7),
                  dict(temperature=1.0, presence_penalty=0.4, seed=8)],
}


@pytest.mark.parametrize("mix", sorted(ROW_MIXES))
@pytest.mark.parametrize("want_top", [False, True])
def test_select_form_equals_cond_form(mix, want_top):
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(0, 3, (S, V)), jnp.float32)
    rows = ROW_MIXES[mix]
    t = SamplingTensors.from_rows([dict(r, step=5) for r in rows], S)
    table = jnp.asarray(rng.integers(0, 4, (SLOTS, V)), jnp.int32)
    penalised = "penalised" in mix
    slot = jnp.asarray([i if (penalised and i < len(rows)) else -1 for i in range(S)], jnp.int32)
    a = _run(logits, t, table, slot, jnp.asarray(want_top), select=True)
    b = _run(logits, t, table, slot, jnp.asarray(want_top), select=False)
    for name, x, y in zip(a._fields, a, b):
        np.testing.assert_array_equal(x, y, err_msg=f"{name} differs between the select and the cond form")
    if want_top:  # the top logprobs were computed, not left as zeros
        assert np.all(a.top_ids[:, 0] == np.argmax(np.asarray(logits), axis=1))


@pytest.mark.parametrize("select", [False, True])
def test_greedy_only_equals_general_on_greedy_rows(select):
    rng = np.random.default_rng(1)
    logits = jnp.asarray(rng.normal(0, 3, (S, V)), jnp.float32)
    t = SamplingTensors.from_rows(ROW_MIXES["greedy"], S)
    table = jnp.zeros((SLOTS, V), jnp.int32)
    slot = jnp.full((S,), -1, jnp.int32)
    general = _run(logits, t, table, slot, jnp.asarray(False), select=select)
    greedy = _run(logits, t, table, slot, jnp.asarray(False), select=select, greedy_only=True)
    np.testing.assert_array_equal(greedy.tokens, general.tokens)
    np.testing.assert_array_equal(greedy.logprobs, general.logprobs)
    np.testing.assert_array_equal(greedy.tokens, np.argmax(np.asarray(logits), axis=1))


def test_engine_greedy_program_gives_the_same_outputs():
    """The GPU engine runs all-greedy steps on the greedy-only program: same tokens and logprobs as the general
    program, and a step with a sampling row goes to the general program."""
    from jaxinfer import LLM, SamplingParams
    from jaxinfer.runner.batch import SeqInput, pack

    prompts = [[1, 5, 9, 33, 7], [4, 4, 4], list(range(3, 40))]
    sp = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=None)
    outs = []
    for greedy_programs in (False, True):
        # min_bucket_tokens=4: the decodes and the one-token packs below share the 4-token bucket's programs
        llm = LLM("tiny-llama", load_format="dummy", max_model_len=128, max_num_seqs=4, min_bucket_tokens=4,
                  warmup=False, progress=False)
        llm.runner.greedy_programs = greedy_programs
        res = llm.generate(prompts, sp)
        outs.append([(o.outputs[0].token_ids, o.outputs[0].cumulative_logprob) for o in res])
        greedy_built = [k for k in llm.runner._compiled if k[1]]
        assert bool(greedy_built) == greedy_programs  # the greedy program ran (or was never built)
    assert outs[0] == outs[1]
    r = llm.runner
    greedy = pack([SeqInput([1], 0, [1])], r.ladder.pick(1, 1), r.page_size)
    sampling = pack([SeqInput([1], 0, [1], temperature=0.7)], r.ladder.pick(1, 1), r.page_size)
    logprobs = pack([SeqInput([1], 0, [1], want_logprobs=True)], r.ladder.pick(1, 1), r.page_size)
    assert r.step_program(greedy) is r._step_program(greedy.bucket, greedy_only=True)
    assert r.step_program(sampling) is r._programs(sampling.bucket)[0]
    assert r.step_program(logprobs) is r._programs(logprobs.bucket)[0]


def test_warmup_defers_large_general_programs_and_sampling_still_matches(monkeypatch):
    """With greedy-only programs, warm-up compiles the general programs of large buckets in the background; a
    sampling request that lands in such a bucket waits for it and samples what a runner without the greedy
    programs samples (same seed). "Large" is lowered to 4 tokens here (ladder 1, 4, 16: three buckets to warm up
    instead of six at the real 256)."""
    from jaxinfer import LLM, SamplingParams
    from jaxinfer.runner import model_runner

    EAGER_GENERAL_MAX_TOKENS = 4
    monkeypatch.setattr(model_runner, "EAGER_GENERAL_MAX_TOKENS", EAGER_GENERAL_MAX_TOKENS)
    prompt = [int(t) for t in np.random.default_rng(3).integers(3, 500, 40)]  # prefill chunks in the 16 bucket
    sp = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.8, seed=11, ignore_eos=True)
    outs = []
    for greedy_programs in (False, True):
        llm = LLM("tiny-llama", load_format="dummy", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=16,
                  warmup=False, progress=False)
        r = llm.runner
        r.greedy_programs = greedy_programs
        r.warmup(progress=False)
        large = [b for b in r.ladder.buckets if b.num_tokens > EAGER_GENERAL_MAX_TOKENS]
        assert large
        if greedy_programs:
            assert all((b, False) in r._pending or (b, False) in r._compiled for b in large)
            assert all((b, True) in r._compiled for b in large)
            assert r.finish_background_compiles() >= 0.0  # (benchmarks call it before a steady window)
            assert not r._pending and all((b, False) in r._compiled for b in large)
        outs.append(llm.generate([prompt], sp)[0].outputs[0].token_ids)
    assert outs[0] == outs[1]
