"""The network's quantized linear layer: y = x @ dequantize(W) (+ b), and the one entry point over the matmul
implementations (the jnp reference, XLA's dequantize + dot or fp8 dot, the Pallas kernels).

The weights are filled at load by weights/quantize.py (quantize on load) or from pre-quantized checkpoints; which
matmul runs is fixed when the module is built (a static attribute, so the split-once-at-load graph carries it).
Under tensor parallelism the XLA path runs (weights/quantize.py's docstring says why).
"""
from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
from flax import nnx

from jaxinfer.config import QuantizationError, QuantSpec
from pallas_kernels.quantized_matmul import kernel as qmm_kernel
from pallas_kernels.quantized_matmul import reference as qmm_ref
from pallas_kernels.quantized_matmul import xla as qmm_xla

log = logging.getLogger("jaxinfer")


def check_quantized_shape(shape, method: str, group_size: int | None, name: str = "weight"):
    """A quantized weight is 2-D [in, out] of a known method; int4 groups divide its input dimension."""
    if method not in ("int8", "int4", "fp8"):
        raise QuantizationError(f"unknown quantization method {method!r}; use 'int8', 'int4' or 'fp8'")
    if len(shape) != 2:
        raise QuantizationError(f"{name}: quantized weights must be 2-D [in, out], got shape {tuple(shape)}")
    if method == "int4":
        valid = [g for g in (32, 64, 128) if shape[0] % g == 0]
        if not group_size or shape[0] % group_size:
            raise QuantizationError(
                f"{name}: int4 group size {group_size} does not divide its input dimension {shape[0]}; "
                + (f"use one of the group sizes {valid} (e.g. quantization='int4-g{valid[-1]}')" if valid
                   else "no supported group size (32, 64, 128) divides it; use int8 or fp8"))



def resolve_backend(spec: QuantSpec, platform: str | None = None) -> str:
    """'reference' | 'xla' | 'pallas' | 'pallas-interpret' for this spec on this platform."""
    platform = platform or jax.default_backend()
    on_cpu = platform == "cpu"
    if spec.backend == "auto":
        if on_cpu:
            return "reference"
        return "xla" if spec.method == "fp8" else "pallas"
    if spec.backend == "pallas":
        return "pallas-interpret" if on_cpu else "pallas"
    return spec.backend


class QuantLinear(nnx.Module):
    """y = x @ dequantize(W) (+ b), W quantized in one of the layouts of quantized_matmul/reference.py.

    Leaves: q (int8 [in, out] | packed uint8 [in/2, out] | e4m3 [out, in]), scale, offset (int4 only), b.
    `backend` is static: 'reference' | 'xla' | 'pallas' | 'pallas-interpret'.
    axes: logical names of (in, out) of the float weight (layers.Linear); every leaf carries them on its
    matching dimensions (int4's group dimension counts as `in`), so jaxinfer.parallel shards it likewise."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, dtype, spec: QuantSpec, backend: str,
                 name: str = "linear", axes=(None, None)):
        check_quantized_shape((in_features, out_features), spec.method, spec.group_size, name)
        K, N = in_features, out_features
        ax_in, ax_out = axes
        self.method = spec.method
        self.group_size = spec.group_size
        if backend.startswith("pallas") and not qmm_kernel.supports(spec.method, K, N, spec.group_size):
            log.info("%s [%d, %d]: shape not supported by the Pallas kernel; using the XLA path", name, K, N)
            backend = "xla" if backend == "pallas" else "reference"
        self.backend = backend
        if spec.method == "int8":
            self.q = nnx.Param(jnp.zeros((K, N), jnp.int8), logical_axes=(ax_in, ax_out))
            self.scale = nnx.Param(jnp.zeros((N,), jnp.float32), logical_axes=(ax_out,))
            self.offset = None
        elif spec.method == "int4":
            G = K // spec.group_size
            self.q = nnx.Param(jnp.zeros((K // 2, N), jnp.uint8), logical_axes=(ax_in, ax_out))
            self.scale = nnx.Param(jnp.zeros((G, N), dtype), logical_axes=(ax_in, ax_out))
            self.offset = nnx.Param(jnp.zeros((G, N), dtype), logical_axes=(ax_in, ax_out))
        else:
            self.q = nnx.Param(jnp.zeros((N, K), qmm_ref.FP8), logical_axes=(ax_out, ax_in))
            self.scale = nnx.Param(jnp.zeros((N,), jnp.float32), logical_axes=(ax_out,))
            self.offset = None
        self.b = nnx.Param(jnp.zeros((N,), dtype), logical_axes=(ax_out,)) if bias else None

    def __call__(self, x, preferred_element_type=None):
        y = quantized_matmul(x, self.method, self.q[...], self.scale[...],
                             None if self.offset is None else self.offset[...], group_size=self.group_size,
                             backend=self.backend, out_dtype=preferred_element_type or x.dtype)
        if self.b is not None:
            y = y + self.b[...]
        return y


# The Pallas kernel serves every M by default (small-M split-K and large-M tile configurations). Should the
# H200 benchmark (benchmarks/kernels/quantized_matmul.py) show XLA's dequantize + dot winning above some M, set
# the threshold here: steps with more tokens than this use the XLA path.
PALLAS_MAX_M = {"int8": 1 << 30, "int4": 1 << 30}


def quantized_matmul(x, method: str, q, scale, offset=None, *, group_size=None, backend="reference",
                     out_dtype=None):
    """One entry point over the three implementations (see QuantLinear)."""
    if backend == "pallas" and method != "fp8" and x.size // x.shape[-1] > PALLAS_MAX_M[method]:
        backend = "xla"
    if method == "fp8":
        fn = qmm_ref.fp8_matmul_reference if backend == "reference" else qmm_xla.fp8_matmul_xla
        return fn(x, q, scale, out_dtype=out_dtype)
    if backend == "reference":
        if method == "int8":
            return qmm_ref.int8_matmul_reference(x, q, scale, out_dtype=out_dtype)
        return qmm_ref.int4_matmul_reference(x, q, scale, offset, group_size=group_size, out_dtype=out_dtype)
    if backend == "xla":
        if method == "int8":
            return qmm_xla.int8_matmul_xla(x, q, scale, out_dtype=out_dtype)
        return qmm_xla.int4_matmul_xla(x, q, scale, offset, group_size=group_size, out_dtype=out_dtype)
    interpret = backend == "pallas-interpret"
    if method == "int8":
        return qmm_kernel.int8_matmul(x, q, scale, out_dtype=out_dtype, interpret=interpret)
    return qmm_kernel.int4_matmul(x, q, scale, offset, group_size=group_size, out_dtype=out_dtype,
                                  interpret=interpret)
