"""Output kinds end to end on CPU (tiny random Llama + a tiny byte-level BPE tokenizer trained here).

The same workload runs once with every request CUMULATIVE and once DELTA (prefix caching off and explicit seeds, so
both runs compute the same batches): per completion, the DELTA outputs concatenated (text, token ids, logprobs) equal
the CUMULATIVE final, each finish_reason comes exactly once, and the CUMULATIVE outputs' delta_text /
delta_token_ids concatenate to the same. The workload has stop strings (taken from a first run's text, so they do
match), include_stop_str_in_output, n > 1 with sampling and logprobs, eos, preemption (few pages) and speculative
decoding (ngram drafts, so a stop string can fall inside a run of accepted drafts). FINAL_ONLY gives exactly one
output per request, equal to the CUMULATIVE final.
"""
import numpy as np
import pytest

import jaxinfer
from jaxinfer import SamplingParams
from jaxinfer.sampling_params import RequestOutputKind

KW = dict(max_model_len=256, max_num_batched_tokens=48, max_num_seqs=8, progress=False,
          enable_prefix_caching=False)


@pytest.fixture(scope="module")
def tok_dir(tiny_tokenizer_dir):
    return tiny_tokenizer_dir


@pytest.fixture(scope="module")
def llm(tiny_llama_dir, tok_dir):
    return jaxinfer.LLM(tiny_llama_dir, tokenizer=tok_dir, num_pages=12, **KW)


@pytest.fixture(scope="module")
def spec_llm(tiny_llama_dir, tok_dir):
    return jaxinfer.LLM(tiny_llama_dir, tokenizer=tok_dir, num_pages=12, **KW,
                        speculative_config=dict(method="ngram", num_speculative_tokens=3, batch_policy=False))


def _prompts(seed=0, n=10):
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(3, 512, size=int(rng.integers(2, 40))).tolist() for _ in range(n)]
    prompts[1], prompts[5] = [5, 6, 7, 8] * 8, [9, 10, 11] * 6  # quoting prompts: n-gram drafts get accepted
    return prompts


def _params(i, stop=None, kind=RequestOutputKind.CUMULATIVE):
    """A mix: greedy and sampled (n=3), logprobs on some, include_stop_str_in_output on some, eos on some."""
    sampled = i % 3 == 1
    return SamplingParams(n=3 if sampled else 1, temperature=1.0 if sampled else 0.0, seed=100 + i,
                          max_tokens=24 + i % 5, ignore_eos=i % 4 != 0, stop=stop,
                          include_stop_str_in_output=i % 5 == 2, logprobs=2 if i % 4 == 0 else None,
                          prompt_logprobs=1 if i == 4 else None, output_kind=kind)


def _run(llm, reqs):
    """Every (prompt, params) in one engine run; {request id: [its outputs, in order]}."""
    eng = llm.engine
    outs = {}
    for i, (p, sp) in enumerate(reqs):
        eng.add_request(f"r{i:02d}", p, sp)
    while eng.has_unfinished():
        for o in eng.step():
            outs.setdefault(o.request_id, []).append(o)
    assert eng.kv.num_used_pages == 0
    return outs


def _stops_from(llm, prompts):
    """For each prompt, a two-character stop string from the middle of its unstopped text (so it matches)."""
    finals = _run(llm, [(p, _params(i)) for i, p in enumerate(prompts)])
    stops = []
    for i in range(len(prompts)):
        text = finals[f"r{i:02d}"][-1].outputs[0].text
        cands = [text[k:k + 2] for k in range(len(text) // 3, len(text) - 1) if "\ufffd" not in text[k:k + 2]
                 and text[k:k + 2].strip()]
        stops.append([cands[0]] if cands and i % 4 != 3 else None)  # every 4th: no stop string
    return stops


def _concat(outs, n):
    """Per completion index: (text, token ids, logprobs, finish_reason, stop_reason, cumulative_logprob, how many
    outputs carried a finish_reason), from DELTA outputs."""
    acc = [["", [], [], None, None, None, 0] for _ in range(n)]
    for o in outs:
        for c in o.outputs:
            a = acc[c.index]
            a[0] += c.text
            a[1] += c.token_ids
            a[2] += c.logprobs or []
            a[5] = c.cumulative_logprob
            if c.finish_reason is not None:
                a[3], a[4], a[6] = c.finish_reason, c.stop_reason, a[6] + 1
    return [tuple(a) for a in acc]


def _check_delta_equals_cumulative(llm):
    prompts = _prompts()
    stops = _stops_from(llm, prompts)
    cum = _run(llm, [(p, _params(i, stops[i])) for i, p in enumerate(prompts)])
    delta = _run(llm, [(p, _params(i, stops[i], RequestOutputKind.DELTA)) for i, p in enumerate(prompts)])
    assert cum.keys() == delta.keys() == {f"r{i:02d}" for i in range(len(prompts))}
    num_stop_strings = 0
    for rid, couts in cum.items():
        final, douts = couts[-1], delta[rid]
        n = len(final.outputs)
        assert final.finished and douts[-1].finished and not any(o.finished for o in douts[:-1])
        for c, (text, ids, lps, reason, stop_reason, cum_lp, num_fin) in zip(final.outputs, _concat(douts, n)):
            assert text == c.text and ids == c.token_ids, rid
            assert lps == (c.logprobs or []), rid
            assert (reason, stop_reason) == (c.finish_reason, c.stop_reason) and num_fin == 1, rid
            assert cum_lp == pytest.approx(c.cumulative_logprob)
            num_stop_strings += isinstance(c.stop_reason, str)
            if c.stop_reason is not None and isinstance(c.stop_reason, str):  # the match ends (or is cut from) it
                assert c.text.endswith(c.stop_reason) == (rid in ("r02", "r07")), rid
        # the CUMULATIVE outputs' delta fields add up to the final too
        for c in final.outputs:
            parts = [x for o in couts for x in o.outputs if x.index == c.index]
            assert "".join(x.delta_text for x in parts) == c.text
            assert [t for x in parts for t in x.delta_token_ids] == c.token_ids
        # DELTA: every output has something new for each completion it lists; prompt logprobs only in the first
        for o in douts:
            assert o.outputs and all(x.token_ids or x.text or x.finish_reason for x in o.outputs)
            assert all(x.text == x.delta_text and x.token_ids == x.delta_token_ids for x in o.outputs)
        if final.prompt_logprobs is not None:
            assert douts[0].prompt_logprobs == final.prompt_logprobs
            assert all(o.prompt_logprobs is None for o in douts[1:])
    assert num_stop_strings >= 4  # the stop strings did end requests (the test is not vacuous)
    return cum


def test_delta_concatenation_equals_cumulative(llm):
    cum = _check_delta_equals_cumulative(llm)
    assert any(len(o[-1].outputs) == 3 for o in cum.values())


def test_delta_concatenation_equals_cumulative_with_speculation(spec_llm):
    before = spec_llm.engine.spec_stats()["num_accepted_tokens"]
    _check_delta_equals_cumulative(spec_llm)
    assert spec_llm.engine.spec_stats()["num_accepted_tokens"] > before  # drafts were accepted


def test_final_only_one_output_per_request(llm):
    prompts = _prompts(seed=1, n=8)
    cum = _run(llm, [(p, _params(i, ["e"])) for i, p in enumerate(prompts)])
    fin = _run(llm, [(p, _params(i, ["e"], RequestOutputKind.FINAL_ONLY)) for i, p in enumerate(prompts)])
    assert fin.keys() == cum.keys()
    for rid, outs in fin.items():
        assert len(outs) == 1 and outs[0].finished, rid
        want = cum[rid][-1]
        assert [(c.text, c.token_ids, c.logprobs, c.finish_reason, c.stop_reason) for c in outs[0].outputs] == \
            [(c.text, c.token_ids, c.logprobs, c.finish_reason, c.stop_reason) for c in want.outputs]
        assert all(c.delta_text == c.text and c.delta_token_ids == c.token_ids for c in outs[0].outputs)
    # stream=False (LLM.generate's path) is FINAL_ONLY whatever the params say
    eng = llm.engine
    eng.add_request("x", prompts[0], _params(0, None, RequestOutputKind.DELTA), stream=False)
    seen = []
    while eng.has_unfinished():
        seen += [o for o in eng.step() if o.request_id == "x"]
    assert len(seen) == 1 and seen[0].finished and seen[0].outputs[0].token_ids == \
        llm.generate([prompts[0]], _params(0), use_tqdm=False)[0].outputs[0].token_ids
