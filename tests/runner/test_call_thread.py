"""runner/call_thread.py: the step's compiled call on a worker thread (ModelRunner.call_thread: on with a GPU).

Exactness: an engine whose calls run on the thread produces the same tokens and logprobs as one that calls on the
engine thread, with the paths that touch the donated state from the engine thread in the mix (penalty rows written
between calls, prompt logprobs on the synchronous path, seeded sampling, an abort with a step in flight, more
requests than slots). The thread itself: calls in submission order, `drain` waits for the last one, a call's error
reaches the step's reader and not `drain`."""
import sys
import threading
import time

import pytest

import jaxinfer
from jaxinfer import SamplingParams
from jaxinfer.runner.call_thread import CallThread, switch_interval_s, wanted
from jaxinfer.runner.model_runner import ModelRunner


pytestmark = pytest.mark.usefixtures("restore_switch_interval")  # (conftest.py: a CallThread lowers it)


def test_calls_run_in_order_and_drain_waits_for_the_last():
    ct = CallThread(interval_s=0.005)
    order, main = [], threading.get_ident()

    def job(i, delay):
        time.sleep(delay)
        order.append((i, threading.get_ident() != main))

    futs = [ct.submit(job, i, 0.02 if i == 0 else 0.0) for i in range(5)]
    ct.drain()
    assert all(f.done() for f in futs)
    assert order == [(i, True) for i in range(5)]  # in order, none on the calling thread
    assert ct.cpu_s >= 0
    ct.close()


def test_a_failing_call_raises_at_its_reader_not_at_drain():
    ct = CallThread(interval_s=0.005)

    def boom():
        raise RuntimeError("bad step")

    fut = ct.submit(boom)
    ct.drain()  # does not raise: the step's fetch does
    with pytest.raises(RuntimeError, match="bad step"):
        fut.result()
    assert ct.submit(lambda: 7).result() == 7  # the thread keeps serving
    ct.close()


def test_the_switch_interval_is_lowered_at_the_first_call_not_before():
    before = sys.getswitchinterval()
    ct = CallThread(interval_s=0.0007)
    assert sys.getswitchinterval() == before  # an engine whose steps all stay inline keeps the process's
    assert ct.submit(lambda: 1).result() == 1
    assert sys.getswitchinterval() == pytest.approx(0.0007)
    ct.close()


def test_switch_interval_setting_is_checked(monkeypatch):
    monkeypatch.setenv("JAXINFER_SWITCH_INTERVAL", "0.001")
    assert switch_interval_s() == 0.001
    for bad in ("fast", "0", "-1"):
        monkeypatch.setenv("JAXINFER_SWITCH_INTERVAL", bad)
        with pytest.raises(ValueError, match="JAXINFER_SWITCH_INTERVAL"):
            switch_interval_s()


def test_on_by_default_with_a_gpu_only_and_the_setting_wins():
    assert wanted(None, "gpu") and not wanted(None, "cpu")
    assert not wanted(None, "gpu", speculative=True)  # (speculative engines: inline until GPU-measured)
    assert wanted(True, "cpu") and wanted(True, "gpu", speculative=True) and not wanted(False, "gpu")


def test_the_cpu_engine_calls_inline_by_default(monkeypatch):
    monkeypatch.setattr(ModelRunner, "call_thread", None)  # (JAXINFER_CALL_THREAD unset)
    llm = jaxinfer.LLM(model="tiny-llama", load_format="dummy", warmup=False, progress=False, max_model_len=64,
                       max_num_seqs=2, max_num_batched_tokens=32)
    assert llm.runner._calls is None


def test_speculative_engines_ask_for_inline_calls(monkeypatch, tiny_llama_dir):
    """The runners tell `wanted` whether they serve speculation: a plain engine's no, a draft-model engine's target
    and draft runners yes (so with a GPU only the plain engine threads by default)."""
    from jaxinfer.runner import model_runner

    asked = []
    monkeypatch.setattr(model_runner, "call_thread_wanted", lambda setting, backend, speculative: asked.append(
        speculative) or False)
    jaxinfer.LLM(model="tiny-llama", load_format="dummy", warmup=False, progress=False, max_model_len=64,
                 max_num_seqs=2, max_num_batched_tokens=32)
    assert asked == [False]
    asked.clear()
    jaxinfer.LLM(tiny_llama_dir, warmup=False, progress=False, max_model_len=64, max_num_seqs=2,
                 max_num_batched_tokens=32, num_pages=32,
                 speculative_config=dict(method="draft", draft_model=tiny_llama_dir, num_speculative_tokens=2))
    assert sorted(asked) == [True, True]  # the target's runner and the draft model's


def _run(call_thread: bool, monkeypatch, min_tokens: int = 1):
    monkeypatch.setattr(ModelRunner, "call_thread", call_thread)
    monkeypatch.setattr(ModelRunner, "call_thread_min_tokens", min_tokens)
    llm = jaxinfer.LLM(model="tiny-llama", load_format="dummy", warmup=False, progress=False, max_model_len=256,
                       max_num_seqs=4, max_num_batched_tokens=64)
    assert (llm.runner._calls is not None) == call_thread
    dispatch, dispatches = llm.runner.dispatch, []
    monkeypatch.setattr(llm.runner, "dispatch", lambda *a: dispatches.append(1) or dispatch(*a))
    eng = llm.engine
    params = [SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True),
              SamplingParams(max_tokens=20, temperature=0.8, seed=3, ignore_eos=True, logprobs=2),
              SamplingParams(max_tokens=18, temperature=0.0, ignore_eos=True, repetition_penalty=1.3,
                             presence_penalty=0.5),
              SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True, prompt_logprobs=1),
              SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True),  # aborted below
              SamplingParams(max_tokens=22, temperature=0.7, seed=11, ignore_eos=True, frequency_penalty=0.4)]
    for i, sp in enumerate(params):  # six requests on four slots: admissions while others decode
        eng.add_request(f"r{i}", [(5 * i + j) % 400 + 3 for j in range(9 + 3 * i)], sp)
    done, steps = {}, 0
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                c = out.outputs[0]
                lps = None if c.logprobs is None else [sorted((t, round(lp.logprob, 4)) for t, lp in d.items())
                                                        for d in c.logprobs]
                plps = None if out.prompt_logprobs is None else len(out.prompt_logprobs)
                done[out.request_id] = (list(c.token_ids), c.finish_reason, lps, plps)
        steps += 1
        if steps == 6:
            assert eng.abort("r4")  # running, a step of it in flight; an aborted request reports nothing more
    threaded = llm.runner._calls.num_calls if call_thread else 0
    return done, threaded, len(dispatches)


def test_engine_tokens_equal_with_and_without_the_call_thread(monkeypatch):
    off, _, _ = _run(False, monkeypatch)
    on, on_calls, on_steps = _run(True, monkeypatch)  # every call on the thread but prompt-logprob steps
    # calls of >= 4 bucket tokens on the thread (prefill chunks, decodes of 3-4 requests), smaller ones inline
    mixed, mixed_calls, mixed_steps = _run(True, monkeypatch, min_tokens=4)
    assert set(on) == set(off) == {f"r{i}" for i in range(6)} - {"r4"}
    assert off["r2"][0] and off["r3"][3]  # the penalised and the prompt-logprob requests ran
    assert on == off
    assert on_steps - 3 <= on_calls < on_steps  # (the prompt-logprob request's prefill steps are inline)
    assert mixed == off
    assert 5 < mixed_calls < mixed_steps - 5  # both paths ran, interleaved (23 of 39 calls threaded, 12-07)
