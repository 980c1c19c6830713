"""quantization='gguf': keep a GGUF file's 4-bit linear weights quantized instead of dequantizing them.

    LLM("model.Q4_1.gguf", quantization="gguf")   # the file's Q4_0 / Q4_1 / Q4_K projections stay int4
    LLM("model.Q4_1.gguf")                        # (default) every tensor dequantized to the model dtype
    LLM("model.Q4_1.gguf", quantization="int8")   # dequantized, then re-quantized by round-to-nearest (a second
                                                  # rounding on top of the file's; allowed, as before)

What is kept, per GGUF type of a decoder projection (block layouts in weights/prequantized.py):
  Q4_0  w = d * (q - 8)              -> int4 symmetric,        group 32 (exact)
  Q4_1  w = d * q + m                -> int4 with zero points, group 32 (zero = -m / d: float32 rounding)
  Q4_K  w = d*sc_j * q - dmin*m_j    -> int4 with zero points, group 32 (one group per 32-value sub-block)
  Q8_0  one f16 scale per 32 inputs of a row. Not kept: our int8 layout (pallas_kernels/quantized_matmul) has one
        scale per output column and no groups, so Q8_0 would need re-rounding -> dequantized, float Linear.
  Q5_0/1, Q2_K/Q3_K/Q5_K/Q6_K, F16/BF16/F32: no matching kernel layout -> dequantized, float Linear.
q/k/v (fused attn.qkv) and gate/up (fused mlp.gate_up) run as one matmul, so such a module is kept only when all
of its parts are keepable (Q4_0 and Q4_1 parts mix: the device int4 form u * scale + offset holds both);
otherwise all its parts are dequantized. Embeddings, norms and the LM head (output.weight, or the tied
embedding) always stay float, whatever their type (e.g. SmolLM2's Q8_0 token_embd).

On the device an int4 weight is u * scale + offset with scale and offset in the model dtype: a bfloat16 model
rounds the file's f16 d and m to bf16 (8 mantissa bits instead of 11); a float32 model keeps them (to float32
rounding of zero = -m / d). That is the only difference from gguf's own dequantization.
"""
from __future__ import annotations

import logging
import re
from collections import Counter

import numpy as np

from jaxinfer.config import KeepGGUFQuantization, QuantizationError, QuantSpec
from jaxinfer.weights.quant_tensor import QuantizedTensor

log = logging.getLogger("jaxinfer")

# GGUF linear tensor -> (module path inside layers[i], HF name inside model.layers.{i}).
_LINEARS = {
    "attn_q": (("attn", "qkv"), "self_attn.q_proj.weight"),
    "attn_k": (("attn", "qkv"), "self_attn.k_proj.weight"),
    "attn_v": (("attn", "qkv"), "self_attn.v_proj.weight"),
    "attn_output": (("attn", "o"), "self_attn.o_proj.weight"),
    "ffn_gate": (("mlp", "gate_up"), "mlp.gate_proj.weight"),
    "ffn_up": (("mlp", "gate_up"), "mlp.up_proj.weight"),
    "ffn_down": (("mlp", "down"), "mlp.down_proj.weight"),
}
_LINEAR_RE = re.compile(r"^blk\.(\d+)\.(" + "|".join(_LINEARS) + r")\.weight$")
_PARTS = Counter(module for module, _ in _LINEARS.values())  # module -> number of GGUF tensors fused into it


def plan_kept_modules(reader, num_layers: int) -> tuple[dict[tuple, list[str]], dict[tuple, list[str]]]:
    """Which decoder projections of a GGUF file stay quantized, from the tensors' types only (no data read).

    Returns (kept, floating): module path ('layers', i, 'attn', 'qkv') -> the GGUF types of its parts."""
    from jaxinfer.weights.prequantized import GGUF_KEEPABLE_TYPES

    parts: dict[tuple, dict[str, tuple[str, int]]] = {}
    for t in reader.tensors:
        m = _LINEAR_RE.match(t.name)
        if m:
            path = ("layers", int(m.group(1))) + _LINEARS[m.group(2)][0]
            parts.setdefault(path, {})[t.name] = (t.tensor_type.name, int(t.shape[0]))  # shape[0]: in_features
    kept, floating = {}, {}
    for i in range(num_layers):
        for module, n in _PARTS.items():
            path = ("layers", i) + module
            have = parts.get(path, {})
            types = sorted(type_name for type_name, _ in have.values())
            keep = len(have) == n and all(type_name in GGUF_KEEPABLE_TYPES and n_in % GGUF_KEEPABLE_TYPES[type_name]
                                          == 0 for type_name, n_in in have.values())
            (kept if keep else floating)[path] = types
    return kept, floating


def keep_gguf_quantization(src, request: KeepGGUFQuantization):
    """(QuantSpec | None, tensor iterator) for load_model: the spec of the file's kept int4 projections (None when
    nothing can be kept: the model loads float, with a warning) and the stream of HF-named tensors, kept ones as
    QuantizedTensor [in, out], all others dequantized float32."""
    from gguf import GGUFReader

    from jaxinfer.weights.gguf import iter_gguf_tensors

    if src.kind != "gguf":
        raise QuantizationError(
            f"quantization='gguf' keeps a GGUF file's own quantized weights, but {src.name or src.path!r} is a "
            f"{src.kind!r} model, not a *.gguf file loaded with load_format='auto'; use quantization='int8', "
            "'int4' or 'fp8' to quantize it on load, or drop the option")
    reader = GGUFReader(src.path, "r")
    num_layers = int(src.hf_config["num_hidden_layers"])
    kept, floating = plan_kept_modules(reader, num_layers)
    float_types = Counter(t for types in floating.values() for t in types)
    if not kept:
        log.warning("quantization='gguf': no decoder projection of %s is Q4_0 / Q4_1 / Q4_K (types %s); they are "
                    "dequantized and the model runs in float", src.name, dict(float_types))
        return None, iter_gguf_tensors(reader)
    kept_types = Counter(t for types in kept.values() for t in types)
    log.info("quantization='gguf': %d of %d decoder projections of %s stay int4 group 32 (%s)%s", len(kept),
             len(kept) + len(floating), src.name, dict(kept_types),
             f"; dequantized to float: {dict(float_types)}" if floating else "")
    keep_names = frozenset(f"model.layers.{m.group(1)}.{_LINEARS[m.group(2)][1]}" for t in reader.tensors
                           if (m := _LINEAR_RE.match(t.name)) and
                           ("layers", int(m.group(1))) + _LINEARS[m.group(2)][0] in kept)
    symmetric = set(kept_types) == {"Q4_0"}
    spec = QuantSpec("int4", 32, symmetric=symmetric, backend=request.backend, float_modules=frozenset(floating))
    stream = iter_gguf_tensors(reader, keep_quantized=keep_names)
    return spec, (stream if symmetric else _with_zero_points(stream))


def _with_zero_points(stream):
    """Q4_0 tensors (symmetric, q in [-8, 7]) in zero-point form (q + 8, zero 8: the same values, and the same
    device leaves), so they fuse with Q4_1 / Q4_K parts (quant_tensor.concat_out wants one form)."""
    for name, t in stream:
        if isinstance(t, QuantizedTensor) and t.zero is None:
            t = QuantizedTensor("int4", (t.q.astype(np.int16) + 8).astype(np.int8), t.scale,
                                np.full_like(t.scale, 8.0), t.group_size)
        yield name, t
