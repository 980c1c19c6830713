"""Does a step whose every buffer keeps its address make the compiled call cheap? (issue 17, host <= 1.0 ms)

With the step's temporaries (SKIP_TEMP, runner/xla_env.py) and packed inputs (runner/step.stage_inputs) at fixed
addresses, the call of the 8B step still costs 1.0-1.2 ms of host time on the H100 hosts (12-05 d), most of it
`command_buffer::update` of the commands that write the step's fresh output buffers and a `cuGraphLaunch` of
1.2-2.3 ms (12-04 c, traced). The guess tested here: an updated CUDA graph is uploaded again at its next launch
(O(nodes)); a graph none of whose addresses moved launches without the upload, so a step whose outputs alias donated
inputs (the same buffer passed back every call) would dispatch in a fraction of the time.

A toy program of the step's size (32 "layers" x 6 bf16 dots of [B, 4096] x [4096, 4096] with an RMS scaling after
each: ~400 graph nodes, a few ms of device time) is called back to back without waiting (the engine's pipelined
form), seven ways:
  fresh         (tokens, state) = f(state, x): the tokens a fresh buffer every call (the engine today)
  stable        (out, state) = f(state, x, out): the tokens written into `out` (donated, one element longer than
                what is written, so XLA updates it in place) and returned: every address is the same every call
  fresh-inputs  as fresh, with x a new device buffer every call (the engine before staged inputs)
  numpy-inputs  as fresh, x passed as numpy (the engine's form since 12-05 d: the call transfers it)
  stable+1fresh as stable, plus one small fresh output (does one moved command cost what all of them do?)
  pinned-inputs x put in the device's pinned_host memory each call (a host copy) and moved to device memory inside
                the program (12-06 k: does a transfer from pinned memory, an asynchronous DMA, still block?)
  torch-pinned  x as a numpy view of torch-pinned memory passed straight in (where torch is importable)
Printed: the median host time of a call (perf_counter around the call only) and the device time per call.

Measured (H100, 12-06 j, results/graph-stable-outputs-0c602fe-2026-12-06.json, before numpy-inputs existed): the
stable form was not consistently cheaper (fresh 1.10 / 1.65 / 0.43 ms at batch 1 / 64 / 256, stable 0.49 / 1.67 /
0.41; repeats of one form varied 0.4-1.7 ms), so the guess is rejected. fresh-inputs made every call last the whole
device step (3.1-3.8 ms): a transferred input made the dispatch wait for the step before it. 12-06 k (H100, VMM
and BFC allocators): numpy-inputs too (3.88 ms a call = the device step, batch 64 / 256), against 0.26-0.5 ms
for device-resident inputs at batch 256: the engine's numpy inputs make its call wait for the previous step.
12-07 a (H100, results/graph-stable-outputs-bfc-8fc9e1b-2026-12-07.json): under BFC, pinned-inputs 0.96-1.08 ms a call
(not blocked), torch-pinned 3.8-4.0 (blocked); under VMM (the default) the device_put to pinned_host segfaults
(jax 0.11.2). The engine with its inputs in pinned memory dispatched no faster (host_step_cost.py, 2.6-3.2 ms).

  python benchmarks/probes/graph_stable_outputs.py [--batch 64] [--layers 32] [--iters 60]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jaxinfer  # noqa: E402,F401  - sets the engine's XLA flags (SKIP_TEMP) before the backend starts
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import device_name, write_result  # noqa: E402

D = 4096
DOTS_PER_LAYER = 6


def body(weights, state, x):
    """state [B, D] bf16, x [B] int32 -> (tokens [B] int32, new state [B, D])."""
    h = state + x[:, None].astype(state.dtype) * 1e-3
    for w in weights:
        h = jnp.dot(h, w, preferred_element_type=jnp.float32)
        h = (h * jax.lax.rsqrt(jnp.mean(h * h, axis=-1, keepdims=True) + 1e-6)).astype(state.dtype)
    tokens = jnp.argmax(h[:, :512], axis=-1).astype(jnp.int32)
    return tokens, h


def stable_step(weights, state, x, out):
    """out [B + 1] int32, donated: the tokens go into its first B slots in place (a write of the whole buffer would
    be replaced by the new array, which is a fresh allocation)."""
    tokens, h = body(weights, state, x)
    return jax.lax.dynamic_update_slice(out, tokens, (0,)), h


def stable_one_fresh_step(weights, state, x, out):
    """stable_step plus one small fresh output (the tokens again, [B] int32): is one moved command enough to lose
    what the stable form gains (the whole graph re-uploaded), or does the update cost scale with what moved?"""
    tokens, h = body(weights, state, x)
    return jax.lax.dynamic_update_slice(out, tokens, (0,)), h, tokens + 1


def timed_calls(call, iters: int) -> tuple[float, float]:
    """(median host seconds of one call, device seconds per call), calls back to back."""
    for _ in range(5):
        res = call()
    jax.block_until_ready(res)
    host = []
    t0 = time.perf_counter()
    for _ in range(iters):
        t = time.perf_counter()
        res = call()
        host.append(time.perf_counter() - t)
    jax.block_until_ready(res)
    return statistics.median(host), (time.perf_counter() - t0) / iters


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--iters", type=int, default=60)
    ap.add_argument("--dim", type=int, default=D, help="smaller for a CPU smoke run")
    ap.add_argument("--tag", default="", help="appended to the result file's name")
    a = ap.parse_args()
    d = a.dim
    key = jax.random.PRNGKey(0)
    weights = [jax.random.normal(jax.random.fold_in(key, i), (d, d), jnp.bfloat16) * (d ** -0.5)
               for i in range(a.layers * DOTS_PER_LAYER)]
    fresh = jax.jit(body, donate_argnums=(1,))   # the tokens a fresh buffer
    device0 = jax.devices()[0]
    pinned, on_device = (jax.sharding.SingleDeviceSharding(device0, memory_kind=k) for k in ("pinned_host", "device"))
    fresh_pinned = jax.jit(lambda w, s, x: body(w, s, jax.device_put(x, on_device)), donate_argnums=(1,))
    try:
        import torch
    except ImportError:
        torch = None
    stable = jax.jit(stable_step, donate_argnums=(1, 3))
    stable1 = jax.jit(stable_one_fresh_step, donate_argnums=(1, 3))
    rows = []
    for b in a.batch:
        row = dict(batch=b)
        st = {"state": jnp.ones((b, d), jnp.bfloat16), "out": jnp.zeros((b + 1,), jnp.int32)}
        x = jnp.arange(b, dtype=jnp.int32)
        x_host = np.arange(b, dtype=np.int32)

        def call_fresh():
            tok, st["state"] = fresh(weights, st["state"], x)
            return tok

        def call_fresh_inputs():
            tok, st["state"] = fresh(weights, st["state"], jax.device_put(x_host))
            return tok

        def call_fresh_numpy():  # the engine's form: numpy straight into the call (its C++ path transfers it)
            tok, st["state"] = fresh(weights, st["state"], x_host)
            return tok

        def call_pinned():   # a host copy into pinned memory, the H2D copy inside the program
            tok, st["state"] = fresh_pinned(weights, st["state"], jax.device_put(x_host, pinned))
            return tok

        x_torch = None
        if torch is not None and torch.cuda.is_available():
            x_torch = torch.from_numpy(x_host).pin_memory().numpy()

        def call_torch_pinned():
            tok, st["state"] = fresh(weights, st["state"], x_torch)
            return tok

        def call_stable():
            st["out"], st["state"] = stable(weights, st["state"], x, st["out"])
            return st["out"]

        def call_stable1():
            st["out"], st["state"], tok = stable1(weights, st["state"], x, st["out"])
            return tok

        for name, call in (("fresh", call_fresh), ("stable", call_stable), ("fresh-inputs", call_fresh_inputs),
                           ("numpy-inputs", call_fresh_numpy), ("stable+1fresh", call_stable1),
                           ("stable#2", call_stable), ("fresh#2", call_fresh), ("pinned-inputs", call_pinned),
                           ("torch-pinned", call_torch_pinned), ("numpy-inputs#2", call_fresh_numpy)):
            if name == "torch-pinned" and x_torch is None:
                continue
            try:
                host, dev = timed_calls(call, a.iters)
            except Exception as e:   # e.g. no pinned_host memory space on this backend: record, go on
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                print(f"batch {b:4d} {name:<13} ERROR {row[f'{name}_error']}", flush=True)
                continue
            row[f"{name}_call_ms"] = host * 1e3
            row[f"{name}_step_ms"] = dev * 1e3
            print(f"batch {b:4d} {name:<13} call {host * 1e3:7.3f} ms (host, median) | {dev * 1e3:7.3f} ms a call "
                  f"back to back", flush=True)
        # the premise: the stable form's output is the donated buffer (same address call after call)
        ptrs = []
        for _ in range(3):
            call_stable()
            ptrs.append(st["out"].unsafe_buffer_pointer())
        row["stable_out_address_fixed"] = len(set(ptrs)) == 1
        print(f"batch {b:4d} stable output address fixed over 3 calls: {row['stable_out_address_fixed']}", flush=True)
        # the stable form's tokens are the fresh form's (same state chain from ones)
        s1 = jnp.ones((b, d), jnp.bfloat16)
        t_f, _ = fresh(weights, s1, x)
        t_s, _ = stable(weights, jnp.ones((b, d), jnp.bfloat16), x, jnp.zeros((b + 1,), jnp.int32))
        row["tokens_equal"] = bool(np.array_equal(np.asarray(t_f), np.asarray(t_s)[:b]))
        print(f"batch {b:4d} stable tokens == fresh tokens: {row['tokens_equal']}", flush=True)
        rows.append(row)
    name = "graph-stable-outputs" + (f"-{a.tag}" if a.tag else "")
    path = write_result(name, dict(device=device_name(), jax=jax.__version__, layers=a.layers, dim=d, rows=rows))
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
