"""The engine's configuration: SpeculativeConfig, then EngineConfig, made of one frozen group per concern (load,
scheduler, cache, parallel, kernels, speculative) that is handed down whole to the part that reads it. Field
metadata documents every option; the command-line flags are generated from it (cli_args.py)."""
from __future__ import annotations

import dataclasses

from jaxinfer.config.model import ConfigError
from jaxinfer.config.quantization import MATMUL_BACKENDS, KeepGGUFQuantization, QuantSpec, parse_quantization

SPEC_METHODS = ("ngram", "draft", "layer_skip")


@dataclasses.dataclass(frozen=True)
class SpeculativeConfig:
    """Speculative decoding (runner/spec_decode.py verifies; engine/spec_control.py drives it).

    method: "ngram" (prompt lookup, no model), "draft" (a smaller model with the same tokenizer, `draft_model`,
        run by its own runner with its own paged KV cache) or "layer_skip" (the first `num_draft_layers` layers of
        the target + its final norm and head; shares the weights, has its own KV cache).
    num_speculative_tokens: k, the most draft tokens verified per request and step (the target scores k + 1
        positions). With `adaptive`, a request's k shrinks (to 1 at least) while its acceptance rate is below
        `min_acceptance` and grows back above (1 + min_acceptance) / 2.
    max_batch_size: speculation switches off while more than this many requests are running (verification
        costs k extra tokens of compute per request; at large batches decoding is compute-bound and the extra
        work costs more than it saves). Also the most speculating requests in one step. Default 64: on the H200
        (8B shape, k = 4, acceptance 0.7, free drafts; results/spec-speed-*2026-12-01.json) speculation was
        faster than plain decoding at batch 1-64 (1.76x at 1, 1.24x at 64) and slower at 128 (0.95x).
    ngram_min_n / ngram_max_n: n-gram sizes matched, longest first.
    draft_model / draft_load_format: the draft checkpoint (path, GGUF, preset with load_format="dummy").
    draft_quantization: method "draft" only: quantize the draft model's weights on load ("int8", "int4[-gN]",
        "fp8", as the target's `quantization`; the engine's quantized_matmul backend). Drafts only propose: the
        target verifies every token, so output stays exactly the target's; a quantized draft streams fewer bytes
        per draft step (a 1B draft at batch 1 is ~1/3 of its step in weight streaming, issue 21).
    draft_quantize_lm_head: the draft's head under draft_quantization, as `quantize_lm_head` for the target: None
        (default) an int8 head for int8 / int4 drafts (a tied head too, as a quantized copy of the embedding),
        False a float head, True the draft's own method.
    draft_head_vocab: method "draft" only: the draft's LM head over the first N token ids only, N a multiple of
        128 (weights/head_cut.py; FR-Spec's idea, the tokenizer's id order standing in for token frequency). None
        (default): the whole vocabulary. The draft then never proposes a later id; outputs stay the target's.
    num_draft_layers: layer_skip draft depth (default: a quarter of the target's layers, at least 1).
    draft_num_pages: KV pages of the draft's own cache (default: as many as the target's).
    pipelined: verification step n+1 is dispatched before step n's accepted counts are read (engine/spec_pipeline.py,
        runner/spec_carry.py) where the drafter runs on the device ("draft", "layer_skip": one program per cycle,
        runner/draft_cycle.py; "ngram": the prompt lookup on the device, runner/ngram_device.py). False: every
        speculative step is finished before the next is scheduled (n-gram drafts from the host proposer).
    batch_policy: per step, speculation on/off and a cap on k from the measured speed-up table of
        engine/spec_policy.py (batch size x recent draft agreement, per drafter kind: pipelined n-gram drafts as the
        benchmark's free drafts, a draft model or layer-skip as the 1B-shaped draft) on top of max_batch_size; on
        by default since the table holds the pipelined path's measurements (2026-12-05). With it, a draft model
        speculates at batch 1 only where its measured speed-up beats 1.05 (a >= ~0.63; at batch 8 it measured
        0.65-0.99x, so it is off above batch 1), free / n-gram drafts up to batch 64. False: speculate whenever
        the batch is within max_batch_size (the benchmarks that measure speculation itself).
    """

    method: str = "ngram"
    num_speculative_tokens: int = 4
    max_batch_size: int = 64
    adaptive: bool = True
    min_acceptance: float = 0.5
    ngram_min_n: int = 1
    ngram_max_n: int = 4
    draft_model: str | None = None
    draft_load_format: str = "auto"
    draft_quantization: str | None = None
    draft_quantize_lm_head: bool | None = None
    draft_head_vocab: int | None = None
    num_draft_layers: int | None = None
    draft_num_pages: int | None = None
    pipelined: bool = True
    batch_policy: bool = True

    def __post_init__(self):
        if self.method not in SPEC_METHODS:
            raise ConfigError(f"speculative method {self.method!r} is unknown; use one of {list(SPEC_METHODS)}")
        if not isinstance(self.num_speculative_tokens, int) or not 1 <= self.num_speculative_tokens <= 16:
            raise ConfigError(f"num_speculative_tokens={self.num_speculative_tokens!r} must be an int in [1, 16]")
        if not isinstance(self.max_batch_size, int) or self.max_batch_size < 1:
            raise ConfigError(f"speculative max_batch_size={self.max_batch_size!r} must be an int >= 1")
        if not 0.0 <= self.min_acceptance < 1.0:
            raise ConfigError(f"min_acceptance={self.min_acceptance!r} must be in [0, 1)")
        if not 1 <= self.ngram_min_n <= self.ngram_max_n:
            raise ConfigError(f"ngram_min_n={self.ngram_min_n}, ngram_max_n={self.ngram_max_n} must satisfy "
                              f"1 <= ngram_min_n <= ngram_max_n")
        if self.method == "draft" and not self.draft_model:
            raise ConfigError("speculative method 'draft' needs draft_model=PATH (a smaller model with the "
                              "target's tokenizer); or use method 'ngram' / 'layer_skip'")
        if self.method != "draft" and self.draft_model:
            raise ConfigError(f"draft_model={self.draft_model!r} is only used by method 'draft', not "
                              f"{self.method!r}")
        if self.draft_quantization is not None:
            if self.method != "draft":
                raise ConfigError(f"draft_quantization={self.draft_quantization!r} is only used by method 'draft' "
                                  f"(a separate draft checkpoint), not {self.method!r}; a layer_skip draft shares "
                                  "the target's weights, quantized with the target's `quantization`")
            parse_quantization(self.draft_quantization, quantize_lm_head=self.draft_quantize_lm_head)
        elif self.draft_quantize_lm_head is not None:
            raise ConfigError(f"draft_quantize_lm_head={self.draft_quantize_lm_head!r} needs draft_quantization "
                              "(the draft's head is quantized only with its weights)")
        if self.draft_head_vocab is not None:
            if self.method != "draft":
                raise ConfigError(f"draft_head_vocab={self.draft_head_vocab!r} is only used by method 'draft' (a "
                                  f"separate draft checkpoint), not {self.method!r}")
            if isinstance(self.draft_head_vocab, bool) or not isinstance(self.draft_head_vocab, int) \
                    or self.draft_head_vocab < 1:
                raise ConfigError(f"draft_head_vocab={self.draft_head_vocab!r} must be an int >= 1 (token ids "
                                  "below it are the draft's vocabulary), or None for the whole vocabulary")
        if self.num_draft_layers is not None and self.num_draft_layers < 1:
            raise ConfigError(f"num_draft_layers={self.num_draft_layers} must be >= 1")
        if self.draft_num_pages is not None and self.draft_num_pages < 2:
            raise ConfigError(f"draft_num_pages={self.draft_num_pages} must be >= 2 (page 0 is reserved)")

    @classmethod
    def coerce(cls, value) -> "SpeculativeConfig | None":
        """None, a SpeculativeConfig, or a dict of its fields (unknown keys are an error naming them)."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, dict):
            names = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - names)
            if unknown:
                raise ConfigError(f"unknown speculative_config key(s) {unknown}; valid keys are {sorted(names)}")
            return cls(**value)
        raise ConfigError(f"speculative_config must be None, a dict or a SpeculativeConfig, got "
                          f"{type(value).__name__}")


# ---- the engine's configuration: one frozen group per concern, handed down whole ----------------------------
#
# Each field carries its help text (and choices) in its metadata: jaxinfer/cli_args.py generates the command-line
# flags of `jaxinfer generate`, `jaxinfer serve` and the benchmarks from them, and LLM(**options) routes each
# keyword to its group (EngineConfig.from_options). A field's name is its keyword and its flag (--max-num-seqs).

def _opt(default, help: str, *, choices: tuple | None = None, cli: bool = True, aliases: tuple = (),
         default_factory=None):
    """A config field with its documentation. cli=False: not a command-line flag (a programmatic option)."""
    meta = {"help": help, "choices": choices, "cli": cli, "aliases": aliases}
    if default_factory is not None:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _check_choice(name: str, value, choices: tuple):
    if value not in choices:
        raise ConfigError(f"{name} must be {_one_of(choices)}, got {value!r}")


def _one_of(choices: tuple) -> str:
    quoted = [repr(c) for c in choices]
    return ", ".join(quoted[:-1]) + " or " + quoted[-1]


DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class LoadConfig:
    """Which weights, in which dtype, quantized how (jaxinfer/weights/)."""

    model: str | None = _opt(None, "checkpoint dir, *.gguf file, hub id, or preset (with --load-format dummy); "
                                   "default: SmolLM2-135M-Instruct")
    load_format: str = _opt("auto", "auto: read the weights; dummy: random weights at the model's shape",
                            choices=("auto", "dummy"))
    dtype: str = _opt("auto", "compute dtype (auto: float32 checkpoints stay float32, others run in bfloat16)",
                      choices=DTYPES)
    quantization: str | None = _opt(
        None, "quantize weights on load: int8 | int4 | int4-g64 | int4-g32 | int4-asym | fp8 (W8A8); "
              "gguf: keep a GGUF file's own Q4_0 / Q4_1 / Q4_K weights quantized")
    quantize_lm_head: bool | None = _opt(
        None, "the LM head in the model's quantization (a tied head: a quantized copy of the embedding); "
              "--no-quantize-lm-head: a float head; default: an int8 head for int8 / int4 models")

    def __post_init__(self):
        _check_choice("load_format", self.load_format, ("auto", "dummy"))
        _check_choice("dtype", self.dtype, DTYPES)


@dataclasses.dataclass(frozen=True)
class SchedulerConfig:
    """What one step may hold and how steps follow each other (engine/scheduler.py, engine/engine.py)."""

    max_num_batched_tokens: int = _opt(2048, "token budget of one step")
    max_num_seqs: int = _opt(256, "sequences in one step")
    max_model_len: int | None = _opt(None, "context window (default: the model's max_position_embeddings, "
                                           "capped at 8192 on CPU)")
    async_scheduling: bool = _opt(True, "schedule and dispatch step n+1 while step n runs on the device")
    enable_prefix_caching: bool = _opt(
        True, "reuse the KV of full pages whose (chained) token content matches an earlier request's; requests "
              "asking for prompt_logprobs bypass it")

    def __post_init__(self):
        if self.max_num_seqs < 1:
            raise ConfigError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")


@dataclasses.dataclass(frozen=True)
class CacheConfig:
    """The paged KV cache (engine/kv_cache.py pages it; runner/model_runner.py allocates it)."""

    page_size: int = _opt(16, "tokens per KV page (a power of two; on a GPU one page of one KV head is at most "
                              "32 KiB: 128 tokens of a bf16 model of head dim 128)")
    num_pages: int | None = _opt(None, "KV pages (overrides the memory budget)")
    gpu_memory_utilization: float = _opt(0.9, "fraction of device memory the weights + KV cache may use")
    kv_cache_dtype: str = _opt(
        "auto", "KV cache storage: the model dtype, or fp8 (e4m3) / int8 with one float32 scale per token and KV "
                "head (pallas_kernels/paged_attention/kv_quant.py), ~1.9x the pages of bf16",
        choices=("auto", "fp8", "int8"))

    def __post_init__(self):
        if self.page_size < 1 or self.page_size & (self.page_size - 1):
            raise ConfigError(f"page_size must be a power of two >= 1, got {self.page_size}")
        if self.num_pages is not None and self.num_pages < 2:
            raise ConfigError(f"num_pages must be >= 2 (page 0 is reserved), got {self.num_pages}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        _check_choice("kv_cache_dtype", self.kv_cache_dtype, ("auto", "fp8", "int8"))


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """Devices of one host (jaxinfer/parallel.py). Several hosts: DistributedConfig."""

    tensor_parallel_size: int = _opt(1, "devices one model is split over", aliases=("-tp",))
    data_parallel_size: int = _opt(1, "model replicas on disjoint devices; requests go to the least-loaded one",
                                   aliases=("-dp",))

    def __post_init__(self):
        for name in ("tensor_parallel_size", "data_parallel_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {getattr(self, name)!r}")


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """A multi-host job, joined before the engine starts (parallel.initialize_distributed; command line only)."""

    coordinator_address: str | None = _opt(None, "multi-host: HOST:PORT of process 0 (env "
                                                 "JAXINFER_COORDINATOR_ADDRESS)")
    num_processes: int | None = _opt(None, "multi-host: env JAXINFER_NUM_PROCESSES")
    process_id: int | None = _opt(None, "multi-host: env JAXINFER_PROCESS_ID")


ATTENTION_BACKENDS = ("auto", "reference", "pallas", "cudnn")


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Which implementation computes attention and the quantized matmuls, and how they tile."""

    # auto: inside the engine on the H200 the kernel took batch-1 decode from 136 to 186 tok/s and offline
    # throughput from 2,088 to 6,349 output tok/s over the reference.
    attention_backend: str = _opt(
        "auto", "reference (jnp), pallas (the Pallas kernel; interpret mode on CPU, slow), cudnn (cuDNN's fused "
                "attention on the paged cache in decode-shaped steps, the Pallas kernel in the others: CUDA GPUs, "
                "bf16 / fp16 KV, no sliding window) or auto (on one GPU without speculation cuDNN in decode-shaped "
                "steps of >= 16 tokens, 1.23x the kernel's batch-256 decode on an H100, else the kernel; the "
                "reference off the GPU)",
        choices=ATTENTION_BACKENDS)
    kv_loop: str = _opt("auto", "reference attention: static (unrolled over the page-table width; no "
                                "device-to-host syncs: GPU), dynamic (while loop up to the longest context: CPU)",
                        choices=("auto", "static", "dynamic"))
    query_tile: int = _opt(16, "attention: tokens of one sequence per query tile in steps of more tokens than "
                               "sequences (the reference, the Pallas kernel, cuDNN's tile form)")
    kv_chunk_pages: int | None = _opt(None, "reference attention: KV pages per loop iteration (default: 128 "
                                            "with the static loop, 16 with the dynamic one)")
    min_bucket_tokens: int | None = _opt(None, "tokens of the smallest step shape; a step of fewer tokens pads to it "
                                               "(default 1: on GPU a 1-token bucket below 16, 32, ..., or 16 with "
                                               "speculation; runner/cpu_defaults.py)")
    prefill_buckets: bool | None = _opt(
        None, "step shapes for prompts that come alone or with a few decodes: beside each decode-shaped bucket "
              "(16 <= tokens <= max_num_seqs) one of the same tokens, tokens / 16 sequences and query_tile-token "
              "tiles (runner/buckets.py), compiled in the background after warm-up; default: on the CPU without "
              "speculation (measured there, not yet on a GPU)")
    quantized_matmul: str = _opt("auto", "quantized layers (pre-quantized checkpoints too): auto (on GPU int8 "
                                         "xla-nk, int4-g128 mosaic-int4 on one Hopper GPU, else triton-int4, "
                                         "other int4 pallas, XLA's fp8 dot for fp8; the jnp reference on CPU) | "
                                         "reference | xla | pallas | w8a8 (int8 only, activations quantized) | "
                                         "xla-nk (int8 only, [out, in] weights, weight-only) | "
                                         "xla-int4 (int4 only) | triton-int4 (int4 only, [out, in/2] weights: "
                                         "the small-M int4 kernel at M <= 16 on one device, XLA above) | "
                                         "mosaic-int4 (int4-g128 only, int4 [out, in] weights: the Mosaic GPU "
                                         "tensor-core kernels on Hopper: one at M <= 128, the many-token one above; "
                                         "one device) | "
                                         "mosaic-int8 (int8 only, opt-in, measured slower than xla-nk: xla-nk "
                                         "with the Mosaic GPU int8 kernel at M <= 16 on Hopper) | "
                                         "xla-nk-w8a8 (int8 only, opt-in: xla-nk weight-only up to 16 tokens a "
                                         "step, W8A8 above; activations quantized there) | "
                                         "mosaic-int4-w4a8 (int4 only, opt-in: mosaic-int4 below 2048 tokens a "
                                         "step, above them the weights rounded to fp8 and XLA's fp8 dot)",
                                 choices=MATMUL_BACKENDS)
    compilation_cache_dir: str | None = _opt(None, "JAX's persistent compilation cache (default: "
                                                   "$JAXINFER_CACHE/xla, ~/.cache/jaxinfer/xla)")

    def __post_init__(self):
        _check_choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _check_choice("kv_loop", self.kv_loop, ("auto", "static", "dynamic"))
        if self.min_bucket_tokens is not None and (not isinstance(self.min_bucket_tokens, int)
                                                   or self.min_bucket_tokens < 1):
            raise ConfigError(f"min_bucket_tokens must be an integer >= 1, got {self.min_bucket_tokens!r}")


# keyword (and flag) -> the EngineConfig group that holds it; "speculative_config" and "seed" are its own fields
GROUPS = {"load": LoadConfig, "scheduler": SchedulerConfig, "cache": CacheConfig, "parallel": ParallelConfig,
          "kernels": KernelConfig}


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Everything the engine needs, in groups handed down whole: load (weights), scheduler, cache, parallel,
    kernels, speculative (None: no speculation). Build it from flat keywords with `from_options` (what
    LLM(**options) does) or group by group; every group validates itself, this checks their combinations."""

    load: LoadConfig = dataclasses.field(default_factory=LoadConfig)
    scheduler: SchedulerConfig = dataclasses.field(default_factory=SchedulerConfig)
    cache: CacheConfig = dataclasses.field(default_factory=CacheConfig)
    parallel: ParallelConfig = dataclasses.field(default_factory=ParallelConfig)
    kernels: KernelConfig = dataclasses.field(default_factory=KernelConfig)
    speculative: SpeculativeConfig | None = None  # a dict of its fields is accepted too
    seed: int = 0  # random weights of dummy models (the draft: seed + 1) and the engine's default sampling seed

    def __post_init__(self):
        object.__setattr__(self, "speculative", SpeculativeConfig.coerce(self.speculative))
        if self.speculative is not None and (self.parallel.tensor_parallel_size > 1
                                             or self.parallel.data_parallel_size > 1):
            raise ConfigError("speculative_config with tensor_parallel_size / data_parallel_size > 1 is not supported "
                              "yet; run speculative decoding on one device")
        if self.scheduler.max_num_batched_tokens < self.kernels.query_tile:
            raise ConfigError(
                f"max_num_batched_tokens ({self.scheduler.max_num_batched_tokens}) must be >= query_tile "
                f"({self.kernels.query_tile})")
        self.quant_spec  # validates the quantization options together with the matmul backend

    @classmethod
    def option_names(cls) -> dict[str, str]:
        """Flat keyword -> the group holding it ("" for EngineConfig's own fields)."""
        names = {f.name: group for group, g in GROUPS.items() for f in dataclasses.fields(g)}
        names.update(speculative_config="", seed="")
        return names

    @classmethod
    def _by_group(cls, options: dict) -> dict[str, dict]:
        """Flat keywords -> {group ("" for EngineConfig's own fields): {name: value}}; unknown keywords are a
        ConfigError naming them and listing the valid ones (less LLM's own model / load_format / dtype)."""
        names = cls.option_names()
        unknown = sorted(set(options) - set(names))
        if unknown:
            raise ConfigError(f"unknown option(s) {unknown}; valid engine options are "
                              f"{sorted(set(names) - {'model', 'load_format', 'dtype'})}")
        out: dict[str, dict] = {}
        for k, v in options.items():
            out.setdefault(names[k], {})[k] = v
        return out

    @classmethod
    def from_options(cls, **options) -> "EngineConfig":
        """EngineConfig from flat keywords (LLM(model=..., max_num_seqs=..., speculative_config=...)): each goes
        to its group."""
        by = cls._by_group(options)
        own = by.pop("", {})
        return cls(**{g: GROUPS[g](**by.get(g, {})) for g in GROUPS},
                   speculative=own.get("speculative_config"), seed=own.get("seed", 0))

    def replace(self, **options) -> "EngineConfig":
        """A copy with some flat keywords changed (e.g. replace(num_pages=64, speculative_config=None))."""
        by = self._by_group(options)
        own = by.pop("", {})
        changes = {g: dataclasses.replace(getattr(self, g), **kw) for g, kw in by.items()}
        if "speculative_config" in own:
            changes["speculative"] = own["speculative_config"]
        if "seed" in own:
            changes["seed"] = own["seed"]
        return dataclasses.replace(self, **changes)

    @property
    def quant_spec(self):
        """QuantSpec (or KeepGGUFQuantization) of the quantization options, or None."""
        return parse_quantization(self.load.quantization, quantize_lm_head=self.load.quantize_lm_head,
                                  backend=self.kernels.quantized_matmul)
