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
