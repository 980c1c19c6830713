"""Frozen, validated configuration dataclasses (no jax).

`ModelConfig` is read from a Hugging Face `config.json` (or the dict built from GGUF metadata). Everything the
model code does not implement is rejected with an error naming the option (which families exist is
models/registry.py's table), so an unsupported checkpoint never produces silently wrong text.

`SpeculativeConfig` and the quantization options (`QuantSpec`, `parse_quantization`) follow, then the engine's
configuration: `EngineConfig`, made of one group per concern (load, scheduler, cache, parallel, kernels,
speculative) that is handed down whole to the part that reads it. Field metadata documents every option; the
command-line flags are generated from it (cli_args.py).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

_SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


class ConfigError(ValueError):
    """An option jaxinfer does not support, or an invalid value."""


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling. `kind` is "linear" or "llama3" (Llama 3.1+)."""

    kind: str
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Shape and numerics of a Llama-family decoder (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3, SmolLM2)."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 and Llama with attention_bias
    o_bias: bool = False  # Llama with attention_bias
    qk_norm: bool = False  # Qwen3: RMSNorm over head_dim on q and k before RoPE
    sliding_window: int | None = None  # Mistral v0.1: attend to at most this many previous tokens
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    dtype: str = "bfloat16"  # the checkpoint's own dtype (torch_dtype)

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads "
                f"({self.num_kv_heads})")

    @property
    def q_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def qkv_size(self) -> int:
        """Width of the fused QKV projection: [q heads of kv head 0, k0, v0, q heads of kv head 1, ...]."""
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        per_layer = h * self.qkv_size + self.num_heads * self.head_dim * h + 3 * h * i + 2 * h
        if self.qkv_bias:
            per_layer += self.qkv_size
        if self.o_bias:
            per_layer += h
        if self.qk_norm:
            per_layer += 2 * self.head_dim
        head = 0 if self.tie_word_embeddings else h * v
        return v * h + self.num_layers * per_layer + h + head

    def kv_bytes_per_token(self, itemsize: int) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * itemsize

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> "ModelConfig":
        """Build from a Hugging Face config dict; reject the options the model code does not implement. Which
        model_type / architectures exist is the registry's table: models/registry.model_config(hf) checks those
        and then calls this (the loader and `jaxinfer info` go through it)."""
        model_type = hf.get("model_type")
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"unsupported hidden_act {act!r}: only 'silu' (SwiGLU MLP) is implemented")
        if hf.get("mlp_bias"):
            raise ConfigError("unsupported option mlp_bias=True: the MLP projections have no bias in jaxinfer")
        if hf.get("pretraining_tp", 1) not in (1, None):
            # pretraining_tp only changes how transformers slices the matmul; the math is the same.
            pass
        hidden = int(hf["hidden_size"])
        num_heads = int(hf["num_attention_heads"])
        head_dim = hf.get("head_dim") or hidden // num_heads
        rope_theta, rope_scaling = _rope_from_hf(hf)
        attention_bias = bool(hf.get("attention_bias", False))
        qkv_bias = model_type == "qwen2" or attention_bias
        o_bias = model_type in ("llama", "mistral") and attention_bias
        sliding_window = _sliding_window_from_hf(hf, model_type)
        eos = hf.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
        dtype = str(hf.get("torch_dtype") or hf.get("dtype") or "bfloat16").replace("torch.", "")
        return cls(
            model_type=model_type,
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            qk_norm=model_type == "qwen3",
            sliding_window=sliding_window,
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=eos_ids,
            dtype=dtype,
        )


def _rope_from_hf(hf: dict[str, Any]) -> tuple[float, RopeScaling | None]:
    # transformers >= 5 writes `rope_parameters` (with rope_theta inside); older configs write
    # `rope_theta` + `rope_scaling`.
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    theta = float(params.get("rope_theta", hf.get("rope_theta", 10000.0)))
    merged = {**params, **scaling}
    kind = merged.get("rope_type", merged.get("type", "default")) or "default"
    if kind not in _SUPPORTED_ROPE_TYPES:
        raise ConfigError(
            f"unsupported rope scaling type {kind!r}; jaxinfer implements {', '.join(_SUPPORTED_ROPE_TYPES)}")
    if kind == "default":
        return theta, None
    factor = float(merged["factor"])
    if kind == "linear":
        return theta, RopeScaling(kind="linear", factor=factor)
    return theta, RopeScaling(
        kind="llama3",
        factor=factor,
        low_freq_factor=float(merged.get("low_freq_factor", 1.0)),
        high_freq_factor=float(merged.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(merged.get("original_max_position_embeddings", 8192)),
    )


def _sliding_window_from_hf(hf: dict[str, Any], model_type: str) -> int | None:
    window = hf.get("sliding_window")
    if model_type in ("qwen2", "qwen3"):
        if hf.get("use_sliding_window"):
            raise ConfigError(
                f"unsupported option use_sliding_window=True for {model_type} (per-layer windows); "
                "use a checkpoint with use_sliding_window=false")
        return None
    if window is None:
        return None
    window = int(window)
    return window if window < int(hf.get("max_position_embeddings", 0) or 1 << 30) else None


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
    num_draft_layers: layer_skip draft depth (default: a quarter of the target's layers, at least 1).
    draft_num_pages: KV pages of the draft's own cache (default: as many as the target's).
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
    num_draft_layers: int | None = None
    draft_num_pages: int | None = None

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


# ---- quantization: what `quantization=` asks for, parsed and validated without jax ---------------------------
#
#   quantization: "int8"            per-output-channel symmetric int8 weights (bf16 activations)
#                 "int4"            group-wise int4, group 128, symmetric; "int4-g64" / "int4-g32" other groups;
#                                   "int4-asym" (or "int4-g64-asym", ...) asymmetric with zero points
#                 "fp8"             e4m3 weights with per-channel scales, activations quantized per token (W8A8)
#                 "gguf"            GGUF files only: keep the file's own Q4_0 / Q4_1 / Q4_K linear weights quantized
#                                   (int4, group 32) instead of dequantizing them; see weights/gguf_quant.py
#   quantize_lm_head: None (default): int8 and int4 models get an int8 LM head when the model has its own (untied)
#                head, so the whole decode step streams quantized weights (a tied head stays the float embedding);
#                fp8 models keep a float head. True: the head in the model's own method (untied models only, an
#                error otherwise). False: a float head. Embeddings always stay in the model dtype.
#   quantized_matmul: "auto" (on GPU the per-M table of models/quant_paths.py for int8/int4 — the Pallas kernel
#                at every M until the GPU sweep fills it — and XLA's native fp8 dot for fp8; the jnp reference on
#                CPU), "reference", "xla", "pallas" (interpret mode on CPU: slow, for tests), "w8a8" (int8 only:
#                activations quantized per token to int8, XLA's int8 dot; changes numerics) or "xla-int4" (int4
#                only: XLA-native int4 weights, formulation per M from the table).

QUANT_METHODS = ("int8", "int4", "fp8")
INT4_GROUP_SIZES = (32, 64, 128)
MATMUL_BACKENDS = ("auto", "reference", "xla", "pallas", "w8a8", "xla-int4")
_BACKEND_METHODS = {"w8a8": "int8", "xla-int4": "int4"}   # backends for one method only
_INT4_RE = re.compile(r"int4(?:-g(\d+))?(-asym|-sym)?")


class QuantizationError(ConfigError):
    """An invalid or unsupported quantization request."""


@dataclasses.dataclass(frozen=True)
class QuantSpec:
    method: str                 # "int8" | "int4" | "fp8"
    group_size: int | None = None  # int4 only
    symmetric: bool = True      # int4 round-to-nearest: symmetric [-8, 7] or asymmetric [0, 15] with zero points
    lm_head: bool = False       # quantize the LM head too
    head_method: str | None = None  # the LM head's method when it differs from `method` (the int8 default head)
    head_optional: bool = False  # a tied model (no head of its own) keeps its embedding head without an error
    backend: str = "auto"       # quantized_matmul option (see the module docstring)
    # Decoder projections that stay float Linears, as module paths ('layers', i, 'attn', 'qkv'): the layers of a
    # GGUF file whose type cannot be kept quantized (weights/gguf_quant.py). Empty for quantization on load.
    float_modules: frozenset = frozenset()

    def __post_init__(self):
        if self.method not in QUANT_METHODS:
            raise QuantizationError(f"unknown quantization method {self.method!r}; use one of {QUANT_METHODS}")
        if self.method == "int4" and self.group_size not in INT4_GROUP_SIZES:
            raise QuantizationError(
                f"int4 group size {self.group_size} is not supported; use one of {INT4_GROUP_SIZES} "
                "(e.g. quantization='int4-g64')")
        if self.method != "int4" and (self.group_size is not None or not self.symmetric):
            raise QuantizationError(f"{self.method} is per-channel symmetric: no group size or zero points")
        if self.backend not in MATMUL_BACKENDS:
            raise QuantizationError(f"quantized_matmul must be one of {MATMUL_BACKENDS}, got {self.backend!r}")
        only = _BACKEND_METHODS.get(self.backend)
        if only is not None and self.method != only:
            raise QuantizationError(
                f"quantized_matmul={self.backend!r} is for {only} models only, not {self.name}; use 'auto'")
        if self.method == "fp8" and self.backend == "pallas":
            raise QuantizationError(
                "fp8 (W8A8) runs through XLA's native fp8 dot, there is no Pallas fp8 kernel; use "
                "quantized_matmul='auto' or 'xla'")

    def head_spec(self) -> "QuantSpec":
        """The spec the LM head is quantized with (meaningful when lm_head): int8 for the default head of an
        int4 model, else this spec. A backend for another method only ('xla-int4') becomes 'auto' for it."""
        method = self.head_method or self.method
        if method == self.method:
            return self
        backend = self.backend if _BACKEND_METHODS.get(self.backend, method) == method else "auto"
        return QuantSpec(method, None, lm_head=True, backend=backend)

    @property
    def name(self) -> str:
        if self.method != "int4":
            return self.method
        return f"int4-g{self.group_size}" + ("" if self.symmetric else "-asym")


@dataclasses.dataclass(frozen=True)
class KeepGGUFQuantization:
    """quantization='gguf': keep a GGUF file's quantized linear weights as they are. The loader turns it into the
    QuantSpec the file implies (weights/gguf_quant.py); any other model source refuses it."""
    backend: str = "auto"
    name = "gguf"

    def __post_init__(self):
        if self.backend not in MATMUL_BACKENDS:
            raise QuantizationError(f"quantized_matmul must be one of {MATMUL_BACKENDS}, got {self.backend!r}")


def parse_quantization(quantization: str | None, *, quantize_lm_head: bool | None = None,
                       backend: str = "auto") -> QuantSpec | KeepGGUFQuantization | None:
    """'int8' | 'int4[-g32|-g64|-g128][-asym]' | 'fp8' | 'gguf' | None -> QuantSpec (None: no quantization;
    'gguf': KeepGGUFQuantization, resolved against the file at load). quantize_lm_head: see the comment above
    (None: the int8 head of int8 / int4 models)."""
    if quantization is None or quantization in ("none", ""):
        if quantize_lm_head:
            raise QuantizationError("quantize_lm_head=True needs quantization='int8', 'int4' or 'fp8'")
        return None
    if not isinstance(quantization, str):
        raise QuantizationError(f"quantization must be a string like 'int8', 'int4' or 'fp8', got {quantization!r}")
    q = quantization.strip().lower()
    if q == "gguf":
        if quantize_lm_head:
            raise QuantizationError(
                "quantize_lm_head=True does not combine with quantization='gguf': a GGUF file's LM head (or tied "
                "embedding) stays float; drop quantize_lm_head, or use quantization='int8' / 'int4' / 'fp8' to "
                "re-quantize the dequantized weights")
        return KeepGGUFQuantization(backend)
    head = _head_fields(q.split("-")[0], quantize_lm_head)
    if q in ("int8", "fp8"):
        return QuantSpec(q, backend=backend, **head)
    m = _INT4_RE.fullmatch(q)
    if m is None:
        raise QuantizationError(
            f"unknown quantization {quantization!r}; use 'int8', 'fp8', 'int4' (group 128, symmetric), "
            "'int4-g64', 'int4-g32', an asymmetric variant such as 'int4-asym' / 'int4-g64-asym', or 'gguf' "
            "(a GGUF file's own quantization)")
    group = int(m.group(1)) if m.group(1) else 128
    return QuantSpec("int4", group, symmetric=m.group(2) != "-asym", backend=backend, **head)


def _head_fields(method: str, quantize_lm_head: bool | None) -> dict:
    """QuantSpec's LM-head fields for the quantize_lm_head option (the comment above)."""
    if quantize_lm_head is None:
        if method in ("int8", "int4"):
            return dict(lm_head=True, head_method="int8", head_optional=True)
        return dict(lm_head=False)
    return dict(lm_head=bool(quantize_lm_head))


def checkpoint_quantization(hf_config: dict) -> str | None:
    """The quantization a Hugging Face checkpoint already carries ('int4' for AWQ / 4-bit GPTQ, 'int8' for 8-bit
    GPTQ, 'fp8' for fp8 / compressed-tensors float8), or None for a float checkpoint."""
    qc = hf_config.get("quantization_config") or hf_config.get("compression_config")
    if not qc:
        return None
    method = str(qc.get("quant_method", "")).lower()
    bits = qc.get("bits", qc.get("w_bit"))
    if method == "awq":
        return "int4"
    if method == "gptq":
        return {4: "int4", 8: "int8"}.get(int(bits or 4), f"gptq-{bits}bit")
    if method in ("fp8", "fbgemm_fp8"):
        return "fp8"
    if method == "compressed-tensors":
        text = str(qc).lower()
        return "fp8" if "float" in text and "8" in text else "compressed-tensors"
    return method or "unknown"


def check_checkpoint_compatible(spec: QuantSpec | None, hf_config: dict, name: str = "the checkpoint"):
    """Refuse to re-quantize a checkpoint that is already quantized with another method."""
    have = checkpoint_quantization(hf_config)
    if spec is None or have is None:
        return
    if have != spec.method:
        raise QuantizationError(
            f"{name} is already quantized ({have}, quant_method="
            f"{(hf_config.get('quantization_config') or hf_config.get('compression_config')).get('quant_method')!r})"
            f" but quantization={spec.name!r} was requested; drop the quantization option to use the "
            f"checkpoint's own {have} weights, or load a float checkpoint to quantize it as {spec.name}")


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
        None, "the LM head in the model's quantization (untied models); --no-quantize-lm-head: a float head; "
              "default: an int8 head for int8 / int4 models")

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

    page_size: int = _opt(16, "tokens per KV page (a power of two)")
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


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """Which implementation computes attention and the quantized matmuls, and how they tile."""

    # auto: inside the engine on the H200 the kernel took batch-1 decode from 136 to 186 tok/s and offline
    # throughput from 2,088 to 6,349 output tok/s over the reference.
    attention_backend: str = _opt(
        "auto", "reference (jnp), pallas (the Pallas kernel; interpret mode on CPU, slow) or auto (the kernel on "
                "GPU, the reference elsewhere)", choices=("auto", "reference", "pallas"))
    kv_loop: str = _opt("auto", "reference attention: static (unrolled over the page-table width; no "
                                "device-to-host syncs: GPU), dynamic (while loop up to the longest context: CPU)",
                        choices=("auto", "static", "dynamic"))
    query_tile: int = _opt(16, "reference attention: tokens of one sequence per query tile")
    kv_chunk_pages: int | None = _opt(None, "reference attention: KV pages per loop iteration (default: 128 "
                                            "with the static loop, 16 with the dynamic one)")
    quantized_matmul: str = _opt("auto", "quantized layers: auto (on GPU the per-M table of models/quant_paths.py "
                                         "for int8/int4, XLA's fp8 dot for fp8; the jnp reference on CPU) | "
                                         "reference | xla | pallas | w8a8 (int8 only, activations quantized) | "
                                         "xla-int4 (int4 only)",
                                 choices=MATMUL_BACKENDS)
    compilation_cache_dir: str | None = _opt(None, "JAX's persistent compilation cache (default: "
                                                   "$JAXINFER_CACHE/xla, ~/.cache/jaxinfer/xla)")

    def __post_init__(self):
        _check_choice("attention_backend", self.attention_backend, ("auto", "reference", "pallas"))
        _check_choice("kv_loop", self.kv_loop, ("auto", "static", "dynamic"))


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
