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
