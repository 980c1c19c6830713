"""What steps the offline benchmark's scheduler makes (CPU is fine): the step mix behind throughput.py's figure.

The real LLM / Scheduler / KVCacheManager run the throughput benchmark's workload with its scheduler settings on
the "tiny-llama" dummy preset (the device program is cheap on a CPU); every schedule() is recorded. The steps are
grouped by the bucket the GPU's ladder (runner/buckets.py with GPU_LADDER) would run them in and by their shape:
  decode   every sequence has one token (decode-shaped: cuDNN under 'auto')
  mixed    decodes beside prompt chunks (prefill-shaped)
  prefill  prompt chunks only
Read beside step_profile.py's per-shape device times (its mixed-370 shape is the H200 run's mean mixed step) to see
which steps hold the run's seconds. The workload is throughput.py's (make_workload), greedy, ignore_eos; the pool's
size decides how much is preempted and recomputed (--num-pages).

  PYTHONPATH=$PWD python benchmarks/probes/offline_step_mix.py [--max-num-seqs 512 --max-num-batched-tokens 2048]
      [--num-pages 18775] [--num-requests 1000 --prompt-len 512 --output-len 256]
"""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.common import write_result  # noqa: E402
from benchmarks.throughput import make_workload  # noqa: E402
from jaxinfer import LLM, SamplingParams  # noqa: E402
from jaxinfer.runner.buckets import BucketLadder  # noqa: E402
from jaxinfer.runner.cpu_defaults import GPU_LADDER  # noqa: E402


def step_shape(out) -> tuple[int, int, int]:
    """(tokens, sequences, decodes) of one SchedulerOutput; a decode is a sequence with one token in the step."""
    seqs = out.scheduled
    decodes = sum(1 for s in seqs if len(s.token_ids) == 1)
    return out.num_batched_tokens, len(seqs), decodes


def kind_of(tokens: int, seqs: int, decodes: int) -> str:
    if decodes == seqs:
        return "decode"
    return "mixed" if decodes else "prefill"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=1000)
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--num-pages", type=int, default=18775, help="the KV pool (18,775: an H100's for the 8B model)")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    # (tiny-llama's max_model_len, 1024, holds the workload's 768 tokens; the limit sets no step's shape)
    llm = LLM("tiny-llama", load_format="dummy", progress=False, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens, page_size=args.page_size, num_pages=args.num_pages,
              async_scheduling=True)
    ladder = BucketLadder.build(max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
                                max_model_len=args.max_model_len, page_size=args.page_size, query_tile=16,
                                kv_chunk_pages=1, **GPU_LADDER)
    sched = llm.engine.scheduler
    steps = []
    real = sched.schedule

    def recorded():
        out = real()
        if not out.is_empty:
            steps.append(step_shape(out))
        return out
    sched.schedule = recorded

    work = make_workload("fixed", args.num_requests, args.prompt_len, args.output_len, 512, args.max_model_len)
    params = [SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True) for _, m in work]
    llm.generate([p for p, _ in work], params, use_tqdm=False)

    rows = defaultdict(lambda: dict(steps=0, tokens=0, decodes=0, prompt_tokens=0))
    for tokens, seqs, decodes in steps:
        b = ladder.pick(tokens, seqs)
        r = rows[(b.num_tokens, kind_of(tokens, seqs, decodes))]
        r["steps"] += 1
        r["tokens"] += tokens
        r["decodes"] += decodes
        r["prompt_tokens"] += tokens - decodes
    print(f"{len(steps)} steps, {sum(s[0] for s in steps)} tokens "
          f"({args.num_requests} x {args.prompt_len}/{args.output_len}, {args.max_num_seqs} sequences, "
          f"budget {args.max_num_batched_tokens}, {args.num_pages} pages)")
    print(f"{'bucket':>7} {'kind':>8} | {'steps':>6} {'mean tokens':>11} {'mean decodes':>12} {'prompt tok':>10}")
    table = []
    for (bt, kind), r in sorted(rows.items()):
        n = r["steps"]
        print(f"{bt:>7} {kind:>8} | {n:>6} {r['tokens'] / n:>11.1f} {r['decodes'] / n:>12.1f} "
              f"{r['prompt_tokens']:>10}")
        table.append(dict(bucket_tokens=bt, kind=kind, **r))
    write_result(f"offline-step-mix{'-' + args.tag if args.tag else ''}", dict(
        config=vars(args), num_steps=len(steps), rows=table,
        steps=[dict(tokens=t, seqs=s, decodes=d) for t, s, d in steps]))


if __name__ == "__main__":
    main()
