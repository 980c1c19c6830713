"""Host only: N steady pipelined decode steps of the whole LLMEngine at batch 256 (offline: stream=False, no tokenizer,
greedy, ignore_eos), with a fake runner whose dispatch packs the StepBatch as the real one does (runner/batch.pack_step
into the bucket's arrays) and whose fetch returns a fixed token: schedule, the InputBatch's make_step (seq_inputs),
pack, update and the outputs, for counting instructions where wall time is too noisy. Never imports jax (checked).

  for n in 0 200; do OPENBLAS_NUM_THREADS=1 PYTHONHASHSEED=0 valgrind --tool=callgrind \\
      --callgrind-out-file=/tmp/cg.$n python benchmarks/probes/engine_host_steps.py --steps $n 2>&1 \\
      | grep Collected; done
  # instructions a step = (Collected at 200 - Collected at 0) / 200 (OPENBLAS_NUM_THREADS=1: repeats agree exactly)
  python -m cProfile -s tottime benchmarks/probes/engine_host_steps.py --steps 1000  # by function

Measured (2026-12-07 i, this box, OPENBLAS_NUM_THREADS=1; instructions a step): 5.06 M at 5caa45b (before the
decode run's chain), 3.05 M at 460d6af (its schedule + update: scheduler_steps.py's 1.07 M), 2.78 M with pack_step
gathering only the used page-table columns. Callgrind counts a large memcpy (rep movsb) as one instruction a byte:
the packing's ~300 KB of template copy weigh more here than in time. Then (12-07 i): 2.79 M -> 1.89 M with the steady
step's continuation (InputBatch.make_step from the step before's arrays, pack_step patching the step before's
packed buffers: 0.54 M a step for pack_step instead of 0.86 M, of which 0.29 M the buffers' copy) and the plain
step's shortcuts (LLMEngine._launch skips the per-row flag lookups while no flagged slot is held, _finish_plain
the generation compare while no slot was added or freed); schedule + update are still ~1.07 M of it. 1.89 M ->
1.58 M with the continuation packed in place into the buffers of the step before the one in flight, which the
runner releases at its fetch (runner/batch.release; no 300 KB copy a step).
Streaming (--stream: CUMULATIVE outputs every step; --stream --delta: DELTA, as the OpenAI server asks), 2026-12-07
i: output_builder._single_outputs for groups of one sequence: CUMULATIVE 8.05 -> 7.67 M a step, DELTA 6.83 -> 5.62 M;
with the collector off (python -c "import gc, runpy, sys; gc.disable(); ..."), CUMULATIVE 7.01 -> 5.82 M. At batch
256 a step allocates ~1,390 young objects, within a few of two young collections (threshold 700): whether a step
has one or two depends on a handful of objects, not on the outputs' cost (here CUMULATIVE went from one to two a
step, ~0.8 M of the 7.67 M). The rest is mostly inherent to the API: each output's objects, and CUMULATIVE's token
ids snapshot (a copy of the whole list a step: ~30% of _single_outputs at 180 tokens).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402

from jaxinfer.config.engine import SchedulerConfig  # noqa: E402
from jaxinfer.engine.engine import LLMEngine  # noqa: E402
from jaxinfer.outputs import RunnerOutput  # noqa: E402
from jaxinfer.runner.batch import pack_step, release  # noqa: E402
from jaxinfer.runner.buckets import BucketLadder  # noqa: E402
from jaxinfer.sampling_params import SamplingParams  # noqa: E402


class HostRunner:
    """The runner's host side only: dispatch packs (what ModelRunner.dispatch does before its device call), fetch
    hands back one token a sampling sequence."""

    kv_dtype = "bfloat16"
    num_penalty_slots = 0

    def __init__(self, num_pages: int, page_size: int, max_num_seqs: int, max_num_batched_tokens: int,
                 max_model_len: int):
        self.num_pages, self.page_size = num_pages, page_size
        # the GPU's ladder (query tile 16, 4-token decode tiles, the batch-1 bucket)
        self.ladder = BucketLadder.build(max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                                         max_model_len=max_model_len, page_size=page_size, query_tile=16,
                                         kv_chunk_pages=8, small_buckets=(1,))

    def dispatch(self, batch, prev=None, prompt_logprob_targets=None):
        packed = pack_step(batch, self.ladder.pick(batch.num_tokens, batch.num_seqs), self.page_size)
        return batch.num_seqs, packed

    def fetch(self, flight) -> RunnerOutput:
        n = flight[0]
        release(flight[1])  # (as ModelRunner.fetch: the packed inputs may be reused)
        return RunnerOutput(np.full(n, 7, np.int32), np.zeros(n, np.float32), None, None, {})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200, help="steady steps after 40 steps of prefill and first decodes")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--stream", action="store_true", help="stream=True (CUMULATIVE outputs every step)")
    ap.add_argument("--delta", action="store_true", help="with --stream: DELTA outputs (what the OpenAI server asks)")
    a = ap.parse_args()
    max_len = 4096
    runner = HostRunner(20000, 16, a.batch, 2048, max_len)
    eng = LLMEngine(runner, None, SchedulerConfig(max_num_batched_tokens=2048, max_num_seqs=a.batch),
                    max_model_len=max_len, eos_token_ids={2}, vocab_size=32000)
    rng = np.random.default_rng(0)
    sp = SamplingParams(temperature=0.0, max_tokens=3000, ignore_eos=True,
                        output_kind="DELTA" if a.delta else "CUMULATIVE")
    for i in range(a.batch):
        eng.add_request(f"r{i}", rng.integers(3, 30000, size=128).tolist(), sp, stream=a.stream)
    for _ in range(40 + a.steps):
        eng.step()
    assert eng.scheduler.num_running == a.batch
    assert not any(m == "jax" or m.startswith("jax.") for m in sys.modules), "host code imported jax"


if __name__ == "__main__":
    main()
