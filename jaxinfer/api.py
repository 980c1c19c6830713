"""The offline Python API: `LLM` and the one-liner `generate` (vLLM-like)."""
from __future__ import annotations

import logging
import numbers
import os
import time
import weakref
from typing import Iterator, Sequence

from jaxinfer.config import ConfigError, EngineConfig
from jaxinfer.engine.gc_freeze import startup_objects_frozen
from jaxinfer.env_switch import switch
from jaxinfer.outputs import RequestOutput
from jaxinfer.sampling_params import SamplingParams

log = logging.getLogger("jaxinfer")

_CPU_MAX_MODEL_LEN = 8192

Prompt = str | Sequence[int]


class LLM:
    """A model loaded onto the device with a paged KV cache and a continuous-batching engine.

    LLM(model=None, dtype="auto", load_format="auto", **engine_options)
      model: None (default SmolLM2-135M-Instruct), a HF checkpoint dir, a *.gguf file, an orbax checkpoint
             dir saved by `LLM.save`, a hub id, or a preset shape ("llama3-8b") with load_format="dummy".
      engine_options: fields of EngineConfig's groups (page_size, num_pages, gpu_memory_utilization,
             max_model_len, max_num_batched_tokens, max_num_seqs, tensor_parallel_size, data_parallel_size,
             quantization, speculative_config, ...; EngineConfig.option_names()). Unknown options are errors.
    LLM(config=EngineConfig(...)): the whole configuration at once (what the command line builds, cli_args.py).
      warmup: compile every bucket's programs before returning (default: on, unless JAXINFER_WARMUP=0); off, each
             program compiles the first time a step needs it (nothing else changes).
    """

    def __init__(self, model: str | None = None, dtype: str = "auto", load_format: str = "auto",
                 tokenizer: str | None = None, warmup: bool | None = None, progress: bool = True,
                 config: EngineConfig | None = None, _first_request: tuple | None = None, **engine_options):
        if config is None:
            config = EngineConfig.from_options(model=model, dtype=dtype, load_format=load_format, **engine_options)
        elif engine_options or (model, dtype, load_format) != (None, "auto", "auto"):
            given = sorted(engine_options) + [n for n, v, d in (("model", model, None), ("dtype", dtype, "auto"),
                                                                  ("load_format", load_format, "auto")) if v != d]
            raise ConfigError(f"pass either config= or options, not both (got config= and {given}); set them in "
                              "the config, e.g. config.replace(max_num_seqs=8)")
        t0 = time.perf_counter()
        self._progress = progress
        # (prompt, SamplingParams) the caller sends first (`jaxinfer generate`): its step program compiles while
        # the weights load (_start_first_compile)
        self._first_request = _first_request
        # warmup None: JAXINFER_WARMUP (default on; "0" compiles each program on first use, as the test suite does)
        self._warmup = switch("JAXINFER_WARMUP") if warmup is None else warmup
        # seconds per start-up phase (benchmarks/startup.py prints them); tokenizer_s ran on its own thread
        self.startup_breakdown = times = {}
        from jaxinfer.weights.loader import resolve_model
        from jaxinfer.runner.compile_options import enable_compilation_cache
        from jaxinfer.tokenizer import Tokenizer

        times["import_s"] = time.perf_counter() - t0
        self.config = config
        enable_compilation_cache(config.kernels.compilation_cache_dir)
        self.source = resolve_model(config.load.model, config.load.load_format)
        times["config_s"] = time.perf_counter() - t0 - times["import_s"]
        # The tokenizer builds on a thread while the weights load and the runner sets up (tokenizers' Rust code
        # and file reads release the GIL); it is awaited before the engine, which needs its EOS ids.
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1, thread_name_prefix="jaxinfer-tokenizer") as pool:
            tokenizer_future = pool.submit(self._timed, "tokenizer_s", self._load_tokenizer, tokenizer, Tokenizer)
            self._build(config, tokenizer_future)
        self.startup_seconds = time.perf_counter() - t0
        _BUILT[_source_key(self.source)] = weakref.ref(self)  # jaxinfer.generate() reuses it
        log.info("engine ready in %.1f s", self.startup_seconds)

    def _timed(self, name, fn, *args):
        t = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.startup_breakdown[name] = time.perf_counter() - t

    def _build(self, config, tokenizer_future):
        """Weights, runners, engine(s) and warm-up; `tokenizer_future` is awaited once the runners exist."""
        from jaxinfer.weights.loader import load_model
        from jaxinfer.runner import cpu_defaults
        from jaxinfer.runner.cpu_defaults import compute_dtype
        from jaxinfer.runner.model_runner import ModelRunner
        from jaxinfer.engine.engine import LLMEngine

        progress = self._progress
        warmup = self._warmup
        times = self.startup_breakdown
        t = time.perf_counter()
        # Tensor / data parallelism: one sharding plan per replica (None: the single default device).
        plans = [None]
        par = config.parallel
        if par.tensor_parallel_size > 1 or par.data_parallel_size > 1:
            from jaxinfer.parallel import make_plans, replicate_model

            plans = make_plans(par.tensor_parallel_size, par.data_parallel_size)
        dtype = compute_dtype(config.load.dtype)  # "auto": the checkpoint's (bfloat16 for most), float32 on CPU
        # Compiled lazily (no warm-up): greedy-only step programs on every backend (ModelRunner greedy_programs)
        lazy = True if not warmup else None
        early = None
        # CPU only: an accelerator's KV pool is sized from the memory free when the runner is built, which must
        # be after the weights are on it (there the compile is also a smaller share of the start).
        if (self._first_request is not None and not warmup and plans == [None] and config.quant_spec is None
                and cpu_defaults.on_cpu()):
            early = self._start_first_compile(dtype, tokenizer_future)
            times["runner_s"], t = time.perf_counter() - t, time.perf_counter()
        self.model = load_model(self.source, dtype, seed=config.seed, progress=progress,
                                quantization=config.quant_spec, plan=plans[0],
                                shapes=None if early is None else early.loaded,
                                matmul_backend=config.kernels.quantized_matmul)
        self.models = [self.model] + [replicate_model(self.model, p) for p in plans[1:]]
        times["weights_s"], t = time.perf_counter() - t, time.perf_counter()
        cfg = self.model.cfg
        self.model_config = cfg
        max_len = self._max_model_len(cfg)
        if early is not None:  # built from the weights' shapes: now the weights themselves
            early.loaded = self.model
            self.runners = [early]
        else:
            self.runners = [ModelRunner(m, self.config, max_len, greedy_programs=lazy) for m in self.models]
            times["runner_s"], t = time.perf_counter() - t, time.perf_counter()
        self.runner = self.runners[0]
        self.tokenizer = tokenizer_future.result()
        times["tokenizer_wait_s"], t = time.perf_counter() - t, time.perf_counter()
        eos = set(cfg.eos_token_ids)
        if self.tokenizer is not None:
            eos |= set(self.tokenizer.eos_token_ids)
        engines = [LLMEngine(runner, self.tokenizer, config.scheduler, max_model_len=max_len, eos_token_ids=eos,
                             vocab_size=cfg.vocab_size, seed=config.seed, spec=self._speculation(max_len))
                   for runner in self.runners]
        if len(engines) == 1:
            self.engine = engines[0]
        else:
            from jaxinfer.engine.router import DataParallelEngine

            self.engine = DataParallelEngine(engines)
        if warmup:
            for runner in self.runners:
                runner.warmup(progress=progress)
            spec = getattr(self.engine, "spec", None)
            if spec is not None and hasattr(spec.proposer, "warmup"):
                spec.proposer.warmup(progress=progress)
        times["programs_s"] = time.perf_counter() - t  # compile or load every bucket's programs (warm-up)

    # ---- set-up helpers -----------------------------------------------------------------------------------
    def _start_first_compile(self, dtype, tokenizer_future):
        """The runner, built from the weights' shapes (weights/loader.abstract_model) before they are read, and the
        step program of the first request's bucket compiling on a thread as soon as the tokenizer can count its
        tokens: XLA compiles outside the GIL, so on a CPU the compile and the weight loading share the cores
        (2-core box, default model, cold: the first token's ~4.5 s compile no longer waits for ~3 s of loading;
        benchmarks/README.md). Anything that fails here only loses the overlap: the step compiles on first use."""
        from jaxinfer.runner.model_runner import ModelRunner
        from jaxinfer.weights.loader import abstract_model

        shapes = abstract_model(self.source, dtype)
        runner = ModelRunner(shapes, self.config, self._max_model_len(shapes.cfg), greedy_programs=True)
        prompt, params = self._first_request

        def compile_first(future):
            try:
                tok = future.result()
                if isinstance(prompt, str):
                    n = len(tok.encode(prompt))
                elif prompt and isinstance(prompt[0], dict):  # chat messages
                    n = len(tok.apply_chat_template(prompt))
                else:
                    n = len(prompt)  # token ids
                runner.compile_in_background([runner.ladder.pick(n, 1)], greedy_only=runner.greedy_for(params))
            except Exception as e:  # noqa: BLE001  (see the docstring)
                log.debug("first-request compile not started (%s: %s)", type(e).__name__, e)

        tokenizer_future.add_done_callback(compile_first)
        return runner

    def _speculation(self, max_len: int):
        """SpecControl with the configured proposer, or None (engine/spec_control.py)."""
        sc = self.config.speculative
        if sc is None:
            return None
        from jaxinfer.engine.spec_control import SpecControl

        if sc.method == "ngram":
            from jaxinfer.engine.ngram_proposer import NgramProposer

            proposer = NgramProposer(sc.ngram_min_n, sc.ngram_max_n)
            if sc.pipelined:  # drafts also made on the device from the step in flight's carry (pipelined steps)
                from jaxinfer.runner.ngram_device import DeviceNgramProposer

                proposer = DeviceNgramProposer(proposer, self.config.scheduler.max_num_seqs, max_len,
                                               sc.num_speculative_tokens)
        else:
            from jaxinfer.draft_model import build_model_proposer

            proposer = build_model_proposer(sc, self.model, self.config, max_len, self.runner.num_pages,
                                            progress=self._progress)
        max_spec = min(sc.max_batch_size, self.config.scheduler.max_num_seqs)
        policy = None
        if sc.batch_policy:
            from jaxinfer.engine.spec_policy import SpecPolicy

            # pipelined n-gram drafts are looked up on the device: the table's free drafts; host n-gram drafts
            # (pipelined=False) have no table of their own (the cost model); draft model / layer-skip: "model"
            kind = ("free" if sc.pipelined else "host") if sc.method == "ngram" else "model"
            policy = SpecPolicy(kind)
        return SpecControl(proposer, sc.num_speculative_tokens, max_spec, sc.adaptive, sc.min_acceptance,
                           pipelined=sc.pipelined, policy=policy)

    def _load_tokenizer(self, override, Tokenizer):
        src = self.source
        path = override or src.tokenizer_path
        if path is None:
            return None
        import os

        gen = src.generation_config
        if override is None and os.path.isdir(path) and not any(
                os.path.exists(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json",
                                                                 "tokenizer.model")):
            log.warning("no tokenizer files in %s: prompts must be token ids and outputs have no text", path)
            return None
        if path.endswith(".gguf"):
            return Tokenizer.from_pretrained(os.path.dirname(path) or ".", gguf_file=os.path.basename(path),
                                             generation_config=gen)
        return Tokenizer.from_pretrained(path, generation_config=gen)

    def _max_model_len(self, cfg) -> int:
        import jax

        want = self.config.scheduler.max_model_len
        if want is None:
            want = cfg.max_position_embeddings
            if jax.default_backend() == "cpu":
                want = min(want, _CPU_MAX_MODEL_LEN)
        if want > cfg.max_position_embeddings:
            raise ConfigError(
                f"max_model_len={want} exceeds the model's max_position_embeddings="
                f"{cfg.max_position_embeddings}; lower max_model_len")
        return int(want)

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def get_tokenizer(self):
        """The Hugging Face tokenizer (as vLLM's LLM.get_tokenizer); `llm.tokenizer` is jaxinfer's wrapper around
        it (token ids in, text out, chat templates as ids)."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer (dummy weights, or no tokenizer files in the checkpoint); "
                             "pass tokenizer=PATH to LLM(...)")
        return self.tokenizer.hf

    # ---- generation ---------------------------------------------------------------------------------------
    def generate(self, prompts: Prompt | Sequence[Prompt],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run every prompt to completion in one continuous batch; outputs come back in prompt order."""
        prompts = _as_prompt_list(prompts)
        params = _as_params_list(sampling_params, len(prompts))
        ids = []
        try:
            for p, sp in zip(prompts, params):
                ids.append(self.engine.add_request(None, p, sp, stream=False))
        except Exception:
            for rid in ids:  # all-or-nothing: a bad prompt leaves no half-queued batch behind
                self.engine.abort(rid)
            raise
        results: dict[str, RequestOutput] = {}
        from tqdm.auto import tqdm  # (here: ~65 ms of imports a warm `jaxinfer generate` never uses)
        bar = tqdm(total=len(ids), desc="generating", unit="req", disable=not use_tqdm or len(ids) < 2)
        try:
            with startup_objects_frozen():  # no full-heap GC pauses inside the loop (engine/gc_freeze.py)
                while len(results) < len(ids):
                    for out in self.engine.step():
                        if out.finished:
                            results[out.request_id] = out
                            bar.update(1)
        finally:
            bar.close()
            for rid in ids:
                if rid not in results:
                    self.engine.abort(rid)
        return [results[rid] for rid in ids]

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> Iterator[RequestOutput]:
        """Yield the RequestOutputs of one prompt as tokens arrive (cumulative unless sampling_params.output_kind
        asks for DELTA or FINAL_ONLY)."""
        rid = self.engine.add_request(None, prompt, sampling_params)
        try:
            while True:
                for out in self.engine.step():
                    if out.request_id == rid:
                        yield out
                        if out.finished:
                            return
        finally:
            self.engine.abort(rid)

    def chat(self, messages, sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
             use_tqdm: bool = True) -> list[RequestOutput]:
        """messages: one conversation (list of {"role", "content"}) or a list of conversations."""
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer (dummy weights, or no tokenizer files in the checkpoint); "
                             "chat needs a tokenizer with a chat template: pass tokenizer=PATH")
        convs = _as_conversations(messages)
        prompts = [self.tokenizer.apply_chat_template(c, add_generation_prompt=True) for c in convs]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def save(self, path: str):
        """Save weights (orbax), config and tokenizer so `LLM(path)` reloads without conversion."""
        from jaxinfer.weights.checkpoint import save_checkpoint
        import jax
        import numpy as np
        from flax import nnx

        if self.model.quantization is not None:
            raise ValueError(
                f"saving a quantized model ({self.model.quantization.name}) is not supported; save the float model "
                "and pass quantization= when loading it")
        state = nnx.to_pure_dict(jax.tree.unflatten(self.model.treedef, self.model.params))
        if self.model.plan is not None:  # gather the shards and undo the tensor-parallel layout
            from jaxinfer.weights.loader import _flatten, _unflatten
            from jaxinfer.parallel import canonical_layout

            state = _unflatten({p: canonical_layout(p, np.asarray(a), self.model.layout)
                                for p, a in _flatten(state).items()})
        save_checkpoint(path, state, self.source.hf_config,
                        self.tokenizer.hf if self.tokenizer is not None else None)


def _as_conversations(messages) -> list[list[dict]]:
    """One conversation (a list of message dicts) or a list of them -> a list of conversations, each checked: a
    non-empty list of dicts with a string "role" and a "content" (an assistant message with "tool_calls" may omit
    it)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise ValueError(f"chat needs a conversation: a non-empty list of messages like "
                         f"[{{'role': 'user', 'content': 'Hello'}}] (or a list of such lists); got {messages!r}")
    convs = [list(messages)] if isinstance(messages[0], dict) else list(messages)
    for c, conv in enumerate(convs):
        where = f"conversation {c}" if len(convs) > 1 else "the conversation"
        if not isinstance(conv, (list, tuple)) or not conv:
            raise ValueError(f"{where} must be a non-empty list of messages like {{'role': 'user', 'content': "
                             f"'Hello'}}; got {conv!r}")
        for i, m in enumerate(conv):
            if not isinstance(m, dict):
                raise ValueError(f"message {i} of {where} must be a dict with 'role' and 'content', got "
                                 f"{type(m).__name__}: {m!r}")
            if not isinstance(m.get("role"), str):
                raise ValueError(f"message {i} of {where} has no 'role' (a string such as 'user', 'assistant' or "
                                 f"'system'): {m!r}")
            if m.get("content") is None and not m.get("tool_calls"):
                raise ValueError(f"message {i} of {where} has no 'content'; add the message text, e.g. "
                                 f"{{'role': {m['role']!r}, 'content': '...'}}")
    return convs


def _is_token_id(t) -> bool:
    return isinstance(t, numbers.Integral) and not isinstance(t, bool)


def _as_prompt_list(prompts) -> list[Prompt]:
    if isinstance(prompts, str):
        return [prompts]
    if hasattr(prompts, "tolist") and not isinstance(prompts, (list, tuple)):  # numpy array of token ids
        prompts = prompts.tolist()
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a string or a list of token ids (or a list of those); got "
                        f"{type(prompts).__name__}")
    prompts = list(prompts)
    if prompts and all(_is_token_id(t) for t in prompts):
        return [[int(t) for t in prompts]]  # one prompt given as token ids
    for i, p in enumerate(prompts):
        if hasattr(p, "tolist") and not isinstance(p, str):
            p = prompts[i] = p.tolist()
        if not isinstance(p, str) and not (isinstance(p, (list, tuple)) and all(_is_token_id(t) for t in p)):
            raise TypeError(f"prompt {i} must be a string or a list of token ids, got {type(p).__name__}")
    return prompts


def _as_params_list(sp, n: int) -> list[SamplingParams]:
    if sp is None:
        return [SamplingParams()] * n
    if isinstance(sp, SamplingParams):
        return [sp] * n
    sp = list(sp)
    if len(sp) != n:
        raise ValueError(f"got {len(sp)} SamplingParams for {n} prompts; pass one, or one per prompt")
    return sp


_LLM_CACHE: dict[tuple, LLM] = {}  # LLMs that generate() built itself, kept for the process
_BUILT: dict[tuple, "weakref.ref[LLM]"] = {}  # the last LLM built per model source (any caller), while it lives


def _source_key(src) -> tuple:
    return (src.kind, os.path.realpath(src.path) if src.path else src.name)


def generate(prompts: Prompt | Sequence[Prompt], model: str | None = None, **sampling) -> list[RequestOutput]:
    """One-liner: `jaxinfer.generate("Hello", max_tokens=20)`. Runs on an LLM of the same model that is already
    built in this process (by the caller or by an earlier generate()), else builds one and keeps it."""
    from jaxinfer.weights.loader import resolve_model

    key = _source_key(resolve_model(model, "auto"))
    llm = _BUILT[key]() if key in _BUILT else None
    if llm is None:
        llm = _LLM_CACHE[key] = LLM(model)
    return llm.generate(prompts, SamplingParams(**sampling))
