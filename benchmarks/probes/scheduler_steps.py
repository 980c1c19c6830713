"""Host only: the scheduler's schedule + update for N steady pipelined decode steps at batch 256, as the engine runs
them (columnar run, prefix caching on), for counting instructions where wall time is too noisy (the 2-core box's
run-to-run spread is larger than a 5% change):

  for n in 0 200; do PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.$n \\
      python benchmarks/probes/scheduler_steps.py --steps $n 2>&1 | grep Collected; done
  # instructions a step = (Collected at 200 - Collected at 0) / 200; repeats agree within ~2%
  # (OPENBLAS_NUM_THREADS=1 in the environment: repeats agree exactly, no spinning BLAS threads counted)

Measured (2026-12-07 h, this box): 3.44-3.50 M instructions a step at a37c0fd, 3.04-3.13 M with the decode run's page
crossings and filled pages in one call each (kv_cache.append_page_each / cache_pages_each); without prefix caching
(--no-prefix-caching) 2.74-2.75 M at the former. 2026-12-07 i: 2.97-3.08 M (3.08 M with OPENBLAS_NUM_THREADS=1) ->
1.10-1.23 M (1.18 M) with the decode run's chain (engine/decode_run.py: a steady run made from the run before's
columns, no request read); 1.07 M with the filled pages hashed through struct and a copied blake2b state
(KVCacheManager._hash_page; without prefix caching 0.76 M).
"""
from __future__ import annotations

import argparse
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from jaxinfer.engine.kv_cache import KVCacheManager  # noqa: E402
from jaxinfer.engine.request import Request  # noqa: E402
from jaxinfer.engine.scheduler import Scheduler  # noqa: E402


class _Params:  # the SamplingParams fields the scheduler reads
    max_tokens, stop_token_ids, ignore_eos, min_tokens = 3000, None, True, 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="steady steps after 40 steps of prefill and first decodes")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--no-prefix-caching", action="store_true")
    a = ap.parse_args()
    rng = random.Random(0)
    kv = KVCacheManager(20000, 16, enable_prefix_caching=not a.no_prefix_caching)
    s = Scheduler(kv, max_num_batched_tokens=2048, max_num_seqs=a.batch, max_model_len=4096, eos_token_ids={2})
    for i in range(a.batch):
        s.add_request(Request(f"r{i}", [rng.randrange(3, 30000) for _ in range(128)], _Params()))
    prev = None
    for _ in range(40 + a.steps):  # schedule step n + 1, then update step n (pipelined, as the engine does)
        out = s.schedule()
        if prev is not None:
            if prev.decodes is not None:
                s.update(prev, {q.request_id: [7] for q in prev.seqs if q.sample}, [7] * len(prev.decodes))
            else:
                s.update(prev, {q.request_id: [7] for q in prev.scheduled if q.sample})
        prev = out


if __name__ == "__main__":
    main()
