"""Device side of the engine: weights, the paged KV cache, the compiled step per bucket.

The engine (host) hands over a list of `SeqInput`; the runner packs it into the smallest bucket, copies it to the
device as two buffers (int32, float32), launches that bucket's ahead-of-time compiled step without waiting
(`dispatch`), and later copies the sampled tokens back (`fetch`).
"""
from __future__ import annotations

import dataclasses
import logging
import math
import os
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from jaxinfer.config import EngineConfig
from jaxinfer.models.loader import LoadedModel
from jaxinfer.runner.batch import SeqInput, pack
from jaxinfer.runner.buckets import BucketLadder
from jaxinfer.models.attention import AttentionOptions
from jaxinfer.runner.step import make_prompt_logprobs_fn, make_step_fn

log = logging.getLogger("jaxinfer")

_CPU_KV_BUDGET_BYTES = 1 << 30  # without device memory statistics (CPU) size the cache at 1 GiB


@dataclasses.dataclass
class RunnerOutput:
    tokens: np.ndarray        # i32[num_seqs]
    logprobs: np.ndarray      # f32[num_seqs]
    top_ids: np.ndarray       # i32[num_seqs, 20]
    top_logprobs: np.ndarray  # f32[num_seqs, 20]
    prompt_logprobs: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]  # seq index -> (lp[n], ids[n,20], lp[n,20])
    # speculative decoding, per sequence (zeros for sequences that did not verify drafts):
    spec_tokens: np.ndarray | None = None     # i32[num_seqs, K+1]: the first num_accepted + 1 are emitted
    num_accepted: np.ndarray | None = None    # i32[num_seqs]
    spec_logprobs: np.ndarray | None = None   # f32[num_seqs, K+1]


def enable_compilation_cache(cache_dir: str | None):
    """JAX's persistent compilation cache, so a second start skips XLA compilation."""
    cache_dir = cache_dir or os.path.join(
        os.environ.get("JAXINFER_CACHE", os.path.expanduser("~/.cache/jaxinfer")), "xla")
    os.makedirs(cache_dir, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    # Small programs are cached too (the default skips compiles under 1 s).
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)


class ModelRunner:
    def __init__(self, loaded: LoadedModel, config: EngineConfig, max_model_len: int,
                 num_pages: int | None = None):
        self.loaded = loaded
        self.config = config
        self.max_model_len = max_model_len
        self.page_size = config.page_size
        cfg = loaded.cfg
        self.kv_dtype = loaded.dtype
        self.num_pages = num_pages or config.num_pages or self._pages_from_budget()
        shape = (self.num_pages, self.page_size, cfg.num_kv_heads, cfg.head_dim)
        # Zero-filled: attention masks unwritten slots by weight, and 0 * NaN would still poison the sum.
        zeros = jax.jit(lambda: jnp.zeros(shape, self.kv_dtype))
        self.kv_caches = [(zeros(), zeros()) for _ in range(cfg.num_layers)]
        log.info("KV cache: %d pages x %d tokens = %d tokens (%.2f GiB)", self.num_pages, self.page_size,
                 (self.num_pages - 1) * self.page_size, self.kv_cache_bytes / 2**30)
        static = config.kv_loop == "static" or (config.kv_loop == "auto" and jax.default_backend() != "cpu")
        chunk = config.kv_chunk_pages or (128 if static else 16)
        kv_chunk = min(chunk, math.ceil(max_model_len / self.page_size))
        self.ladder = BucketLadder.build(
            max_num_batched_tokens=config.max_num_batched_tokens, max_num_seqs=config.max_num_seqs,
            max_model_len=max_model_len, page_size=self.page_size, query_tile=config.query_tile,
            kv_chunk_pages=kv_chunk, **_spec_ladder_args(config))
        backend = "reference" if config.attention_backend == "auto" else config.attention_backend
        opts = AttentionOptions(kv_chunk, static, backend, interpret=jax.default_backend() == "cpu")
        self._step = make_step_fn(loaded, opts, config.max_num_seqs)
        self._no_prev = jnp.zeros((config.max_num_seqs,), jnp.int32)
        self._compiled: dict = {}  # Bucket -> (step, prompt_logprobs) executables
        self._prompt_logprobs = make_prompt_logprobs_fn(loaded)

    # ---- memory -------------------------------------------------------------------------------------------
    @property
    def kv_cache_bytes(self) -> int:
        per_page = self.loaded.cfg.kv_bytes_per_token(jnp.dtype(self.kv_dtype).itemsize) * self.page_size
        return per_page * self.num_pages

    def _pages_from_budget(self) -> int:
        cfg = self.loaded.cfg
        per_page = cfg.kv_bytes_per_token(jnp.dtype(self.kv_dtype).itemsize) * self.page_size
        stats = jax.devices()[0].memory_stats() or {}
        if "bytes_limit" in stats:
            # Leave room for activations of the largest bucket: hidden/MLP intermediates and f32 logits.
            T, S = self.config.max_num_batched_tokens, self.config.max_num_seqs
            act = 8 * T * (cfg.hidden_size + 2 * cfg.intermediate_size + cfg.qkv_size) + 16 * S * cfg.vocab_size
            budget = stats["bytes_limit"] * self.config.gpu_memory_utilization - stats.get("bytes_in_use", 0) - act
        else:
            budget = _CPU_KV_BUDGET_BYTES
        pages = int(budget // per_page)
        need = math.ceil(self.max_model_len / self.page_size) + 1
        if pages < need:
            raise MemoryError(
                f"the KV cache budget ({budget / 2**30:.2f} GiB) holds {pages} pages, fewer than the {need} one "
                f"request of max_model_len={self.max_model_len} needs; lower max_model_len or raise "
                "gpu_memory_utilization")
        return pages

    # ---- compile ------------------------------------------------------------------------------------------
    def warmup(self, progress: bool = True):
        """Compile (or load from the persistent cache) the step and prompt-logprob programs of every bucket,
        ahead of time: nothing is run, so warm-up costs compilation only."""
        t0 = time.perf_counter()
        for b in tqdm(self.ladder.buckets, desc="compiling buckets", disable=not progress, leave=False):
            self._programs(b)
        log.info("compiled %d buckets in %.1f s", len(self.ladder.buckets), time.perf_counter() - t0)

    def _programs(self, bucket):
        """(step, prompt_logprobs) executables of a bucket, compiled on first use (warm-up does all)."""
        progs = self._compiled.get(bucket)
        if progs is None:
            ints, floats = pack([SeqInput(token_ids=[0], start_pos=0, page_table=[0])], bucket,
                                self.page_size).flat()
            spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype)  # noqa: E731
            step = self._step.lower(self.loaded.params, self.kv_caches, spec(ints), spec(floats), self._no_prev,
                                    bucket=bucket).compile()
            hidden = jax.ShapeDtypeStruct((bucket.num_tokens, self.loaded.cfg.hidden_size), self.loaded.dtype)
            targets = jax.ShapeDtypeStruct((bucket.num_tokens,), jnp.int32)
            prompt = self._prompt_logprobs.lower(self.loaded.params, hidden, targets).compile()
            progs = self._compiled[bucket] = (step, prompt)
        return progs

    # ---- run ----------------------------------------------------------------------------------------------
    def dispatch(self, seqs: Sequence[SeqInput], prev: "InFlight | None" = None,
                 prompt_logprob_targets: dict[int, np.ndarray] | None = None) -> "InFlight":
        """Pack and launch one step without waiting for it. `prev`: the step still in flight whose sampled
        tokens fill this step's placeholders. prompt_logprob_targets: seq index -> next-token ids of that
        sequence's tokens (their log-probs are computed on the device too)."""
        n_tok = sum(len(s.token_ids) for s in seqs)
        bucket = self.ladder.pick(n_tok, len(seqs))
        step, prompt_fn = self._programs(bucket)
        batch = pack(seqs, bucket, self.page_size)
        ints, floats = jax.device_put(batch.flat())
        prev_tokens = prev.out.tokens if prev is not None else self._no_prev
        self.kv_caches, out, hidden = step(self.loaded.params, self.kv_caches, ints, floats, prev_tokens)
        prompt = None
        if prompt_logprob_targets:
            targets = np.zeros(bucket.num_tokens, np.int32)
            for i, tgt in prompt_logprob_targets.items():
                a = int(batch.token_offsets[i])
                targets[a:a + len(tgt)] = tgt
            prompt = prompt_fn(self.loaded.params, hidden, targets)
        spec_seqs = [i for i, s in enumerate(seqs) if s.num_spec]  # verify row r holds sequence spec_seqs[r]
        return InFlight(out, prompt, dict(prompt_logprob_targets or {}), batch.token_offsets, len(seqs), spec_seqs)

    def fetch(self, flight: "InFlight") -> RunnerOutput:
        """Wait for a dispatched step and copy its (small) results to the host."""
        n = flight.num_seqs
        tokens, logprobs, top_ids, top_lp = jax.device_get(
            (flight.out.tokens, flight.out.logprobs, flight.out.top_ids, flight.out.top_logprobs))
        prompt_lp = {}
        if flight.prompt is not None:
            lp, ids, top = jax.device_get(flight.prompt)
            for i, tgt in flight.prompt_targets.items():
                a = int(flight.token_offsets[i])
                prompt_lp[i] = (lp[a:a + len(tgt)], ids[a:a + len(tgt)], top[a:a + len(tgt)])
        res = RunnerOutput(tokens[:n], logprobs[:n], top_ids[:n], top_lp[:n], prompt_lp)
        if flight.spec_seqs:
            toks, acc, lps = jax.device_get((flight.out.spec_tokens, flight.out.num_accepted,
                                             flight.out.spec_logprobs))
            rows = np.asarray(flight.spec_seqs)
            res.spec_tokens = np.zeros((n, toks.shape[1]), np.int32)
            res.num_accepted = np.zeros(n, np.int32)
            res.spec_logprobs = np.zeros((n, toks.shape[1]), np.float32)
            res.spec_tokens[rows] = toks[:len(rows)]
            res.num_accepted[rows] = acc[:len(rows)]
            res.spec_logprobs[rows] = lps[:len(rows)]
        return res


@dataclasses.dataclass
class InFlight:
    """A dispatched step: device arrays not yet copied to the host."""

    out: Any                    # StepOutput of device arrays
    prompt: Any                 # (lp, top ids, top lp) device arrays, or None
    prompt_targets: dict[int, np.ndarray]
    token_offsets: np.ndarray
    num_seqs: int
    spec_seqs: list[int] = dataclasses.field(default_factory=list)  # sequence index of each verify row


def _spec_ladder_args(config: EngineConfig) -> dict:
    """Verify rows per bucket: up to the speculation batch limit, k drafts each; none without speculation."""
    spec = config.speculative_config
    if spec is None:
        return {}
    return dict(max_spec_seqs=min(spec.max_batch_size, config.max_num_seqs),
                num_spec_tokens=spec.num_speculative_tokens)
