"""Keep Python's cyclic garbage collector off the objects of start-up while the engine loop runs (host only).

A loaded model leaves ~270k objects on the Python heap (pytrees of weights, compiled programs, tokenizer). The
per-step objects of the engine loop (ScheduledSeq, SeqInput, numpy arrays, outputs) trigger young-generation
collections every step, and every ~40 steps at batch 256 a full (generation 2) collection that walks the whole
heap: ~150-190 ms on the CPU of the test machine, i.e. ~4 ms per step on average and a long latency spike
(benchmarks/probes/host_step_cost.py, column "gc"). `gc.freeze()` moves every object alive now into the permanent
generation, which collections skip; `gc.unfreeze()` puts them back, so nothing frozen here leaks: it is only
exempt while the loop runs. Both are O(1) list splices in CPython.
"""
from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def startup_objects_frozen():
    """Exempt the objects alive on entry from cyclic collection until exit. A no-op when the GC is disabled or
    something else (the server, the caller) has already frozen objects: their freeze is left as it is."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
