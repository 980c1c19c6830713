"""The large-M int8 tensor-core path (pallas_kernels/quantized_matmul/mosaic_large_m.py, JAX's Mosaic GPU
mixed-type matmul) on the H200: every tile configuration against the float32 reference, ragged leading dims, and
the engine's path table taking it at prefill sizes. Run with
`python benchmarks/gpu_tests.py tests/kernels/test_mosaic_large_m_gpu.py`."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.quantized_matmul import mosaic_large_m as MM
from pallas_kernels.quantized_matmul import reference as qr
from tests.kernels.quant_cases import rel_err

pytestmark = pytest.mark.gpu

BF16_BOUND = 1e-2  # bf16 activations, a bf16 kernel output scaled once more: ~2 x 2^-9 relative per element


def _case(M, K, N, seed):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    q = rng.integers(-127, 128, (N, K)).astype(np.int8)
    scale = rng.uniform(1e-3, 1e-2, N).astype(np.float32)
    want = qr.int8_matmul_reference(x.astype(jnp.float32), jnp.asarray(q.T), jnp.asarray(scale))
    return x, jnp.asarray(q), jnp.asarray(scale), want


def test_usable_on_hopper():
    assert MM.usable(), "a Hopper GPU and jax.experimental.pallas.ops.gpu.hopper_mixed_type_matmul_mgpu are needed"


@pytest.mark.parametrize("config", sorted(MM.CONFIGS))
@pytest.mark.parametrize("M,K,N", [(256, 4096, 1024), (128, 1024, 512), (512, 14336, 256)])
def test_every_config_matches_reference(config, M, K, N):
    if not MM.divides(M, K, N, config):
        pytest.skip(f"config {config} does not divide {(M, K, N)} (supports() routes such shapes elsewhere)")
    x, q, scale, want = _case(M, K, N, seed=M + K + N)
    got = jax.jit(lambda x, q, s: MM.int8_matmul_large_m(x, q, s, config=config))(x, q, scale)
    assert got.dtype == jnp.bfloat16 and got.shape == (M, N)
    assert rel_err(got.astype(jnp.float32), want) < BF16_BOUND


def test_leading_dims_and_out_dtype():
    x, q, scale, want = _case(256, 512, 256, seed=3)
    got = MM.int8_matmul_large_m(x.reshape(2, 128, 512), q, scale, out_dtype=jnp.float32)
    assert got.shape == (2, 128, 256) and got.dtype == jnp.float32
    assert rel_err(got.reshape(256, 256), want) < BF16_BOUND


def test_engine_path_takes_the_kernel_at_prefill_sizes(monkeypatch):
    from jaxinfer.models import quant_paths

    assert quant_paths.path_for("int8", "xla-nk", 2048, 4096, 28672) == "mosaic-nk"
    assert quant_paths.path_for("int8", "xla-nk", 2048, 4096, 6144) == "mosaic-nk"
    assert quant_paths.path_for("int8", "xla-nk", 256, 4096, 6144) == "convert-nk"  # the kernel loses there
    monkeypatch.setenv("JAXINFER_MOSAIC", "0")
    assert quant_paths.path_for("int8", "xla-nk", 2048, 4096, 28672) == "convert-nk"
