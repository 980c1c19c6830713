"""serving/async_engine.py releases a request's slot before the request's last item reaches its client: with
max_waiting=0 and one sequence, a client that sends its next request the moment it has its answer is admitted
(CI saw a 503 there once: tests/serving/test_server.py::test_max_waiting_503, the slot freed after the answer)."""
import asyncio

from jaxinfer import LLM, SamplingParams
from serving.async_engine import AsyncEngine, QueueFullError, _Deliveries, _put_all


def test_slot_released_before_the_last_output_is_delivered(tiny_llama_dir, monkeypatch):
    llm = LLM(tiny_llama_dir, dtype="float32", num_pages=64, max_model_len=128, max_num_batched_tokens=32,
              max_num_seqs=1, warmup=False, progress=False)
    aeng = AsyncEngine(llm.engine, max_waiting=0)
    seen = []  # (finished?, requests counted unfinished) at the moment each item is handed to a client
    real_put = _Deliveries.put

    def recording_put(deliveries, sink, item):
        seen.append((getattr(item, "finished", True), aeng.num_unfinished))
        real_put(deliveries, sink, item)

    monkeypatch.setattr(_Deliveries, "put", recording_put)

    async def run():
        try:
            first = await aeng.add_request([1, 5, 7], SamplingParams(max_tokens=6, temperature=0.0))
            async for out in first:
                pass
            assert out.finished
            # the answer is here: the one slot must be free already, with no wait
            second = await aeng.add_request([1, 2], SamplingParams(max_tokens=2, temperature=0.0))
            async for out2 in second:
                pass
            return out, out2
        finally:
            await aeng.shutdown(5)

    out, out2 = asyncio.run(run())
    assert len(out.outputs[0].token_ids) == 6 and out2.finished
    finals = [n for finished, n in seen if finished]
    assert finals and all(n == 0 for n in finals), seen  # counted finished before its last item went out
    assert any(n == 1 for finished, n in seen if not finished)  # (the count is what a client's admission sees)


def test_full_while_running_still_refused(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, dtype="float32", num_pages=64, max_model_len=512, max_num_batched_tokens=32,
              max_num_seqs=1, warmup=False, progress=False)

    async def run():
        aeng = AsyncEngine(llm.engine, max_waiting=0)
        try:
            slow = await aeng.add_request([1, 5, 7], SamplingParams(max_tokens=200, temperature=0.0,
                                                                   ignore_eos=True))
            try:
                await aeng.add_request([1, 2], SamplingParams(max_tokens=2))
                refused = False
            except QueueFullError:
                refused = True
            slow.abort()
            return refused
        finally:
            await aeng.shutdown(5)

    assert asyncio.run(run())


def test_one_wakeup_of_the_event_loop_per_step(tiny_llama_dir):
    """A step's outputs for all its requests reach the event loop in ONE call_soon_threadsafe (each call writes to
    the loop's wake-up pipe; one per request cost the engine thread ~2 µs each), in order: every stream gets the
    tokens of offline generation, and the hand-offs number the steps that produced outputs, not the outputs."""
    llm = LLM(tiny_llama_dir, dtype="float32", num_pages=128, max_model_len=128, max_num_batched_tokens=64,
              max_num_seqs=8, warmup=False, progress=False)
    prompts = [[1, 5, 7 + i] for i in range(8)]
    sp = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
    handoffs = []  # the number of items in each _put_all hand-off

    async def run():
        loop = asyncio.get_running_loop()
        real = loop.call_soon_threadsafe

        def counting(cb, *args, **kw):
            if cb is _put_all:
                handoffs.append(len(args[0]))
            return real(cb, *args, **kw)

        loop.call_soon_threadsafe = counting
        aeng = AsyncEngine(llm.engine)
        try:
            from jaxinfer.sampling_params import RequestOutputKind
            streams = await aeng.add_requests(prompts, sp.clone(output_kind=RequestOutputKind.DELTA))
            got = []
            for st in streams:
                ids = []
                async for out in st:
                    ids += out.outputs[0].token_ids
                got.append(ids)
            return got
        finally:
            await aeng.shutdown(5)

    got = asyncio.run(run())
    assert got == want
    assert sum(handoffs) >= 8 * 5 and len(handoffs) <= 5 + 2, handoffs  # ~one hand-off per decode step
    assert max(handoffs) == 8
