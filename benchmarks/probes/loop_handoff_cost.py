"""Engine-thread cost of handing one step's outputs to the server's event loop (issue 17: serving at batch 256).

serving/async_engine.py's engine thread gives every RequestOutput of a step to its request's asyncio.Queue. Each
`loop.call_soon_threadsafe` also writes a byte to the loop's wake-up pipe (a system call). This probe times, on
a thread beside a running event loop with --requests consumers, one step's hand-off done per output ('each', the
form before 12-07) and as one call carrying the whole step ('batched', the engine's form since), median over
--steps steps, in µs of the producing thread's time.

  python benchmarks/probes/loop_handoff_cost.py [--requests 256] [--steps 200]

Measured (2-core CPU box, 12-07, two runs): 'each' 531 and 2,732 µs a step at 256 requests, 'batched' 22-23 µs.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.common import write_result  # noqa: E402
from serving.async_engine import _put_all  # noqa: E402


async def measure(n: int, steps: int) -> dict:
    loop = asyncio.get_running_loop()
    queues = [asyncio.Queue() for _ in range(n)]
    done, res = asyncio.Event(), {}

    def producer():
        for mode in ("each", "batched"):
            times = []
            for step in range(steps):
                t = time.perf_counter()
                if mode == "each":
                    for q in queues:
                        loop.call_soon_threadsafe(q.put_nowait, step)
                else:
                    loop.call_soon_threadsafe(_put_all, [(q, step) for q in queues])
                times.append(time.perf_counter() - t)
                time.sleep(0.002)   # (a device step's worth of idle time for the loop to drain the queues)
            res[mode] = 1e6 * statistics.median(times)
        loop.call_soon_threadsafe(done.set)

    async def consume(q):
        while True:
            await q.get()

    tasks = [asyncio.create_task(consume(q)) for q in queues]
    th = threading.Thread(target=producer)
    th.start()
    await done.wait()
    th.join()
    for t in tasks:
        t.cancel()
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    res = asyncio.run(measure(a.requests, a.steps))
    for mode, us in res.items():
        print(f"{mode:8s} {us:8.1f} µs a step of the engine thread ({a.requests} outputs)")
    print("wrote", write_result("loop-handoff-cost", dict(requests=a.requests, steps=a.steps, us_per_step=res),
                                tag=a.tag))


if __name__ == "__main__":
    main()
