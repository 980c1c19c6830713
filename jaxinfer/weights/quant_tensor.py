"""The host-side (numpy) form of one quantized linear weight: the contract between whoever produces quantized
weights (round-to-nearest on load, AWQ / GPTQ / FP8 / GGUF checkpoint readers) and whoever puts them on the
device (weights/quantize.py, the quantized-matmul kernels).

Layout follows `layers.Linear`: [in_features, out_features], so `y = x @ dequantize(w)`.

  kind "int8": q int8 [in, out] in [-127, 127];          scale f32 [out];            w = q * scale
  kind "int4": q int8 [in, out] holding 4-bit values:     scale f32 [in/g, out];      w = (q - zero) * scale
               symmetric   -> q in [-8, 7],  zero None                                 (per group of g input rows)
               asymmetric  -> q in [0, 15],  zero f32 [in/g, out]
  kind "fp8":  q float8_e4m3fn [in, out];                 scale f32 [out];            w = q * scale

int4 values are kept one per int8 here (simple to build, check and concatenate); packing two per byte is the
device side's business. Fused projections (QKV, gate/up) concatenate along `out`, which every kind supports
because scales are per output column (and per input group).
"""
from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np

KINDS = ("int8", "int4", "fp8")


@dataclasses.dataclass
class QuantizedTensor:
    kind: str
    q: np.ndarray                   # [in, out]
    scale: np.ndarray               # f32 [out] (int8, fp8) or [in // group_size, out] (int4)
    zero: np.ndarray | None = None  # f32 [in // group_size, out] (asymmetric int4) or None
    group_size: int | None = None   # int4 only

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"quantized tensor kind {self.kind!r} is not one of {KINDS}")
        if self.q.ndim != 2:
            raise ValueError(f"quantized weight must be 2-D [in, out], got shape {self.q.shape}")
        n_in, n_out = self.q.shape
        if self.kind == "int4":
            if not self.group_size or n_in % self.group_size:
                raise ValueError(f"int4 group_size {self.group_size} must divide the input dimension {n_in}")
            want = (n_in // self.group_size, n_out)
        else:
            want = (n_out,)
        if self.scale.shape != want:
            raise ValueError(f"{self.kind} scale shape {self.scale.shape} != expected {want} for q {self.q.shape}")
        if self.zero is not None and (self.kind != "int4" or self.zero.shape != want):
            raise ValueError(f"zero points are only for int4, with shape {want}; got {self.zero.shape}")

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.q.shape)

    def dequantize(self) -> np.ndarray:
        """float32 [in, out]: the exact weights the quantized matmul must reproduce."""
        q = self.q.astype(np.float32)
        if self.kind == "int4":
            g = self.group_size
            scale = np.repeat(self.scale.astype(np.float32), g, axis=0)
            zero = 0.0 if self.zero is None else np.repeat(self.zero.astype(np.float32), g, axis=0)
            return (q - zero) * scale
        return q * self.scale.astype(np.float32)[None, :]


def concat_out(parts: list[QuantizedTensor]) -> QuantizedTensor:
    """Fuse quantized projections along the output axis (QKV, gate/up). All parts must share kind/group."""
    first = parts[0]
    for p in parts[1:]:
        if (p.kind, p.group_size, p.zero is None) != (first.kind, first.group_size, first.zero is None):
            raise ValueError("cannot fuse quantized projections of different kinds / group sizes / zero points")
    zero = None if first.zero is None else np.concatenate([p.zero for p in parts], axis=-1)
    return QuantizedTensor(first.kind, np.concatenate([p.q for p in parts], axis=-1),
                           np.concatenate([p.scale for p in parts], axis=-1), zero, first.group_size)


FP8_E4M3 = ml_dtypes.float8_e4m3fn
FP8_E4M3_MAX = float(ml_dtypes.finfo(FP8_E4M3).max)  # 448
