"""Engine behaviour that the host fast paths (LLMEngine._launch / _finish_step / _outputs) must keep."""
import dataclasses
import time

import pytest

from jaxinfer.outputs import SeqInput


def test_seq_input_leading_fields_are_in_the_order_the_engine_passes_them():
    # LLMEngine._launch builds SeqInput positionally (hot path): a field inserted before prev_row would shift them.
    names = [f.name for f in dataclasses.fields(SeqInput)]
    assert names[:11] == ["token_ids", "start_pos", "page_table", "temperature", "top_k", "top_p", "min_p", "seed",
                          "step", "want_logprobs", "prev_row"]


@pytest.fixture(scope="module")
def engine():
    import jaxinfer

    llm = jaxinfer.LLM("tiny-llama", load_format="dummy", max_model_len=64, max_num_seqs=8,
                       max_num_batched_tokens=64, progress=False)
    return llm.engine


def test_non_streaming_group_reported_once_equal_to_its_streaming_twin(engine):
    from jaxinfer import SamplingParams

    # n=2 sampled sequences that end at different steps (stop token ids hit at different lengths for this seed)
    sp = SamplingParams(n=2, temperature=1.0, seed=7, max_tokens=24, stop_token_ids=list(range(3, 60)))
    prompt = [5, 9, 11, 200, 301]
    engine.add_request("q", prompt, sp, stream=False)
    engine.add_request("s", prompt, sp, stream=True)  # the same request, streamed: the reference
    engine.add_request("b", [7, 8], SamplingParams(max_tokens=6, temperature=0.0))
    engine.add_request("a", [7, 9], SamplingParams(max_tokens=6, temperature=0.0))
    seen, first_s_output_time, last_stream = [], None, None
    while engine.has_unfinished():
        outs = engine.step()
        t = time.monotonic()
        ids = [o.request_id for o in outs]
        assert ids == sorted(ids)  # one step's outputs come in request-id order
        for o in outs:
            if o.request_id == "q":
                seen.append(o)
            if o.request_id == "s":
                first_s_output_time = first_s_output_time or t
                last_stream = o
    assert len(seen) == 1 and seen[0].finished  # stream=False: one output, when all sequences are done
    q = seen[0]
    assert [c.token_ids for c in q.outputs] == [c.token_ids for c in last_stream.outputs]
    assert [c.finish_reason for c in q.outputs] == [c.finish_reason for c in last_stream.outputs]
    assert [c.stop_reason for c in q.outputs] == [c.stop_reason for c in last_stream.outputs]
    assert [c.cumulative_logprob for c in q.outputs] == pytest.approx(
        [c.cumulative_logprob for c in last_stream.outputs])
    # the test needs the two sequences to finish at different steps (a property of the fixed seed)
    assert len(q.outputs[0].token_ids) != len(q.outputs[1].token_ids)
    # first_token_time is stamped when the first token came, not when the group was finally reported
    assert q.metrics["first_token_time"] <= first_s_output_time < q.metrics["finished_time"]


def test_plain_step_logprob_sums_equal_the_per_token_path(engine):
    """Steps without logprobs finish as columns (LLMEngine._finish_plain, sums kept in the InputBatch); the same
    requests asking for logprobs take the per-token path: their cumulative_logprob is the sum of their reported token
    logprobs, and the plain runs' must equal it (same greedy tokens), also for requests admitted mid-run into the
    slots of finished ones."""
    from jaxinfer import SamplingParams

    prompts = [[3 + i, 40 + 2 * i, 77, 9 + i] for i in range(6)]

    def run(tag, sp, max_tokens):
        finals, k = {}, 0
        for i, p in enumerate(prompts[:3]):
            engine.add_request(f"{tag}{i}", p, sp.clone(max_tokens=max_tokens[i]), stream=i % 2 == 0)
        while engine.has_unfinished():
            if k == 4:  # later admissions reuse the slots of the finished ones
                for i, p in enumerate(prompts[3:], start=3):
                    engine.add_request(f"{tag}{i}", p, sp.clone(max_tokens=max_tokens[i]), stream=False)
            for o in engine.step():
                if o.finished:
                    finals[o.request_id[len(tag):]] = o.outputs[0]
            k += 1
        return finals

    lens = [3, 9, 2, 8, 5, 9]
    plain = run("p", SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True), lens)
    traced = run("t", SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True, logprobs=0), lens)
    assert set(plain) == set(traced) == {str(i) for i in range(6)}
    for i, t in traced.items():
        p = plain[i]
        assert p.token_ids == t.token_ids and len(p.token_ids) == lens[int(i)]
        want = sum(d[tok].logprob for d, tok in zip(t.logprobs, t.token_ids))
        assert t.cumulative_logprob == pytest.approx(want, rel=1e-6)
        assert p.cumulative_logprob == pytest.approx(want, rel=1e-6)
        assert p.cumulative_logprob != 0.0


def _run_text_requests(llm, force_general: bool):
    """Requests with stop strings, eos, max_tokens, n = 2, every output kind, through llm's engine; with
    force_general one more running request asks for logprobs, so no step is plain (LLMEngine._finish_step's
    per-token path); without, the same request without logprobs (the batches hold the same rows). Returns every
    reported output of the text requests, in order."""
    from jaxinfer import SamplingParams
    from jaxinfer.sampling_params import RequestOutputKind as K

    eng = llm.engine
    eng.add_request("zz-keep", [9, 8, 7], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True,
                                                          logprobs=0 if force_general else None))
    specs = [
        ("a", dict(stop=["e"], temperature=1.0, seed=1), K.DELTA, True),
        ("b", dict(stop=["th", "in"], include_stop_str_in_output=True, temperature=1.0, seed=2), K.CUMULATIVE, True),
        ("c", dict(n=2, stop=["o"], temperature=1.0, seed=3, min_tokens=3), K.DELTA, True),
        ("d", dict(temperature=1.0, seed=4, stop_token_ids=list(range(100, 140))), K.DELTA, True),
        ("e", dict(temperature=0.0, stop=["zzzz"]), K.CUMULATIVE, False),  # ends by max_tokens, held text flushed
        ("f", dict(temperature=1.0, seed=6, stop=[" "], skip_special_tokens=False), K.FINAL_ONLY, True),
    ]
    for rid, kw, kind, stream in specs:
        eng.add_request(rid, [3, 17, 5, 99, 42], SamplingParams(max_tokens=30, output_kind=kind, **kw), stream=stream)
    got = []
    while eng.has_unfinished():
        for o in eng.step():
            if o.request_id != "zz-keep":
                got.append((o.request_id, o.finished, [(c.index, c.text, list(c.token_ids), c.finish_reason,
                                                        c.stop_reason, round(c.cumulative_logprob, 4))
                                                       for c in o.outputs]))
    return got


def test_plain_steps_with_a_tokenizer_equal_the_per_token_path():
    """With a tokenizer, plain steps (no logprobs, no drafts) detokenize in LLMEngine._finish_plain: every output
    (texts, deltas, token ids, stop strings and their reasons, flushes at the end, logprob sums) equals the general
    per-token path's for the same requests."""
    import jaxinfer
    from jaxinfer.weights.default_model import default_model_path

    llm = jaxinfer.LLM("tiny-llama", load_format="dummy", max_model_len=64, max_num_seqs=16, max_num_batched_tokens=64,
                       tokenizer=default_model_path(), progress=False)
    general = _run_text_requests(llm, force_general=True)
    plain = _run_text_requests(llm, force_general=False)
    assert plain == general
    finals = {rid: outs for rid, fin, outs in general if fin}
    reasons = {c[4] for outs in finals.values() for c in outs}
    assert {"e", "o"} & reasons and ({"th", "in"} & reasons)  # stop strings did match (the test exercises them)
    assert any(c[3] == "length" for c in finals["e"])
