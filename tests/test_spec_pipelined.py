"""Pipelined speculative steps (engine/spec_pipeline.py + runner/spec_carry.py) end to end on CPU (tiny random
Llama, float32): step n+1 is dispatched before step n's accepted counts are read, drafts come from a device table
(the true greedy continuation with some positions corrupted, so verification both accepts runs and rejects), and
the greedy outputs must equal plain decoding's exactly, with stop tokens, max_tokens, preemption and an abort with a
step in flight, and no page leaked."""
import numpy as np
import pytest

import jaxinfer
from jaxinfer.engine.spec_control import SpecControl
from jaxinfer.runner.spec_carry import TableProposer
from tests.spec_cases import greedy, run_staggered, speculates

KW = dict(max_model_len=256, max_num_batched_tokens=32, max_num_seqs=8, progress=False)
K = 3


@pytest.fixture(scope="module")
def base(tiny_llama_dir):
    return jaxinfer.LLM(tiny_llama_dir, num_pages=200, **KW)


@pytest.fixture(scope="module")
def spec_llm(tiny_llama_dir):
    return jaxinfer.LLM(tiny_llama_dir, num_pages=8, speculative_config=dict(method="ngram",
                                                                            num_speculative_tokens=K,
                                                                            batch_policy=False), **KW)


def _noisy(ref, rng, p_bad):
    return [t if rng.random() >= p_bad else (t + 1 + int(rng.integers(0, 500))) % 512 for t in ref]


@pytest.mark.parametrize("p_bad", [0.0, 0.3])
def test_pipelined_greedy_identical_to_plain(base, spec_llm, monkeypatch, p_bad):
    rng = np.random.default_rng(int(p_bad * 10))
    prompts = [rng.integers(3, 512, size=int(rng.integers(1, 40))).tolist() for _ in range(8)]
    max_tokens = [int(rng.integers(1, 24)) for _ in prompts]
    ref = [o.outputs[0].token_ids for o in base.generate(prompts, [greedy(m) for m in max_tokens], use_tqdm=False)]
    stops = {i: [r[len(r) // 2]] for i, r in enumerate(ref) if i % 3 == 0 and len(r) > 4}
    want = {i: (r[:r.index(stops[i][0]) + 1] if i in stops else r) for i, r in enumerate(ref)}

    eng = spec_llm.engine
    tables = {f"r{i}": p + _noisy(ref[i], rng, p_bad) for i, p in enumerate(prompts)}
    tables["victim"] = prompts[0] + ref[0]
    eng.spec = SpecControl(TableProposer(tables, K), K, 8, adaptive=False)
    launched, dispatch = [], eng.runner.dispatch

    def spy(inputs, prev, *a):  # a speculative step dispatched while another is in flight: pipelined
        launched.append((speculates(inputs), prev is not None))
        return dispatch(inputs, prev, *a)

    monkeypatch.setattr(eng.runner, "dispatch", spy)
    done = run_staggered(eng, prompts, max_tokens, stops, rng, victim_tokens=30, abort_at=5)
    assert {i: o.outputs[0].token_ids for i, o in done.items()} == want
    for i, o in done.items():
        assert o.outputs[0].finish_reason == ("stop" if i in stops else "length")
    st = eng.spec_stats()
    assert st["num_verify_steps"] > 0
    if p_bad == 0.0:
        assert st["acceptance_rate"] > 0.9
    else:
        assert 0.0 < st["acceptance_rate"] < 1.0
    assert any(s and p for s, p in launched), "no speculative step was pipelined"
    assert eng.scheduler.stats().num_preemptions_total > 0
    eng.kv.check_invariants()
    assert eng.kv.num_used_pages == 0


@pytest.mark.parametrize("method", ["draft", "layer_skip"])
def test_draft_model_cycles_are_pipelined(tiny_llama_dir, base, method):
    """A draft model's proposals run as one device program per cycle from the carry (runner/draft_cycle.py):
    speculative steps are dispatched with a step in flight, the greedy outputs equal plain decoding's (the draft
    is the target itself for "draft": every draft accepted, so each cycle folds in the catch-up token), and the
    target's and the draft's caches end empty."""
    extra = {"layer_skip": dict(num_draft_layers=1), "draft": dict(draft_model=tiny_llama_dir)}[method]
    # tests/test_spec_e2e.py's engine shape (8 pages: these requests get preempted too): the same compiled
    # programs, from JAX's persistent cache
    llm = jaxinfer.LLM(tiny_llama_dir, num_pages=8, speculative_config=dict(
        method=method, num_speculative_tokens=K, batch_policy=False, **extra), **KW)
    rng = np.random.default_rng(5)
    prompts = [rng.integers(3, 512, size=int(rng.integers(1, 40))).tolist() for _ in range(5)]
    max_tokens = [int(rng.integers(2, 30)) for _ in prompts]
    ref = [o.outputs[0].token_ids for o in base.generate(prompts, [greedy(m) for m in max_tokens], use_tqdm=False)]
    eng = llm.engine
    launched, dispatch = [], eng.runner.dispatch
    eng.runner.dispatch = lambda inputs, prev, *a: (launched.append(
        (speculates(inputs), prev is not None)) or dispatch(inputs, prev, *a))
    try:
        got = [o.outputs[0].token_ids for o in llm.generate(prompts, [greedy(m) for m in max_tokens],
                                                             use_tqdm=False)]
    finally:
        eng.runner.dispatch = dispatch
    assert got == ref
    assert any(s and p for s, p in launched), "no speculative step was pipelined"
    st = eng.spec_stats()
    assert st["num_verify_steps"] > 0
    if method == "draft":
        assert st["acceptance_rate"] == 1.0
    eng.kv.check_invariants()
    assert eng.kv.num_used_pages == 0
    prop = eng.spec.proposer
    prop.kv.check_invariants()
    assert prop.kv.num_used_pages == 0 and not prop._computed


@pytest.mark.parametrize("method", ["draft", "layer_skip"])
def test_draft_cycle_runs_batch_1_in_small_buckets(tiny_llama_dir, base, monkeypatch, method):
    """A GPU draft runner's own ladder starts at 16 tokens (small_buckets=False: no small step programs), but under
    DraftCycle.small_pair (an A/B switch, off by default) the pipelined cycle at batch 1 runs its 2-token step 1 and
    1-token steps 2..k in buckets of 2 and 1 tokens (ModelRunner.decode_ladder), larger batches in the runner's
    ladder (no pair beyond n = 1's added). The CPU ladder is swapped for the GPU's here: the cycle compiles its
    (2, 1)-token bucket pair and the greedy outputs equal plain decoding's, with every draft accepted ("draft": the
    target itself, each cycle folding in the catch-up token) or some rejected ("layer_skip": the cycle's positions
    shifted back on the device)."""
    from jaxinfer.runner import cpu_defaults
    from jaxinfer.runner.draft_cycle import DraftCycle

    monkeypatch.setattr(cpu_defaults, "CPU_LADDER", cpu_defaults.GPU_LADDER)
    monkeypatch.setattr(DraftCycle, "small_pair", True)
    extra = {"layer_skip": dict(num_draft_layers=1), "draft": dict(draft_model=tiny_llama_dir)}[method]
    llm = jaxinfer.LLM(tiny_llama_dir, num_pages=64, speculative_config=dict(
        method=method, num_speculative_tokens=K, batch_policy=False, **extra), **KW)
    prop = llm.engine.spec.proposer
    assert [b.num_tokens for b in prop.runner.ladder.buckets] == [16, 32]
    assert [b.num_tokens for b in prop.runner.decode_ladder.buckets] == [1, 2, 16, 32]
    prompt = np.random.default_rng(9).integers(3, 512, size=21).tolist()
    ref = base.generate([prompt], greedy(20), use_tqdm=False)[0].outputs[0].token_ids
    assert llm.generate([prompt], greedy(20), use_tqdm=False)[0].outputs[0].token_ids == ref
    assert {(b1.num_tokens, b2.num_tokens) for b1, b2, _ in prop.cycle._compiled} == {(2, 1)}
    assert {(b1.num_tokens, b2.num_tokens) for b1, b2 in prop.cycle.buckets()} == {(2, 1), (16, 16)}
    st = llm.engine.spec_stats()
    assert st["num_verify_steps"] > 0
    assert st["acceptance_rate"] == 1.0 if method == "draft" else 0.0 < st["acceptance_rate"] < 1.0
    prop.kv.check_invariants()
    assert prop.kv.num_used_pages == 0


def test_one_sequence_verifies_in_its_own_bucket(tiny_llama_dir, base, monkeypatch):
    """A speculating runner on the GPU ladder gets a bucket of K + 1 tokens, one sequence and one verify row below its
    16-token bucket (runner/buckets.py verify_bucket): staggered requests with drafts both accepted and rejected
    verify in it whenever one sequence is left, and in the larger buckets otherwise, with the greedy outputs of plain
    decoding, stop tokens and an abort with a step in flight included, and no page leaked. (The CPU ladder is swapped
    for the GPU's here.)"""
    from jaxinfer.runner import cpu_defaults

    monkeypatch.setattr(cpu_defaults, "CPU_LADDER", cpu_defaults.GPU_LADDER)
    llm = jaxinfer.LLM(tiny_llama_dir, num_pages=64, speculative_config=dict(
        method="ngram", num_speculative_tokens=K, batch_policy=False), **KW)
    eng = llm.engine
    first = eng.runner.ladder.buckets[0]
    assert (first.num_tokens, first.num_seqs, first.spec_rows, first.spec_len) == (K + 1, 1, 1, K)
    assert [b.num_tokens for b in eng.runner.ladder.buckets[1:]] == [16, 32]
    rng = np.random.default_rng(11)
    prompts = [rng.integers(3, 512, size=int(rng.integers(1, 30))).tolist() for _ in range(4)]
    max_tokens = [30, 6, 9, 4]                                       # r0 outlives the others: batches of one
    ref = [o.outputs[0].token_ids for o in base.generate(prompts, [greedy(m) for m in max_tokens], use_tqdm=False)]
    stops = {2: [ref[2][5]]} if len(ref[2]) > 6 else {}
    want = {i: (r[:r.index(stops[i][0]) + 1] if i in stops else r) for i, r in enumerate(ref)}
    tables = {f"r{i}": p + _noisy(ref[i], rng, 0.3) for i, p in enumerate(prompts)}
    tables["victim"] = prompts[0] + ref[0]
    eng.spec = SpecControl(TableProposer(tables, K), K, 8, adaptive=False)
    used, packed = [], eng.runner._packed_step

    def spy(seqs, bucket):
        batch, prog = packed(seqs, bucket)
        used.append((batch.bucket, speculates(seqs)))
        return batch, prog

    monkeypatch.setattr(eng.runner, "_packed_step", spy)
    done = run_staggered(eng, prompts, max_tokens, stops, rng, victim_tokens=12, abort_at=3)
    assert {i: o.outputs[0].token_ids for i, o in done.items()} == want
    assert (first, True) in used                                     # a verification in the verify bucket
    assert (first, False) in used                                    # and a plain decode (no drafts left)
    assert any(b != first and s for b, s in used)                    # and in a larger one
    eng.kv.check_invariants()
    assert eng.kv.num_used_pages == 0
