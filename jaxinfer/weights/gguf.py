"""GGUF file -> Hugging Face style config dict, HF-named float32 numpy tensors, and an HF tokenizer.

The rest of jaxinfer only knows Hugging Face checkpoints (config.json + `model.layers.{i}...` tensors with
HF layouts), so this module translates a llama.cpp GGUF file into exactly that:

* `gguf_to_hf_config(reader_or_path) -> dict` reads the metadata (`{arch}.block_count`, ...).
* `iter_gguf_tensors(path)` yields `(hf_name, float32 array)` one tensor at a time (the file is memory-mapped;
  each tensor is dequantized only when the caller asks for it, so peak host memory is ~one fp32 tensor
  beyond what the caller keeps).
* `load_gguf_tokenizer(path)` builds a transformers tokenizer from the embedded vocabulary/merges.

Conventions undone here (both verified against transformers' own GGUF loader in
tests/numerics/test_gguf_loader.py):

1. Shapes. GGUF stores `ne` (fastest dimension first), so `ReaderTensor.shape` is numpy's shape reversed.
   `ReaderTensor.data` is already in numpy order (rows, ...), and `gguf.quants.dequantize` returns
   numpy order too, so a linear weight comes back as [out_features, in_features] == torch nn.Linear layout.
2. RoPE row permutation (architecture "llama" only, which includes Mistral GGUFs). llama.cpp's
   convert_hf_to_gguf.py permutes the rows of attn_q / attn_k (weights and biases) so its *interleaved*
   RoPE (pairs (2j, 2j+1)) equals HF's *rotate-half* RoPE (pairs (j, j + head_dim/2)):
       gguf = hf.reshape(n_head, 2, head_dim // 2, ...).swapaxes(1, 2).reshape(hf.shape)
   We apply the inverse (same as transformers' LlamaTensorProcessor._reverse_permute_weights):
       hf = gguf.reshape(n_head, head_dim // 2, 2, ...).swapaxes(1, 2).reshape(gguf.shape)
   with n_head = num_attention_heads for Q and num_key_value_heads for K.
   qwen2 / qwen3 GGUFs are NOT permuted (llama.cpp runs them with NEOX-style rotate-half RoPE already).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

import gguf
from gguf import GGMLQuantizationType, GGUFReader

from jaxinfer.models.registry import hf_architecture_name
from jaxinfer.weights.gguf_reader import (find_tensor, gguf_architecture, gguf_field, numpy_shape, open_gguf,
                                         require_field, reverse_rope_permute, rope_permuted_heads, to_hf_name)
from jaxinfer.weights.prequantized import gguf_linear_quantized

# Quantization types we dequantize (all through gguf.quants.dequantize, pure numpy). Listed explicitly so an
# exotic type fails with a clear message at the tensor that uses it, not deep inside gguf.
SUPPORTED_QUANT_TYPES = frozenset(
    GGMLQuantizationType[name]
    for name in (
        "F32", "F16", "BF16",
        "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    )
)  # fmt: skip

def gguf_to_hf_config(reader_or_path: GGUFReader | str | os.PathLike) -> dict:
    """Hugging Face `config.json`-style dict for a llama / mistral / qwen2 / qwen3 GGUF file.

    Keys: model_type, architectures, hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
    num_key_value_heads, head_dim, rms_norm_eps, rope_theta, max_position_embeddings, vocab_size,
    tie_word_embeddings, attention_bias, hidden_act, bos/pad/unk_token_id (when present), eos_token_id (int, or
    a list when the file also names end-of-turn tokens), sliding_window=None for Mistral, and rope_scaling
    (only when the file carries scaling metadata or Llama-3 rope_freqs).
    Raises ValueError naming the architecture when it is not supported.
    """
    reader = open_gguf(reader_or_path)
    arch = gguf_architecture(reader)
    k = lambda suffix: f"{arch}.{suffix}"  # noqa: E731  metadata keys are prefixed with the architecture

    name = str(gguf_field(reader, "general.name", "") or "")
    # llama.cpp writes Mistral models as "llama"; transformers tells them apart by name, and so do we.
    model_type = "mistral" if arch == "llama" and "mistral" in name.lower() else arch

    hidden = int(require_field(reader, k("embedding_length")))
    n_heads = int(require_field(reader, k("attention.head_count")))
    n_kv = gguf_field(reader, k("attention.head_count_kv"), n_heads)
    if isinstance(n_kv, list):  # per-layer lists exist for hybrid models; we need one value
        if len(set(n_kv)) != 1:
            raise ValueError(f"GGUF {k('attention.head_count_kv')}={n_kv} varies per layer; not supported.")
        n_kv = n_kv[0]
    # head_dim: explicit key_length when written (qwen3 has head_dim != hidden/heads), else the RoPE dimension
    # (== head_dim for full-rotary llama/mistral), else hidden / heads.
    head_dim = gguf_field(reader, k("attention.key_length")) or gguf_field(reader, k("rope.dimension_count"))
    head_dim = int(head_dim) if head_dim else hidden // n_heads

    embd = find_tensor(reader, "token_embd.weight")
    # The embedding's row count is the model's real vocabulary; metadata / token lists can disagree with it
    # (padding tokens), and the weights are what the model has to index.
    vocab_size = numpy_shape(embd)[0] if embd is not None else gguf_field(reader, k("vocab_size"))
    if vocab_size is None:
        vocab_size = len(require_field(reader, "tokenizer.ggml.tokens"))

    config: dict[str, Any] = {
        "model_type": model_type,
        "architectures": [hf_architecture_name(model_type)],
        "hidden_size": hidden,
        "intermediate_size": int(require_field(reader, k("feed_forward_length"))),
        "num_hidden_layers": int(require_field(reader, k("block_count"))),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(n_kv),
        "head_dim": head_dim,
        "rms_norm_eps": float(require_field(reader, k("attention.layer_norm_rms_epsilon"))),
        # 10000.0 is llama.cpp's own default when freq_base is absent.
        "rope_theta": float(gguf_field(reader, k("rope.freq_base"), 10000.0)),
        "max_position_embeddings": int(require_field(reader, k("context_length"))),
        "vocab_size": int(vocab_size),
        # No separate output matrix -> the LM head reuses token_embd (same rule as transformers).
        "tie_word_embeddings": find_tensor(reader, "output.weight") is None,
        "attention_bias": find_tensor(reader, "blk.0.attn_q.bias") is not None,
        "hidden_act": "silu",
    }
    if model_type == "mistral":
        # llama.cpp runs "llama"-architecture files with full attention; say so explicitly, because
        # MistralConfig's default (4096) would otherwise switch sliding-window attention on.
        config["sliding_window"] = None
    for gguf_key, hf_key in (
        ("tokenizer.ggml.bos_token_id", "bos_token_id"),
        ("tokenizer.ggml.padding_token_id", "pad_token_id"),
        ("tokenizer.ggml.unknown_token_id", "unk_token_id"),
    ):
        value = gguf_field(reader, gguf_key)
        if value is not None:
            config[hf_key] = int(value)
    # End of generation: eos plus the end-of-turn / end-of-message tokens instruct GGUFs declare separately
    # (Llama 3: <|eot_id|>, <|eom_id|>). One id stays an int, several become a list, as in HF configs.
    eos_ids: list[int] = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"):
        value = gguf_field(reader, key)
        if value is not None and int(value) not in eos_ids:
            eos_ids.append(int(value))
    if eos_ids:
        config["eos_token_id"] = eos_ids[0] if len(eos_ids) == 1 else eos_ids

    rope_scaling = _rope_scaling(reader, arch, config)
    if rope_scaling is not None:
        config["rope_scaling"] = rope_scaling
    return config


def _rope_scaling(reader: GGUFReader, arch: str, config: dict) -> dict | None:
    """HF rope_scaling dict from `{arch}.rope.scaling.*` metadata or a Llama-3 `rope_freqs.weight` tensor."""
    kind = gguf_field(reader, f"{arch}.rope.scaling.type")
    freqs_tensor = find_tensor(reader, "rope_freqs.weight")
    if freqs_tensor is not None:
        factors = np.asarray(gguf.quants.dequantize(freqs_tensor.data, freqs_tensor.tensor_type), np.float64)
        return _llama3_scaling_from_factors(factors.reshape(-1), config)
    if kind in (None, "none"):
        return None
    if kind not in ("linear", "yarn"):
        raise ValueError(
            f"GGUF {arch}.rope.scaling.type={kind!r} is not supported (supported: none, linear, yarn)."
        )
    scaling: dict[str, Any] = {"rope_type": kind,
                               "factor": float(require_field(reader, f"{arch}.rope.scaling.factor"))}
    orig = gguf_field(reader, f"{arch}.rope.scaling.original_context_length")
    if orig is not None:
        scaling["original_max_position_embeddings"] = int(orig)
    if kind == "yarn":
        for suffix, hf_key in (
            ("yarn_beta_fast", "beta_fast"),
            ("yarn_beta_slow", "beta_slow"),
            ("attn_factor", "attention_factor"),
        ):
            value = gguf_field(reader, f"{arch}.rope.scaling.{suffix}")
            if value is not None:
                scaling[hf_key] = float(value)
    return scaling


def _llama3_scaling_from_factors(factors: np.ndarray, config: dict) -> dict:
    """Recover HF's llama3 rope_scaling from llama.cpp's per-frequency divisors (shape [head_dim // 2]).

    convert_hf_to_gguf.py writes rope_freqs[j] = inv_freq[j] / llama3_scaled_inv_freq[j] using
    original context 8192 (its hard default), low_freq_factor / high_freq_factor from the HF config (1 and 4
    for every Llama 3.x release) and factor = the largest divisor. We rebuild the divisors from those
    parameters and insist they match, so a file with custom factors fails loudly instead of running with
    a silently different RoPE.
    """
    head_dim, theta = config["head_dim"], config["rope_theta"]
    if factors.shape != (head_dim // 2,):
        raise ValueError(f"GGUF rope_freqs.weight has shape {factors.shape}; expected ({head_dim // 2},).")
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    factor = float(factors.max())
    old_ctx, low, high = 8192, 1.0, 4.0
    smooth = np.clip((old_ctx / wavelen - low) / (high - low), 0.0, 1.0)
    expected = 1.0 / ((1.0 - smooth) / factor + smooth)
    if not np.allclose(factors, expected, rtol=1e-4, atol=1e-6):
        raise ValueError(
            "GGUF rope_freqs.weight does not match Llama-3 RoPE scaling with original context 8192, "
            f"low_freq_factor 1, high_freq_factor 4, factor {factor}; this custom RoPE scaling is not supported. "
            "Load the Hugging Face checkpoint (config.json + safetensors) instead."
        )
    return {
        "rope_type": "llama3",
        "factor": factor,
        "low_freq_factor": low,
        "high_freq_factor": high,
        "original_max_position_embeddings": old_ctx,
    }


def dequantize_tensor(tensor) -> np.ndarray:
    """float32 numpy array of a gguf ReaderTensor, in numpy (HF) order; a fresh array, not a view of the file."""
    qtype = GGMLQuantizationType(tensor.tensor_type)
    if qtype not in SUPPORTED_QUANT_TYPES:
        raise ValueError(
            f"GGUF tensor {tensor.name!r} uses quantization type {qtype.name}, which jaxinfer does not "
            f"dequantize (supported: {', '.join(sorted(q.name for q in SUPPORTED_QUANT_TYPES))}). "
            "Use a GGUF quantized with one of these types."
        )
    out = gguf.quants.dequantize(tensor.data, qtype)
    shape = numpy_shape(tensor)
    if qtype == GGMLQuantizationType.F32:
        # A view of the memory-mapped file: copy so the caller owns its memory and the file can be closed.
        out = np.array(out, dtype=np.float32, copy=True)
    else:  # the other types return fresh arrays already
        out = np.ascontiguousarray(out, dtype=np.float32)
    if out.size != math.prod(shape):
        raise ValueError(f"GGUF tensor {tensor.name!r}: dequantized {out.size} values, expected shape {shape}.")
    return out.reshape(shape)


def iter_gguf_tensors(path: GGUFReader | str | os.PathLike,
                      keep_quantized: frozenset[str] = frozenset()) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (hf_name, float32 array) for every tensor of a GGUF file, one at a time, in file order.

    Layouts are Hugging Face's: linear weights [out_features, in_features], norms [dim], embeddings
    [vocab, hidden]. `lm_head.weight` is yielded only when the file has `output.weight`; otherwise the
    config says tie_word_embeddings=True and the caller reuses `model.embed_tokens.weight`.
    Nothing is read from disk until the tensor is reached (the file is memory-mapped).
    `path` may also be an open GGUFReader (opening one parses the whole vocabulary: ~3 s for a 49k vocab).
    keep_quantized: HF names of linear weights yielded as QuantizedTensor [in, out] instead (their GGUF type must
    be one prequantized.gguf_to_quantized maps; see weights/gguf_quant.py).
    """
    reader = open_gguf(path)
    arch = gguf_architecture(reader)
    n_heads = int(require_field(reader, f"{arch}.attention.head_count"))
    n_kv = int(gguf_field(reader, f"{arch}.attention.head_count_kv", n_heads))
    for tensor in reader.tensors:
        hf_name = to_hf_name(tensor.name)
        if hf_name is None:
            continue
        if hf_name in keep_quantized:
            qt = gguf_linear_quantized(tensor, arch, n_heads, n_kv)  # RoPE permutation undone on its columns
            if qt is None:
                raise ValueError(f"GGUF tensor {tensor.name!r} ({tensor.tensor_type.name}) cannot be kept quantized")
            yield hf_name, qt
            continue
        w = dequantize_tensor(tensor)
        heads = rope_permuted_heads(tensor.name, arch, n_heads, n_kv)
        yield hf_name, (w if heads is None else reverse_rope_permute(w, heads))


def load_gguf_tokenizer(path: str | os.PathLike):
    """transformers tokenizer built from the GGUF's embedded vocabulary, merges, special tokens and chat template
    (without torch for byte-level BPE vocabularies: see gguf_tokenizer.py)."""
    from jaxinfer.weights.gguf_tokenizer import build_gguf_tokenizer

    from jaxinfer.weights import prepared
    from jaxinfer.weights.gguf_tokenizer import tokenizer_from_spec, tokenizer_spec

    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path!r} does not exist; pass the path of a .gguf file.")
    spec = prepared.load_metadata(path).get("tokenizer")  # (the file's metadata is then never parsed)
    if spec is not None:
        return tokenizer_from_spec(spec)
    hf = build_gguf_tokenizer(path)
    spec = tokenizer_spec(hf)
    if spec is not None:
        prepared.store_metadata(path, tokenizer=spec)
    return hf
