"""One bad request fails alone (issue 18): a request whose row makes the batched step raise is found by bisection
(engine/isolation.py), ended with an error, and every other request of the batch finishes with the same tokens as
offline greedy generation (tiny random Llama on CPU)."""
import numpy as np
import pytest

import jaxinfer
from jaxinfer import SamplingParams
from jaxinfer.engine.isolation import failing_rows
from jaxinfer.runner.model_runner import ModelRunner

# tests/test_quantization_e2e.py's float engine shape: the same step programs, one compile in the suite
KW = dict(num_pages=64, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=8, progress=False)
PEN = dict(repetition_penalty=1.3, frequency_penalty=0.5)


@pytest.mark.parametrize("n,bad", [(1, [0]), (2, [1]), (7, [0, 6]), (8, [3]), (16, [2, 3, 11]), (5, [])])
def test_failing_rows_bisection(n, bad):
    probes = []

    def ok(rows):
        probes.append(list(rows))
        return not set(rows) & set(bad)

    assert failing_rows(n, ok) == bad
    assert [list(range(n))] not in probes  # the whole batch is known to fail: never probed again
    assert all(len(set(bad) & set(p)) > 0 or len(p) > 0 for p in probes)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return jaxinfer.LLM(tiny_llama_dir, **KW)


def _poisoned(**kw):
    """A request that got past validation with a top_k that does not fit int32 (assignments after construction are
    not re-validated): packing its row raises, for the whole batch."""
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, **kw)
    sp.top_k = 2**31
    return sp


def test_bad_request_fails_alone(llm):
    _bad_requests_fail_alone(llm)


def test_bad_request_fails_alone_with_the_call_thread(tiny_llama_dir, monkeypatch, restore_switch_interval):
    """The same with every compiled call on the call thread (runner/call_thread.py): the packing that fails runs on
    the engine thread, and the probe dispatches read their outputs through the thread's futures."""
    monkeypatch.setattr(ModelRunner, "call_thread", True)
    monkeypatch.setattr(ModelRunner, "call_thread_min_tokens", 1)
    threaded = jaxinfer.LLM(tiny_llama_dir, **KW)
    assert threaded.runner._calls is not None
    _bad_requests_fail_alone(threaded)
    assert threaded.runner._calls.num_calls > 20


def _bad_requests_fail_alone(llm):
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 512, size=int(rng.integers(3, 30))).tolist() for _ in range(6)]
    greedy = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    penalised = greedy.clone(**PEN)
    ref = [o.outputs[0].token_ids for o in llm.generate(prompts, greedy, use_tqdm=False)]
    ref_pen = llm.generate(prompts[0], penalised, use_tqdm=False)[0].outputs[0].token_ids
    assert ref_pen != ref[0]  # the penalties matter: a probe counting its discarded sample would show

    eng = llm.engine
    for i, p in enumerate(prompts):
        eng.add_request(f"g{i}", p, greedy.clone(output_kind="delta" if i % 2 else "cumulative"))
    eng.add_request("pen", prompts[0], penalised)
    finals, delta_ids = {}, {}
    for k in range(60):
        if k == 3:  # into the running batch: two bad requests (one with n=2) at once
            eng.add_request("bad1", prompts[1], _poisoned())
            eng.add_request("bad2", prompts[2], _poisoned(n=2))
        if not eng.has_unfinished():
            break
        for o in eng.step():
            if o.request_id in ("g1", "g3", "g5"):
                delta_ids.setdefault(o.request_id, []).extend(o.outputs[0].token_ids)
            if o.finished:
                assert o.request_id not in finals
                finals[o.request_id] = o
    assert set(finals) == {f"g{i}" for i in range(6)} | {"pen", "bad1", "bad2"}
    for rid in ("bad1", "bad2"):
        o = finals[rid]
        assert o.error and "int32" in o.error, o.error
        assert [c.finish_reason for c in o.outputs] == ["abort"] * len(o.outputs)
    for i in range(6):
        o = finals[f"g{i}"]
        assert o.error is None
        got = delta_ids[f"g{i}"] if i % 2 else o.outputs[0].token_ids
        assert got == ref[i], i
    assert finals["pen"].outputs[0].token_ids == ref_pen
    assert eng.kv.num_used_pages == 0 and eng.scheduler.num_running == 0
    # and it keeps serving
    assert llm.generate(prompts[3], greedy, use_tqdm=False)[0].outputs[0].token_ids == ref[3]
