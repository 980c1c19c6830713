"""Event-loop time a streamed token costs in the server's SSE loop, before and after 12-07 b (CPU is fine).

serving/server.py `_Server._stream` read each prompt's RequestStream through a pump task into a second
asyncio.Queue and awaited `asyncio.wait_for(queue.get(), None)` for every token; since 12-07 b a request with one
prompt (the common case) awaits its stream directly. This probe runs both patterns on one event loop with no
engine and no sockets: N handler tasks, one per stream; each "step" puts one output into every stream's queue (as
AsyncEngine's one hand-off a step does) and waits until every handler has encoded its SSE chunk (the same
json.dumps as the server's). Printed: event-loop µs a step and a token. Socket writes and aiohttp's work are not
in it (they are the same for both patterns).

  python benchmarks/probes/stream_loop_cost.py [--streams 256] [--steps 200] [--repeat 2]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


class _Out:  # the fields of a RequestOutput the loop reads
    __slots__ = ("finished", "text")

    def __init__(self, finished: bool):
        self.finished, self.text = finished, "ab"


async def _stream(queue: asyncio.Queue):
    """A RequestStream's iteration: items until a finished one."""
    while True:
        item = await queue.get()
        yield item
        if item.finished:
            return


def _chunk(text: str) -> bytes:
    return b"data: " + json.dumps({"id": "cmpl-x", "object": "text_completion", "created": 1, "model": "m",
                                   "choices": [{"index": 0, "text": text, "logprobs": None,
                                                "finish_reason": None}]}).encode() + b"\n\n"


async def _pumped(sink: asyncio.Queue, done: list):
    """Before: a pump task into a second queue, wait_for on every get."""
    queue: asyncio.Queue = asyncio.Queue()

    async def pump():
        try:
            async for out in _stream(sink):
                await queue.put((0, out))
        finally:
            await queue.put((0, None))

    task = asyncio.create_task(pump())
    while True:
        _, out = await asyncio.wait_for(queue.get(), None)
        if out is None:
            break
        _chunk(out.text)
        done[0] += 1
    await task


async def _direct(sink: asyncio.Queue, done: list):
    """After: the stream awaited directly (one prompt)."""
    it = _stream(sink)

    async def next_item():
        try:
            return 0, await it.__anext__()
        except StopAsyncIteration:
            return 0, None

    while True:
        _, out = await next_item()
        if out is None:
            break
        _chunk(out.text)
        done[0] += 1


async def _run(handler, streams: int, steps: int) -> float:
    sinks = [asyncio.Queue() for _ in range(streams)]
    done = [0]
    tasks = [asyncio.create_task(handler(s, done)) for s in sinks]
    await asyncio.sleep(0)
    t0 = time.perf_counter()
    for step in range(steps):
        for s in sinks:
            s.put_nowait(_Out(step == steps - 1))
        while done[0] < (step + 1) * streams:
            await asyncio.sleep(0)
    dt = time.perf_counter() - t0
    await asyncio.gather(*tasks)
    return dt / steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    rows = []
    for rep in range(a.repeat):
        for name, handler in (("pump+queue (before)", _pumped), ("direct (after)", _direct)):
            s = asyncio.run(_run(handler, a.streams, a.steps))
            rows.append(dict(pattern=name, round=rep, us_per_step=1e6 * s, us_per_token=1e6 * s / a.streams))
            print(f"{name:20s} round {rep}: {1e6 * s:8.0f} µs a step, {1e6 * s / a.streams:5.2f} µs a token "
                  f"({a.streams} streams)", flush=True)
    from benchmarks.common import write_result

    print("wrote", write_result("stream-loop-cost", dict(streams=a.streams, steps=a.steps, rows=rows)))


if __name__ == "__main__":
    main()
