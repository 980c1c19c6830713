"""Where do the 2-3.5 ms of host time in one call of the compiled step go? (issue 17, item 2)

step_dispatch.py timed the call of the 8B decode step (until it returns to Python) at 2.2-3.5 ms with command
buffers, also with the device idle and also with the same input buffers every call; call_overhead.py put ~0.7 ms
of it on the ~360 argument buffers. This probe names the rest: it runs the engine's step program of each batch
bucket back to back (as step_dispatch's "busy" variant: fresh input buffers, previous tokens fed in, KV cache
donated) under `jax.profiler.trace(create_perfetto_trace=True)` and sums, per host thread, the trace events
(XLA / PjRt / StreamExecutor TraceMe annotations: execute, command-buffer record / update / launch, buffer
allocation, ...) by name, per call. The call's own wall time is timed beside it, untraced and traced.

  python benchmarks/probes/call_trace.py [--model llama3-8b] [--batch 1 64 256] [--context 512] [--iters 20]
      [--option KEY=VALUE ...]   (per-executable XLA options merged into the engine's, e.g. a command-buffer mode;
                                  process-wide ones go in XLA_FLAGS)
      [--same-inputs] [--fixed-prev] (the same input buffers / the same previous-token buffer every call: with the
                                  temporaries stable (runner/xla_env.py), what is left of `command_buffer::update`
                                  is the commands touching moved inputs and outputs; these say which)

Output: per batch the top host events (ms per call, count per call, thread), and a JSON in benchmarks/results.

--exactness N: after the timings, N more calls per batch alternate the greedy and the general program with device
arrays of random sizes allocated and kept between calls (so the allocator hands out moving addresses, as in
serving), every call's tokens kept on the device and fetched at the end; the sha256 of all tokens is printed. Two
processes with different command-buffer address modes must print the same digest (the dummy weights are seeded):
a mode that replays a graph with a stale address gives other tokens.
"""
from __future__ import annotations

import argparse
import collections
import hashlib
import glob
import gzip
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import write_result  # noqa: E402
from benchmarks.probes.step_dispatch import _fresh_step, _seqs, add_probe_args, probe_llm  # noqa: E402


# The Python tracer's frames of the probe itself and of the profiler: not part of the call.
_OWN_FRAMES = ("profiler.py", "contextlib.py", "call_trace.py", "time perf_counter")


def host_event_totals(trace_dir: str, calls: int, top: int = 30) -> list[dict]:
    """Sum the complete ("X") events of the perfetto trace under trace_dir by (thread, name), per call.
    Device planes (GPU streams) are left out: their pid's name carries '/device:'."""
    paths = glob.glob(os.path.join(trace_dir, "**", "perfetto_trace.json.gz"), recursive=True)
    if not paths:
        return [{"error": f"no perfetto_trace.json.gz under {trace_dir}"}]
    with gzip.open(paths[0], "rt") as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    pid_name, tid_name = {}, {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            pid_name[e["pid"]] = e["args"]["name"]
        if e.get("ph") == "M" and e.get("name") == "thread_name":
            tid_name[(e["pid"], e["tid"])] = e["args"]["name"]
    total = collections.defaultdict(float)
    count = collections.Counter()
    for e in events:
        if e.get("ph") != "X" or "/device:" in pid_name.get(e.get("pid"), ""):
            continue
        if any(f in e.get("name", "") for f in _OWN_FRAMES):
            continue
        key = (tid_name.get((e["pid"], e["tid"]), str(e["tid"])), e["name"])
        total[key] += float(e.get("dur", 0.0))  # microseconds
        count[key] += 1
    rows = sorted(total, key=total.get, reverse=True)[:top]
    return [dict(thread=t, name=n[:120], ms_per_call=total[(t, n)] / calls / 1e3, count_per_call=count[(t, n)] / calls)
            for t, n in rows]


def probe(llm, batch: int, ctx: int, iters: int, extra_options: dict | None = None, same_inputs: bool = False,
          fixed_prev: bool = False) -> dict:
    from jaxinfer.runner.batch import pack
    from jaxinfer.runner.compile_options import step_compiler_options

    r = llm.runner
    hb = pack(_seqs(r, batch, ctx), r.ladder.pick(batch, batch), r.page_size)
    flat = hb.flat()
    opts = step_compiler_options(hb.bucket)
    if extra_options:
        opts = {**(opts or {}), **extra_options}
    out = {"batch": batch, "bucket": str(hb.bucket), "compiler_options": opts, "same_inputs": same_inputs,
           "fixed_prev": fixed_prev}
    fixed = jax.device_put(flat) if same_inputs else None  # one pair of input buffers for every call
    exes = {}
    for greedy in (True, False):
        exe = exes[greedy] = _fresh_step(llm, hb.bucket, flat, options=opts, greedy_only=greedy)
        prev = [r._no_prev]

        def call():
            ints, floats = fixed if same_inputs else jax.device_put(flat)
            o, _ = r.run_compiled(exe, ints, floats, r._no_prev if fixed_prev else prev[0])
            prev[0] = o.tokens
            return o.tokens

        def run(n):
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            jax.block_until_ready(prev[0])
            return float(np.median(times) * 1e3)

        jax.block_until_ready(call())
        untraced = run(iters)
        d = tempfile.mkdtemp(prefix="call-trace-")
        with jax.profiler.trace(d, create_perfetto_trace=True):
            traced = run(iters)
        name = "greedy" if greedy else "general"
        out[name] = dict(call_ms_untraced=untraced, call_ms_traced=traced, host_events=host_event_totals(d, iters))
        print(f"batch {batch} {name}: call median {untraced:.3f} ms untraced, {traced:.3f} traced; host events "
              "(ms per call, count per call, thread):", flush=True)
        for e in out[name]["host_events"]:
            if "error" in e:
                print("   ", e["error"])
            else:
                print(f"    {e['ms_per_call']:8.3f}  {e['count_per_call']:7.1f}  {e['thread'][:28]:28s} {e['name']}")
    out["_exes"], out["_flat"] = exes, flat
    return out


def exactness(llm, row: dict, calls: int, seed: int = 0) -> str:
    """sha256 of the tokens of `calls` back-to-back calls (see the module docstring). Same inputs, seed and KV
    state in every process: the KV cache is zeroed first, so the digest depends only on the programs' results."""
    import jax.numpy as jnp

    r, exes, flat = llm.runner, row.pop("_exes"), row.pop("_flat")
    rng = np.random.default_rng(seed)
    r.kv_caches = jax.tree.map(jnp.zeros_like, r.kv_caches)
    r.penalty_table = jax.tree.map(jnp.zeros_like, r.penalty_table)
    prev, kept, junk = r._no_prev, [], []
    for i in range(calls):
        ints, floats = jax.device_put(flat)
        o, _ = r.run_compiled(exes[i % 2 == 0], ints, floats, prev)
        prev = o.tokens
        kept.append(o.tokens)
        junk.append(jnp.ones(int(rng.integers(1, 1 << 22)), jnp.uint8))  # 1 B - 4 MiB, freed in random order
        if len(junk) > 3:
            junk.pop(int(rng.integers(0, len(junk))))
    digest = hashlib.sha256(b"".join(np.asarray(t).tobytes() for t in kept)).hexdigest()
    print(f"exactness batch {row['batch']}: {calls} calls, sha256 {digest}", flush=True)
    return digest


def _option_value(v: str):
    """A compile option's value from the command line: XLA wants booleans and integers typed, enums as names."""
    if v.lower() in ("true", "false"):
        return v.lower() == "true"
    return int(v) if v.lstrip("-").isdigit() else v


def main():
    ap = argparse.ArgumentParser()
    add_probe_args(ap, iters=20)
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--same-inputs", action="store_true", help="one pair of input buffers for every call")
    ap.add_argument("--fixed-prev", action="store_true", help="the same previous-token buffer for every call")
    ap.add_argument("--exactness", type=int, default=0, metavar="N", help="N more calls per batch, digest printed")
    ap.add_argument("--tag", default="", help="suffix of the result's name (one file per variant)")
    a = ap.parse_args()
    extra = {k: _option_value(v) for k, v in (kv.split("=", 1) for kv in a.option)}
    llm = probe_llm(a)
    rows = [probe(llm, b, a.context, a.iters, extra, a.same_inputs, a.fixed_prev) for b in a.batch]
    for row in rows:
        if a.exactness:
            row["exactness_sha256"] = exactness(llm, row, a.exactness)
        row.pop("_exes", None), row.pop("_flat", None)
    print("memory_stats:", {k: v for k, v in (jax.devices()[0].memory_stats() or {}).items()
                            if k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit", "bytes_reserved",
                                     "pool_bytes", "largest_free_block_bytes")}, flush=True)
    print("wrote", write_result("call-trace", dict(model=a.model, options=extra, rows=rows), tag=a.tag))


if __name__ == "__main__":
    main()
