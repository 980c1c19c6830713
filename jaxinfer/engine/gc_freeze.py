"""Keep Python's cyclic garbage collector off the objects of start-up while the engine loop runs (host only).

A loaded model leaves ~270k objects on the Python heap (pytrees of weights, compiled programs, tokenizer). The
per-step objects of the engine loop (ScheduledSeq, SeqInput, numpy arrays, outputs) trigger young-generation
collections every step, and every ~40 steps at batch 256 a full (generation 2) collection that walks the whole
heap: ~150-190 ms on the CPU of the test machine, i.e. ~4 ms per step on average and a long latency spike
(benchmarks/probes/host_step_cost.py, column "gc"). `gc.freeze()` moves every object alive now into the permanent
generation, which collections skip; `gc.unfreeze()` puts them back, so nothing frozen here leaks: it is only
exempt while the loop runs. Both are O(1) list splices in CPython.

The young generation's threshold is raised while the loop runs (LOOP_GEN0_THRESHOLD): a streaming step at batch 256
allocates ~1,400 container objects (its RequestOutputs and their lists), so the default 700 ran two young
collections a step, each walking what was still alive of them; at 20,000 one runs every ~14 steps. The engine's host
step, streaming at batch 256 (benchmarks/probes/engine_host_steps.py --stream under callgrind, run through runpy
after gc.set_threshold(700 | 20000, 10, 10)): 7.68 -> 5.82 M instructions a step (2026-12-07 i), the same as with
the collector off. Cyclic garbage then waits for at most that many allocations.
"""
from __future__ import annotations

import contextlib
import gc


LOOP_GEN0_THRESHOLD = 20_000


def raise_young_threshold() -> tuple[int, ...]:
    """Raise the young generation's threshold to LOOP_GEN0_THRESHOLD (never lower it); returns the thresholds
    before, for gc.set_threshold(*before)."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], LOOP_GEN0_THRESHOLD), *before[1:])
    return before


@contextlib.contextmanager
def startup_objects_frozen():
    """Exempt the objects alive on entry from cyclic collection until exit, and raise the young generation's
    threshold meanwhile (restored on exit). A no-op when the GC is disabled or something else (the server, the
    caller) has already frozen objects: their freeze and thresholds are left as they are."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    before = raise_young_threshold()
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()
