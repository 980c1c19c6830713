"""Quantized matmul (bf16 activations x int8 / int4 / fp8 weights): `kernel.py` (Pallas, Triton backend, GPU;
int8 and int4), `xla.py` (plain XLA: the fp8 W8A8 path and the peers), `xla_fused.py` (XLA formulations XLA may
fuse: int8 W8A8 through the int8 dot, mixed-type int8 dots, native int4 arrays) and `reference.py` (pure jnp,
float32: the specification of the weight layouts and the CPU path). Same arguments, same results (W8A8 int8:
the results of its own reference, which also rounds the activations)."""
from pallas_kernels.quantized_matmul.kernel import int4_matmul, int8_matmul
from pallas_kernels.quantized_matmul.reference import (dequantize_int4_native, fp8_matmul_reference,
                                                       int4_matmul_reference, int4_native_from_u,
                                                       int4_native_matmul_reference, int8_matmul_reference,
                                                       int8_w8a8_matmul_reference, pack_int4,
                                                       quantize_activations_int8, unpack_int4)
from pallas_kernels.quantized_matmul.xla import fp8_matmul_xla, int4_matmul_xla, int8_matmul_xla
from pallas_kernels.quantized_matmul.xla_fused import (int4_native_dequant_xla, int4_native_grouped_xla,
                                                       int8_convert_xla, int8_mixed_xla, int8_w8a8_xla)

__all__ = ["int8_matmul", "int4_matmul", "int8_matmul_reference", "int4_matmul_reference", "fp8_matmul_reference",
           "int8_matmul_xla", "int4_matmul_xla", "fp8_matmul_xla", "pack_int4", "unpack_int4",
           "int8_w8a8_matmul_reference", "quantize_activations_int8", "int4_native_from_u",
           "dequantize_int4_native", "int4_native_matmul_reference", "int8_w8a8_xla", "int8_mixed_xla",
           "int8_convert_xla", "int4_native_dequant_xla", "int4_native_grouped_xla"]
