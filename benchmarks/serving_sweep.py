"""The whole online-serving sweep in one command: start `python -m serving` on a dummy model as a subprocess, wait
for /health, run benchmarks/serving.py's load generator at each request rate (Poisson arrivals, ShareGPT-like
lengths, random token-id prompts, ignore_eos), stop the server with SIGTERM, then the peer (`transformers serve`)
when it can run here, and write one JSON + a PNG of latency vs rate.

  python benchmarks/serving_sweep.py                      # H200: llama3-8b dummy, rates 1 4 16 64 (~5-7 min)
  python benchmarks/serving_sweep.py --model tiny-llama --rates 2 8 --num-prompts 12 12 \\
      --max-model-len 512 --max-num-seqs 16 --max-num-batched-tokens 256        # CPU smoke test

Prompts per rate (default): clamp(50 * rate, 50, 400), so the slow rates do not dominate the wall time
(1 req/s -> 50 prompts, 4 -> 200, 16 and 64 -> 400).

Peer: `transformers serve` needs fastapi + uvicorn (transformers[serving]) and a checkpoint with a tokenizer
(--peer-model); when either is missing its entry in the JSON says "unavailable: <reason>" instead of failing.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen, timeout_s: float, log_path: str) -> float:
    t0 = time.perf_counter()
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return time.perf_counter() - t0
        except OSError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before /health answered; log: "
                               f"{open(log_path).read()[-3000:]}")
        if time.perf_counter() - t0 > timeout_s:
            raise TimeoutError(f"server not healthy after {timeout_s:.0f} s; log: {open(log_path).read()[-3000:]}")
        time.sleep(0.5)


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> int | None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None
    return proc.returncode


def sweep(url, model_name, rates, counts, vocab, max_len, concurrency):
    from benchmarks.serving import run_rate
    from benchmarks.throughput import make_workload

    rows = []
    for rate, n in zip(rates, counts):
        work = make_workload("sharegpt", n, 0, 0, vocab, max_len, seed=int(rate * 1000))
        r = asyncio.run(run_rate(url, model_name, work, rate, concurrency))
        r["num_prompts"] = n
        rows.append(r)
        print(f"rate {rate:6.1f} ({n} prompts): {r['completed']} ok / {r['failed']} failed, {r['req_per_s']:.2f} "
              f"req/s, {r['output_tok_per_s']:.0f} out tok/s | TTFT p50 {r['ttft_ms'].get('p50', float('nan')):.0f}"
              f" ms p99 {r['ttft_ms'].get('p99', float('nan')):.0f} | TPOT p50 "
              f"{r['tpot_ms'].get('p50', float('nan')):.1f} ms p99 {r['tpot_ms'].get('p99', float('nan')):.1f} | "
              f"ITL p99 {r['itl_ms'].get('p99', float('nan')):.1f} ms", flush=True)
    return rows


def targets(rows):
    """Issue 5's targets, checked on the measured rows (None where the rate was not run)."""
    by = {r["rate"]: r for r in rows}
    out = {}
    if 4 in by:
        out["rate4_ttft_p50_lt_100ms"] = by[4]["ttft_ms"].get("p50", 1e9) < 100
        out["rate4_tpot_p50_lt_10ms"] = by[4]["tpot_ms"].get("p50", 1e9) < 10
    if 16 in by:  # sustained: nothing failed and completions kept up with 80% of the offered rate
        r = by[16]
        out["rate16_sustained"] = r["failed"] == 0 and r["req_per_s"] >= 0.8 * 16
        out["rate16_tpot_p99_lt_50ms"] = r["tpot_ms"].get("p99", 1e9) < 50
    return out


def run_peer(a, rates, counts, vocab, max_len):
    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        return {"status": f"unavailable: {', '.join(missing)} not importable (transformers serve needs "
                          f"transformers[serving])"}
    if not a.peer_model:
        return {"status": "unavailable: no --peer-model (transformers serve needs a checkpoint with a tokenizer; "
                          "the dummy model has none)"}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = os.path.join(a.log_dir, "transformers-serve.log")
    cmd = ["transformers", "serve", a.peer_model, "--continuous-batching", "--port", str(port), "--host",
           "127.0.0.1", "--dtype", "bfloat16"]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    try:
        ready_s = wait_healthy(url, proc, a.startup_timeout, log_path)
        rows = sweep(url, a.peer_model, rates, counts, vocab, max_len, a.max_concurrency)
        return {"status": "ok", "command": " ".join(cmd), "ready_s": ready_s, "rows": rows}
    except Exception as e:  # noqa: BLE001 - recorded, never hidden
        return {"status": f"failed: {type(e).__name__}: {str(e)[:2000]}", "command": " ".join(cmd)}
    finally:
        stop(proc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", type=float, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--num-prompts", type=int, nargs="+", default=None,
                    help="prompts per rate (one value, or one per rate); default clamp(50 * rate, 50, 400)")
    ap.add_argument("--max-concurrency", type=int, default=0)
    ap.add_argument("--startup-timeout", type=float, default=420)
    ap.add_argument("--peer-model", default=None, help="checkpoint for `transformers serve` (optional)")
    ap.add_argument("--profile", default=None, metavar="DIR", help="the server writes a jax.profiler trace here")
    ap.add_argument("--log-dir", default=os.environ.get("OUT") or "/tmp")
    from jaxinfer.cli_args import add_engine_args, as_flags
    add_engine_args(ap, model="llama3-8b", load_format="dummy", max_model_len=2048)  # the server's flags
    a = ap.parse_args()

    from jaxinfer.weights.presets import PRESETS

    if a.model not in PRESETS:
        raise SystemExit(f"--model {a.model!r} is not a preset; choose one of {sorted(PRESETS)}")
    vocab = PRESETS[a.model]["vocab_size"]
    counts = a.num_prompts or [int(min(max(50 * r, 50), 400)) for r in a.rates]
    if len(counts) == 1:
        counts = counts * len(a.rates)
    if len(counts) != len(a.rates):
        raise SystemExit(f"--num-prompts has {len(counts)} values for {len(a.rates)} rates")

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "serving", *as_flags(a), "--port", str(port), "--served-model-name", a.model] + (
        ["--profile", a.profile] if a.profile else [])
    log_path = os.path.join(a.log_dir, "jaxinfer-serve.log")
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                env=dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", "")))
    try:
        ready_s = wait_healthy(url, proc, a.startup_timeout, log_path)
        print(f"jaxinfer serve ready in {ready_s:.1f} s ({url})", flush=True)
        rows = sweep(url, a.model, a.rates, counts, vocab, a.max_model_len, a.max_concurrency)
        metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    finally:
        rc = stop(proc)
    print(f"server stopped (exit {rc}) after {time.perf_counter() - t0:.0f} s", flush=True)
    peer = run_peer(a, a.rates, counts, vocab, a.max_model_len)
    print("peer transformers serve:", peer["status"])

    import jax

    from benchmarks.common import RESULTS_DIR, write_result
    from benchmarks.serving import plot

    # The device is the server's, not this process's: benchmarks.common asks jax, which sees the same machine.
    verdict = targets(rows)
    path = write_result("serving", dict(
        model=a.model, load_format="dummy", server_command=" ".join(cmd), server_ready_s=ready_s,
        server_exit_code=rc, config=vars(a), rows=rows, targets=verdict, peer_transformers_serve=peer,
        requests_total_metric=[l for l in metrics.splitlines() if l.startswith("jaxinfer_requests_total")],
        jax_backend=jax.default_backend()))
    png = plot(rows, os.path.join(RESULTS_DIR, os.path.basename(path).replace(".json", ".png")),
               peer.get("rows"))
    out = os.environ.get("OUT")
    if out and png:
        import shutil

        shutil.copy(png, out)
    print("targets:", verdict)
    print("wrote", path, "| plot:", png)


if __name__ == "__main__":
    main()
