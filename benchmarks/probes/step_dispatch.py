"""Why does the engine's step dispatch block for about a whole device step? (issue 17, item 1)

The host profile of latency.py at batch 64 showed the compiled call (`jax/_src/stages.py __call__`) taking ~9.9 ms
of each ~13.7 ms step: step n+1's dispatch returned only when step n was done, so the host work of n+1 was
serialised behind the device instead of overlapping it. This probe times the compiled decode step's CALL (the
time until it returns to Python, not the device time) for one bucket under variants that each remove one
suspect:

  idle          the device is idle when the call is made (block_until_ready before each): the host cost alone
  busy          back to back, fresh device inputs each call (device_put of the packed numpy batch), the previous
                step's tokens fed in and its KV cache donated: what the engine does (general sampler program)
  busy_same     back to back with the SAME input device buffers every call (no new addresses for XLA's command
                buffers, i.e. CUDA graphs, to update)
  busy_conds    the sampler's skips as lax.cond (runner/branches.py select_branches(False); the form before
                2026-12-02): XLA GPU's ConditionalThunk waits on the host for its predicate
  busy_greedy   the greedy-only program (runner/sampler.py greedy_only) the engine runs for all-greedy steps
  busy_nocb / busy_cb_default / busy_cb_all   compiled without command buffers / with XLA's default types / with
                every type (CONDITIONAL and WHILE too); the engine's choice is step_compiler_options
  busy_nodonate a step program that donates nothing (KV cache copied, not updated in place)

First run (commit f9fae88, results/step-dispatch-2026-12-02.json's first version, H200, 8B, context 512): with the
conditionals the call took 9.7 ms of a 9.8 ms device step at batch 64 (idle: 9.8 ms, so it waited for the device,
not for the host); traced as selects 2.6 ms (device 8.5 ms). Without command buffers (buckets > 128 tokens) the call
is ~8.4-8.7 ms of host launches at batch 64 / 256 whatever the sampler, and at batch 256 it also waits for the
launch queue (busy 16.5 ms): there the host work is overlapped anyway, the step being device-bound.
For each: median / p90 call time, and the device step time (wall time of the whole back-to-back run / iters).
If `busy` blocks and `idle` does not, the call waits for the device; the variant that returns at once names the
cause.

  python benchmarks/probes/dispatch_blocking.py [--model llama3-8b] [--batch 1 64 256] [--context 512]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import write_result  # noqa: E402


def _seqs(runner, batch: int, ctx: int):
    from jaxinfer.runner.batch import SeqInput

    per = ctx // runner.page_size + 1
    return [SeqInput(token_ids=[1], start_pos=ctx, page_table=list(range(1 + i * per, 1 + (i + 1) * per)))
            for i in range(batch)]


def _time_calls(call, iters: int, idle: bool):
    """call() -> device output; returns (call times in s, wall time of the run in s)."""
    out = call()
    jax.block_until_ready(out)
    times = []
    t_run = time.perf_counter()
    for _ in range(iters):
        if idle:
            jax.block_until_ready(out)
        t0 = time.perf_counter()
        out = call()
        times.append(time.perf_counter() - t0)
    jax.block_until_ready(out)
    return times, time.perf_counter() - t_run


CB_ALL = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE"


def _fresh_step(llm, bucket, flat, *, donate=True, select=None, options=None, greedy_only=False):
    """A newly traced and compiled step program of `bucket` (a fresh jit object: jit caches its traces), in the
    runner's own form: its param arena (the weights as runner.step_params packs them) and, when the runner stages
    its inputs (runner/step.stage_inputs), the stage buffers as the last argument, so runner.run_compiled calls it
    as it calls the engine's programs (until 12-06 j this built the form before both, which run_compiled rejects).
    select: None = the engine's choice (selects on GPU), True / False = selects / lax.cond."""
    from jaxinfer.runner.branches import select_branches
    from jaxinfer.runner.compile_options import compile_lowered
    from jaxinfer.runner.step import make_step_fn

    r = llm.runner
    fn = make_step_fn(r.loaded, r.attention_options, r.config.scheduler.max_num_seqs, donate=donate,
                      carry_width=r.carry_width, page_size=r.page_size, arena=r._arena, staged=r.staged)
    spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)  # noqa: E731
    args = (r.step_params, r.kv_caches, spec(flat[0]), spec(flat[1]), r._no_prev, r.penalty_table)
    if r.staged:
        args += (r.stage_specs(flat[0].shape[0], flat[1].shape[0]),)
    with select_branches(select):
        lowered = fn.lower(*args, bucket=bucket, greedy_only=greedy_only)
    return compile_lowered(lowered, options)


def probe_batch(llm, batch: int, ctx: int, iters: int) -> dict:
    from jaxinfer.runner.batch import pack
    from jaxinfer.runner.compile_options import step_compiler_options

    r = llm.runner
    hb = pack(_seqs(r, batch, ctx), r.ladder.pick(batch, batch), r.page_size)
    bucket = hb.bucket
    flat = hb.flat()
    fixed = jax.device_put(flat)
    engine_opts = step_compiler_options(bucket)
    # name: (how the program is built, same input buffers every call, device idle at each call)
    variants = {
        "idle": (dict(options=engine_opts), False, True),
        "busy": (dict(options=engine_opts), False, False),
        "busy_same": (dict(options=engine_opts), True, False),
        "busy_conds": (dict(options=engine_opts, select=False), False, False),
        "idle_conds": (dict(options=engine_opts, select=False), False, True),
        "busy_greedy": (dict(options=engine_opts, greedy_only=True), False, False),
        "idle_greedy": (dict(options=engine_opts, greedy_only=True), False, True),
        "busy_nocb": (dict(options={"xla_gpu_enable_command_buffer": ""}), False, False),
        "busy_cb_default": (dict(options=None), False, False),
        "busy_cb_all": (dict(options={"xla_gpu_enable_command_buffer": CB_ALL}), False, False),
        "busy_nodonate": (dict(options=engine_opts, donate=False), False, False),
    }
    rows, built = {}, {}
    for name, (how, same, idle) in variants.items():
        key = tuple(sorted((k, str(v)) for k, v in how.items()))
        try:
            if key not in built:
                built[key] = _fresh_step(llm, bucket, flat, **how)
            exe = built[key]
            prev = [r._no_prev]

            def call():
                ints, floats = fixed if same else jax.device_put(flat)
                out, _ = r.run_compiled(exe, ints, floats, prev[0])
                prev[0] = out.tokens
                return out.tokens

            times, wall = _time_calls(call, iters, idle)
            rows[name] = _summary(times, wall, iters)
        except Exception as e:  # noqa: BLE001
            rows[name] = {"error": repr(e)[:300]}
        print(f"  batch {batch} {name}: {rows[name]}", flush=True)
    built.clear()
    return dict(batch=batch, context=ctx, bucket=str(bucket), engine_compiler_options=engine_opts, variants=rows)


def _summary(times, wall, iters):
    t = np.asarray(times) * 1e3
    return dict(call_ms_median=float(np.median(t)), call_ms_p90=float(np.percentile(t, 90)),
                call_ms_min=float(t.min()), step_ms=wall / iters * 1e3)


def add_probe_args(ap: argparse.ArgumentParser, iters: int) -> None:
    """The arguments of the step-call probes (this one and call_trace.py)."""
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--iters", type=int, default=iters)
    ap.add_argument("--max-model-len", type=int, default=1024)


def probe_llm(a):
    """A lazily compiled engine on dummy weights sized for the probes' largest batch at --context."""
    from jaxinfer import LLM

    pages_per_seq = a.context // 16 + 2
    return LLM(a.model, load_format="dummy", max_model_len=a.max_model_len,
               max_num_batched_tokens=max(256, max(a.batch)), max_num_seqs=max(a.batch),
               num_pages=max(a.batch) * pages_per_seq + 8, warmup=False, progress=False)


def main():
    ap = argparse.ArgumentParser()
    add_probe_args(ap, iters=30)
    a = ap.parse_args()
    llm = probe_llm(a)
    rows = []
    for b in a.batch:
        res = probe_batch(llm, b, a.context, a.iters)
        rows.append(res)
        print(f"batch {b} ({res['bucket']}; engine compiler options {res['engine_compiler_options']}):")
        for name, v in res["variants"].items():
            if "error" in v:
                print(f"  {name:14s} error {v['error']}")
            else:
                print(f"  {name:14s} call median {v['call_ms_median']:7.3f} ms  p90 {v['call_ms_p90']:7.3f}  "
                      f"min {v['call_ms_min']:7.3f} | device step {v['step_ms']:7.3f} ms")
    dev = jax.devices()[0]
    print("wrote", write_result("step-dispatch", dict(model=a.model, platform_version=getattr(
        dev.client, "platform_version", ""), rows=rows)))


if __name__ == "__main__":
    main()
