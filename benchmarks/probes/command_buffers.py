"""Do XLA command buffers (CUDA graphs) cover the engine's step on the GPU, and what do they buy?

For each XLA_FLAGS variant (a fresh child process each, since XLA reads its flags once):
  default   : XLA's default command-buffer types
  off       : --xla_gpu_enable_command_buffer=  (every kernel launched one by one)
  all       : FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE (control flow captured too)
the child builds the engine (Llama-3-8B shape, dummy bf16 weights), compiles the batch-1 and batch-64 decode
buckets, and reports
  * the device-only step time (compiled step called back to back) and the engine's decode tok/s: the evidence.
    Default vs off is what command buffers buy;
  * a census of the optimized HLO of each step program (`Compiled.as_text()`): command-buffer computations,
    instructions inside them, kernel-launching instructions (fusions, custom calls, conditionals, whiles). On
    jax 0.11.x XLA forms command buffers on the thunk sequence after HLO, so the census reads 0 command buffers
    in every variant; it stays for older XLA versions (which convert in HLO) and for the launch counts.

  python benchmarks/probes/command_buffers.py [--variants default off all] [--out DIR]

--sweep instead compiles the decode step of each batch bucket twice in one process, with XLA's default command
buffers and with none (per-executable `compile(compiler_options=...)`), and times each back to back at a fixed
context (device-only step time), to see for which buckets the CUDA graphs pay:

  python benchmarks/probes/command_buffers.py --sweep [--batch 1 8 32 64 128 256] [--context 512]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VARIANTS = {
    "default": "",
    "off": "--xla_gpu_enable_command_buffer=",
    "all": "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,CUDNN,CONDITIONAL,WHILE",
}
LAUNCHING = re.compile(r"=\s*\S+\s+(fusion|custom-call|conditional|while|call)\(")


def hlo_census(text: str) -> dict:
    """Counts over the optimized HLO text: command-buffer computations, instructions inside them, and
    kernel-launching instructions of the ENTRY computation that are not command-buffer calls."""
    comps, name, body = {}, None, []
    for line in text.splitlines():
        m = re.match(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$", line)
        if m and not line.startswith(" "):
            name, body = ("ENTRY" if m.group(1) else m.group(2)), []
            comps[name] = body
        elif line.strip() == "}":
            name = None
        elif name is not None:
            body.append(line)
    cb = {n: b for n, b in comps.items() if "command_buffer" in n}
    entry = comps.get("ENTRY", [])
    outside = [ln.strip()[:160] for ln in entry if LAUNCHING.search(ln) and "command_buffer" not in ln]
    return dict(command_buffers=len(cb), instructions_in_command_buffers=sum(len(b) for b in cb.values()),
                entry_instructions=len(entry), launches_outside=len(outside), outside_examples=outside[:12],
                conditionals=text.count(" conditional("), whiles=text.count(" while("))


def child(out_dir: str, variant: str, model: str):
    sys.path.insert(0, ROOT)
    import jax

    from benchmarks.latency import device_only_step_s, run_batch
    from jaxinfer import LLM

    t0 = time.perf_counter()
    llm = LLM(model, load_format="dummy", max_model_len=1024, max_num_batched_tokens=256, max_num_seqs=64,
              gpu_memory_utilization=0.6, warmup=False, progress=False)
    load_s = time.perf_counter() - t0
    res = dict(variant=variant, xla_flags=os.environ.get("XLA_FLAGS", ""), jax=jax.__version__, load_s=load_s)
    for batch, new in ((1, 96), (64, 48)):
        run_batch(llm, batch, 128, 4, 256)  # compiles the buckets this batch uses
        r = run_batch(llm, batch, 128, new, 256)  # steady state: every request decoding (benchmarks/latency.py)
        ttft, tps, step_med = r["ttft_s"], r["steady_tok_s"], r["steady_step_s"]
        dev = device_only_step_s(llm, batch, 128 + new // 2)
        r = llm.runner
        step, _ = r._programs(r.ladder.pick(batch, batch))
        text = step.as_text()
        with open(os.path.join(out_dir, f"hlo_{variant}_b{batch}.txt"), "w") as f:
            f.write(text)
        res[f"batch{batch}"] = dict(decode_tok_s=tps, step_ms_median=step_med * 1e3, device_step_ms=dev * 1e3,
                                    ttft_ms=ttft * 1e3, **hlo_census(text))
        print(variant, batch, json.dumps({k: v for k, v in res[f"batch{batch}"].items() if k != "outside_examples"}),
              flush=True)
    with open(os.path.join(out_dir, f"cb_{variant}.json"), "w") as f:
        json.dump(res, f, indent=2)


def sweep(model: str, batches: list[int], ctx: int, out_dir: str):
    sys.path.insert(0, ROOT)
    import jax

    from benchmarks.common import write_result
    from jaxinfer import LLM
    from jaxinfer.outputs import SeqInput
    from jaxinfer.runner.batch import pack

    llm = LLM(model, load_format="dummy", max_model_len=ctx + 64, max_num_batched_tokens=max(256, max(batches)),
              max_num_seqs=max(batches), num_pages=max(batches) * (ctx // 16 + 2) + 2, warmup=False, progress=False)
    r = llm.runner
    variants = {"default": None, "off": {"xla_gpu_enable_command_buffer": ""}}  # per-executable XLA options
    rows = []
    for b in batches:
        per = ctx // r.page_size + 1
        seqs = [SeqInput(token_ids=[1], start_pos=ctx, page_table=list(range(1 + i * per, 1 + (i + 1) * per)))
                for i in range(b)]
        hb = pack(seqs, r.ladder.pick(b, b), r.page_size)
        ints, floats = jax.device_put(hb.flat())
        row = dict(batch=b, bucket=str(hb.bucket), context=ctx)
        for name, opts in variants.items():
            if name == "default" and b == batches[0]:  # the first bucket's default program, dumped as it compiles
                opts = {"xla_dump_to": os.path.join(out_dir, "dump"), "xla_dump_hlo_as_text": True}
            step = r.compile_step(hb.bucket, opts)
            for _ in range(3):
                out, _ = r.run_compiled(step, ints, floats)
            jax.block_until_ready(out)
            ts = []
            for _ in range(5):
                t0 = time.perf_counter()
                for _ in range(10):
                    out, _ = r.run_compiled(step, ints, floats)
                jax.block_until_ready(out)
                ts.append((time.perf_counter() - t0) / 10)
            row[f"{name}_ms"] = 1e3 * sorted(ts)[len(ts) // 2]
        row["off_over_default"] = row["off_ms"] / row["default_ms"]
        rows.append(row)
        print(f"batch {b:4d} {row['bucket']}: command buffers {row['default_ms']:.2f} ms, none {row['off_ms']:.2f} ms "
              f"(none/default {row['off_over_default']:.2f})", flush=True)
    print("wrote", write_result("command-buffer-sweep", dict(model=f"{model} dummy bf16", rows=rows)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/command_buffers"))
    ap.add_argument("--model", default="llama3-8b", help="a preset (random weights) or a path")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32, 64, 128, 256])
    ap.add_argument("--context", type=int, default=512)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    if a.sweep:
        return sweep(a.model, a.batch, a.context, a.out)
    if a.child:
        return child(a.out, a.child, a.model)
    results = []
    for v in a.variants:
        env = dict(os.environ, XLA_FLAGS=(os.environ.get("XLA_FLAGS", "") + " " + VARIANTS[v]).strip(),
                   PYTHONUNBUFFERED="1")
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, __file__, "--child", v, "--out", a.out, "--model", a.model], env=env)
        path = os.path.join(a.out, f"cb_{v}.json")
        if p.returncode != 0 or not os.path.exists(path):
            results.append(dict(variant=v, error=f"child exited {p.returncode}"))
            continue
        with open(path) as f:
            results.append(json.load(f))
        print(f"variant {v} done in {time.perf_counter() - t0:.0f} s", flush=True)
    sys.path.insert(0, ROOT)
    from benchmarks.common import write_result

    for r in results:
        for b in ("batch1", "batch64"):
            if b in r:
                x = r[b]
                print(f"{r['variant']:>8} {b:>8}: {x['decode_tok_s']:8.1f} tok/s, step {x['step_ms_median']:.2f} ms, "
                      f"device {x['device_step_ms']:.2f} ms | command buffers {x['command_buffers']} "
                      f"({x['instructions_in_command_buffers']} instr), launches outside {x['launches_outside']}")
    print("wrote", write_result("command-buffers", dict(model=f"{a.model} dummy bf16", variants=results)))


if __name__ == "__main__":
    main()
