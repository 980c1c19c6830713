"""The Mosaic GPU int8 decode kernel (pallas_kernels/quantized_matmul/mosaic_int8.py) on a Hopper GPU against the
float32 reference of the engine's int8 [N, K] layout: 8B projection shapes, M in 1..128. Written 2026-12-05, not
yet run on a GPU. Run with `python benchmarks/gpu_tests.py tests/kernels/test_mosaic_int8_gpu.py`."""
import jax.numpy as jnp
import pytest

from pallas_kernels.quantized_matmul import mosaic_int8 as M8
from tests.kernels.quant_cases import rel_err
from tests.kernels.test_mosaic_int8 import int8_nk_case

pytestmark = pytest.mark.gpu

# bf16 activations times exact int8 values, f32 accumulation, f32 output: only summation order differs
F32_BOUND = 1e-4


def test_usable_on_hopper():
    assert M8.usable(), "a Hopper GPU and Pallas Mosaic GPU are needed"


@pytest.mark.parametrize("M", [1, 5, 16, 64, 128])
@pytest.mark.parametrize("K,N", [(4096, 6144), (14336, 4096), (4096, 28672), (512, 64)])
def test_matches_reference(M, K, N):
    x, q, scale, want = int8_nk_case(M, K, N, seed=M * 7 + K + N)
    got = M8.int8_matmul_mosaic(x, q, scale, out_dtype=jnp.float32)
    assert got.shape == (M, N)
    assert rel_err(got, want) < F32_BOUND


@pytest.mark.parametrize("target,stages", [(256, 1), (512, 2), (2048, 4)])
def test_other_configs_match(target, stages):
    M, K, N = 3, 4096, 1024
    x, q, scale, want = int8_nk_case(M, K, N, seed=11)
    got = M8.int8_matmul_mosaic(x, q, scale, out_dtype=jnp.float32,
                                cfg=M8.default_config(M, K, N, target_ctas=target, max_stages=stages))
    assert rel_err(got, want) < F32_BOUND


def test_bf16_output():
    x, q, scale, want = int8_nk_case(4, 1024, 256, seed=5)
    got = M8.int8_matmul_mosaic(x, q, scale)
    assert got.dtype == jnp.bfloat16 and rel_err(got.astype(jnp.float32), want) < 1e-2
