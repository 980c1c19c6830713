"""Does the step's compiled call hold the GIL? (issue 17 item 2, issue 20 batch 1: a dispatch thread helps only if not)

The engine thread's host time per step is mostly the compiled call (H200, 12-04: batch 1 dispatch 2.96 of 3.77 ms,
batch 256 2.54 of 5.31 ms; `host_step_cost.py`). If the call releases the GIL for its C++ part (command-buffer
update, cuGraphLaunch), a second thread can make it while the engine thread runs the next step's Python work.

For each batch: the decode step program (greedy, the one the engine runs), called back to back for --seconds,
(a) alone: call time median; (b) while a Python thread spins a counter: the counter's rate over its rate with the
main thread asleep = the share of the call time the GIL is free.
Answer on the H200 (results/call-gil-2026-12-05.json): mostly free (67-93%), but beside the spinning thread each
call took 240-380 ms instead of 4-13: the call re-takes the GIL dozens of times, each time waiting out the switch
interval, so a dispatch thread beside the engine thread's Python would serialise on the GIL (not built).
--switch-interval repeats the measurement under other values of sys.setswitchinterval (Python's default 0.005 s):
with a shorter interval the call's GIL re-takes wait less, at the price of more switches for every thread; if the
call beside the spinner then takes about its time alone, a dispatch thread is worth building.

  python benchmarks/probes/call_gil.py [--model llama3-8b] [--batch 1 64 256] [--switch-interval 0.005 0.0002]
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import write_result  # noqa: E402


def _spin(stop: threading.Event, counter: list):
    n = 0
    while not stop.is_set():
        n += 1
        if not n % 4096:
            counter[0] = n
    counter[0] = n


def _spin_rate(work, seconds: float) -> float:
    """Counter increments per second of a spinning thread while `work(seconds)` runs on this thread."""
    stop, counter = threading.Event(), [0]
    t = threading.Thread(target=_spin, args=(stop, counter))
    t0 = time.perf_counter()
    t.start()
    work(seconds)
    stop.set()
    t.join()
    return counter[0] / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--switch-interval", type=float, nargs="+", default=[0.005],
                    help="sys.setswitchinterval values (seconds) to measure under, in order")
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    from jaxinfer import LLM
    from jaxinfer.outputs import SeqInput
    from jaxinfer.runner.batch import pack

    llm = LLM(a.model, load_format="dummy", max_model_len=1024, max_num_seqs=max(a.batch), progress=False)
    llm.runner.finish_background_compiles()
    r = llm.runner
    rows = []
    for interval, b in [(i, b) for i in a.switch_interval for b in a.batch]:
        sys.setswitchinterval(interval)
        base = _spin_rate(time.sleep, a.seconds)
        per = a.context // r.page_size + 1
        seqs = [SeqInput(token_ids=[1], start_pos=a.context, page_table=list(range(1 + i * per, 1 + (i + 1) * per)))
                for i in range(b)]
        hb = pack(seqs, r.ladder.pick(b, b), r.page_size)
        step = r.step_program(hb)
        flat = hb.flat()
        calls = []

        def work(seconds, record=calls):
            out = None
            t_end = time.perf_counter() + seconds
            while time.perf_counter() < t_end:
                t0 = time.perf_counter()
                ints, floats = jax.device_put(flat)
                out, _ = r.run_compiled(step, ints, floats)
                record.append(time.perf_counter() - t0)
            jax.block_until_ready(out)

        work(0.5, [])  # warm
        alone = []
        work(a.seconds, alone)
        rate = _spin_rate(work, a.seconds)
        row = dict(switch_interval_s=interval, spinner_idle_rate=base, batch=b,
                   call_ms_median=1e3 * float(np.median(alone)),
                   call_ms_median_with_spinner=1e3 * float(np.median(calls)),
                   gil_free_share=rate / base)
        rows.append(row)
        print(f"switch interval {1e3 * interval:.2f} ms, batch {b:>3}: call (device_put + step) median "
              f"{row['call_ms_median']:.2f} ms alone, "
              f"{row['call_ms_median_with_spinner']:.2f} ms beside a spinning thread; the spinner ran at "
              f"{100 * row['gil_free_share']:.0f}% of its idle rate during the calls", flush=True)
    print("wrote", write_result("call-gil", dict(model=a.model, context=a.context, rows=rows), tag=a.tag))


if __name__ == "__main__":
    main()
