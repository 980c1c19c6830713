"""Prefix-cache counters for /metrics, read from the engine thread's last published stats (no locking: the
stats object is replaced whole, never mutated).

  jaxinfer_prefix_cache_queries_total       counter  prompt (+ known output) tokens looked up at admission
  jaxinfer_prefix_cache_hits_total          counter  of those, tokens found cached (not computed)
  jaxinfer_prefix_cache_hit_requests_total  counter  admissions that reused at least one page
  jaxinfer_prefix_cache_evictions_total     counter  cached pages evicted to make room
  jaxinfer_prefix_cache_hit_rate            gauge    hits / queries since start
  jaxinfer_prefix_cache_cached_pages        gauge    pages holding a reusable hash now (in use or evictable)
  jaxinfer_prefix_cache_enabled             gauge    1 if the engine caches prefixes
Requests that ask for prompt_logprobs bypass the lookup and are not counted as queries.
"""
from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector


class PrefixCacheCollector(Collector):
    def __init__(self, aeng):
        self.aeng = aeng

    def collect(self):
        st = self.aeng.stats.prefix_cache
        for key, help_ in (("queries", "tokens looked up in the prefix cache at admission"),
                           ("hits", "tokens found in the prefix cache at admission"),
                           ("hit_requests", "admissions that reused at least one cached page"),
                           ("evictions", "cached KV pages evicted")):
            yield CounterMetricFamily(f"jaxinfer_prefix_cache_{key}", help_, value=st.get(key, 0))
        yield GaugeMetricFamily("jaxinfer_prefix_cache_hit_rate", "prefix-cache hits / queries since start",
                                value=st.get("hit_rate", 0.0))
        yield GaugeMetricFamily("jaxinfer_prefix_cache_cached_pages", "KV pages holding a reusable prefix hash",
                                value=st.get("cached_pages", 0))
        yield GaugeMetricFamily("jaxinfer_prefix_cache_enabled", "1 if prefix caching is on",
                                value=float(bool(st.get("enabled", False))))
