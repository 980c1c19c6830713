"""OpenAI-compatible HTTP server over one jaxinfer LLM.

Why aiohttp (not FastAPI + uvicorn): one dependency that is already on the GPU image, a plain
`web.StreamResponse` for SSE (no extra sse package), an `AppRunner` that tests can start on a loopback port in a
background thread, and `web.run_app` that already turns SIGTERM/SIGINT into a graceful shutdown (on_shutdown
hooks, then exit 0). Validation is small enough that pydantic would add more code than it saves.

Endpoints: POST /v1/completions, POST /v1/chat/completions (both with `stream: true` as SSE
`data: {...}\\n\\n` chunks ending with `data: [DONE]\\n\\n`), GET /v1/models, GET /health, GET /metrics.
The engine gives cumulative text; streams send the new suffix (the detokenizer never retracts text).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
import uuid

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST

from serving.async_engine import AsyncEngine, EngineStoppedError, QueueFullError
from serving.metrics_prefix_cache import PrefixCacheCollector
from serving.protocol import ProtocolError, error_body, parse_chat_request, parse_completion_request

log = logging.getLogger("serving")

ENGINE_KEY = web.AppKey("engine", AsyncEngine)
STATE_KEY = web.AppKey("state", dict)

_LAT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class _Metrics:
    def __init__(self, aeng: AsyncEngine):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("jaxinfer_requests", "HTTP requests by endpoint and status", ["endpoint", "status"],
                                registry=r)
        self.ttft = Histogram("jaxinfer_time_to_first_token_seconds", "time to first token", buckets=_LAT_BUCKETS,
                              registry=r)
        self.tpot = Histogram("jaxinfer_time_per_output_token_seconds", "time per output token after the first",
                              buckets=_LAT_BUCKETS, registry=r)
        self.e2e = Histogram("jaxinfer_e2e_request_latency_seconds", "request latency", buckets=_LAT_BUCKETS,
                             registry=r)
        self.prompt_tokens = Counter("jaxinfer_prompt_tokens", "prompt tokens processed", registry=r)
        self.generation_tokens = Counter("jaxinfer_generation_tokens", "tokens generated", registry=r)
        g = Gauge("jaxinfer_num_requests_running", "requests running in the engine", registry=r)
        g.set_function(lambda: aeng.stats.num_running)
        g = Gauge("jaxinfer_num_requests_waiting", "requests waiting in the engine", registry=r)
        g.set_function(lambda: aeng.stats.num_waiting)
        g = Gauge("jaxinfer_kv_pages_used", "KV-cache pages in use", registry=r)
        g.set_function(lambda: aeng.stats.kv_pages_used)
        g = Gauge("jaxinfer_kv_pages_total", "usable KV-cache pages", registry=r)
        g.set_function(lambda: aeng.stats.kv_pages_total)
        r.register(PrefixCacheCollector(aeng))
        # speculative decoding (0 when off): counters since start, as gauges of the engine's running totals
        for key, doc in (("num_draft_tokens", "draft tokens verified"), ("num_accepted_tokens", "draft tokens accepted"),
                         ("num_verify_steps", "speculative verifications (one per request and step)"),
                         ("acceptance_rate", "accepted / drafted tokens"),
                         ("mean_accepted_length", "tokens produced per verification (accepted + 1)")):
            g = Gauge(f"jaxinfer_spec_{key}", doc, registry=r)
            g.set_function(lambda key=key: (aeng.stats.spec or {}).get(key, 0))


def _err(status: int, message: str, param: str | None = None, type: str = "invalid_request_error",
         headers=None) -> web.Response:
    return web.json_response(error_body(message, param, type), status=status, headers=headers)


class _Timing:
    """Per-request latency bookkeeping for the histograms."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.first = None

    def token(self):
        if self.first is None:
            self.first = time.perf_counter()

    def observe(self, m: _Metrics, n_tokens: int, prompt_tokens: int):
        end = time.perf_counter()
        m.e2e.observe(end - self.t0)
        if self.first is not None:
            m.ttft.observe(self.first - self.t0)
            if n_tokens > 1:
                m.tpot.observe((end - self.first) / (n_tokens - 1))
        m.prompt_tokens.inc(prompt_tokens)
        m.generation_tokens.inc(n_tokens)


class _Server:
    def __init__(self, llm, served_model_name: str, aeng: AsyncEngine):
        self.llm = llm
        self.tokenizer = llm.tokenizer
        self.model_name = served_model_name
        self.aeng = aeng
        self.metrics = _Metrics(aeng)
        self.created = int(time.time())

    # ---- helpers --------------------------------------------------------------------------------------------
    async def _json(self, request: web.Request):
        try:
            return json.loads(await request.read())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ProtocolError(f"invalid JSON body: {e}", None)

    def _check_model(self, model):
        if model is not None and model != self.model_name:
            raise ProtocolError(f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                                "model")

    def _tok(self, tid: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{tid}"
        return self.tokenizer.decode([tid], skip_special_tokens=False)

    async def _start(self, prompts, params):
        """Add every prompt; all-or-nothing. Returns the streams."""
        streams = []
        try:
            for p in prompts:
                streams.append(await self.aeng.add_request(p, params))
        except BaseException:
            for s in streams:
                s.abort()
            raise
        return streams

    async def _handle(self, endpoint: str, request: web.Request, fn):
        m = self.metrics
        try:
            resp = await fn(request)
        except ProtocolError as e:
            resp = _err(e.status, e.message, e.param, e.type)
        except QueueFullError as e:
            resp = _err(503, str(e), None, "server_busy", headers={"Retry-After": "1"})
        except EngineStoppedError as e:
            resp = _err(503, str(e), None, "server_shutting_down", headers={"Retry-After": "5"})
        except (ValueError, TypeError) as e:  # the engine's message (prompt too long, bad token ids, penalties)
            msg = str(e)
            param = None
            for f in ("presence_penalty", "frequency_penalty", "repetition_penalty", "max_tokens", "prompt"):
                if msg.startswith(f):
                    param = f
            if param is None and ("max_model_len" in msg or "prompt" in msg or "vocabulary" in msg):
                param = "messages" if endpoint == "chat" else "prompt"
            resp = _err(400, msg, param)
        except (ConnectionResetError, asyncio.CancelledError):
            m.requests.labels(endpoint, "499").inc()
            raise
        except Exception as e:  # noqa: BLE001
            log.exception("internal error")
            resp = _err(500, f"internal error: {e}", None, "internal_error")
        m.requests.labels(endpoint, str(resp.status)).inc()
        return resp

    # ---- endpoints ------------------------------------------------------------------------------------------
    async def completions(self, request):
        return await self._handle("completions", request, self._completions)

    async def chat(self, request):
        return await self._handle("chat", request, self._chat)

    async def _completions(self, request):
        req = parse_completion_request(await self._json(request))
        self._check_model(req.model)
        params = req.to_sampling_params()
        if self.tokenizer is None and any(isinstance(p, str) for p in req.prompts):
            raise ProtocolError("this model has no tokenizer: pass the prompt as token ids", "prompt")
        streams = await self._start(req.prompts, params)
        rid = f"cmpl-{uuid.uuid4().hex}"
        if req.stream:
            return await self._stream(request, streams, req, rid, chat=False)
        finals = await self._gather(streams, req.n)
        choices, usage = [], self._usage(finals)
        for i, out in enumerate(finals):
            for c in out.outputs:
                choices.append({"index": i * req.n + c.index, "text": c.text,
                                "logprobs": self._cmpl_logprobs(c, 0) if req.logprobs is not None else None,
                                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
        return web.json_response({"id": rid, "object": "text_completion", "created": int(time.time()),
                                  "model": self.model_name, "choices": choices, "usage": usage})

    async def _chat(self, request):
        req = parse_chat_request(await self._json(request))
        self._check_model(req.model)
        params = req.to_sampling_params()
        if self.tokenizer is None:
            raise ProtocolError("this model has no tokenizer, so no chat template; use /v1/completions with "
                                "token ids", "messages")
        try:
            prompt = self.tokenizer.apply_chat_template(req.messages, add_generation_prompt=True)
        except ValueError as e:
            raise ProtocolError(str(e), "messages")
        except Exception as e:  # noqa: BLE001 - template errors (jinja) are the caller's messages
            raise ProtocolError(f"could not apply the chat template: {e}", "messages")
        streams = await self._start([prompt], params)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if req.stream:
            return await self._stream(request, streams, req, rid, chat=True)
        (out,) = await self._gather(streams, req.n)
        choices = []
        for c in out.outputs:
            choices.append({"index": c.index, "message": {"role": "assistant", "content": c.text},
                            "logprobs": self._chat_logprobs(c, 0, req.top_logprobs)
                            if req.want_logprobs else None,
                            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
        return web.json_response({"id": rid, "object": "chat.completion", "created": int(time.time()),
                                  "model": self.model_name, "choices": choices, "usage": self._usage([out])})

    async def _gather(self, streams, n):
        timings = [_Timing() for _ in streams]

        async def one(s, t):
            last = None
            try:
                async for out in s:
                    if any(c.token_ids for c in out.outputs):
                        t.token()
                    last = out
            finally:
                s.abort()
            t.observe(self.metrics, sum(len(c.token_ids) for c in last.outputs), len(last.prompt_token_ids))
            return last

        return await asyncio.gather(*(one(s, t) for s, t in zip(streams, timings)))

    def _usage(self, finals):
        p = sum(len(o.prompt_token_ids) for o in finals)
        c = sum(len(x.token_ids) for o in finals for x in o.outputs)
        return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}

    def _cmpl_logprobs(self, c, start: int, text_offset0: int = 0):
        if c.logprobs is None:
            return None
        tokens, token_lps, tops, offsets = [], [], [], []
        off = text_offset0
        for d, sampled in zip(c.logprobs[start:], c.token_ids[start:]):
            s = self._tok(sampled)
            tokens.append(s)
            token_lps.append(d[sampled].logprob)
            tops.append({self._tok(t): lp.logprob for t, lp in d.items()})
            offsets.append(off)
            off += len(s)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}

    def _chat_logprobs(self, c, start: int, top_n: int):
        if c.logprobs is None:
            return None
        content = []
        for d, sampled in zip(c.logprobs[start:], c.token_ids[start:]):
            s = self._tok(sampled)
            top = sorted(d.items(), key=lambda kv: -kv[1].logprob)[:top_n]
            content.append({"token": s, "logprob": d[sampled].logprob, "bytes": list(s.encode("utf-8")),
                            "top_logprobs": [{"token": self._tok(t), "logprob": lp.logprob,
                                              "bytes": list(self._tok(t).encode("utf-8"))} for t, lp in top]})
        return {"content": content}

    async def _stream(self, request, streams, req, rid, chat: bool):
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        n = req.n
        sent_text = {}   # choice index -> chars sent
        sent_tok = {}    # choice index -> tokens whose logprobs were sent
        sent_ids = {}    # choice index -> token ids seen (one chunk per step that produced tokens)
        fin_sent = set()  # choice indices whose finish_reason was sent
        finals = [None] * len(streams)
        timings = [_Timing() for _ in streams]
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(i, s):
            try:
                async for out in s:
                    await queue.put((i, out))
            except Exception as e:  # noqa: BLE001
                await queue.put((i, e))
            finally:
                await queue.put((i, None))

        def chunk(choices, usage=None):
            d = {"id": rid, "object": obj, "created": created, "model": self.model_name, "choices": choices}
            if usage is not None:
                d["usage"] = usage
            return b"data: " + json.dumps(d).encode() + b"\n\n"

        await resp.prepare(request)
        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
        try:
            if chat:
                for j in range(n):
                    await resp.write(chunk([{"index": j, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}]))
            done = 0
            while done < len(streams):
                i, out = await queue.get()
                if out is None:
                    done += 1
                    continue
                if isinstance(out, Exception):
                    raise out
                finals[i] = out
                choices = []
                for c in out.outputs:
                    idx = i * n + c.index
                    if c.token_ids:
                        timings[i].token()
                    new_text = c.text[sent_text.get(idx, 0):]
                    k0 = sent_tok.get(idx, 0)
                    new_lps = c.logprobs[k0:] if c.logprobs is not None else None
                    new_ids = len(c.token_ids) > sent_ids.get(idx, 0)
                    # A chunk per engine step that produced tokens, even when the detokenizer holds the text back
                    # (or there is no tokenizer): clients time tokens by chunks, as with vLLM.
                    if idx in fin_sent or (not new_text and not c.finish_reason and not new_lps and not new_ids):
                        continue
                    sent_ids[idx] = len(c.token_ids)
                    if c.finish_reason:
                        fin_sent.add(idx)
                    sent_text[idx] = len(c.text)
                    sent_tok[idx] = len(c.logprobs) if c.logprobs is not None else 0
                    if chat:
                        ch = {"index": idx, "delta": {"content": new_text} if new_text else {},
                              "logprobs": self._chat_logprobs(c, k0, req.top_logprobs)
                              if req.want_logprobs else None, "finish_reason": c.finish_reason}
                    else:
                        ch = {"index": idx, "text": new_text,
                              "logprobs": self._cmpl_logprobs(c, k0) if req.logprobs is not None else None,
                              "finish_reason": c.finish_reason}
                    if c.finish_reason:
                        ch["stop_reason"] = c.stop_reason
                    choices.append(ch)
                for ch in choices:  # one choice per chunk, like OpenAI (clients read choices[0])
                    await resp.write(chunk([ch]))
            for t, f in zip(timings, finals):
                if f is not None:
                    t.observe(self.metrics, sum(len(c.token_ids) for c in f.outputs), len(f.prompt_token_ids))
            if req.include_usage:
                await resp.write(chunk([], self._usage([f for f in finals if f is not None])))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, asyncio.CancelledError, OSError):
            log.info("client went away: aborting %s", rid)
            raise
        except Exception as e:  # noqa: BLE001 - the stream is open: report the error in-band
            log.exception("stream failed")
            try:
                await resp.write(b"data: " + json.dumps(error_body(str(e), None, "internal_error")).encode()
                                 + b"\n\n")
            except Exception:  # noqa: BLE001
                pass
        finally:
            for s in streams:
                s.abort()
            for t in tasks:
                t.cancel()
        return resp

    async def models(self, request):
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "jaxinfer",
             "max_model_len": self.llm.max_model_len}]})

    async def health(self, request):
        return web.Response(text="ok")

    async def metrics_ep(self, request):
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})


def create_app(llm, served_model_name: str | None = None, max_waiting: int | None = None,
               shutdown_grace_s: float = 10.0) -> web.Application:
    """An aiohttp app serving `llm` (a jaxinfer.LLM). Its AsyncEngine thread starts now, stops on app shutdown."""
    name = served_model_name or getattr(getattr(llm, "source", None), "name", None) or "jaxinfer"
    aeng = AsyncEngine(llm.engine, max_waiting=max_waiting)
    srv = _Server(llm, name, aeng)
    app = web.Application(client_max_size=64 * 1024 * 1024)
    app[ENGINE_KEY] = aeng
    app[STATE_KEY] = {"server": srv}
    app.router.add_post("/v1/completions", srv.completions)
    app.router.add_post("/v1/chat/completions", srv.chat)
    app.router.add_get("/v1/models", srv.models)
    app.router.add_get("/health", srv.health)
    app.router.add_get("/metrics", srv.metrics_ep)

    async def on_shutdown(app):
        await aeng.shutdown(shutdown_grace_s)

    app.on_shutdown.append(on_shutdown)
    return app


def build_parser() -> argparse.ArgumentParser:
    from jaxinfer.cli_args import add_engine_args

    p = argparse.ArgumentParser(prog="jaxinfer serve", description="OpenAI-compatible HTTP server")
    add_engine_args(p)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--max-waiting", type=int, default=None,
                   help="refuse (503) requests beyond max_num_seqs + this many; default: no limit")
    p.add_argument("--no-warmup", action="store_true", help="compile buckets on first use instead of at start")
    p.add_argument("--shutdown-grace", type=float, default=10.0)
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="write a jax.profiler trace of the serving run (start to shutdown) to DIR")
    return p


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    from jaxinfer import LLM
    from jaxinfer.cli_args import config_from_args, init_distributed

    try:
        config = config_from_args(a)
        if init_distributed(a):
            raise ValueError("jaxinfer serve runs on one host (tensor/data parallel over its devices); across "
                             "hosts run the offline API or `jaxinfer generate` on every host (README)")
        llm = LLM(config=config, warmup=not a.no_warmup)
    except (ValueError, TypeError, FileNotFoundError, MemoryError) as e:  # same contract as `jaxinfer generate`
        print(f"jaxinfer serve: error: {e}", file=sys.stderr)
        return 2
    app = create_app(llm, a.served_model_name, a.max_waiting, a.shutdown_grace)
    # The server lives until exit and so do the objects of start-up: take them out of the cyclic GC for good, so
    # its full collections stop walking ~270k objects in the middle of engine steps (engine/gc_freeze.py).
    import gc

    gc.collect()
    gc.freeze()
    if a.profile:
        import jax

        jax.profiler.start_trace(a.profile)
    # run_app maps SIGTERM/SIGINT to a graceful shutdown (on_shutdown -> AsyncEngine.shutdown) and returns.
    try:
        web.run_app(app, host=a.host, port=a.port, shutdown_timeout=a.shutdown_grace + 5, print=log.info)
    finally:
        if a.profile:
            jax.profiler.stop_trace()
    return 0
