"""The network's quantized linear layer: y = x @ dequantize(W) (+ b), and the one entry point over the matmul
implementations (the jnp reference, XLA's dequantize + dot or fp8 dot, the Pallas kernels).

The weights are filled at load by weights/quantize.py (quantize on load) or from pre-quantized checkpoints; which
matmul runs is fixed when the module is built (a static attribute, so the split-once-at-load graph carries it)
and, for the 'auto' / 'xla-int4' backends, per traced step size M from the table in models/quant_paths.py.
Under tensor parallelism the XLA path runs (weights/quantize.py's docstring says why).
"""
from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
from flax import nnx

from jaxinfer.config import QuantizationError, QuantSpec
from jaxinfer.models import quant_paths
from jaxinfer.models.quant_paths import quantized_matmul
from pallas_kernels.quantized_matmul import kernel as qmm_kernel
from pallas_kernels.quantized_matmul import mosaic_int4 as qmm_mosaic
from pallas_kernels.quantized_matmul import reference as qmm_ref

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



def resolve_backend(spec: QuantSpec, platform: str | None = None, *, distributed: bool = False,
                    hopper: bool | None = None) -> str:
    """'reference' | 'xla' | 'pallas' | 'pallas-interpret' | 'auto' | 'w8a8' | 'xla-int4' | 'triton-int4' |
    'mosaic-int4' ... for this spec on this platform (models/quant_paths.py: what each runs, and the per-M table
    behind 'auto'). distributed: the weights are placed by a tensor / data-parallel plan (the native int4 layouts
    do not run there yet: weights/quantize.Quantizer). hopper: a Hopper GPU (None: ask the device); 'auto' for
    int4 group 128 on one Hopper GPU is 'mosaic-int4' (quant_paths.HOPPER_INT4_DEFAULT)."""
    platform = platform or jax.default_backend()
    on_cpu = platform == "cpu"
    if spec.backend == "auto":
        if on_cpu:
            return "reference"
        if spec.method == "int4" and spec.group_size not in quant_paths.GPU_INT4_DEFAULT_GROUPS:
            return "auto"  # (the [N, K/2] kernel's batched form takes g = 128 only: elsewhere the [K/2, N] one)
        if spec.method == "int4" and not distributed and (qmm_mosaic.usable() if hopper is None else hopper):
            return quant_paths.HOPPER_INT4_DEFAULT
        return quant_paths.GPU_DEFAULT[spec.method]
    if spec.backend == "pallas":
        return "pallas-interpret" if on_cpu else "pallas"
    return spec.backend


def weight_layout(spec: QuantSpec, platform: str | None = None, *, distributed: bool = False,
                  hopper: bool | None = None) -> str:
    """The device layout of this spec's QuantLinear leaves (resolve_backend's arguments): int4 'packed' (uint8
    [K/2, N]), 'packed-nk', 'native' (jnp.int4 [K, N]) or 'native-nk'; int8 'kn' ('nk' for 'xla-nk'); fp8 'nk'."""
    return quant_paths.weight_layout_of(spec.method, resolve_backend(spec, platform, distributed=distributed,
                                                                     hopper=hopper))


class QuantLinear(nnx.Module):
    """y = x @ dequantize(W) (+ b), W quantized in one of the layouts of quantized_matmul/reference.py.

    Leaves: q (int8 [in, out] | int8 [out, in] ('xla-nk') | packed uint8 [in/2, out] | packed uint8 [out, in/2]
    ('triton-int4') | int4 [in, out] | int4 [out, in] ('mosaic-int4') | e4m3 [out, in]), scale, offset
    (int4 only; none for symmetric weights in the native int4 layout), b.
    `backend` is static (resolve_backend); with 'auto' / 'xla-int4' the path is picked per call from the
    static token count M (models/quant_paths.py).
    axes: logical names of (in, out) of the float weight (layers.Linear); every leaf carries them on its
    matching dimensions (int4's group dimension counts as `in`), so jaxinfer.parallel shards it likewise."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool, dtype, spec: QuantSpec, backend: str,
                 name: str = "linear", axes=(None, None), kernels: bool = True):
        check_quantized_shape((in_features, out_features), spec.method, spec.group_size, name)
        K, N = in_features, out_features
        ax_in, ax_out = axes
        self.method = spec.method
        self.group_size = spec.group_size
        if backend.startswith("pallas") and not qmm_kernel.supports(spec.method, K, N, spec.group_size):
            log.info("%s [%d, %d]: shape not supported by the Pallas kernel; using the XLA path", name, K, N)
            backend = "xla" if backend == "pallas" else "reference"
        self.backend = backend
        self.kernels = kernels   # False under tensor parallelism: no small-M kernel paths (quant_paths.path_for)
        if spec.method == "int8" and quant_paths.weight_layout_of("int8", backend) == "nk":
            self.q = nnx.Param(jnp.zeros((N, K), jnp.int8), logical_axes=(ax_out, ax_in))
            self.scale = nnx.Param(jnp.zeros((N,), jnp.float32), logical_axes=(ax_out,))
            self.offset = None
        elif spec.method == "int8":
            self.q = nnx.Param(jnp.zeros((K, N), jnp.int8), logical_axes=(ax_in, ax_out))
            self.scale = nnx.Param(jnp.zeros((N,), jnp.float32), logical_axes=(ax_out,))
            self.offset = None
        elif spec.method == "int4" and quant_paths.weight_layout_of("int4", backend) == "native":
            G = K // spec.group_size
            self.q = nnx.Param(jnp.zeros((K, N), jnp.int4), logical_axes=(ax_in, ax_out))
            self.scale = nnx.Param(jnp.zeros((G, N), dtype), logical_axes=(ax_in, ax_out))
            self.offset = (None if spec.symmetric
                           else nnx.Param(jnp.zeros((G, N), dtype), logical_axes=(ax_in, ax_out)))
        elif spec.method == "int4" and quant_paths.weight_layout_of("int4", backend) == "native-nk":
            G = K // spec.group_size
            self.q = nnx.Param(jnp.zeros((N, K), jnp.int4), logical_axes=(ax_out, ax_in))
            self.scale = nnx.Param(jnp.zeros((G, N), dtype), logical_axes=(ax_in, ax_out))
            self.offset = (None if spec.symmetric
                           else nnx.Param(jnp.zeros((G, N), dtype), logical_axes=(ax_in, ax_out)))
        elif spec.method == "int4" and quant_paths.weight_layout_of("int4", backend) == "packed-nk":
            G = K // spec.group_size
            self.q = nnx.Param(jnp.zeros((N, K // 2), jnp.uint8), logical_axes=(ax_out, ax_in))
            self.scale = nnx.Param(jnp.zeros((G, N), dtype), logical_axes=(ax_in, ax_out))
            self.offset = nnx.Param(jnp.zeros((G, N), dtype), logical_axes=(ax_in, ax_out))
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
                             backend=self.backend, out_dtype=preferred_element_type or x.dtype,
                             kernels=self.kernels)
        if self.b is not None:
            y = y + self.b[...]
        return y
