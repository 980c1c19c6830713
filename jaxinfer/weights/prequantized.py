"""Pre-quantized checkpoints -> `QuantizedTensor` (numpy only): AWQ (GEMM), GPTQ, FP8 (`quant_method: fp8` and
compressed-tensors float8), and GGUF Q4_0 / Q4_1 / Q4_K blocks.

Every reader returns weights in jaxinfer's [in, out] layout whose `.dequantize()` reproduces the format's own
dequantization formula (exactly for AWQ, GPTQ, FP8 and GGUF Q4_0; to float32 rounding for GGUF Q4_1 / Q4_K,
see below). What is NOT representable is an error (or, for GGUF, `None`: keep the tensor dequantized) — never a
silent approximation.

AWQ, GEMM packing (AutoAWQ `WQLinear_GEMM`; `quantization_config: {quant_method: awq, bits: 4, group_size,
zero_point: true, version: gemm}`), per linear `<name>.qweight/.qzeros/.scales`:
    qweight int32 [in, out/8]: 8 nibbles per int32 along `out`, in the AWQ order: nibble i (bits 4i..4i+3) of
                               packed column c holds output column 8c + AWQ_ORDER[i], AWQ_ORDER = 0 2 4 6 1 3 5 7
    qzeros  int32 [in/g, out/8]: same packing;   scales fp16 [in/g, out];   w = (q - z) * s
    -> int4 asymmetric (q in [0, 15], zero = z), exact.

GPTQ (AutoGPTQ / GPTQModel; `quant_method: gptq, bits: 4, group_size, desc_act, sym`), per linear
`<name>.qweight/.qzeros/.scales/.g_idx`:
    qweight int32 [in/8, out]: 8 nibbles per int32 along `in`, sequential (row 8r + i in bits 4i..4i+3)
    qzeros  int32 [in/g, out/8]: sequential nibbles along `out`;   scales fp16 [in/g, out]
    g_idx   int32 [in]: group of each input row (i // g unless desc_act reordered them)
    w = (q - (z + 1)) * s in the original ("gptq", v1) checkpoint format, which stores zero - 1;
    w = (q - z) * s with `checkpoint_format: gptq_v2`.
    -> int4 asymmetric (zero = z + 1 as float: 16 is possible in v1 and is kept as is), or int4 symmetric
       (q - 8, zero None) when `sym` and every zero is 8. group_size -1 means one group over all of `in`.
    desc_act=True with a g_idx that is not i // g (act-order) needs the input rows permuted: a clear error.

FP8 (`quant_method: fp8` e.g. vLLM / llm-compressor "FP8" / "FP8-Dynamic", or `quant_method:
compressed-tensors` with float 8-bit weights): `<name>.weight` float8_e4m3fn [out, in], `<name>.weight_scale`
f32 scalar / [1] (per tensor) or [out] / [out, 1] (per channel), optional `<name>.input_scale` (static activation
scale; returned separately: the W8A8 path uses dynamic per-token activation scales). -> fp8 [in, out] with a
per-column scale (a per-tensor scale is broadcast), exact. Block-wise scales (`weight_block_size`) are an error.

GGUF (llama.cpp blocks of a row of [out, in], along `in`):
    Q4_0 (18 bytes / 32 values): f16 d, 16 bytes of nibbles (byte j: value j low, value j + 16 high);
         w = d * (q - 8)              -> int4 symmetric, group 32, exact.
    Q4_1 (20 bytes / 32): f16 d, f16 m, nibbles as Q4_0;   w = d * q + m
         -> int4 asymmetric, group 32, zero = -m / d: (q - zero) * d equals d * q + m to float32 rounding
            (~1e-7 relative), not bit for bit. A block with d == 0 holds the constant m: it becomes q = 0,
            scale 1, zero = -m (exact).
    Q4_K (144 bytes / 256): f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) pairs for 8 sub-blocks of 32,
         128 bytes of nibbles (64 values per 32 bytes: low nibbles sub-block 2c, high nibbles 2c + 1);
         w = d * sc_j * q - dmin * m_j  -> int4 asymmetric, group 32, zero = dmin * m_j / (d * sc_j); same
            float32-rounding caveat; a sub-block with scale 0 (the constant -dmin * m_j) becomes q = 0,
            scale 1, zero = dmin * m_j (exact).
    Q8_0 (34 bytes / 32): f16 d, 32 int8;  w = d * q. NOT representable: QuantizedTensor int8 has one scale per
         output column, Q8_0 one per 32 inputs of a row; requantizing per channel would be lossy -> None (the
         loader keeps it dequantized). Other types -> None as well.
"""
from __future__ import annotations

import json
import mmap
import os
import re
from typing import Iterator

import ml_dtypes
import numpy as np

from jaxinfer.weights.quant_tensor import FP8_E4M3, QuantizedTensor

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)      # nibble i of a packed int32 holds output column 8c + AWQ_ORDER[i]
AWQ_REVERSE_ORDER = (0, 4, 1, 5, 2, 6, 3, 7)  # output column k sits in nibble AWQ_REVERSE_ORDER[k]
_SHIFTS = np.arange(0, 32, 4, dtype=np.uint32)  # [8]


class QuantFormatError(ValueError):
    """A pre-quantized checkpoint jaxinfer cannot represent (or one whose tensors contradict its config)."""


# ---------------------------------------------------------------------------------------------------------------
# nibble unpacking
# ---------------------------------------------------------------------------------------------------------------
def _nibbles_last(packed: np.ndarray) -> np.ndarray:
    """int32 [..., n] -> uint8 [..., n, 8]: nibble i = bits 4i..4i+3 (sequential)."""
    u = packed.astype(np.int32).view(np.uint32)
    return ((u[..., None] >> _SHIFTS) & 0xF).astype(np.uint8)


def unpack_awq(packed: np.ndarray) -> np.ndarray:
    """AWQ GEMM int32 [rows, out/8] -> uint8 [rows, out] in output-column order."""
    nib = _nibbles_last(packed)[..., list(AWQ_REVERSE_ORDER)]  # [rows, out/8, 8]: column 8c + k
    return nib.reshape(packed.shape[0], -1)


def unpack_rows_sequential(packed: np.ndarray) -> np.ndarray:
    """GPTQ qweight int32 [in/8, out] -> uint8 [in, out] (row 8r + i from nibble i of row r)."""
    nib = _nibbles_last(packed)  # [in/8, out, 8]
    return nib.transpose(0, 2, 1).reshape(-1, packed.shape[1])


def unpack_cols_sequential(packed: np.ndarray) -> np.ndarray:
    """GPTQ qzeros int32 [groups, out/8] -> uint8 [groups, out]."""
    return _nibbles_last(packed).reshape(packed.shape[0], -1)


# ---------------------------------------------------------------------------------------------------------------
# AWQ / GPTQ / FP8 linear layers
# ---------------------------------------------------------------------------------------------------------------
def _group_size(cfg_group: int, n_in: int, where: str) -> int:
    g = n_in if cfg_group in (-1, None, 0) else int(cfg_group)
    if g <= 0 or n_in % g:
        raise QuantFormatError(f"{where}: group_size {cfg_group} does not divide the input dimension {n_in}; "
                               "this checkpoint is malformed or its config does not match its tensors")
    return g


def _check_bits(qcfg: dict, where: str):
    bits = int(qcfg.get("bits", qcfg.get("w_bit", 4)))
    if bits != 4:
        raise QuantFormatError(f"{where}: {bits}-bit {qcfg.get('quant_method')} weights are not supported "
                               "(jaxinfer reads 4-bit AWQ / GPTQ only); use a 4-bit checkpoint or quantize "
                               "a float checkpoint on load")


def awq_linear(qweight, qzeros, scales, qcfg: dict, where: str = "awq") -> QuantizedTensor:
    _check_bits(qcfg, where)
    version = str(qcfg.get("version", "gemm")).lower()
    if version != "gemm":
        raise QuantFormatError(f"{where}: AWQ version {version!r} is not supported (only the GEMM packing)")
    if qcfg.get("zero_point", True) is False:
        raise QuantFormatError(f"{where}: AWQ zero_point=false checkpoints are not supported")
    q = unpack_awq(qweight)                                     # [in, out]
    n_in, n_out = q.shape
    g = _group_size(qcfg.get("group_size", qcfg.get("q_group_size", 128)), n_in, where)
    if scales.shape != (n_in // g, n_out) or qzeros.shape != (n_in // g, n_out // 8):
        raise QuantFormatError(f"{where}: scales {scales.shape} / qzeros {qzeros.shape} do not match qweight "
                               f"{qweight.shape} with group_size {g} (want {(n_in // g, n_out)} and "
                               f"{(n_in // g, n_out // 8)})")
    zero = unpack_awq(qzeros).astype(np.float32)                # [in/g, out]
    return QuantizedTensor("int4", q.astype(np.int8), scales.astype(np.float32), zero, g)


def gptq_linear(qweight, qzeros, scales, g_idx, qcfg: dict, where: str = "gptq") -> QuantizedTensor:
    _check_bits(qcfg, where)
    q = unpack_rows_sequential(qweight)                         # [in, out]
    n_in, n_out = q.shape
    g = _group_size(qcfg.get("group_size", 128), n_in, where)
    if scales.shape != (n_in // g, n_out) or qzeros.shape != (n_in // g, n_out // 8):
        raise QuantFormatError(f"{where}: scales {scales.shape} / qzeros {qzeros.shape} do not match qweight "
                               f"{qweight.shape} with group_size {g} (want {(n_in // g, n_out)} and "
                               f"{(n_in // g, n_out // 8)})")
    if g_idx is not None and not np.array_equal(np.asarray(g_idx), np.arange(n_in) // g):
        raise QuantFormatError(
            f"{where}: g_idx reorders the input rows (desc_act=True / act-order); jaxinfer needs "
            "desc_act=False checkpoints (or act-order ones whose g_idx is i // group_size)")
    zero = unpack_cols_sequential(qzeros).astype(np.float32)   # [in/g, out] as stored
    if str(qcfg.get("checkpoint_format", "gptq")).lower() != "gptq_v2":
        zero = zero + 1.0                                       # v1 stores zero - 1
    scale = scales.astype(np.float32)
    if qcfg.get("sym", False) and np.all(zero == 8.0):
        return QuantizedTensor("int4", (q.astype(np.int16) - 8).astype(np.int8), scale, None, g)
    return QuantizedTensor("int4", q.astype(np.int8), scale, zero, g)


def fp8_linear(weight, weight_scale, where: str = "fp8") -> QuantizedTensor:
    """weight float8_e4m3fn [out, in]; weight_scale scalar / [1] / [out] / [out, 1]."""
    if weight.dtype != FP8_E4M3:
        raise QuantFormatError(f"{where}: weight dtype {weight.dtype} is not float8_e4m3fn")
    n_out, n_in = weight.shape
    s = np.asarray(weight_scale, np.float32)
    if s.size == 1:
        scale = np.full((n_out,), s.reshape(()), np.float32)
    elif s.shape in ((n_out,), (n_out, 1)):
        scale = s.reshape(n_out)
    else:
        raise QuantFormatError(f"{where}: weight_scale shape {s.shape} is neither per tensor nor per output "
                               f"channel ({n_out},) for weight {weight.shape} (block-wise fp8 is not supported)")
    return QuantizedTensor("fp8", np.ascontiguousarray(weight.T), scale)


# ---------------------------------------------------------------------------------------------------------------
# checkpoint directories
# ---------------------------------------------------------------------------------------------------------------
_ST_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
              "F8_E4M3": ml_dtypes.float8_e4m3fn, "I64": np.int64, "I32": np.int32, "I16": np.int16,
              "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of a .safetensors file as numpy arrays (memory-mapped; float8 / bfloat16 through ml_dtypes,
    which safetensors' own numpy reader does not map)."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    n = int.from_bytes(mm[:8], "little")
    header = json.loads(mm[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        if info["dtype"] not in _ST_DTYPES:
            raise QuantFormatError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(mm, dtype=_ST_DTYPES[info["dtype"]], count=(b - a) // np.dtype(
            _ST_DTYPES[info["dtype"]]).itemsize, offset=8 + n + a).reshape(info["shape"])
    return out


def quant_method(hf_config: dict) -> str | None:
    q = hf_config.get("quantization_config")
    return None if not q else str(q.get("quant_method", "")).lower()


def _compressed_tensors_fp8(qcfg: dict):
    """Accept only compressed-tensors configs whose weight schemes are 8-bit float per tensor / channel."""
    for name, grp in (qcfg.get("config_groups") or {}).items():
        w = grp.get("weights") or {}
        if not (w.get("type") == "float" and int(w.get("num_bits", 0)) == 8
                and w.get("strategy", "tensor") in ("tensor", "channel")):
            raise QuantFormatError(f"compressed-tensors group {name!r}: weights {w} are not float8 per tensor / "
                                   "per channel; jaxinfer reads only that compressed-tensors scheme")


def read_quantized_checkpoint(path: str) -> tuple[dict, dict[str, object], dict[str, np.ndarray]]:
    """A Hugging Face directory with a quantization_config -> (config, tensors, input_scales).

    tensors: HF name -> QuantizedTensor for each quantized linear (`<module>.weight`, [in, out]) or the float
    numpy array of every other tensor (HF layout, e.g. embeddings, norms, biases). input_scales: `<module>` ->
    static activation scale of FP8 checkpoints that carry one.
    """
    with open(os.path.join(path, "config.json")) as f:
        hf = json.load(f)
    method = quant_method(hf)
    qcfg = hf.get("quantization_config") or {}
    if method not in ("awq", "gptq", "fp8", "compressed-tensors"):
        raise QuantFormatError(f"{path}: quantization_config.quant_method {method!r} is not supported; jaxinfer "
                               "reads awq (GEMM), gptq, fp8 and compressed-tensors float8 checkpoints")
    if method == "fp8" and qcfg.get("weight_block_size"):
        raise QuantFormatError(f"{path}: block-wise fp8 (weight_block_size {qcfg['weight_block_size']}) is not "
                               "supported; use a per-tensor or per-channel fp8 checkpoint")
    if method == "compressed-tensors":
        _compressed_tensors_fp8(qcfg)
    if method == "gptq" and qcfg.get("desc_act"):
        pass  # allowed only when every g_idx is trivial: checked per layer in gptq_linear
    raw: dict[str, np.ndarray] = {}
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise QuantFormatError(f"{path}: no *.safetensors files")
    for f in files:
        raw.update(read_safetensors(os.path.join(path, f)))
    tensors: dict[str, object] = {}
    input_scales: dict[str, np.ndarray] = {}
    used: set[str] = set()
    for name in sorted(raw):
        if method in ("awq", "gptq") and name.endswith(".qweight"):
            mod = name[: -len(".qweight")]
            parts = [mod + s for s in (".qzeros", ".scales")]
            missing = [p for p in parts if p not in raw]
            if missing:
                raise QuantFormatError(f"{path}: {mod} has a qweight but no {missing}")
            if method == "awq":
                tensors[mod + ".weight"] = awq_linear(raw[name], raw[parts[0]], raw[parts[1]], qcfg, mod)
            else:
                g_idx = raw.get(mod + ".g_idx")
                tensors[mod + ".weight"] = gptq_linear(raw[name], raw[parts[0]], raw[parts[1]], g_idx, qcfg, mod)
                used.add(mod + ".g_idx")
            used.update([name, *parts])
        elif method in ("fp8", "compressed-tensors") and name.endswith(".weight_scale"):
            mod = name[: -len(".weight_scale")]
            tensors[mod + ".weight"] = fp8_linear(raw[mod + ".weight"], raw[name], mod)
            used.update([name, mod + ".weight"])
            if mod + ".input_scale" in raw:
                input_scales[mod] = np.asarray(raw[mod + ".input_scale"], np.float32).reshape(-1)
                used.add(mod + ".input_scale")
    for name, arr in raw.items():
        if name in used:
            continue
        if arr.dtype == FP8_E4M3:
            raise QuantFormatError(f"{path}: {name} is float8 but has no weight_scale")
        tensors[name] = np.asarray(arr)
    return hf, tensors, input_scales


# ---------------------------------------------------------------------------------------------------------------
# GGUF blocks
# ---------------------------------------------------------------------------------------------------------------
def _blocks(raw: np.ndarray, n_out: int, n_in: int, per_block: int, block_bytes: int) -> np.ndarray:
    """uint8 data of a [out, in] GGUF tensor -> [out, in / per_block, block_bytes]."""
    if n_in % per_block:
        raise QuantFormatError(f"GGUF rows of {n_in} values are not a whole number of {per_block}-value blocks")
    return np.asarray(raw, np.uint8).reshape(n_out, n_in // per_block, block_bytes)


def _f16(b: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(b).view(np.float16)[..., 0].astype(np.float32)


def _q4_nibbles(qs: np.ndarray) -> np.ndarray:
    """[..., 16] bytes -> [..., 32] values: byte j holds value j (low nibble) and value j + 16 (high)."""
    return np.concatenate([qs & 0xF, qs >> 4], axis=-1)


def _k_scale_min(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K 12 bytes [..., 12] -> 6-bit (scale, min) [..., 8] each (llama.cpp get_scale_min_k4)."""
    sc = sc.astype(np.uint8)
    lo_s, lo_m = sc[..., 0:4] & 63, sc[..., 4:8] & 63
    hi_s = (sc[..., 8:12] & 0xF) | ((sc[..., 0:4] >> 6) << 4)
    hi_m = (sc[..., 8:12] >> 4) | ((sc[..., 4:8] >> 6) << 4)
    return np.concatenate([lo_s, hi_s], -1), np.concatenate([lo_m, hi_m], -1)


def _constant_blocks(q: np.ndarray, scale: np.ndarray, minus_min: np.ndarray):
    """Blocks w = scale * q - minus_min ([out, G, 32], [out, G], [out, G]) -> (q, scale, zero) with
    w = (q - zero) * scale. A block with scale 0 is the constant -minus_min: it gets q = 0, scale 1,
    zero = minus_min, which reproduces it exactly (the int4 layout has no other way to hold a constant)."""
    flat = scale == 0
    if np.any(flat):
        q = np.where(flat[..., None], 0, q).astype(np.int8)
        scale = np.where(flat, 1.0, scale).astype(np.float32)
    zero = (minus_min / scale).astype(np.float32)
    return q, scale.astype(np.float32), zero


def gguf_to_quantized(type_name: str, raw: np.ndarray, n_out: int, n_in: int) -> QuantizedTensor | None:
    """Raw block bytes of a GGUF [out, in] weight -> QuantizedTensor [in, out], or None if the type is not
    representable (Q8_0 and everything else but Q4_0 / Q4_1 / Q4_K; see the module docstring). Types listed in
    GGUF_KEEPABLE_TYPES always convert (no block value makes them fail)."""
    if type_name == "Q4_0":
        b = _blocks(raw, n_out, n_in, 32, 18)
        d = _f16(b[..., 0:2])                                          # [out, in/32]
        q = _q4_nibbles(b[..., 2:18]).astype(np.int8) - 8              # [out, in/32, 32]
        return QuantizedTensor("int4", np.ascontiguousarray(q.reshape(n_out, n_in).T), d.T.copy(), None, 32)
    if type_name == "Q4_1":
        b = _blocks(raw, n_out, n_in, 32, 20)
        d, m = _f16(b[..., 0:2]), _f16(b[..., 2:4])
        q = _q4_nibbles(b[..., 4:20]).astype(np.int8)                 # [out, in/32, 32]
        q, d, zero = _constant_blocks(q, d, -m)                        # w = (q - zero) * d, zero = -m / d
        return QuantizedTensor("int4", np.ascontiguousarray(q.reshape(n_out, n_in).T), d.T.copy(), zero.T.copy(),
                               32)
    if type_name == "Q4_K":
        b = _blocks(raw, n_out, n_in, 256, 144)
        d, dmin = _f16(b[..., 0:2]), _f16(b[..., 2:4])                 # [out, in/256]
        sc, mn = _k_scale_min(b[..., 4:16])                            # [out, in/256, 8]
        qs = b[..., 16:144].reshape(n_out, n_in // 256, 4, 32)         # 4 chunks of 64 values
        q = np.stack([qs & 0xF, qs >> 4], axis=3).astype(np.int8)      # [out, nb, 4, 2, 32]: sub-block 2c + h
        scale = (d[..., None] * sc).astype(np.float32)                 # [out, nb, 8]
        minv = (dmin[..., None] * mn).astype(np.float32)
        G = n_in // 32
        q, scale, zero = _constant_blocks(q.reshape(n_out, G, 32), scale.reshape(n_out, G), minv.reshape(n_out, G))
        return QuantizedTensor("int4", np.ascontiguousarray(q.reshape(n_out, n_in).T), scale.T.copy(), zero.T.copy(),
                               32)
    return None


_GGUF_LINEAR = re.compile(r"^blk\.\d+\.(attn_q|attn_k|attn_v|attn_output|ffn_gate|ffn_up|ffn_down)\.weight$")
# GGUF types gguf_to_quantized maps onto int4 group 32, and the values per block each needs along `in`.
GGUF_KEEPABLE_TYPES = {"Q4_0": 32, "Q4_1": 32, "Q4_K": 256}


def gguf_linear_quantized(t, arch: str, n_head: int, n_kv: int) -> QuantizedTensor | None:
    """One gguf ReaderTensor of a linear weight ([out, in] blocks) -> QuantizedTensor [in, out] with llama.cpp's
    RoPE row permutation of attn_q / attn_k (gguf_reader.rope_permuted_heads) undone on its output columns, or None
    when its type is not representable."""
    from jaxinfer.weights.gguf_reader import reverse_rope_permute, rope_permuted_heads  # (imports gguf: lazily)

    n_in, n_out = int(t.shape[0]), int(t.shape[1])  # GGUF ne: fastest dimension first
    qt = gguf_to_quantized(t.tensor_type.name, t.data, n_out, n_in)
    heads = rope_permuted_heads(t.name, arch, n_head, n_kv)
    if qt is not None and heads is not None:
        perm = reverse_rope_permute(np.arange(n_out), heads)         # output-column permutation
        qt = QuantizedTensor(qt.kind, qt.q[:, perm], qt.scale[:, perm],
                             None if qt.zero is None else qt.zero[:, perm], qt.group_size)
    return qt


def iter_gguf_quantized(path, only=None) -> Iterator[tuple[str, QuantizedTensor]]:
    """(HF name, QuantizedTensor [in, out]) for each linear weight of a GGUF file stored in a
    representable type. Q/K rows of llama-architecture files are RoPE-permuted by llama.cpp: the permutation
    acts on output columns, so it is undone on q / scale / zero alike (gguf_reader.reverse_rope_permute).
    only: optional predicate on the HF name (read just those tensors)."""
    from gguf import GGUFReader

    from jaxinfer.weights.gguf_reader import gguf_architecture, gguf_field, to_hf_name

    reader = GGUFReader(path)
    arch = gguf_architecture(reader)
    n_head = gguf_field(reader, f"{arch}.attention.head_count")
    n_kv = gguf_field(reader, f"{arch}.attention.head_count_kv", n_head)
    for t in reader.tensors:
        if not _GGUF_LINEAR.match(t.name) or (only is not None and not only(to_hf_name(t.name))):
            continue
        qt = gguf_linear_quantized(t, arch, n_head, n_kv)
        if qt is not None:
            yield to_hf_name(t.name), qt
