"""Online serving load test (like vLLM's benchmark_serving): Poisson arrivals (or a fixed concurrency) of the
ShareGPT-like length mix against a running OpenAI-compatible server, streaming; reports TTFT, TPOT and
inter-token latency p50/p90/p99, request and token throughput per request rate; JSON to benchmarks/results/ and a
PNG of latency vs rate when matplotlib is there.

  jaxinfer serve --model llama3-8b --load-format dummy --port 8000 &
  python benchmarks/serving.py --url http://127.0.0.1:8000 --rates 1 4 16 64 --num-prompts 200

Prompts are random token ids (the server accepts token-id prompts), outputs forced to their length with
ignore_eos, so any model (dummy weights included) gives the same workload.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.throughput import make_workload  # noqa: E402


async def one_request(session, url, model, prompt, max_tokens):
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "ignore_eos": True}
    t0 = time.perf_counter()
    times = []
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        if resp.status != 200:
            return {"ok": False, "status": resp.status, "error": (await resp.text())[:200]}
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            # one chunk per engine step that produced a token (dummy models have no tokenizer: empty text)
            if chunk.get("choices") and chunk["choices"][0].get("finish_reason") is None:
                times.append(time.perf_counter())
    if not times:
        return {"ok": False, "status": 200, "error": "no tokens"}
    itl = np.diff(times).tolist()
    n = max_tokens
    return {"ok": True, "ttft": times[0] - t0, "e2e": times[-1] - t0, "t_end": times[-1], "itl": itl,
            "output_tokens": n,
            "tpot": (times[-1] - times[0]) / max(n - 1, 1), "prompt_tokens": len(prompt)}


async def run_rate(url, model, work, rate, concurrency, seed=0):
    """One rate. Besides the totals over the whole run (req_per_s = completed / wall, the drain of the last
    requests included, as vLLM's benchmark_serving reports it), the rate the server completed requests at while
    they kept arriving: window_req_per_s = completions in [arrival_s / 2, arrival_s] / (arrival_s / 2), where
    arrival_s is the time of the last send, beside window_offered_req_per_s = sends in the same window / its
    length (the realised Poisson rate). If the server keeps up the two agree; if not, the first is its service
    rate. Unlike req_per_s it does not fall with long requests finishing after the last arrival. The window
    starts half-way so that the requests completing in it arrived after the start (at 32 req/s x 1000 prompts,
    ~2% of requests take longer than the 15 s before the window: a ~1% low bias)."""
    import aiohttp

    rng = np.random.default_rng(seed)
    sem = asyncio.Semaphore(concurrency) if concurrency else None
    timeout = aiohttp.ClientTimeout(total=3600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async def go(p, m):
            if sem is None:
                return await one_request(session, url, model, p, m)
            async with sem:
                return await one_request(session, url, model, p, m)

        tasks, sends = [], []
        t0 = time.perf_counter()
        for p, m in work:
            sends.append(time.perf_counter() - t0)
            tasks.append(asyncio.create_task(go(p, m)))
            if rate != float("inf"):
                await asyncio.sleep(rng.exponential(1.0 / rate))
        arrival = time.perf_counter() - t0
        results = await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    ok = [r for r in results if r["ok"]]
    lo, hi = arrival / 2, arrival
    done_in_window = sum(1 for r in ok if lo <= r["t_end"] - t0 <= hi)
    sent_in_window = sum(1 for t in sends if lo <= t <= hi)

    def pct(xs):
        return {f"p{q}": float(np.percentile(xs, q)) * 1e3 for q in (50, 90, 99)} if xs else {}

    out_tok = sum(r["output_tokens"] for r in ok)
    return {"rate": rate, "concurrency": concurrency, "completed": len(ok), "failed": len(results) - len(ok),
            "seconds": wall, "req_per_s": len(ok) / wall, "output_tok_per_s": out_tok / wall,
            "arrival_s": arrival, "window_req_per_s": done_in_window / (hi - lo) if hi > lo else float("nan"),
            "window_offered_req_per_s": sent_in_window / (hi - lo) if hi > lo else float("nan"),
            "total_tok_per_s": (out_tok + sum(r["prompt_tokens"] for r in ok)) / wall,
            "ttft_ms": pct([r["ttft"] for r in ok]), "tpot_ms": pct([r["tpot"] for r in ok]),
            "itl_ms": pct([x for r in ok for x in r["itl"]]), "e2e_ms": pct([r["e2e"] for r in ok])}


def plot(rows, path, peer_rows=None):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the GPU image has no matplotlib: a plain numpy/zlib PNG instead
        from benchmarks.png_plot import write_chart

        panels = []
        for key, name in (("ttft_ms", "TTFT (ms)"), ("tpot_ms", "TPOT (ms)")):
            series = []
            for label, rs in (("jaxinfer", rows), ("transformers", peer_rows or [])):
                for q in ("p50", "p99"):
                    if rs:
                        series.append((f"{label} {q}", [r["rate"] for r in rs],
                                        [r[key].get(q, float("nan")) for r in rs]))
            panels.append((name, series))
        return write_chart(path, panels, "request rate (req/s)")
    rates = [r["rate"] for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for key, a in (("ttft_ms", ax[0]), ("tpot_ms", ax[1])):
        for q in ("p50", "p99"):
            a.plot(rates, [r[key].get(q, np.nan) for r in rows], marker="o", label=f"jaxinfer {q}")
            if peer_rows:
                a.plot([r["rate"] for r in peer_rows], [r[key].get(q, np.nan) for r in peer_rows], marker="x",
                       linestyle="--", label=f"transformers serve {q}")
        a.set_xscale("log")
        a.set_xlabel("request rate (req/s)")
        a.set_ylabel(key.replace("_ms", " (ms)"))
        a.legend()
    fig.tight_layout()
    fig.savefig(path)
    return path


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--model", default=None, help="model name the server serves (default: ask /v1/models)")
    ap.add_argument("--rates", type=float, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--max-concurrency", type=int, default=0, help="cap on requests in flight (0 = none)")
    ap.add_argument("--num-prompts", type=int, default=200)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--max-len", type=int, default=2048)
    a = ap.parse_args()
    import urllib.request

    model = a.model or json.load(urllib.request.urlopen(f"{a.url}/v1/models"))["data"][0]["id"]
    work = make_workload("sharegpt", a.num_prompts, 0, 0, a.vocab, a.max_len)
    rows = []
    for rate in a.rates:
        r = asyncio.run(run_rate(a.url, model, work, rate, a.max_concurrency))
        rows.append(r)
        ms = lambda kind, q: r[kind].get(q, float("nan"))  # noqa: E731
        print(f"rate {rate:6.1f}: {r['completed']} ok / {r['failed']} failed, {r['req_per_s']:.2f} req/s, "
              f"{r['output_tok_per_s']:.0f} out tok/s | TTFT p50 {ms('ttft_ms', 'p50'):.0f} ms "
              f"p99 {ms('ttft_ms', 'p99'):.0f} | TPOT p50 {ms('tpot_ms', 'p50'):.1f} "
              f"ms p99 {ms('tpot_ms', 'p99'):.1f} | ITL p99 {ms('itl_ms', 'p99'):.1f} ms")
    from benchmarks.common import RESULTS_DIR, write_result

    path = write_result("serving", dict(url=a.url, model=model, num_prompts=a.num_prompts, rows=rows))
    png = os.path.join(RESULTS_DIR, os.path.basename(path).replace(".json", ".png"))
    print("wrote", path, "| plot:", plot(rows, png))


if __name__ == "__main__":
    main()
