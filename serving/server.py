"""OpenAI-compatible HTTP server over one jaxinfer LLM.

Why aiohttp (not FastAPI + uvicorn): one dependency that is already on the GPU image, a plain
`web.StreamResponse` for SSE (no extra sse package), an `AppRunner` that tests can start on a loopback port in a
background thread, and `web.run_app` that already turns SIGTERM/SIGINT into a graceful shutdown (on_shutdown
hooks, then exit 0). Validation is small enough that pydantic would add more code than it saves.

Endpoints: POST /v1/completions, POST /v1/chat/completions (both with `stream: true` as SSE
`data: {...}\\n\\n` chunks ending with `data: [DONE]\\n\\n`), GET /v1/models, GET /v1/models/{id}, GET /health,
GET /metrics. Streams ask the engine for DELTA outputs and write each as a chunk; non-streaming requests ask for
FINAL_ONLY (one output per prompt, when it has finished; DELTA when a --request-timeout may cut them short).

Nothing a client sends gets a 5xx: every refusal is a 4xx with an OpenAI-style body (the error middleware also
turns aiohttp's own 404 / 405 / 413 into that body); a body over --max-body-bytes is refused from its
Content-Length before it is read; operator limits (serving/limits.py) refuse with 400s naming their flag;
/metrics counts refusals by reason. All prompts of a request are admitted together. A request whose client went
away is aborted (streams when a write fails, plain requests by polling the connection). On shutdown, streams still
running after the grace period end with a final chunk (finish_reason "length") and [DONE]; plain requests get a
503 before their first byte.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from jaxinfer.outputs import CompletionOutput
from serving.async_engine import AsyncEngine, EngineStoppedError, QueueFullError, RequestFailedError
from serving.limits import ServerLimits
from serving.metrics import Metrics as _Metrics, Timing as _Timing
from serving.protocol import ProtocolError, error_body, parse_chat_request, parse_completion_request

log = logging.getLogger("serving")

ENGINE_KEY = web.AppKey("engine", AsyncEngine)
STATE_KEY = web.AppKey("state", dict)

def _err(status: int, message: str, param: str | None = None, type: str = "invalid_request_error",
         headers=None) -> web.Response:
    return web.json_response(error_body(message, param, type), status=status, headers=headers)


class _Collected:
    """One prompt's answer, put together from its outputs (DELTA pieces, or one FINAL_ONLY output: the same
    concatenation); `cut()` ends the completions still running (deadline) with finish_reason 'length'."""

    def __init__(self, n: int):
        self.outputs = [CompletionOutput(i, "", []) for i in range(n)]
        self.prompt_token_ids: list[int] = []
        self.metrics: dict = {}

    def add(self, out) -> None:
        self.prompt_token_ids, self.metrics = out.prompt_token_ids, out.metrics or {}
        for c in out.outputs:
            a = self.outputs[c.index]
            a.text += c.text
            a.token_ids += c.token_ids
            if c.logprobs is not None:
                a.logprobs = (a.logprobs or []) + c.logprobs
            a.cumulative_logprob = c.cumulative_logprob
            if c.finish_reason is not None:
                a.finish_reason, a.stop_reason = c.finish_reason, c.stop_reason

    def cut(self) -> None:
        for a in self.outputs:
            if a.finish_reason is None:
                a.finish_reason = "length"


def _client_gone(request: web.Request) -> bool:
    t = request.transport
    return t is None or t.is_closing()


_JSON_TYPES = ("application/json",)
_GONE = web.RequestKey("jaxinfer_client_gone", bool)  # a stream's client went away (counted as 499)
_ROUTES = "POST /v1/completions, POST /v1/chat/completions, GET /v1/models, GET /health, GET /metrics"


class _Server:
    def __init__(self, llm, served_model_name: str, aeng: AsyncEngine, limits: ServerLimits):
        self.llm = llm
        self.tokenizer = llm.tokenizer
        self.model_name = served_model_name
        self.aeng = aeng
        self.limits = limits
        self.metrics = _Metrics(aeng)
        self.created = int(time.time())

    # ---- helpers --------------------------------------------------------------------------------------------
    async def _json(self, request: web.Request):
        ct = request.headers.get("Content-Type")
        if ct is not None and request.content_type not in _JSON_TYPES and not request.content_type.endswith("+json"):
            raise ProtocolError(f"Content-Type must be application/json, got {ct!r}; send the body as JSON with "
                                f"'Content-Type: application/json'", None, status=415,
                                reason="unsupported_media_type")
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge:  # a body without Content-Length that grew past the limit
            raise ProtocolError(f"the request body is larger than {self.limits.max_body_bytes} bytes, this "
                                f"server's limit (--max-body-bytes)", None, status=413, reason="body_too_large")
        try:
            return json.loads(raw)
        except RecursionError:
            raise ProtocolError("the JSON body is nested too deeply", None, reason="invalid_json") from None
        except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError, bad UTF-8, a 5000-digit integer
            raise ProtocolError(f"invalid JSON body: {e}", None, reason="invalid_json") from None

    async def _encode(self, prompts: list) -> list[list[int]]:
        """Token ids of every prompt (text prompts tokenized off the event loop, as the engine would)."""
        texts = [p for p in prompts if isinstance(p, str)]
        if not texts:
            return prompts
        enc = await asyncio.get_running_loop().run_in_executor(None, lambda: [self.tokenizer.encode(t) for t in texts])
        it = iter(enc)
        return [next(it) if isinstance(p, str) else p for p in prompts]

    def _check_model(self, model):
        if model is not None and model != self.model_name:
            raise ProtocolError(f"the model {model!r} does not exist; this server serves {self.model_name!r}",
                                "model")

    def _tok(self, tid: int) -> str:
        if self.tokenizer is None:
            return f"token_id:{tid}"
        return self.tokenizer.decode([tid], skip_special_tokens=False)

    async def _start(self, prompts, params):
        """Add every prompt in one admission (they share the first steps); all-or-nothing. Returns the streams."""
        return await self.aeng.add_requests(prompts, params)

    async def _handle(self, endpoint: str, request: web.Request, fn):
        m = self.metrics
        reason = None
        try:
            resp = await fn(request)
        except ProtocolError as e:
            resp, reason = _err(e.status, e.message, e.param, e.type), e.reason
        except QueueFullError as e:
            resp, reason = _err(503, str(e), None, "server_busy", headers={"Retry-After": "1"}), "queue_full"
        except EngineStoppedError as e:
            resp = _err(503, str(e), None, "server_shutting_down", headers={"Retry-After": "5"})
            reason = "shutting_down"
        except RequestFailedError as e:  # a step failed on this request alone (the others went on)
            resp, reason = _err(400, str(e), None), "engine_error"
        except (ValueError, TypeError) as e:  # the engine's message (prompt too long, bad token ids, penalties)
            reason = "invalid_request"
            msg = str(e)
            param = None
            for f in ("presence_penalty", "frequency_penalty", "repetition_penalty", "max_tokens", "prompt"):
                if msg.startswith(f):
                    param = f
            if param is None and ("max_model_len" in msg or "prompt" in msg or "vocabulary" in msg):
                param = "messages" if endpoint == "chat" else "prompt"
            resp = _err(400, msg, param)
        except ConnectionResetError:  # a plain request whose client went away (aborted): nobody reads this
            m.requests.labels(endpoint, "499").inc()
            return web.Response(status=499)
        except asyncio.CancelledError:
            m.requests.labels(endpoint, "499").inc()
            raise
        except Exception as e:  # noqa: BLE001
            log.exception("internal error")
            resp = _err(500, f"internal error: {e}", None, "internal_error")
        if reason is not None:
            m.rejected.labels(reason).inc()
        m.requests.labels(endpoint, "499" if request.get(_GONE) else str(resp.status)).inc()
        return resp

    # ---- endpoints ------------------------------------------------------------------------------------------
    async def completions(self, request):
        return await self._handle("completions", request, self._completions)

    async def chat(self, request):
        return await self._handle("chat", request, self._chat)

    async def _completions(self, request):
        req = parse_completion_request(await self._json(request))
        self._check_model(req.model)
        lim = self.limits
        lim.check(len(req.prompts), req.n, None, req.max_tokens, "prompt")  # before tokenizing anything
        params = self._params(req)
        if self.tokenizer is None and any(isinstance(p, str) for p in req.prompts):
            raise ProtocolError("this model has no tokenizer: pass the prompt as token ids", "prompt")
        prompts = await self._encode(req.prompts)
        lim.check(len(prompts), req.n, [len(p) for p in prompts], req.max_tokens, "prompt")
        streams = await self._start(prompts, params)
        rid = f"cmpl-{uuid.uuid4().hex}"
        if req.stream:
            return await self._stream(request, streams, req, rid, chat=False)
        finals = await self._gather(request, streams, req.n)
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
        self.limits.check(1, req.n, None, req.max_tokens or 1, "messages")
        if self.tokenizer is None:
            raise ProtocolError("this model has no tokenizer, so no chat template; use /v1/completions with "
                                "token ids", "messages")
        try:
            prompt = self.tokenizer.apply_chat_template(req.messages, add_generation_prompt=True)
        except ValueError as e:
            raise ProtocolError(str(e), "messages")
        except Exception as e:  # noqa: BLE001 - template errors (jinja) are the caller's messages
            raise ProtocolError(f"could not apply the chat template: {e}", "messages")
        (ids,) = await self._encode([prompt])
        if req.max_tokens is None:  # the server's cap, within the context window
            req.max_tokens = max(1, min(self.limits.default_max_tokens, self.llm.max_model_len - len(ids)))
        self.limits.check(1, req.n, [len(ids)], req.max_tokens, "messages")
        streams = await self._start([ids], self._params(req))
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        if req.stream:
            return await self._stream(request, streams, req, rid, chat=True)
        (out,) = await self._gather(request, streams, req.n)
        choices = []
        for c in out.outputs:
            choices.append({"index": c.index, "message": {"role": "assistant", "content": c.text},
                            "logprobs": self._chat_logprobs(c, 0, req.top_logprobs)
                            if req.want_logprobs else None,
                            "finish_reason": c.finish_reason, "stop_reason": c.stop_reason})
        return web.json_response({"id": rid, "object": "chat.completion", "created": int(time.time()),
                                  "model": self.model_name, "choices": choices, "usage": self._usage([out])})

    def _params(self, req):
        """SamplingParams of a parsed request: DELTA for streams; FINAL_ONLY for plain answers, or DELTA when a
        deadline may cut them short (the part so far is then the answer)."""
        from jaxinfer.sampling_params import RequestOutputKind

        params = req.to_sampling_params()
        if not req.stream and self.limits.request_timeout_s is not None:
            params = params.clone(output_kind=RequestOutputKind.DELTA)
        return params

    async def _gather(self, request, streams, n):
        """Every prompt's answer (_Collected). Aborts them all (and raises ConnectionResetError) when the client
        goes away; ends them with finish_reason 'length' at the deadline (--request-timeout)."""
        timings = [_Timing() for _ in streams]
        cols = [_Collected(n) for _ in streams]

        async def one(s, col):
            async for out in s:
                col.add(out)

        task = asyncio.ensure_future(asyncio.gather(*(one(s, c) for s, c in zip(streams, cols))))
        timeout = self.limits.request_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while True:
                wait = 0.25 if deadline is None else max(0.0, min(0.25, deadline - time.monotonic()))
                done, _ = await asyncio.wait({task}, timeout=wait)
                if done:
                    task.result()  # the streams' errors (shutdown, a failed request)
                    break
                if _client_gone(request):
                    log.info("client went away: aborting a plain request")
                    raise ConnectionResetError("the client went away")
                if deadline is not None and time.monotonic() >= deadline:
                    for c in cols:
                        c.cut()
                    self.metrics.timeouts.inc()
                    break
        finally:
            if not task.done():
                task.cancel()
            for s in streams:
                s.abort()
        for t, col in zip(timings, cols):
            m = col.metrics
            if m.get("first_token_time") is not None:  # the engine's clock: time to first token since admission
                t.first = t.t0 + (m["first_token_time"] - m["arrival_time"])
            t.observe(self.metrics, sum(len(c.token_ids) for c in col.outputs), len(col.prompt_token_ids))
        return cols

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
        """SSE: the engine sends DELTA outputs (only what a step added, only for completions that produced
        something); each completion of each output becomes one chunk, written as it comes. The stream always ends
        the way OpenAI clients expect: every choice gets a finish_reason (a deadline or the shutdown cuts the
        running ones with 'length'), then [DONE]; a request the engine failed on gets an error event first."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        created = int(time.time())
        obj = "chat.completion.chunk" if chat else "text_completion"
        n = req.n
        num_tokens = [0] * len(streams)      # completion tokens per prompt (all its n completions)
        prompt_lens = [None] * len(streams)  # set by the prompt's first output
        unfinished = set(range(len(streams) * n))  # choice indices without a finish_reason yet
        timings = [_Timing() for _ in streams]
        timeout = self.limits.request_timeout_s
        deadline = None if timeout is None else time.monotonic() + timeout

        # next_item() -> (prompt index, a RequestOutput, an exception the stream raised, or None: that stream ended).
        # One stream (one prompt, the common case): read it directly. Several: a pump task each into one queue. The
        # pump and its queue cost ~3 µs of event-loop time a token (256 streams: 2.5 -> 1.7 ms a step on the CPU box,
        # benchmarks/probes/stream_loop_cost.py; not measured end to end on a GPU host yet).
        if len(streams) == 1:
            only = streams[0]

            async def next_item():
                try:
                    return 0, await only.__anext__()
                except StopAsyncIteration:
                    return 0, None
                except Exception as e:  # noqa: BLE001
                    return 0, e
        else:
            queue: asyncio.Queue = asyncio.Queue()
            next_item = queue.get

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

        def choice(idx, text, c=None, finish_reason=None):
            if chat:
                ch = {"index": idx, "delta": {"content": text} if text else {},
                      "logprobs": self._chat_logprobs(c, 0, req.top_logprobs)
                      if c is not None and req.want_logprobs else None, "finish_reason": finish_reason}
            else:
                ch = {"index": idx, "text": text,
                      "logprobs": self._cmpl_logprobs(c, 0) if c is not None and req.logprobs is not None else None,
                      "finish_reason": finish_reason}
            if finish_reason:
                ch["stop_reason"] = c.stop_reason if c is not None else None
            return ch

        await resp.prepare(request)
        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)] if len(streams) > 1 else []
        failure = None
        try:
            if chat:
                for j in range(n):
                    await resp.write(chunk([{"index": j, "delta": {"role": "assistant", "content": ""},
                                             "logprobs": None, "finish_reason": None}]))
            done = 0
            while done < len(streams):
                try:
                    if deadline is None:
                        i, out = await next_item()
                    else:
                        i, out = await asyncio.wait_for(next_item(), max(0.0, deadline - time.monotonic()))
                except asyncio.TimeoutError:
                    self.metrics.timeouts.inc()
                    break  # the deadline: the running choices are cut below
                if out is None:
                    done += 1
                    continue
                if isinstance(out, EngineStoppedError):  # shutdown past the grace period: cut, end cleanly
                    break
                if isinstance(out, Exception):  # a step failed on this request: an error event, then the end
                    failure = out
                    break
                prompt_lens[i] = len(out.prompt_token_ids)
                # One chunk per completion per engine step that produced tokens, even when the detokenizer holds
                # the text back (or there is no tokenizer): clients time tokens by chunks, as with vLLM.
                for c in out.outputs:  # one choice per chunk, like OpenAI (clients read choices[0])
                    if c.token_ids:
                        timings[i].token()
                        num_tokens[i] += len(c.token_ids)
                    idx = i * n + c.index
                    if c.finish_reason:
                        unfinished.discard(idx)
                    await resp.write(chunk([choice(idx, c.text, c, c.finish_reason)]))
            if failure is not None:
                await resp.write(b"data: " + json.dumps(error_body(str(failure), None)).encode() + b"\n\n")
            else:
                for idx in sorted(unfinished):  # cut by the deadline or the shutdown
                    await resp.write(chunk([choice(idx, "", None, "length")]))
            for t, k, p in zip(timings, num_tokens, prompt_lens):
                if p is not None:
                    t.observe(self.metrics, k, p)
            if req.include_usage and failure is None:
                p, c = sum(x for x in prompt_lens if x is not None), sum(num_tokens)
                await resp.write(chunk([], {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c}))
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
        except (ConnectionResetError, OSError):  # the client went away: aborted (finally), nothing to write
            log.info("client went away: aborting %s", rid)
            request[_GONE] = True
        except asyncio.CancelledError:
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

    def _model_card(self) -> dict:
        return {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "jaxinfer",
                "max_model_len": self.llm.max_model_len}

    async def models(self, request):
        return web.json_response({"object": "list", "data": [self._model_card()]})

    async def model(self, request):
        """GET /v1/models/{id}: the model object, or OpenAI's 404."""
        mid = request.match_info["model"]
        if mid != self.model_name:
            self.metrics.rejected.labels("not_found").inc()
            return web.json_response({"error": {"message": f"The model '{mid}' does not exist", "type":
                                                "invalid_request_error", "param": "model", "code": "model_not_found"}},
                                     status=404)
        return web.json_response(self._model_card())

    async def health(self, request):
        return web.Response(text="ok")

    async def metrics_ep(self, request):
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})


def _error_middleware(srv: _Server):
    """Every answer an OpenAI-style body: aiohttp's own 404 / 405 / 413 too; a body over the limit refused from its
    Content-Length before it is read; anything unexpected a logged 500 with that body."""
    limit = srv.limits.max_body_bytes

    @web.middleware
    async def errors(request: web.Request, handler):
        cl = request.content_length
        if cl is not None and cl > limit:
            srv.metrics.rejected.labels("body_too_large").inc()
            return _err(413, f"the request body is {cl} bytes; this server takes at most {limit} (--max-body-bytes)")
        try:
            return await handler(request)
        except web.HTTPException as e:
            if e.status < 400:
                raise
            if e.status == 404:
                reason, msg = "not_found", f"unknown path {request.path!r}; this server serves {_ROUTES}"
            elif e.status == 405:
                allowed = ", ".join(sorted(getattr(e, "allowed_methods", ()) or ()))
                reason, msg = "method_not_allowed", f"method {request.method} is not allowed on {request.path!r}" + (
                    f"; use {allowed}" if allowed else "")
            elif e.status == 413:
                reason, msg = "body_too_large", f"the request body is larger than {limit} bytes (--max-body-bytes)"
            else:
                reason, msg = "http_error", e.reason or str(e)
            srv.metrics.rejected.labels(reason).inc()
            return _err(e.status, msg)
        except (asyncio.CancelledError, ConnectionResetError):
            raise
        except Exception as e:  # noqa: BLE001 - a bug: logged, still a JSON body
            log.exception("internal error")
            return _err(500, f"internal error: {e}", None, "internal_error")

    return errors


def create_app(llm, served_model_name: str | None = None, max_waiting: int | None = None,
               shutdown_grace_s: float = 10.0, limits: ServerLimits | None = None) -> web.Application:
    """An aiohttp app serving `llm` (a jaxinfer.LLM). Its AsyncEngine thread starts now, stops on app shutdown."""
    name = served_model_name or getattr(getattr(llm, "source", None), "name", None) or "jaxinfer"
    limits = limits or ServerLimits()
    aeng = AsyncEngine(llm.engine, max_waiting=max_waiting)
    srv = _Server(llm, name, aeng, limits)
    app = web.Application(client_max_size=limits.max_body_bytes, middlewares=[_error_middleware(srv)])
    app[ENGINE_KEY] = aeng
    app[STATE_KEY] = {"server": srv}
    app.router.add_post("/v1/completions", srv.completions)
    app.router.add_post("/v1/chat/completions", srv.chat)
    app.router.add_get("/v1/models", srv.models)
    app.router.add_get("/v1/models/{model}", srv.model)
    app.router.add_get("/health", srv.health)
    app.router.add_get("/metrics", srv.metrics_ep)

    async def on_shutdown(app):
        await aeng.shutdown(shutdown_grace_s)

    app.on_shutdown.append(on_shutdown)
    return app
