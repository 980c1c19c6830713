"""The server's Prometheus metrics (`/metrics`) and per-request latency bookkeeping."""
from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from serving.async_engine import AsyncEngine
from serving.metrics_prefix_cache import PrefixCacheCollector

_LAT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class Metrics:
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
        self.rejected = Counter("jaxinfer_rejected_requests", "requests refused (4xx / 503), by reason", ["reason"],
                                registry=r)
        self.timeouts = Counter("jaxinfer_request_timeouts", "requests ended by --request-timeout", registry=r)
        g = Gauge("jaxinfer_engine_steps", "engine steps since start", registry=r)
        g.set_function(lambda: aeng.stats.num_steps)
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


class Timing:
    """Per-request latency bookkeeping for the histograms."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.first = None

    def token(self):
        if self.first is None:
            self.first = time.perf_counter()

    def observe(self, m: Metrics, n_tokens: int, prompt_tokens: int):
        end = time.perf_counter()
        m.e2e.observe(end - self.t0)
        if self.first is not None:
            m.ttft.observe(self.first - self.t0)
            if n_tokens > 1:
                m.tpot.observe((end - self.first) / (n_tokens - 1))
        m.prompt_tokens.inc(prompt_tokens)
        m.generation_tokens.inc(n_tokens)
