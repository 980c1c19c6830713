"""AsyncEngine: one LLMEngine driven by ONE background thread, fed from asyncio.

The engine is not thread-safe, so only the engine thread touches it. Everything else talks to that thread
through two lists guarded by a condition variable:
  * adds:   (request ids, prompts, params, concurrent Future, sinks): all prompts of one HTTP request. The
            engine thread adds them all between two steps (so they share the first steps, as the same prompts from
            separate clients would; all or none: a bad one aborts the others) and resolves the future with the ids
            or the ValueError, so the HTTP handler can still answer 400 before streaming anything.
  * aborts: request ids; applied between steps (pages are freed at once by engine.abort).
The thread loops `engine.step()` while there is work and sleeps on the condition variable when idle. A step's
RequestOutputs go to their requests' asyncio.Queues in ONE `loop.call_soon_threadsafe` a step (each such call
writes to the loop's wake-up pipe: 256 of them cost the engine thread 0.5-2.7 ms a step on the CPU box, one
~22 µs; benchmarks/probes/loop_handoff_cost.py).

Failures: a request the engine ended because a step failed on it (RequestOutput.error; the others of that step went
on) raises RequestFailedError from its stream. If a step raises anyway, every request fails (the last resort).

Back-pressure: with `max_waiting` set, a request is refused with `QueueFullError` (-> HTTP 503 + Retry-After)
when the requests not yet finished would exceed `max_num_seqs + max_waiting`, i.e. when more than
`max_waiting` would have to wait for a free slot.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import threading
import time
from typing import AsyncIterator, Sequence

from jaxinfer.outputs import RequestOutput
from jaxinfer.sampling_params import SamplingParams

log = logging.getLogger("serving")


class QueueFullError(Exception):
    """Too many requests are waiting; retry later (HTTP 503)."""


class EngineStoppedError(Exception):
    """The engine is shutting down (HTTP 503) or the request was aborted by the shutdown."""


class RequestFailedError(Exception):
    """The engine ended this request because a step failed on it (the other requests went on)."""


@dataclasses.dataclass
class EngineStats:
    num_running: int = 0
    num_waiting: int = 0
    kv_pages_used: int = 0
    kv_pages_total: int = 0
    prefix_cache: dict = dataclasses.field(default_factory=dict)  # LLMEngine.prefix_cache_stats()
    spec: dict | None = None  # speculative decoding counters (LLMEngine.spec_stats()), None when off
    num_steps: int = 0  # engine steps since start


class _Sink:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()

    def put(self, item):
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            pass


def _put_all(items: list) -> None:
    """On the event loop: [(queue, item), ...] into their queues, in order."""
    for queue, item in items:
        queue.put_nowait(item)


class _Deliveries:
    """One step's (sink, item) pairs, handed to their event loops with one call_soon_threadsafe per loop."""

    def __init__(self):
        self.by_loop: dict = {}

    def put(self, sink: _Sink, item) -> None:
        self.by_loop.setdefault(sink.loop, []).append((sink.queue, item))

    def flush(self) -> None:
        for loop, items in self.by_loop.items():
            try:
                loop.call_soon_threadsafe(_put_all, items)
            except RuntimeError:  # the loop is closed: nobody is listening any more
                pass
        self.by_loop = {}


class RequestStream:
    """Async iterator of one request's RequestOutputs (as its SamplingParams.output_kind asks); `abort()` stops it."""

    def __init__(self, engine: "AsyncEngine", request_id: str, sink: _Sink):
        self.engine, self.request_id, self._sink = engine, request_id, sink
        self.finished = False

    def __aiter__(self):
        return self

    async def __anext__(self) -> RequestOutput:
        if self.finished:
            raise StopAsyncIteration
        item = await self._sink.queue.get()
        if isinstance(item, BaseException):
            self.finished = True
            raise item
        if item.finished:
            self.finished = True
        return item

    def abort(self):
        if not self.finished:
            self.finished = True
            self.engine.abort(self.request_id)


class AsyncEngine:
    def __init__(self, engine, max_waiting: int | None = None):
        self.engine = engine
        self.max_waiting = max_waiting
        self.max_num_seqs = int(getattr(engine.scheduler, "max_num_seqs", 1))
        self._cv = threading.Condition()
        self._adds: list = []
        self._aborts: list[str] = []
        self._sinks: dict[str, _Sink] = {}      # engine thread only
        self._num_unfinished = 0                # admitted and not finished (guarded by _cv)
        self._accepting = True
        self._stop = False
        self._ids = 0
        self._num_steps = 0                     # engine thread only (published in stats)
        self.stats = EngineStats(kv_pages_total=int(engine.kv.num_usable_pages),
                                 prefix_cache=engine.prefix_cache_stats())
        self._thread = threading.Thread(target=self._loop, name="jaxinfer-engine", daemon=True)
        self._thread.start()

    # ---- API for the event loop -----------------------------------------------------------------------------
    async def add_request(self, prompt: str | Sequence[int], params: SamplingParams,
                          request_id: str | None = None) -> RequestStream:
        """Queue a request; returns its stream. Raises ValueError (bad request), QueueFullError, EngineStoppedError."""
        (stream,) = await self.add_requests([prompt], params, None if request_id is None else [request_id])
        return stream

    async def add_requests(self, prompts: Sequence[str | Sequence[int]], params: SamplingParams,
                           request_ids: Sequence[str] | None = None) -> list[RequestStream]:
        """Queue several prompts as one admission (the engine adds them between the same two steps); all or none.
        Returns their streams. Raises ValueError (a bad prompt: none is queued), QueueFullError, EngineStoppedError."""
        loop = asyncio.get_running_loop()
        k = len(prompts)
        sinks = [_Sink(loop) for _ in range(k)]
        fut: concurrent.futures.Future = concurrent.futures.Future()
        with self._cv:
            if not self._accepting:
                raise EngineStoppedError("the server is shutting down")
            if self.max_waiting is not None and self._num_unfinished + k > self.max_num_seqs + self.max_waiting:
                raise QueueFullError(f"too many requests: {self._num_unfinished} in flight + {k} new "
                                     f"(max_num_seqs={self.max_num_seqs} + max_waiting={self.max_waiting})")
            if request_ids is None:
                request_ids = [f"req-{self._ids + 1 + j}" for j in range(k)]
                self._ids += k
            self._num_unfinished += k
            self._adds.append((list(request_ids), list(prompts), params, fut, sinks))
            self._cv.notify()
        rids = await asyncio.wrap_future(fut)  # raises the engine's ValueError
        return [RequestStream(self, rid, sink) for rid, sink in zip(rids, sinks)]

    def abort(self, request_id: str):
        """Thread-safe; applied by the engine thread before its next step."""
        with self._cv:
            self._aborts.append(request_id)
            self._cv.notify()

    @property
    def num_unfinished(self) -> int:
        with self._cv:
            return self._num_unfinished

    async def shutdown(self, grace_s: float = 10.0):
        """Stop accepting; let in-flight requests finish for up to grace_s; abort the rest; stop the thread."""
        with self._cv:
            self._accepting = False
        deadline = time.monotonic() + grace_s
        while self.num_unfinished and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        with self._cv:
            self._stop = True
            self._cv.notify()
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 30)

    # ---- the engine thread ----------------------------------------------------------------------------------
    def _loop(self):
        eng = self.engine
        while True:
            with self._cv:
                while not (self._stop or self._adds or self._aborts or eng.has_unfinished()):
                    self._cv.wait()
                adds, self._adds = self._adds, []
                aborts, self._aborts = self._aborts, []
                stop = self._stop
            for rid in aborts:
                if rid in self._sinks:
                    eng.abort(rid)
                    self._sinks.pop(rid)
                    self._finished(1)
            for rids, prompts, params, fut, sinks in adds:
                if stop:
                    self._finished(len(rids))
                    fut.set_exception(EngineStoppedError("the server is shutting down"))
                    continue
                added = []
                try:
                    for rid, prompt in zip(rids, prompts):
                        added.append(eng.add_request(rid, prompt, params))
                except Exception as e:  # noqa: BLE001 - handed to the caller; all or none
                    for rid in added:
                        eng.abort(rid)
                    self._finished(len(rids))
                    fut.set_exception(e)
                    continue
                self._sinks.update(zip(added, sinks))
                fut.set_result(added)
            if stop:
                for rid, sink in list(self._sinks.items()):
                    eng.abort(rid)
                    sink.put(EngineStoppedError("aborted: the server is shutting down"))
                self._finished(len(self._sinks))
                self._sinks.clear()
                self._publish()
                return
            if eng.has_unfinished():
                try:
                    outs = eng.step()
                    self._num_steps += 1
                except Exception as e:  # noqa: BLE001 - fail every request, keep serving
                    log.exception("engine step failed")
                    failed = list(self._sinks.items())
                    self._sinks.clear()
                    self._finished(len(failed))
                    for rid, sink in failed:
                        eng.abort(rid)
                        sink.put(RuntimeError(f"engine step failed: {e}"))
                    outs = []
                # A request's slot is released before its last item reaches the client: a client that sends its
                # next request as soon as it has the answer must find the slot free (max_waiting), not get a 503.
                deliveries = _Deliveries()
                for out in outs:
                    sink = self._sinks.get(out.request_id)
                    if sink is None:
                        continue
                    if out.error is not None:  # ended alone: a step failed on it
                        del self._sinks[out.request_id]
                        self._finished(1)
                        deliveries.put(sink, RequestFailedError(out.error))
                        continue
                    if out.finished:
                        del self._sinks[out.request_id]
                        self._finished(1)
                    deliveries.put(sink, out)
                deliveries.flush()
            self._publish()

    def _finished(self, k: int):
        if k:
            with self._cv:
                self._num_unfinished -= k

    def _publish(self):
        sched = self.engine.scheduler
        self.stats = EngineStats(num_running=sched.num_running, num_waiting=sched.num_waiting,
                                 kv_pages_used=int(self.engine.kv.num_used_pages),
                                 kv_pages_total=self.stats.kv_pages_total,
                                 prefix_cache=self.engine.prefix_cache_stats(), spec=self.engine.spec_stats(),
                                 num_steps=self._num_steps)


async def collect(stream: AsyncIterator[RequestOutput]) -> RequestOutput:
    last = None
    async for out in stream:
        last = out
    return last
