"""Quantized matmul (bf16 activations x int8 / int4 / fp8 weights): `kernel.py` (Pallas, Triton backend, GPU;
int8 and int4), `xla.py` (plain XLA: the fp8 W8A8 path and the peers) and `reference.py` (pure jnp, float32:
the specification of the weight layouts and the CPU path). Same arguments, same results."""
from pallas_kernels.quantized_matmul.kernel import int4_matmul, int8_matmul
from pallas_kernels.quantized_matmul.reference import (fp8_matmul_reference, int4_matmul_reference,
                                                       int8_matmul_reference, pack_int4, unpack_int4)
from pallas_kernels.quantized_matmul.xla import fp8_matmul_xla, int4_matmul_xla, int8_matmul_xla

__all__ = ["int8_matmul", "int4_matmul", "int8_matmul_reference", "int4_matmul_reference", "fp8_matmul_reference",
           "int8_matmul_xla", "int4_matmul_xla", "fp8_matmul_xla", "pack_int4", "unpack_int4"]
