"""The step's compiled call on a thread of its own: on by default with a GPU (JAXINFER_CALL_THREAD=0 / 1 forces it).

Why: on the GPU the compiled call of step n+1 lasts until step n ends on the device, because a step's inputs are a
host->device transfer (docs/architecture.md, "A transferred input ..."), and it spends that time on the CPU
(benchmarks/probes/host_step_cost.py counts 2.6-3.2 ms of it a step at batch 256 on an H100 host). Made here, on
one worker thread, the call leaves the engine thread free to finish step n (fetch, update, outputs) and schedule
and pack step n+2 meanwhile. The call releases the GIL for most of its C++ work but takes it back many times; beside
a thread running Python each re-take waits out the interpreter's switch interval (5 ms by default: a batch-1 call
took 332 ms instead of 4.3 on the H200, benchmarks/probes/call_gil.py, 2026-12-05), so the thread's first call
lowers the process's switch interval (JAXINFER_SWITCH_INTERVAL seconds, default 0.0001: on an H100 the
8B step's call beside a spinning thread took 5.9 / 13.7 ms at batch 1 / 256 at 0.1 ms, as alone, but 23-25 ms at
0.5 ms and 250-280 ms at 5 ms; call_gil.py --switch-interval, 2026-12-07).

Measured (H100, 8B shape, benchmarks/README.md "2026-12-07 b"): the engine thread's host time a step at batch 256
3.0-3.4 ms -> 0.86-1.14 ms, the call thread ~2 ms of CPU beside it; batch 64 / 256 decode tok/s unchanged (the step
is device-bound there); batch 1 3% slower (175.1 -> 170.0 tok/s at 0.2 ms, 169.9 at 0.1 ms; inferred, not
profiled: when step n ends, the engine thread's Python and the call of step n+1 want the GIL at once, and the
call's re-takes delay the next step's launch), hence small steps stay inline. H200 (12-07 c): the engine thread's
host time at batch 256 2,495 -> 1,026 µs, wall a step 9.31 / 9.38 ms. Served traffic (H100, 8B, ShareGPT-like mix at
64 req/s offered, 12-07 e): 29.0 -> 32.6 req/s completed, TPOT p99 27.4 -> 13.5 ms, as with only the switch interval
lowered (32.65 req/s; serve now lowers it itself); batch 1 / 64 / 256 decode within 0.7% on / off. Hence on with a
GPU (speculative engines excepted until measured: `wanted`); off on the CPU, whose compiled call is the computation
itself rather than a wait for the device.

Invariants:
- Calls run in submission order, one at a time (one worker), so each reads the donated state (KV cache, penalty
  counts, stage buffers) the call before it left.
- The engine thread reads or replaces that state only after the last submitted call has returned
  (`drain`, from ModelRunner's kv_caches / penalty_table (DrainedState) and call_staged), so nothing donated is used
  twice and nothing is lost.
- An exception of the call reaches the engine when it reads the step's outputs (fetch), not at dispatch. The
  engine's per-request isolation (engine/isolation.py) is unaffected: a row fails the batch in packing, which stays
  on the engine thread, and the probe dispatches read their outputs through the futures
  (tests/test_isolation_e2e.py runs it with every call on the thread).
- Steps of fewer than ModelRunner.call_thread_min_tokens bucket tokens are called inline; such a call waits for the
  threaded ones before it (it reads the previous step's tokens and the drained state), so the two paths mix.

Host only in the sense of this module: it imports no jax; the runner hands it closures.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor

from jaxinfer.env_switch import positive_seconds

DEFAULT_SWITCH_INTERVAL_S = 0.0001


def switch_interval_s() -> float:
    """JAXINFER_SWITCH_INTERVAL (seconds) or the default; a clear error for a value that is not a positive number."""
    raw = os.environ.get("JAXINFER_SWITCH_INTERVAL")
    return DEFAULT_SWITCH_INTERVAL_S if raw is None else positive_seconds(raw, "JAXINFER_SWITCH_INTERVAL")


def wanted(setting: bool | None, backend: str, speculative: bool = False) -> bool:
    """Whether a single-device runner makes its calls on a CallThread: `setting` (JAXINFER_CALL_THREAD; None when
    unset or 'auto') when given, else on a GPU backend for engines without speculation. A speculative engine's
    runners (the target's and the draft model's) keep inline calls by default: the speed-ups of issue 21 were
    measured that way and their steps are not yet GPU-measured threaded (their exactness is, on the CPU:
    tests/test_call_thread_e2e.py)."""
    return setting if setting is not None else (backend == "gpu" and not speculative)


class CallThread:
    """One worker thread making a runner's compiled calls in order. `cpu_s`: the worker's CPU time in calls;
    `num_calls`: calls submitted."""

    def __init__(self, interval_s: float | None = None):
        self._interval_s = switch_interval_s() if interval_s is None else interval_s  # (a bad setting fails here)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="jaxinfer-call")
        self._worker = self._pool.submit(threading.get_ident).result()
        self.last: Future | None = None
        self.cpu_s = 0.0
        self.num_calls = 0  # calls submitted

    def submit(self, fn, *args) -> Future:
        """fn(*args) on the worker, after every call submitted before it. The first call lowers the process's switch
        interval: an engine whose steps all stay inline (below ModelRunner.call_thread_min_tokens) leaves it alone."""
        if not self.num_calls:
            sys.setswitchinterval(self._interval_s)
        self.num_calls += 1
        self.last = self._pool.submit(self._timed, fn, args)
        return self.last

    def _timed(self, fn, args):
        t0 = time.thread_time()
        try:
            return fn(*args)
        finally:
            self.cpu_s += time.thread_time() - t0

    def drain(self) -> None:
        """Wait until the last submitted call has returned (a no-op on the worker itself). Its exception, if any, is
        not raised here: the step it belongs to raises it when its outputs are read."""
        last = self.last
        if last is not None and threading.get_ident() != self._worker:
            try:
                last.result()
            except Exception:  # noqa: BLE001 - reported by the step's own fetch
                pass

    def close(self) -> None:
        self._pool.shutdown(wait=True)


class DrainedState:
    """A class attribute for donated state the calls thread through (ModelRunner.kv_caches, penalty_table): the
    value lives in the instance's `_<name>`; with a CallThread in the instance's `_calls`, reading or replacing it
    off the worker first waits for the last submitted call (CallThread.drain)."""

    def __set_name__(self, owner, name: str):
        self.slot = "_" + name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        if obj._calls is not None:
            obj._calls.drain()
        return getattr(obj, self.slot)

    def __set__(self, obj, value) -> None:
        if obj._calls is not None:
            obj._calls.drain()
        setattr(obj, self.slot, value)
