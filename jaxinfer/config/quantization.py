"""Quantization options: what `quantization=` asks for (QuantSpec, KeepGGUFQuantization), parsed and validated
without jax, and the checks against a checkpoint's own quantization."""
from __future__ import annotations

import dataclasses
import re

from jaxinfer.config.model import ConfigError

# ---- quantization: what `quantization=` asks for, parsed and validated without jax ---------------------------
#
#   quantization: "int8"            per-output-channel symmetric int8 weights (bf16 activations)
#                 "int4"            group-wise int4, group 128, symmetric; "int4-g64" / "int4-g32" other groups;
#                                   "int4-asym" (or "int4-g64-asym", ...) asymmetric with zero points
#                 "fp8"             e4m3 weights with per-channel scales, activations quantized per token (W8A8)
#                 "gguf"            GGUF files only: keep the file's own Q4_0 / Q4_1 / Q4_K linear weights quantized
#                                   (int4, group 32) instead of dequantizing them; see weights/gguf_quant.py
#   quantize_lm_head: None (default): int8 and int4 models get an int8 LM head, so the whole decode step streams
#                quantized weights; fp8 models keep a float head. True: the head in the model's own method. False:
#                a float head. Embeddings always stay in the model dtype. A model whose head is tied to the
#                embedding (tie_word_embeddings: Llama-3.2-1B, SmolLM2) gets a quantized head as a separate copy,
#                RTN of embed.T ([H, V], the same logical axes as an untied head), while the embedding stays
#                float for the token lookups: the head costs V x H bytes (int8; V x H / 2 for an int4 head) + its
#                scales on top of the float model (Llama-3.2-1B: +263 MB int8 next to the 525 MB bf16 embedding),
#                and each decode step streams those instead of the bf16 embedding. quantization='gguf' never
#                quantizes the head (weights/gguf_quant.py).
#   quantized_matmul: "auto" (on GPU: int8 'xla-nk', int4 group 128 'mosaic-int4' on one Hopper GPU and
#                'triton-int4' elsewhere, XLA's native fp8 dot for fp8; the jnp reference on CPU), "reference",
#                "xla", "pallas" (interpret mode on CPU: slow, for tests), "w8a8" (int8 only:
#                activations quantized per token to int8, XLA's int8 dot; changes numerics), "xla-nk" (int8 only:
#                [out, in] weights, weight-only, formulation per weight size and M from the table: on a GPU the
#                Pallas-Triton small-M kernel at M <= 16, XLA's convert + dot above), "xla-int4" (int4 only:
#                XLA-native int4 weights, formulation per M from the table) or "triton-int4" (int4 only: [out, in/2]
#                packed weights, the small-M int4 kernel at M <= 16 on one device, XLA dequantize + dot above / under TP)
#                or "mosaic-int4" (int4 group 128 only: signed int4 [out, in] weights, the Mosaic GPU tensor-core
#                kernels on a Hopper GPU, one at M <= 128 and the many-token one above; one device only) or "mosaic-int8"
#                (int8 only, opt-in, measured slower than 'xla-nk': its [out, in] weights, the Mosaic GPU int8 kernel
#                at M <= 16 on a Hopper GPU instead of the Pallas-Triton one, XLA's convert + dot above) or
#                "xla-nk-w8a8" (int8 only, opt-in: 'xla-nk''s weights, weight-only up to 16 tokens a step and W8A8
#                through XLA's int8 dot above, activations quantized per token: prefill and large batches change
#                numerics, as 'w8a8' does everywhere; for the offline speed of int8, see models/quant_paths.py)
#                or "mosaic-int4-w4a8" (int4 only, opt-in: 'mosaic-int4''s weights and kernels up to
#                W4A8_MIN_TOKENS - 1 tokens a step (XLA's dequantize + dot where a kernel cannot run: other group
#                sizes, other GPUs), W4A8 above: the weights rounded to e4m3 per output channel, the activations
#                per token, XLA's fp8 dot; changes the numerics of large steps, for the offline speed of int4).

QUANT_METHODS = ("int8", "int4", "fp8")
INT4_GROUP_SIZES = (32, 64, 128)
MATMUL_BACKENDS = ("auto", "reference", "xla", "pallas", "w8a8", "xla-nk", "xla-nk-w8a8", "xla-int4", "triton-int4",
                   "mosaic-int4", "mosaic-int8", "mosaic-int4-w4a8")
_BACKEND_METHODS = {"w8a8": "int8", "xla-nk": "int8", "xla-nk-w8a8": "int8", "xla-int4": "int4",
                    "triton-int4": "int4", "mosaic-int4": "int4", "mosaic-int8": "int8",
                    "mosaic-int4-w4a8": "int4"}  # one method only
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
        if self.backend == "mosaic-int4" and self.group_size != 128:
            raise QuantizationError(
                f"quantized_matmul='mosaic-int4' takes int4 group 128 weights only (its kernel dequantizes one "
                f"128-wide group a step), not {self.name}; use 'auto' for other group sizes")
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
            return dict(lm_head=True, head_method="int8")
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


SMOOTHQUANT_KEY = "jaxinfer_smoothquant"  # config.json key `jaxinfer smoothquant` writes ({alpha, calibration_tokens})
SMOOTHQUANT_BACKEND = "xla-nk-w8a8"


def smoothed_checkpoint_spec(spec, hf_config: dict, platform: str, *, distributed: bool = False):
    """The QuantSpec to load a checkpoint with: int8 with quantized_matmul='auto' on a SmoothQuant-smoothed
    checkpoint (its config carries SMOOTHQUANT_KEY) on one GPU becomes SMOOTHQUANT_BACKEND (W8A8 above 16 tokens a
    step: its offline throughput is 1.08x bf16 where weight-only int8's is 0.83x, H100, benchmarks/README.md
    "2026-12-06 e"; smoothing is what keeps W8A8's perplexity near the int8 bound). Anything else unchanged: other
    methods, an explicit backend, the CPU (its 'reference' path is weight-only), parallel plans (untested there)."""
    if (isinstance(spec, QuantSpec) and spec.method == "int8" and spec.backend == "auto" and platform == "gpu"
            and not distributed and SMOOTHQUANT_KEY in (hf_config or {})):
        return dataclasses.replace(spec, backend=SMOOTHQUANT_BACKEND)
    return spec


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
