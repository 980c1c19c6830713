"""The engine with steady decodes as columns (engine/decode_run.py, the default from decode_run.MIN_RUN running
requests) against the same engine running every step through the general scheduler loop: the same workload must give the same
outputs, step by step (tokens, finish reasons, stop reasons, cumulative logprobs, what each step reports), with
the step in flight, eos / stop tokens / max_tokens / max_model_len ends, seeded sampling, aborts mid-decode, a
cache small enough to preempt, and requests arriving while a run is on. The run must actually be taken."""
import numpy as np
import pytest

import jaxinfer
from jaxinfer import SamplingParams
from jaxinfer.engine import decode_run
from jaxinfer.runner import batch as batch_mod
from jaxinfer.sampling_params import RequestOutputKind


def _params(rng, i):
    kind = (RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY)[i % 3]
    if i % 4 == 0:
        return SamplingParams(temperature=0.8, seed=i, max_tokens=int(rng.integers(8, 40)), output_kind=kind)
    stop = rng.integers(3, 512, size=8).tolist() if i % 5 == 0 else None  # (~1.5% of tokens stop it)
    return SamplingParams(temperature=0.0, max_tokens=int(rng.integers(16, 70)), ignore_eos=i % 3 == 0,
                          stop_token_ids=stop, output_kind=kind)


def _run(llm, columnar: bool, seed: int):
    eng = llm.engine
    eng.scheduler.columnar = columnar
    # more eos ids than the model's one, so that eos ends requests in this random model's outputs (~1.5% of tokens)
    eng.scheduler.eos_token_ids = frozenset({2, *range(100, 108)})
    rng = np.random.default_rng(seed)
    n = 200
    prompts = [rng.integers(3, 512, size=int(rng.integers(1, 24))).tolist() for _ in range(n)]
    first = 72  # a batch large enough for a run, then arrivals and aborts while it decodes
    for i in range(first):
        eng.add_request(f"r{i}", prompts[i], _params(rng, i))
    log, step, nxt = [], 0, first
    while eng.has_unfinished():
        outs = eng.step()
        log.append(sorted((o.request_id, o.finished, tuple(tuple(c.token_ids) for c in o.outputs),
                           tuple(c.finish_reason for c in o.outputs), tuple(c.stop_reason for c in o.outputs),
                           tuple(round(c.cumulative_logprob or 0.0, 4) for c in o.outputs)) for o in outs))
        step += 1
        for _ in range(2):
            if nxt < n:
                eng.add_request(f"r{nxt}", prompts[nxt], _params(rng, nxt))
                nxt += 1
        if step in (9, 23):
            eng.abort(f"r{step}")
    assert eng.kv.num_used_pages == 0
    reasons = [x[4][0] for step_log in log for x in step_log if x[1]]
    assert sum(r is None for r in reasons) >= 3 and sum(r is not None for r in reasons) >= 3  # eos and stop ids
    return log


# 600 pages: the engine's run threshold; 40 pages: preemption (23 in this workload), with runs from 4
@pytest.mark.parametrize("num_pages,min_run", [(600, decode_run.MIN_RUN), (40, 4)])
def test_columnar_decodes_equal_the_general_loop(tiny_llama_dir, monkeypatch, num_pages, min_run):
    llm = jaxinfer.LLM(tiny_llama_dir, num_pages=num_pages, max_model_len=96, max_num_batched_tokens=256,
                       max_num_seqs=72, progress=False)
    llm.engine.scheduler.min_decode_run = min_run
    taken = []
    real = decode_run.schedule_steady

    def counting(sched, budget):
        run = real(sched, budget)
        taken.append(0 if run is None else len(run))
        return run

    monkeypatch.setattr(decode_run, "schedule_steady", counting)
    general = _run(llm, False, 0)
    assert not any(taken)
    llm.engine.kv.reset_prefix_cache()  # (the second run must not hit the first one's pages: other batch shapes)
    columnar = _run(llm, True, 0)
    assert sum(t >= min_run for t in taken) >= 10, taken  # the runs happened
    assert columnar == general
    if num_pages == 40:
        assert llm.engine.scheduler.stats().num_preemptions_total > 0


def test_steady_continuation_through_the_runner_equals_the_general_loop(tiny_llama_dir, monkeypatch):
    """A long steady stretch through the real ModelRunner: the decode run's chain, the InputBatch's continuation and
    pack_step's continuation, packed in place into the buffers of a packing the runner released at its fetch
    (runner/batch.py), must give the general loop's tokens and logprobs (greedy and seeded sampling, page
    crossings); the continuation and the in-place packing are counted, so the comparison covers them."""
    llm = jaxinfer.LLM(tiny_llama_dir, num_pages=600, max_model_len=96, max_num_batched_tokens=256,
                       max_num_seqs=72, progress=False)
    packed = {"continued": 0, "in_place": 0}
    real_cont = batch_mod._pack_continuation

    def cont(sb, bucket, page_size, last, n_pages):
        packed["continued"] += 1
        packed["in_place"] += bool(sb.root and batch_mod._FREE.get((bucket, sb.root)))
        return real_cont(sb, bucket, page_size, last, n_pages)

    monkeypatch.setattr(batch_mod, "_pack_continuation", cont)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, 512, size=int(rng.integers(1, 24))).tolist() for _ in range(70)]
    params = [SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=i, max_tokens=50 + i % 7, ignore_eos=True,
                             logprobs=None) for i in range(70)]

    def run(columnar: bool):
        llm.engine.scheduler.columnar = columnar
        llm.engine.kv.reset_prefix_cache()
        for i, (p, sp) in enumerate(zip(prompts, params)):
            llm.engine.add_request(f"s{i}", p, sp)
        done = {}
        while llm.engine.has_unfinished():
            for o in llm.engine.step():
                if o.finished:
                    done[o.request_id] = (tuple(o.outputs[0].token_ids), round(o.outputs[0].cumulative_logprob, 4))
        return done

    general = run(False)
    assert packed["continued"] == 0
    steady = run(True)
    assert packed["continued"] >= 30 and packed["in_place"] >= 20, packed
    assert steady == general
