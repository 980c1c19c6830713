"""mosaic_large_m.py on the CPU: the tile arithmetic, the wrapper's algebra around the kernel (transposes and the
per-channel scale, with a jnp stand-in for the GPU kernel) against the float32 reference, and the engine's path
falling back to XLA where the kernel cannot run. The kernel itself: tests/kernels/test_mosaic_large_m_gpu.py."""
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.models import quant_paths
from pallas_kernels.quantized_matmul import mosaic_large_m as MM
from pallas_kernels.quantized_matmul import reference as qr
from tests.kernels.quant_cases import rel_err


def test_tiles_divide():
    a = MM.tiles("a")
    assert (a.cta_m, a.cta_n) == (256, 128)
    assert MM.divides(2048, 4096, 28672, "a") and not MM.divides(64, 4096, 28672, "a")
    assert MM.config_for(64, 4096, 28672) == "b"       # 64 tokens: the 64-wide tile
    assert MM.config_for(96, 4096, 28672) is None      # no tile divides 96 tokens
    assert MM.config_for(2048, 4096, 1000) is None     # nor 1000 output channels
    assert not MM.supports(1, 4096, 4096)


def test_wrapper_algebra_matches_reference():
    rng = np.random.default_rng(0)
    M, K, N = 48, 64, 40
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    q = rng.integers(-127, 128, (N, K)).astype(np.int8)
    scale = rng.uniform(1e-3, 1e-2, N).astype(np.float32)

    def kernel_standin(a, b):  # what the kernel computes: (a int8 -> bf16) @ b, f32 accumulation, bf16 out
        return jnp.dot(a.astype(jnp.bfloat16), b, preferred_element_type=jnp.float32).astype(jnp.bfloat16)

    got = MM._transposed(x, jnp.asarray(q), jnp.asarray(scale), jnp.bfloat16, kernel_standin)
    want = qr.int8_matmul_reference(x.astype(jnp.float32), jnp.asarray(q.T), jnp.asarray(scale))
    assert got.shape == (M, N) and rel_err(got.astype(jnp.float32), want) < 1e-2
    # a wrong transpose or scaling axis is far off (the bound can fail)
    bad = MM._transposed(x, jnp.asarray(q), jnp.asarray(scale[::-1].copy()), jnp.bfloat16, kernel_standin)
    assert rel_err(bad.astype(jnp.float32), want) > 0.1


def test_cpu_falls_back_to_xla():
    assert not MM.usable()
    assert quant_paths.path_for("int8", "xla-nk", 2048, 4096, 28672) == "convert-nk"
    with pytest.raises(ValueError, match="no tile configuration"):
        MM.int8_matmul_large_m(jnp.zeros((96, 128), jnp.bfloat16), jnp.zeros((256, 128), jnp.int8),
                               jnp.ones(256, jnp.float32))
