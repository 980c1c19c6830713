"""Soak and fault benchmark (issue 18): mixed traffic against an in-process jaxinfer server for --minutes, recording
every request's outcome, then checking that nothing was lost and nothing leaked.

  python benchmarks/soak.py --minutes 3                                  # CPU: tiny-llama, dummy weights
  python benchmarks/soak.py --model llama3-8b --minutes 30 --rate 20 --max-num-seqs 64 --max-tokens 256  # GPU, 8B

Traffic: Poisson arrivals at --rate requests/s of random token-id prompts (any model, dummy weights included;
outputs forced to their length with ignore_eos), a mix of plain and streaming requests, --disconnect-frac of clients
closing their stream after two chunks, --malformed-frac malformed requests (bad JSON, deep nesting, wrong types,
int32 overflow, oversize body, wrong path / method / content type, unsupported fields), and every --burst-every
seconds a burst of --burst-size requests at once, past --max-waiting (503 + Retry-After: cleanly refused).

Outcomes: ok (answered in full: plain with its max_tokens, streams with a finish_reason and [DONE]), disconnected
(closed by the client on purpose), refused (4xx for malformed requests), busy (503 with Retry-After), bad (a 4xx
for a well-formed request, or a wrong answer), 5xx, lost (no answer: an exception or a timeout). The run passes
with 0 lost, 0 5xx, 0 bad and, once the traffic stops, 0 KV pages used and 0 requests running. RSS (of the whole
process: server, engine and the load generator; and device memory on a GPU) is sampled every 5 s; the growth after
warm-up (the first 20% of the run) is printed.
Results: benchmarks/results/soak-<commit>[-cpu]-<date>.json.
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


def _rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _device_bytes() -> int | None:
    import jax

    from jaxinfer.runner.device_memory import memory_budget

    memory = memory_budget(jax.devices()[0])  # jax's statistics, or the CUDA driver's under the VMM allocator
    return None if memory is None else memory[1]


MALFORMED = [  # (name, method, path, body bytes, content type)
    ("bad_json", "POST", "/v1/completions", b"{not json", "application/json"),
    ("deep_nesting", "POST", "/v1/completions", b"[" * 5000 + b"]" * 5000, "application/json"),
    ("wrong_type", "POST", "/v1/completions", b'{"prompt": [5, 6], "max_tokens": "8"}', "application/json"),
    ("int32_overflow", "POST", "/v1/completions", b'{"prompt": [5, 6], "top_k": 2147483648}', "application/json"),
    ("bad_token_id", "POST", "/v1/completions", b'{"prompt": [5, 99999999]}', "application/json"),
    ("oversize", "POST", "/v1/completions", b'{"prompt": "' + b"a" * (5 * 2**20) + b'"}', "application/json"),
    ("unknown_path", "POST", "/v1/nothing", b"{}", "application/json"),
    ("wrong_method", "GET", "/v1/completions", b"", None),
    ("content_type", "POST", "/v1/completions", b"prompt=hi", "application/x-www-form-urlencoded"),
    ("not_utf8", "POST", "/v1/completions", b'{"prompt": "caf\xe9"}', "application/json"),
    ("unsupported", "POST", "/v1/completions", b'{"prompt": [5], "tools": [{"type": "function"}]}',
     "application/json"),
    ("too_long", "POST", "/v1/completions", json.dumps({"prompt": [5] * 100000}).encode(), "application/json"),
]


async def _plain(session, url, prompt, max_tokens):
    body = {"model": "soak", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True}
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        status, data = resp.status, await resp.read()
    if status != 200:
        return status, None
    got = json.loads(data)["usage"]["completion_tokens"]
    return status, got == max_tokens


async def _stream(session, url, prompt, max_tokens, disconnect: bool):
    body = {"model": "soak", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "ignore_eos": True,
            "stream": True}
    resp = await session.post(f"{url}/v1/completions", json=body)
    try:
        if resp.status != 200:
            await resp.read()
            return resp.status, None
        chunks, finish, done = 0, None, False
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data:"):
                continue
            if line == "data: [DONE]":
                done = True
                break
            chunks += 1
            ch = json.loads(line[5:])
            if "error" in ch:
                return 200, False
            if ch.get("choices") and ch["choices"][0].get("finish_reason"):
                finish = ch["choices"][0]["finish_reason"]
            if disconnect and chunks >= 2:
                return 200, "disconnected"
        return 200, done and finish is not None
    finally:
        resp.close()


async def _malformed(session, url, case):
    _, method, path, body, ctype = case
    headers = {} if ctype is None else {"Content-Type": ctype}
    async with session.request(method, url + path, data=body or None, headers=headers) as resp:
        await resp.read()
        return resp.status, None


async def _metrics(session, url) -> dict:
    async with session.get(url + "/metrics") as resp:
        text = await resp.text()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, v = line.rpartition(" ")
            out[name] = float(v)
    return out


def _classify(kind, status, ok, headers_503=True):
    if ok == "disconnected":
        return "disconnected"
    if status is None:
        return "lost"
    if status == 503:
        return "busy"
    if status >= 500:
        return "5xx"
    if kind == "malformed":
        return "refused" if 400 <= status < 500 else "bad"
    if status != 200 or not ok:
        return "bad"
    return "ok"


async def run(a) -> dict:
    import aiohttp
    from aiohttp import web

    from jaxinfer import LLM
    from serving.limits import ServerLimits
    from serving.server import create_app

    kw = dict(max_num_seqs=a.max_num_seqs, max_model_len=a.max_model_len, progress=False)
    if a.num_pages:
        kw["num_pages"] = a.num_pages
    if a.max_num_batched_tokens:
        kw["max_num_batched_tokens"] = a.max_num_batched_tokens
    llm = LLM(a.model, load_format=a.load_format, dtype=a.dtype, **kw)
    vocab = llm.engine.vocab_size
    app = create_app(llm, served_model_name="soak", max_waiting=a.max_waiting, limits=ServerLimits())
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"

    rng = np.random.default_rng(a.seed)
    records, tasks = [], []
    rss, dev = [], []
    burst_size = a.burst_size or 2 * (a.max_num_seqs + a.max_waiting)
    t_start = time.monotonic()
    t_end = t_start + 60 * a.minutes

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=a.request_timeout)) as session:
        async def one(kind, *args):
            t0 = time.monotonic()
            status, ok, err = None, None, None
            try:
                if kind == "plain":
                    status, ok = await _plain(session, url, *args)
                elif kind in ("stream", "disconnect"):
                    status, ok = await _stream(session, url, *args, disconnect=kind == "disconnect")
                else:
                    status, ok = await _malformed(session, url, *args)
            except Exception as e:  # noqa: BLE001 - recorded: a lost request
                err = f"{type(e).__name__}: {e}"[:200]
            rec = {"kind": kind if kind != "malformed" else f"malformed:{args[0][0]}", "t": round(t0 - t_start, 3),
                   "latency": round(time.monotonic() - t0, 4), "status": status,
                   "outcome": _classify(kind, status, ok)}
            if err:
                rec["error"] = err
            records.append(rec)

        def launch(kind):
            if len(tasks) > 256:  # keep only the running ones (finished tasks would count as RSS growth)
                tasks[:] = [t for t in tasks if not t.done()]
            if kind == "malformed":
                args = (MALFORMED[int(rng.integers(len(MALFORMED)))],)
            else:
                prompt = rng.integers(3, vocab, size=int(rng.integers(4, 65))).tolist()
                args = (prompt, int(rng.integers(1, a.max_tokens + 1)))
            tasks.append(asyncio.create_task(one(kind, *args)))

        async def sampler():
            while time.monotonic() < t_end:
                rss.append((round(time.monotonic() - t_start, 1), _rss_bytes()))
                d = _device_bytes()
                if d is not None:
                    dev.append((round(time.monotonic() - t_start, 1), d))
                await asyncio.sleep(5)

        samp = asyncio.create_task(sampler())
        next_burst = t_start + a.burst_every
        while time.monotonic() < t_end:
            await asyncio.sleep(float(rng.exponential(1.0 / a.rate)))
            u = rng.random()
            if u < a.malformed_frac:
                launch("malformed")
            elif u < a.malformed_frac + a.disconnect_frac:
                launch("disconnect")
            else:
                launch("stream" if rng.random() < a.stream_frac else "plain")
            if time.monotonic() >= next_burst:
                for _ in range(burst_size):
                    launch("plain")
                next_burst += a.burst_every
        await asyncio.gather(*tasks)
        samp.cancel()
        # once every client is gone: nothing running, no page held
        deadline, m = time.monotonic() + 120, {}
        while time.monotonic() < deadline:
            m = await _metrics(session, url)
            if m.get("jaxinfer_num_requests_running") == 0 and m.get("jaxinfer_kv_pages_used") == 0 \
                    and m.get("jaxinfer_num_requests_waiting") == 0:
                break
            await asyncio.sleep(0.2)
        rss.append((round(time.monotonic() - t_start, 1), _rss_bytes()))
    await runner.cleanup()

    counts: dict[str, int] = {}
    by_kind: dict[str, dict[str, int]] = {}
    for r in records:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
        k = by_kind.setdefault(r["kind"].split(":")[0], {})
        k[r["outcome"]] = k.get(r["outcome"], 0) + 1
    warm = t_start + 0.2 * 60 * a.minutes
    after = [b for t, b in rss if t >= warm - t_start] or [rss[-1][1]]
    lat = sorted(r["latency"] for r in records if r["outcome"] == "ok")
    return {
        "config": {k: v for k, v in vars(a).items()},
        "duration_s": round(time.monotonic() - t_start, 1), "num_requests": len(records), "outcomes": counts,
        "by_kind": by_kind, "lost": counts.get("lost", 0), "num_5xx": counts.get("5xx", 0),
        "num_bad": counts.get("bad", 0),
        "final": {"kv_pages_used": m.get("jaxinfer_kv_pages_used"), "running": m.get("jaxinfer_num_requests_running"),
                  "waiting": m.get("jaxinfer_num_requests_waiting"),
                  "rejected": {k: v for k, v in m.items() if k.startswith("jaxinfer_rejected_requests_total")}},
        "rss_bytes": rss, "rss_growth_after_warmup_bytes": after[-1] - after[0],
        "device_bytes": dev, "device_growth_after_warmup_bytes": (
            (lambda d: d[-1] - d[0])([b for t, b in dev if t >= warm - t_start] or [0]) if dev else None),
        "ok_latency_s": {"p50": lat[len(lat) // 2] if lat else None, "p99": lat[int(len(lat) * 0.99)] if lat else None},
        "records": records,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny-llama")
    ap.add_argument("--load-format", default="dummy")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--rate", type=float, default=4.0, help="mean arrivals per second (Poisson)")
    ap.add_argument("--max-tokens", type=int, default=48, help="generated lengths are uniform in [1, this]")
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=512)
    ap.add_argument("--num-pages", type=int, default=None)
    ap.add_argument("--max-num-batched-tokens", type=int, default=None)
    ap.add_argument("--max-waiting", type=int, default=16)
    ap.add_argument("--burst-every", type=float, default=30.0, help="seconds between bursts")
    ap.add_argument("--burst-size", type=int, default=None, help="default: 2 x (max_num_seqs + max_waiting)")
    ap.add_argument("--stream-frac", type=float, default=0.5)
    ap.add_argument("--disconnect-frac", type=float, default=0.1)
    ap.add_argument("--malformed-frac", type=float, default=0.05)
    ap.add_argument("--request-timeout", type=float, default=600.0, help="client-side: a request lost after this")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    res = asyncio.run(run(a))
    from benchmarks.common import write_result

    path = write_result("soak", res)
    fin = res["final"]
    print(f"soak: {res['num_requests']} requests in {res['duration_s']} s: {res['outcomes']}")
    print(f"  lost {res['lost']}, 5xx {res['num_5xx']}, bad {res['num_bad']}; after the traffic: kv pages used "
          f"{fin['kv_pages_used']}, running {fin['running']}, waiting {fin['waiting']}")
    print(f"  RSS growth after warm-up: {res['rss_growth_after_warmup_bytes'] / 2**20:+.1f} MiB"
          + ("" if res["device_growth_after_warmup_bytes"] is None else
             f"; device memory growth: {res['device_growth_after_warmup_bytes'] / 2**20:+.1f} MiB"))
    print(f"  -> {path}")
    passed = (res["lost"] == 0 and res["num_5xx"] == 0 and res["num_bad"] == 0 and fin["kv_pages_used"] == 0
              and fin["running"] == 0)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
