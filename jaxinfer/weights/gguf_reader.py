"""The GGUF file's primitives shared by the config, tensor, quantized-tensor and tokenizer readers: open a file,
read a metadata field, check the architecture, map a tensor name to its Hugging Face name, undo llama.cpp's RoPE
row permutation (gguf.py's docstring, point 2, says why it exists).
"""
from __future__ import annotations

import functools
import os
import re
from typing import Any

import numpy as np
from gguf import GGUFReader

# GGUF `general.architecture` values we can translate. "mistral" is not a llama.cpp architecture:
# Mistral models are written with architecture "llama" (we detect them through general.name, like transformers).
SUPPORTED_ARCHITECTURES = ("llama", "qwen2", "qwen3")

# Architectures whose attn_q / attn_k rows llama.cpp's converter permuted (see module docstring, point 2).
_ROPE_PERMUTED_ARCHITECTURES = ("llama",)

# GGUF tensor name -> HF tensor name. {i} is the layer index.
_GLOBAL_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_TENSORS = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_output.bias": "self_attn.o_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",  # qwen3: RMSNorm over head_dim, shape [head_dim]
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
# Tensors that carry no weights of their own in HF form: Llama 3.x `rope_freqs.weight` holds per-frequency
# RoPE divisors that gguf_to_hf_config turns back into rope_scaling={"rope_type": "llama3", ...}.
_SKIPPED_TENSORS = ("rope_freqs.weight",)


def open_gguf(reader_or_path: GGUFReader | str | os.PathLike) -> GGUFReader:
    if isinstance(reader_or_path, GGUFReader):
        return reader_or_path
    path = os.fspath(reader_or_path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"GGUF file {path!r} does not exist; pass the path of a .gguf file.")
    st = os.stat(path)
    return _reader(os.path.abspath(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=2)
def _reader(path: str, size: int, mtime_ns: int) -> GGUFReader:
    """One parsed reader per file version: parsing the metadata (a 49k-token vocabulary and its merges, element by
    element in gguf-py) took ~3.5 s per open on 2 cores, and loading a model opened the file three times (config,
    weights, tokenizer). size / mtime_ns in the key: a replaced file is parsed again."""
    return _PlainArrayReader(path, "r")


class _PlainArrayReader(GGUFReader):
    """GGUFReader over a plain ndarray view of its memory map (same bytes, still mapped lazily): gguf-py parses the
    metadata one element at a time, and every slice of an np.memmap pays for memmap.__array_finalize__ (2.4 s ->
    0.8 s to open the default model's file)."""

    @property
    def data(self):
        return self._data

    @data.setter
    def data(self, value):
        self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value


def gguf_field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """Metadata value for `key` as a Python scalar / str / list, or `default` when absent."""
    field = reader.get_field(key)
    return default if field is None else field.contents()


def require_field(reader: GGUFReader, key: str) -> Any:
    value = gguf_field(reader, key)
    if value is None:
        raise ValueError(
            f"GGUF metadata key {key!r} is missing; the file is incomplete or not a decoder-only LLM "
            f"(general.architecture={gguf_field(reader, 'general.architecture')!r})."
        )
    return value


def gguf_architecture(reader: GGUFReader) -> str:
    arch = gguf_field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"GGUF architecture {arch!r} is not supported by jaxinfer; supported architectures: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} (Mistral GGUFs use 'llama'). Convert a supported model "
            f"or load the Hugging Face checkpoint instead."
        )
    return arch


def find_tensor(reader: GGUFReader, name: str):
    for t in reader.tensors:
        if t.name == name:
            return t
    return None


def numpy_shape(tensor) -> tuple[int, ...]:
    """GGUF lists dimensions fastest-first (ne0, ne1, ...); numpy wants them slowest-first."""
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def to_hf_name(gguf_name: str) -> str | None:
    """HF name for a GGUF tensor name, None for tensors we skip on purpose; ValueError when unknown."""
    if gguf_name in _GLOBAL_TENSORS:
        return _GLOBAL_TENSORS[gguf_name]
    if gguf_name in _SKIPPED_TENSORS:
        return None
    m = _LAYER_RE.match(gguf_name)
    if m and m.group(2) in _LAYER_TENSORS:
        return f"model.layers.{int(m.group(1))}.{_LAYER_TENSORS[m.group(2)]}"
    raise ValueError(
        f"GGUF tensor {gguf_name!r} has no Hugging Face equivalent in jaxinfer's llama/qwen mapping; "
        "the file holds a variant this loader does not know (e.g. MoE or a vision tower)."
    )


def rope_permuted_heads(tensor_name: str, arch: str, n_heads: int, n_kv: int) -> int | None:
    """The head count of llama.cpp's RoPE row permutation of a GGUF tensor (attn_q: n_heads, attn_k: n_kv, in the
    architectures whose converter permutes), or None when its rows are in Hugging Face's order."""
    if arch not in _ROPE_PERMUTED_ARCHITECTURES:
        return None
    if ".attn_q." in tensor_name:
        return n_heads
    if ".attn_k." in tensor_name:
        return n_kv
    return None


def reverse_rope_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's attn_q / attn_k row permutation: rows (head, j, pair) -> (head, pair, j).

    w: [n_head * head_dim, ...] (weight [rows, in_features] or bias [rows]). Row h*head_dim + 2*j + p of
    the GGUF tensor becomes row h*head_dim + p*(head_dim//2) + j of the HF tensor (p in {0, 1}).
    """
    rows = w.shape[0]
    if rows % (2 * n_head):
        raise ValueError(f"cannot un-permute RoPE rows: {rows} rows is not a multiple of 2 * n_head={2 * n_head}.")
    half = rows // n_head // 2
    return w.reshape(n_head, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
