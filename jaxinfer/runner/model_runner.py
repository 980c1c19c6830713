"""Device side of the engine: weights, the paged KV cache, the compiled step per bucket.

The engine (host) hands over a `StepBatch` (or a list of `SeqInput`: the draft model's paths); the runner packs it into the smallest bucket, copies it to the
device as two buffers (int32, float32), launches that bucket's ahead-of-time compiled step without waiting
(`dispatch`), and later copies the sampled tokens back (`fetch`).
"""
from __future__ import annotations

import logging
import math
import operator
import threading
import time
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxinfer.config import EngineConfig
from jaxinfer.env_switch import auto_switch
from jaxinfer.weights.loader import LoadedModel
from jaxinfer.outputs import RunnerOutput, SeqInput, StepBatch
from jaxinfer.runner import attention_backend, param_arena
from jaxinfer.runner.batch import _TOKEN_IDS, pack, pack_step, release
from jaxinfer.runner.compile_options import compile_lowered, step_compiler_options
from jaxinfer.runner.call_thread import CallThread, DrainedState, wanted as call_thread_wanted
from jaxinfer.runner.in_flight import InFlight
from jaxinfer.runner.cpu_defaults import cpu_kv_pages
from jaxinfer.runner.device_memory import memory_budget
from jaxinfer.runner.ladders import runner_ladders
from jaxinfer.runner.penalties import host_row, write_row
from jaxinfer.weights.prepared import release_writes
from jaxinfer.runner.program_cache import ProgramCache, abstract_signature, program_cache_enabled, program_key
from jaxinfer.runner.sampler import GREEDY_EPS
from jaxinfer.runner.spec_carry import carry_width
from jaxinfer.models.attention import AttentionOptions, device_num_sms
from jaxinfer.runner.step import make_prompt_logprobs_fn, make_step_fn, stage_shapes, unpack_host_outputs
from pallas_kernels.paged_attention import kv_quant

log = logging.getLogger("jaxinfer")

# per-sequence fields read with map(attrgetter): no Python-level loop over every sequence of a step
_PENALTY_INIT = operator.attrgetter("penalty_init")
# With greedy-only programs (GPU), buckets of more tokens than this compile their general step program in the
# background after warm-up (their greedy-only one at warm-up): cold start-up of the 8B shape was ~15 s per bucket
# with both programs eager (about 120 s for 8 buckets), and 44.7 s with 13 eager programs (8 general, 5 greedy-only;
# results/startup-cold-2026-12-02.json), while the general program of a large bucket is only needed once a sampling
# request runs there.
EAGER_GENERAL_MAX_TOKENS = 256


class ModelRunner:
    # A/B switch of the probes: put the step's packed inputs on the device with jax.device_put before the call
    # (the transfer before 2026-12-05) instead of handing the numpy arrays to the compiled call
    device_put_inputs = False
    # Start the copy of the step's small results to the host as soon as the step is enqueued (it runs when the step
    # is done), so fetch() finds them there instead of waiting out a device->host round trip. H100 host, 8B,
    # host_step_cost.py (benchmarks/gpu_host_columns.sh at 9b1568c, two alternating runs each): fetch 131-150 ->
    # 45-47 µs a step at batch 1 / 64 / 256, host per step at batch 256 2,065-2,182 -> 2,019-2,025 µs. (CPU probe:
    # no change, fetch ~100 µs either way.) False: the copy starts in fetch (the A/B's other side).
    early_host_copy = True
    # Pack the step's norm scales into one buffer a dtype (runner/param_arena.py; single-device runners). False: the
    # flat weights list (the A/B side of benchmarks/probes/param_arena_cost.py and the arena's engine test).
    pack_norm_scales = True
    # Copy the step's packed inputs into donated fixed-address buffers inside the step program and read them there
    # (runner/step.stage_inputs: fewer CUDA-graph commands to update a call). Single-device runners. False: the
    # step reads the transferred inputs themselves (the A/B side of benchmarks/probes/host_step_cost.py).
    stage_inputs = True
    # Make the step's compiled call on a worker thread (runner/call_thread.py; single-device runners), so the engine
    # thread does not spend the call's time. None (JAXINFER_CALL_THREAD unset): on with a GPU, off on the CPU (whose
    # calls are the computation itself, not a wait for the device). On a GPU (H100, 8B, 12-07 e): the engine
    # thread's host time a step at batch 256 4.5 -> 1.6 ms; served ShareGPT-like traffic at 64 req/s offered 29.0 ->
    # 32.6 req/s, TPOT p99 27.4 -> 13.5 ms (the lower switch interval it sets is that gain: serve sets it too);
    # batch 1 / 64 / 256 decode tok/s unchanged (+-0.7%). Speculative engines (target and draft runner) keep inline
    # calls by default: their steps are not yet GPU-measured threaded. JAXINFER_CALL_THREAD=0 / 1 forces it off / on
    # everywhere ('auto': the default).
    call_thread = auto_switch("JAXINFER_CALL_THREAD")
    # ... and only for steps of at least this many bucket tokens: a smaller step's call is short and its host work
    # small (batch 1 lost 3% with every call on the thread, 12-07 b); a call made inline after threaded ones waits
    # for them (prev's tokens and the drained state), so the two mix in any order.
    call_thread_min_tokens = 64
    # The donated state the compiled calls thread through: with the call thread on, the engine thread reads or
    # replaces it only once the last submitted call has returned (call_thread.py's invariants).
    kv_caches = DrainedState()      # [(k_pages, v_pages)] a layer
    penalty_table = DrainedState()  # i32[num_penalty_slots, vocab]

    def __init__(self, loaded: LoadedModel, config: EngineConfig, max_model_len: int,
                 num_pages: int | None = None, small_buckets: bool = True, greedy_programs: bool | None = None,
                 draft: bool = False):
        self.loaded = loaded
        self.config = config
        self._calls: CallThread | None = None  # (before the donated state's first assignment: its setters read it)
        self.max_model_len = max_model_len
        self.page_size = config.cache.page_size
        cfg = loaded.cfg
        # Tensor / data parallelism (jaxinfer/parallel.py): this replica's devices, the KV cache split by KV head.
        self.plan = plan = loaded.plan
        self._device = plan.devices[0] if plan is not None else jax.devices()[0]
        self._kv_shards = plan.tp if plan is not None else 1
        self._replicated = plan.replicated if plan is not None else None
        # Penalty token counts, one row per sequence that may run at once (runner/penalties.py); allocated before
        # the KV budget is measured so it is accounted for (8B shapes: 256 x 128256 x 4 B = 131 MB).
        self.num_penalty_slots = config.scheduler.max_num_seqs
        self.penalty_table = jax.jit(lambda: jnp.zeros((self.num_penalty_slots, cfg.vocab_size), jnp.int32),
                                     out_shardings=self._replicated)()
        self._write_penalty_row = jax.jit(write_row, donate_argnums=(0,))
        self._write_penalty_row_exe = None
        kind = config.cache.kv_cache_dtype  # "auto" | "fp8" | "int8"
        # The storage dtype; part of the prefix-cache hash (engine.py extra_key).
        self.kv_dtype = kv_quant.cache_dtype(kind, loaded.dtype)
        self.num_pages = num_pages or config.cache.num_pages or self._pages_from_budget()
        shape = (self.num_pages, self.page_size, cfg.num_kv_heads, cfg.head_dim)
        kv_sharding = None
        if plan is not None:
            from jaxinfer.parallel import KV_CACHE_AXES

            kv_sharding = plan.sharding(KV_CACHE_AXES, shape)
            if kind != "auto":  # quantized pages: the per-token scales [pages, page, kv_heads] split likewise
                kv_sharding = kv_quant.QuantizedPages(kv_sharding, plan.sharding(KV_CACHE_AXES[:-1], shape[:-1]))
        # Zero-filled: attention masks unwritten slots by weight, and 0 * NaN would still poison the sum.
        zeros = jax.jit(lambda: kv_quant.empty_pages(kind, shape, loaded.dtype), out_shardings=kv_sharding)
        self.kv_caches = [(zeros(), zeros()) for _ in range(cfg.num_layers)]
        log.info("KV cache: %d pages x %d tokens = %d tokens (%.2f GiB per device)", self.num_pages, self.page_size,
                 (self.num_pages - 1) * self.page_size, self.kv_cache_bytes / 2**30)
        # Sharded (tp > 1), XLA copies the whole per-device cache into the dynamic loop every layer (measured on
        # CPU: O(num_pages) per step); the static loop has no such copy, so tensor parallelism always uses it.
        static = config.kernels.kv_loop == "static" or (config.kernels.kv_loop == "auto" and (
            jax.default_backend() != "cpu" or self._kv_shards > 1))
        chunk = config.kernels.kv_chunk_pages or (128 if static else 16)
        kv_chunk = min(chunk, math.ceil(max_model_len / self.page_size))
        ladders = runner_ladders(config, max_model_len, self.page_size, kv_chunk, small_buckets)
        self.ladder, self.decode_ladder, self._background = ladders
        backend = attention_backend.resolve(loaded, config, single_device=plan is None)
        opts = AttentionOptions(kv_chunk, static, backend, interpret=jax.default_backend() == "cpu",
                                mesh=plan.mesh if plan is not None and plan.tp > 1 else None,
                                num_sms=device_num_sms(), cudnn_min_tokens=attention_backend.cudnn_min_tokens(config))
        kv_shardings = None if plan is None else [(kv_sharding, kv_sharding)] * cfg.num_layers
        self.attention_options = opts
        # Speculation on: steps pass each other the carry of runner/spec_carry.py (pipelined verification).
        spec = config.speculative
        self.carry_width = carry_width(spec.num_speculative_tokens) if spec is not None else 0
        # The step takes the norm scales as one buffer a dtype, not one each: host time per argument buffer
        # (runner/param_arena.py). Sharded plans keep their per-weight shardings.
        self._arena = (param_arena.plan(loaded.params, param_arena.norm_scales(loaded.treedef, loaded.params))
                       if plan is None and self.pack_norm_scales else None)
        self._step_params_src = self._step_params = None
        step_args = (loaded, opts, config.scheduler.max_num_seqs, kv_shardings)
        step_kw = dict(carry_width=self.carry_width, page_size=self.page_size, arena=self._arena)
        self._step = make_step_fn(*step_args, **step_kw)  # (the form the draft programs inline)
        self.staged = self.stage_inputs and plan is None
        self._run_step = make_step_fn(*step_args, **step_kw, staged=True) if self.staged else self._step
        self._stages: dict = {}  # (len(ints), len(floats)) -> the stage buffers (step.stage_inputs), when staged
        M = config.scheduler.max_num_seqs
        # (draft: this runner is a speculative engine's draft model; neither it nor its target threads by default)
        speculative = draft or config.speculative is not None
        if call_thread_wanted(self.call_thread, jax.default_backend(), speculative) and plan is None:
            self._calls = CallThread()
        self._no_prev = jax.device_put(np.zeros((M, self.carry_width) if self.carry_width else (M,), np.int32),
                                       self._replicated)
        self._compiled: dict = {}  # (Bucket, greedy_only) -> step executable
        self._compiled_prompt: dict = {}  # Bucket -> prompt_logprobs executable
        self._pending: dict = {}  # (Bucket, greedy_only) -> Future of a step executable (compile_in_background)
        # GPU: a second step program per bucket for steps whose rows are all greedy, unpenalised and ask no top
        # logprobs (runner/sampler.py greedy_only): the general program's sampler work is all selects there
        # (runner/branches.py), which cost ~0.6 ms at batch 1 on the H200. CPU: the general program only (its
        # lax.conds skip that work already, and a second compile per bucket would double CPU start-up).
        # The sampler is a large share of a decode step (H200, results/step-dispatch-2026-12-02.json: batch 64
        # device step 8.5 ms general vs 6.8 ms greedy-only; batch 256 16.7 vs 13.5 ms). Each extra program costs
        # ~7 s of cold compile (8B shape): see EAGER_GENERAL_MAX_TOKENS for which are compiled when.
        # greedy_programs=True (api.LLM when it compiles lazily, warmup=False): on the CPU too, since then only the
        # programs a run uses are compiled, and the greedy one compiles in less than half the general one's time
        # (XLA:CPU, tiny model: 0.8 vs 1.9 s; `jaxinfer generate`'s greedy default, and most of the test suite).
        self.greedy_programs = jax.default_backend() == "gpu" if greedy_programs is None else greedy_programs
        self._prompt_logprobs = make_prompt_logprobs_fn(loaded)
        # Compiled programs on disk (runner/program_cache.py): one device only (a sharded program's devices are
        # part of the executable); everything the traced step closes over goes into `_program_parts`.
        self.program_cache = ProgramCache() if program_cache_enabled() and plan is None else None
        self._first_fetch_done = False
        self._first_step_done = threading.Event()  # compile_in_background(after_first_step=True) waits for it
        self._after_first_step: set = set()  # the (Bucket, greedy_only) keys of those programs
        self.program_wait_s = 0.0  # seconds callers waited for a program (compile, cache load, or a background one)
        self._program_parts = (repr(config), repr(cfg), str(jnp.dtype(loaded.dtype)), repr(loaded.quantization),
                               repr(opts), max_model_len, self.num_pages, self._device.id)

    # ---- memory -------------------------------------------------------------------------------------------
    @property
    def bytes_per_page(self) -> int:
        """K + V of all layers for one page, scales included (quantized KV: ~half of bf16's)."""
        cfg = self.loaded.cfg
        per_head = kv_quant.bytes_per_token_head(self.config.cache.kv_cache_dtype, cfg.head_dim,
                                                 jnp.dtype(self.loaded.dtype).itemsize)
        return 2 * cfg.num_layers * cfg.num_kv_heads * per_head * self.page_size

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of KV cache per device (the cache is split over the tensor-parallel devices)."""
        return self.bytes_per_page * self.num_pages // self._kv_shards

    def _pages_from_budget(self) -> int:
        cfg = self.loaded.cfg
        per_page = self.bytes_per_page // self._kv_shards
        memory = memory_budget(self._device)  # (limit, in use); None on CPU
        if memory is not None:
            # Leave room for activations of the largest bucket: hidden/MLP intermediates and f32 logits.
            T, S = self.config.scheduler.max_num_batched_tokens, self.config.scheduler.max_num_seqs
            act = 8 * T * (cfg.hidden_size + 2 * cfg.intermediate_size + cfg.qkv_size) + 16 * S * cfg.vocab_size
            limit, in_use = memory
            budget = limit * self.config.cache.gpu_memory_utilization - in_use - act
            pages = int(budget // per_page)
        else:  # CPU: no memory statistics; size the pool for the request limits (runner/cpu_defaults.py)
            pages = cpu_kv_pages(per_page, self.config.scheduler.max_num_seqs, self.max_model_len, self.page_size)
            budget = pages * per_page
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
        then run each step program once on an empty batch (its one dummy token writes into the reserved page 0):
        the first execution of a program loads its kernels onto the GPU, which otherwise landed in the first
        request's time to first token (measured on the H200: 273 ms TTFT at batch 1 vs 45 ms at batch 64).
        With greedy-only programs (GPU) the general programs of buckets above EAGER_GENERAL_MAX_TOKENS are compiled
        in the background once this returns; a step that needs one first waits for it."""
        t0 = time.perf_counter()
        out = None
        # step programs on two worker threads while this one compiles the prompt-logprob programs: XLA compiles
        # outside the GIL, so a 2-core CPU compiles about twice as fast
        deferred = [b for b in self.ladder.buckets if self._general_deferred(b)]
        later = [b for b in self.ladder.buckets if b in self._background]  # all their programs
        eager = [b for b in self.ladder.buckets if b not in later]
        self.compile_in_background([b for b in eager if b not in deferred], workers=2)
        from tqdm.auto import tqdm  # (here: ~65 ms of imports a warm `jaxinfer generate` never uses)
        runs = []
        for b in tqdm(eager, desc="compiling buckets", disable=not progress, leave=False):
            self._prompt_program(b)
            steps = [] if b in deferred else [self._step_program(b)]
            if self.greedy_programs:
                steps.append(self._step_program(b, greedy_only=True))
            runs.append((b, steps))
        # First runs only once every eager compile is done: a program's first run on a GPU captures its command
        # buffer (CUDA graph), and an XLA autotuner profiling a compile on a worker thread beside a capture failed
        # the start-up (H100, 12-07 j: CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, then "All configs failed").
        if jax.default_backend() != "cpu":  # CPU programs have no kernels to load; keep CPU start-up short
            for b, steps in runs:
                ints, floats = jax.device_put(self.placeholder_batch(b), self._replicated)
                for step in steps:
                    out, _ = self.run_compiled(step, ints, floats)
        if later:  # the small buckets' programs: a 1-token step runs in the next bucket up until they are ready
            if self.greedy_programs:
                self.compile_in_background(later, workers=1, greedy_only=True)
            self.compile_in_background(later, workers=1)
        if deferred:  # general programs of the large buckets: after warm-up, on one thread (a step waits for one)
            self.compile_in_background(deferred, workers=1)
        self._penalty_writer()
        jax.block_until_ready(out)
        log.info("compiled %d buckets in %.1f s", len(self.ladder.buckets), time.perf_counter() - t0)
        release_writes()  # warm-up's compiles are done: background cache writes may start

    @property
    def step_params(self):
        """The weights as the step programs take them: param_arena.pack of loaded.params (built again only when
        loaded.params is another list, e.g. the real weights after a runner built from their shapes)."""
        if self._step_params_src is not self.loaded.params:
            self._step_params = param_arena.pack(self.loaded.params, self._arena)
            self._step_params_src = self.loaded.params
        return self._step_params

    def run_compiled(self, step, ints, floats, prev_tokens=None):
        """Run one compiled step program on packed device buffers, threading the runner's donated state (KV cache,
        penalty counts). Returns (StepOutput, hidden). Used by warm-up and the benchmarks' device-only timings."""
        return self._call(step, ints, floats, self._no_prev if prev_tokens is None else prev_tokens)

    def _call(self, step, ints, floats, prev_tokens):
        """One call of a compiled step program, threading the donated state (KV cache, penalty counts and, when
        staged, the stage buffers of this input length). Returns (StepOutput, hidden)."""
        if not self.staged:
            self.kv_caches, out, hidden, self.penalty_table = step(self.step_params, self.kv_caches, ints, floats,
                                                                   prev_tokens, self.penalty_table)
            return out, hidden
        self.kv_caches, out, hidden, self.penalty_table = self.call_staged(
            step, ints, floats, self.step_params, self.kv_caches, ints, floats, prev_tokens, self.penalty_table)
        return out, hidden

    def call_staged(self, program, ints, floats, *args):
        """program(*args, stage) for a program that stages its packed inputs `ints` / `floats` (step.stage_inputs:
        the target's step, the draft programs): passes the stage buffers of their lengths (made on first use),
        keeps the ones it returns last for the next call, returns its other outputs."""
        if self._calls is not None:
            self._calls.drain()
        key = (ints.shape[0], floats.shape[0])
        stage = self._stages.pop(key, None)
        if stage is None:
            stage = tuple(jax.device_put(np.zeros(shape, dtype), self._replicated)
                          for shape, dtype in stage_shapes(*key))
        *outs, self._stages[key] = program(*args, stage)
        return outs

    def stage_specs(self, num_ints: int, num_floats: int) -> tuple:
        """The stage buffers' shapes, to lower a staged program at."""
        return tuple(jax.ShapeDtypeStruct(shape, dtype, sharding=self._replicated)
                     for shape, dtype in stage_shapes(num_ints, num_floats))

    def placeholder_batch(self, bucket) -> tuple[np.ndarray, np.ndarray]:
        """Packed (ints, floats) of a one-token step in `bucket`: the shapes a bucket's programs are lowered at."""
        return pack([SeqInput(token_ids=[0], start_pos=0, page_table=[0])], bucket, self.page_size).flat()

    def compile_step(self, bucket, compiler_options: dict | None = None, state_specs=None, greedy_only: bool = False):
        """The step executable of a bucket, compiled ahead of time (compiler_options: per-executable XLA options,
        e.g. {"xla_gpu_enable_command_buffer": ""}; the probes in benchmarks/probes use them). state_specs: the
        (kv_caches, penalty_table) shapes to lower at (default: the current arrays). greedy_only: the variant for
        steps whose rows are all greedy, unpenalised and ask no top logprobs."""
        ints, floats = self.placeholder_batch(bucket)
        spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=self._replicated)  # noqa: E731
        kv, table = state_specs or (self.kv_caches, self.penalty_table)
        args = (self.step_params, kv, spec(ints), spec(floats), self._no_prev, table)
        if self.staged:
            args += (self.stage_specs(ints.shape[0], floats.shape[0]),)

        def build():
            lowered = self._run_step.lower(*args, bucket=bucket, greedy_only=greedy_only)
            return compile_lowered(lowered, compiler_options)

        if self.program_cache is None:
            return build()
        key = program_key("step", *self._program_parts, repr(bucket), greedy_only, repr(compiler_options),
                          abstract_signature(args))
        return self.program_cache.get_or_compile(key, build, [self._device])

    def compile_in_background(self, buckets, workers: int = 1, greedy_only: bool = False,
                              after_first_step: bool = False) -> None:
        """Start compiling (or loading from the persistent cache) these buckets' step programs on a worker thread,
        so they overlap with the caller's own work (XLA compiles outside the GIL). A dispatch that needs one of
        them waits for it; until one is ready a step of its bucket runs in the first larger bucket whose program
        is (_packed_step). The donated state is lowered from its shapes (specs taken here), never from the
        arrays, which a running step may have consumed.
        after_first_step: start only once the first step's results are fetched (or a dispatch waits for one of
        these programs): the first token's program then has the CPU to itself (`jaxinfer generate`'s decode
        bucket: on the 2-core box, shared, the prompt's program compiled beside it took ~9 s instead of ~6)."""
        from concurrent.futures import ThreadPoolExecutor

        specs = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                             (self.kv_caches, self.penalty_table))
        todo = [(b, greedy_only) for b in dict.fromkeys(buckets)]
        todo = [k for k in todo if k not in self._compiled and k not in self._pending]
        if not todo:
            return
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="jaxinfer-compile")
        for b, g in todo:
            if after_first_step:
                self._after_first_step.add((b, g))
                self._pending[b, g] = pool.submit(self._compile_after_first_step, b, specs, g)
            else:
                self._pending[b, g] = pool.submit(self.compile_step, b, step_compiler_options(b), specs, g)
        pool.shutdown(wait=False)

    def _compile_after_first_step(self, bucket, specs, greedy_only: bool):
        while not self._first_step_done.wait(0.25):
            if not threading.main_thread().is_alive():  # exiting before any step (an error): nothing to compile
                raise RuntimeError("the process ended before its first step")
        return self.compile_step(bucket, step_compiler_options(bucket), specs, greedy_only)

    def finish_background_compiles(self) -> float:
        """Wait for every compile_in_background program (warm-up defers the general programs of large buckets to
        a background thread); returns the seconds waited. Benchmarks call it before a steady-state window: a
        background compile's Python lowering holds the GIL in slices, so steps that run beside it are slower."""
        t0 = time.perf_counter()
        for key in list(self._pending):
            self._compiled[key] = self._pending.pop(key).result()
        return time.perf_counter() - t0

    def _general_deferred(self, bucket) -> bool:
        """Warm-up leaves this bucket's general step program to a background compile (EAGER_GENERAL_MAX_TOKENS)."""
        return self.greedy_programs and bucket.num_tokens > EAGER_GENERAL_MAX_TOKENS

    def step_program(self, batch) -> Any:
        """The step executable for a packed batch: the greedy-only one when it has one and every row qualifies
        (padding rows are greedy and unpenalised)."""
        return self._step_program(*self._program_key(batch))

    def greedy_for(self, params) -> bool:
        """Whether steps of requests with these SamplingParams alone run the greedy-only program (as _program_key
        decides from a packed batch): for compiling it ahead (api.LLM's first request, the CLI's decode bucket)."""
        return bool(self.greedy_programs and params is not None and params.temperature < GREEDY_EPS
                    and params.logprobs is None and params.presence_penalty == 0 and params.frequency_penalty == 0
                    and params.repetition_penalty == 1)

    def _program_key(self, batch) -> tuple:
        """(bucket, greedy_only) of the step program a packed batch runs."""
        a = batch.arrays
        greedy = bool(self.greedy_programs and not a["want_logprobs"].any()
                      and bool((a["temperature"] < GREEDY_EPS).all()) and bool((a["penalty_slot"] < 0).all()))
        return batch.bucket, greedy

    def _program_ready(self, key) -> bool:
        """Compiled already, or compiled in the background and done: running it waits for nothing."""
        return key in self._compiled or (key in self._pending and self._pending[key].done())

    def _packed_step(self, seqs, bucket):
        """(packed batch, its step executable) for `seqs`: in `bucket`, or while that bucket's program is still
        compiling in the background, in the first larger bucket whose program is ready (a 1-token step in the
        16-token bucket while the GPU's 1-token bucket compiles); waits for its own program when none is."""
        packer = pack_step if isinstance(seqs, StepBatch) else pack
        batch = packer(seqs, bucket, self.page_size)
        key = self._program_key(batch)
        pending = self._pending.get(key)
        if pending is not None and not pending.done():
            for bigger in self.ladder.buckets[self.ladder.buckets.index(bucket) + 1:]:
                if bigger.num_seqs < bucket.num_seqs:  # (a prefill twin: fewer sequences than this step may have)
                    continue
                other = packer(seqs, bigger, self.page_size)
                other_key = self._program_key(other)
                if self._program_ready(other_key):  # (never a fresh compile of a bigger bucket)
                    batch, key = other, other_key
                    break
        return batch, self._step_program(*key)

    def _programs(self, bucket):
        """(step, prompt_logprobs) executables of a bucket, compiled on first use (warm-up does all)."""
        return self._step_program(bucket), self._prompt_program(bucket)

    def _step_program(self, bucket, greedy_only: bool = False):
        """The step executable of a bucket (greedy_only: the variant for all-greedy steps), compiled on first use
        or taken from compile_in_background (waiting for it if it is still compiling)."""
        key = (bucket, greedy_only)
        step = self._compiled.get(key)
        if step is None:
            t0 = time.perf_counter()
            pending = self._pending.pop(key, None)  # compile_in_background's, maybe still running
            if pending is not None:
                if key in self._after_first_step:  # waiting for the first step would wait for itself
                    self._first_step_done.set()
                step = pending.result()
            else:
                step = self.compile_step(bucket, step_compiler_options(bucket), greedy_only=greedy_only)
            self._compiled[key] = step
            self.program_wait_s += time.perf_counter() - t0
            log.debug("step of %d tokens / %d sequences compiled (or loaded from the cache) in %.2f s",
                      bucket.num_tokens, bucket.num_seqs, time.perf_counter() - t0)
        return step

    def _prompt_program(self, bucket):
        """The prompt-logprob executable of a bucket, compiled on first use (warm-up does all): a lazy start
        (`jaxinfer generate`) compiles only the step programs it runs."""
        prompt = self._compiled_prompt.get(bucket)
        if prompt is None:
            t0 = time.perf_counter()
            rep = self._replicated
            hidden = jax.ShapeDtypeStruct((bucket.num_tokens, self.loaded.cfg.hidden_size), self.loaded.dtype,
                                          sharding=rep)
            targets = jax.ShapeDtypeStruct((bucket.num_tokens,), jnp.int32, sharding=rep)
            args = (self.loaded.params, hidden, targets)
            build = lambda: self._prompt_logprobs.lower(*args).compile()  # noqa: E731
            if self.program_cache is None:
                prompt = build()
            else:
                key = program_key("prompt_logprobs", *self._program_parts, repr(bucket), abstract_signature(args))
                prompt = self.program_cache.get_or_compile(key, build, [self._device])
            self._compiled_prompt[bucket] = prompt
            self.program_wait_s += time.perf_counter() - t0
        return prompt

    def _penalty_writer(self):
        """The compiled row write of the penalty table (one shape: compiled once, at warm-up)."""
        if self._write_penalty_row_exe is None:
            V = self.loaded.cfg.vocab_size
            self._write_penalty_row_exe = self._write_penalty_row.lower(
                self.penalty_table, jax.ShapeDtypeStruct((), jnp.int32),
                jax.ShapeDtypeStruct((V,), jnp.int32)).compile()
        return self._write_penalty_row_exe

    # ---- run ----------------------------------------------------------------------------------------------
    def dispatch(self, seqs: StepBatch | Sequence[SeqInput], prev: "InFlight | None" = None,
                 prompt_logprob_targets: dict[int, np.ndarray] | None = None) -> "InFlight":
        """Pack and launch one step without waiting for it. `prev`: the step still in flight whose sampled
        tokens fill this step's placeholders. prompt_logprob_targets: seq index -> next-token ids of that
        sequence's tokens (their log-probs are computed on the device too)."""
        if isinstance(seqs, StepBatch):
            n_seqs = seqs.num_seqs
            bucket = self.ladder.pick(seqs.num_tokens, n_seqs)
            inits = list(seqs.penalty_inits.values())
        else:
            n_seqs = len(seqs)
            bucket = self.ladder.pick(sum(map(len, map(_TOKEN_IDS, seqs))), n_seqs)
            inits = [x for x in map(_PENALTY_INIT, seqs) if x is not None]  # (no Python loop over all seqs)
        batch, step = self._packed_step(seqs, bucket)
        bucket = batch.bucket
        # a penalised sequence starting (or restarting): its counts row, from its known tokens
        for init in inits:
            slot, prompt_ids, output_ids = init
            if not 0 <= slot < self.num_penalty_slots:
                raise ValueError(f"penalty slot {slot} is outside [0, {self.num_penalty_slots})")
            row = host_row(prompt_ids, output_ids, self.loaded.cfg.vocab_size)
            self.penalty_table = self._penalty_writer()(self.penalty_table, np.int32(slot), row)
        # numpy straight into the compiled call: its C++ path transfers them to the program's input sharding;
        # jax.device_put first cost ~75 µs more of host time a step (CPU, 2026-12-05; ~0.56 ms on the GPU, 12-04)
        ints, floats = batch.flat()
        if self.device_put_inputs:  # the former transfer (benchmarks/probes/host_step_cost.py --device-put-inputs)
            ints, floats = jax.device_put((ints, floats), self._replicated)
        prompt = None
        threaded = self._calls is not None and bucket.num_tokens >= self.call_thread_min_tokens
        if threaded and not prompt_logprob_targets:  # (InFlight.out resolves the future)
            out = self._calls.submit(lambda: self._call_and_copy(step, ints, floats, prev)[0])
        else:
            out, hidden = self._call_and_copy(step, ints, floats, prev)
        if prompt_logprob_targets:
            targets = np.zeros(bucket.num_tokens, np.int32)
            for i, tgt in prompt_logprob_targets.items():
                a = int(batch.token_offsets[i])
                targets[a:a + len(tgt)] = tgt
            prompt_fn = self._prompt_program(bucket)
            prompt = prompt_fn(self.loaded.params, hidden, jax.device_put(targets, self._replicated))
        want_top = bool(batch.arrays["want_logprobs"].any())  # packed already: no second pass over seqs
        verify_row = batch.arrays["verify_row"]  # packed already: verify row r holds sequence spec_seqs[r]
        spec_seqs = verify_row[verify_row < bucket.num_seqs].tolist()
        return InFlight(out, prompt, dict(prompt_logprob_targets or {}), batch.token_offsets, n_seqs, want_top,
                        spec_seqs, packed=batch)

    def _prev_tokens(self, prev: "InFlight | None"):
        return (prev.carry if prev.carry is not None else prev.out.carry) if prev is not None else self._no_prev

    def _call_and_copy(self, step, ints, floats, prev: "InFlight | None"):
        """A step's call and the early copy of its results to the host: (StepOutput, hidden). On the call thread
        prev's outputs are ready when it runs (calls run in order)."""
        out, hidden = self._call(step, ints, floats, self._prev_tokens(prev))
        if self.early_host_copy:
            out.host.copy_to_host_async()
        return out, hidden

    @property
    def call_thread_cpu_s(self) -> float:
        """CPU seconds the call thread spent in calls (0 with the thread off): the host cost the engine thread's
        time no longer shows."""
        return self._calls.cpu_s if self._calls is not None else 0.0

    def fetch(self, flight: "InFlight") -> RunnerOutput:
        """Wait for a dispatched step and copy its (small) results to the host."""
        if not self._first_fetch_done:  # start-up is over: background cache writes and compiles may start now
            self._first_fetch_done = True
            self._first_step_done.set()
            release_writes()
        n, o = flight.num_seqs, flight.out
        # Every device->host copy costs host time: tokens, logprobs and the verification results come as one
        # array (StepOutput.host), the top-20 arrays only when asked for.
        if flight.want_top:
            host, top_ids, top_lp = jax.device_get((o.host, o.top_ids, o.top_logprobs))
        else:
            # np.asarray, not jax.device_get: one array needs no async fan-out, and device_get's pytree walk cost
            # ~170 µs of host CPU a step here against ~35 (CPU probe, batch 256, 2026-12-05)
            host, top_ids, top_lp = np.asarray(o.host), None, None
        tokens, logprobs, acc, toks, lps = unpack_host_outputs(host, o.tokens.shape[0], o.logprobs.shape[0],
                                                               *o.spec_tokens.shape)  # (device shapes: no wait)
        if flight.packed is not None:
            # the step's results are on the host, so it ran: its inputs were transferred (the transfer reads the
            # numpy buffers until it completes, and the step waits for it); a later packing may reuse them
            release(flight.packed)
            flight.packed = None
        prompt_lp = {}
        if flight.prompt is not None:
            lp, ids, top = jax.device_get(flight.prompt)
            for i, tgt in flight.prompt_targets.items():
                a = int(flight.token_offsets[i])
                prompt_lp[i] = (lp[a:a + len(tgt)], ids[a:a + len(tgt)], top[a:a + len(tgt)])
        res = RunnerOutput(tokens[:n], logprobs[:n], None if top_ids is None else top_ids[:n],
                           None if top_lp is None else top_lp[:n], prompt_lp)
        if flight.spec_seqs:
            rows = np.asarray(flight.spec_seqs)
            res.spec_tokens = np.zeros((n, toks.shape[1]), np.int32)
            res.num_accepted = np.zeros(n, np.int32)
            res.spec_logprobs = np.zeros((n, toks.shape[1]), np.float32)
            res.spec_tokens[rows] = toks[:len(rows)]
            res.num_accepted[rows] = acc[:len(rows)]
            res.spec_logprobs[rows] = lps[:len(rows)]
        return res
