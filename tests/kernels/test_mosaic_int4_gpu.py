"""The Mosaic GPU int4 decode kernel (pallas_kernels/quantized_matmul/mosaic_int4.py) on the H200 against the
float32 reference of the native-nk layout: 8B projection shapes, M in 1..16, with and without offsets, every split
the benchmark sweeps. Run with `python benchmarks/gpu_tests.py tests/kernels/test_mosaic_int4_gpu.py`."""
import jax
import jax.numpy as jnp
import pytest

from pallas_kernels.quantized_matmul import mosaic_int4 as MI
from tests.kernels.quant_cases import assert_engine_path_like_xla, rel_err
from tests.kernels.test_mosaic_int4 import native_nk_case

pytestmark = pytest.mark.gpu

# bf16 activations times exact int4 values, f32 accumulation, f32 output: only summation order differs
F32_BOUND = 1e-4


def test_usable_on_hopper():
    assert MI.usable(), "a Hopper GPU and Pallas Mosaic GPU are needed"


@pytest.mark.parametrize("M", [1, 5, 8, 16, 32, 77, 128])   # (M > 16: added 12-05, not yet run on a GPU)
@pytest.mark.parametrize("K,N", [(4096, 6144), (14336, 4096), (512, 64)])
@pytest.mark.parametrize("offset", [True, False])
def test_matches_reference(M, K, N, offset):
    x, q, scale, off, want = native_nk_case(M, K, N, seed=M * 7 + K + N, offset=offset)
    got = MI.int4_matmul_mosaic(x, q, scale, off, out_dtype=jnp.float32)
    assert got.shape == (M, N)
    assert rel_err(got, want) < F32_BOUND


@pytest.mark.parametrize("target,stages", [(256, 1), (512, 2), (2048, 4), (4096, 8)])
def test_every_swept_config_matches(target, stages):
    M, K, N = 3, 4096, 1024
    x, q, scale, off, want = native_nk_case(M, K, N, seed=11)
    cfg = MI.default_config(M, K, N, target_ctas=target, max_stages=stages)
    got = MI.int4_matmul_mosaic(x, q, scale, off, out_dtype=jnp.float32, cfg=cfg)
    assert rel_err(got, want) < F32_BOUND


def test_bf16_output_and_leading_dims():
    x, q, scale, off, want = native_nk_case(4, 1024, 256, seed=5)
    got = jax.jit(lambda x: MI.int4_matmul_mosaic(x.reshape(2, 2, 1024), q, scale, off))(x)
    assert got.shape == (2, 2, 256) and got.dtype == jnp.bfloat16
    assert rel_err(got.reshape(4, 256).astype(jnp.float32), want) < 1e-2


@pytest.mark.parametrize("quantization", ["int4", "int4-asym"])
def test_int4_default_on_hopper_is_the_mosaic_kernel_and_matches_reference(g128_llama_dir, quantization):
    """On one Hopper GPU quantization='int4' (group 128) resolves to 'mosaic-int4' (models/quant_linear.py); the
    8-token prefill and the batch-1 steps run the kernel, and the engine agrees with XLA's dequantize + dot and the
    jnp reference on the same int4 weights (quant_cases.assert_engine_path_like_xla: bf16 model; the float32 form of
    this test failed on 12-05 d because the kernel rounds activations to bf16 and the float32 reference does not)."""
    assert_engine_path_like_xla(g128_llama_dir, quantization, [3, 17, 5, 99, 42, 7, 250, 11], max_model_len=128,
                                num_pages=64, warmup=False, progress=False)
