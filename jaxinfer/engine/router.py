"""Data parallelism on the host: several LLMEngine replicas (each on its own device group, jaxinfer/parallel.py)
behind the one-engine interface that `LLM` and the server's AsyncEngine drive. Host code only (no jax).

Routing: a new request goes to the replica with the fewest unfinished requests routed to it (ties: the lowest
index), and stays there (its KV pages live on that replica's devices). `step()` steps every replica that has
work; each replica's step only dispatches to its own devices and waits for its own previous step, so the
replicas' device work overlaps.
"""
from __future__ import annotations

import itertools
from typing import Sequence


class _SchedulerView:
    """The totals over the replicas' schedulers that the server reports (running / waiting / max_num_seqs)."""

    def __init__(self, engines):
        self._engines = engines

    @property
    def num_running(self) -> int:
        return sum(e.scheduler.num_running for e in self._engines)

    @property
    def num_waiting(self) -> int:
        return sum(e.scheduler.num_waiting for e in self._engines)

    @property
    def max_num_seqs(self) -> int:
        return sum(e.scheduler.max_num_seqs for e in self._engines)


class _KVView:
    def __init__(self, engines):
        self._engines = engines

    @property
    def num_usable_pages(self) -> int:
        return sum(e.kv.num_usable_pages for e in self._engines)

    @property
    def num_used_pages(self) -> int:
        return sum(e.kv.num_used_pages for e in self._engines)


class DataParallelEngine:
    def __init__(self, engines: Sequence):
        if not engines:
            raise ValueError("DataParallelEngine needs at least one engine replica")
        self.engines = list(engines)
        self.tokenizer = self.engines[0].tokenizer
        self.max_model_len = min(e.max_model_len for e in self.engines)
        self.scheduler = _SchedulerView(self.engines)
        self.kv = _KVView(self.engines)
        self._owner: dict[str, int] = {}  # unfinished request id -> replica index
        self._load = [0] * len(self.engines)  # unfinished requests per replica
        self._ids = itertools.count()

    def replica_loads(self) -> list[int]:
        return list(self._load)

    def add_request(self, request_id: str | None, prompt, params=None, *, stream: bool = True) -> str:
        """Queue on the least-loaded replica. Raises ValueError (nothing queued) like LLMEngine.add_request."""
        if request_id is None:
            request_id = str(next(self._ids))
            while request_id in self._owner:
                request_id = str(next(self._ids))
        request_id = str(request_id)
        if request_id in self._owner:
            raise ValueError(f"request id {request_id!r} is already in use; pick a unique request_id")
        i = min(range(len(self.engines)), key=lambda r: (self._load[r], r))
        rid = self.engines[i].add_request(request_id, prompt, params, stream=stream)
        self._owner[rid] = i
        self._load[i] += 1
        return rid

    def abort(self, request_id: str) -> bool:
        i = self._owner.pop(request_id, None)
        if i is None:
            return False
        self._load[i] -= 1
        return self.engines[i].abort(request_id)

    def has_unfinished(self) -> bool:
        return any(e.has_unfinished() for e in self.engines)

    def step(self) -> list:
        outputs = []
        for eng in self.engines:
            if eng.has_unfinished():
                outputs.extend(eng.step())
        for out in outputs:
            if out.finished:
                i = self._owner.pop(out.request_id, None)
                if i is not None:
                    self._load[i] -= 1
        return outputs

    def spec_stats(self) -> None:
        """Speculative decoding is single-replica only (EngineConfig refuses it with data parallelism)."""
        return None

    def prefix_cache_stats(self) -> dict:
        per = [e.prefix_cache_stats() for e in self.engines]
        out = {k: sum(p[k] for p in per) for k in ("queries", "hits", "hit_requests", "cached_pages", "evictions")}
        out["enabled"] = per[0]["enabled"]
        out["hit_rate"] = out["hits"] / out["queries"] if out["queries"] else 0.0
        return out
