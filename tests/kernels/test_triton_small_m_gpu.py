"""The Triton small-M kernels through their JAX entry points (jax-triton) on the GPU: bf16 activations, the
default configuration and the other inner form, ragged shapes, against the float32 references of reference.py.
Run on the H200 with `pytest -m gpu tests/kernels/test_triton_small_m_gpu.py` (jax-triton carried as a wheel)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.quantized_matmul import reference as qr
from pallas_kernels.quantized_matmul import triton_small_m as T
from tests.kernels.quant_cases import rel_err

pytestmark = pytest.mark.gpu

# bf16 activations and a bf16 output: ~2^-9 relative rounding of each output element
BF16_BOUND = 1e-2


def test_usable_on_gpu():
    assert T.usable(), "triton + jax-triton + a GPU backend are needed for the Triton paths"


@pytest.mark.parametrize("M", [1, 3, 16])
@pytest.mark.parametrize("K,N", [(4096, 6144), (1000, 520), (14336, 4096)])
@pytest.mark.parametrize("form", ["default", "other"])
def test_int8_nk_matches_reference(M, K, N, form):
    rng = np.random.default_rng(M + K + N)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    q = rng.integers(-127, 128, (K, N)).astype(np.int8)
    scale = rng.uniform(1e-3, 1e-2, N).astype(np.float32)
    cfg = None
    if form == "other":     # the FMA form at M = 1, a wider tile and split 4 otherwise
        cfg = (T.Config(1, 32, 256, 4, False, 4, 3) if M == 1 else T.Config(16, 128, 128, 4, True, 4, 3))
    got = T.int8_matmul_nk(x, jnp.asarray(q.T), jnp.asarray(scale), cfg=cfg)
    assert got.dtype == jnp.bfloat16 and got.shape == (M, N)
    want = qr.int8_matmul_reference(x.astype(jnp.float32), jnp.asarray(q), jnp.asarray(scale))
    assert rel_err(got.astype(jnp.float32), want) < BF16_BOUND


@pytest.mark.parametrize("M", [1, 5, 16])
@pytest.mark.parametrize("K,N,g", [(4096, 6144, 128), (1024, 520, 32), (14336, 4096, 64)])
@pytest.mark.parametrize("symmetric", [True, False])
def test_int4_nk_matches_reference(M, K, N, g, symmetric):
    rng = np.random.default_rng(M * 3 + K + g)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    u = rng.integers(0, 16, (K, N)).astype(np.uint8)
    packed = qr.pack_int4(u, g)
    scale = jnp.asarray(rng.uniform(0.01, 0.1, (K // g, N)), jnp.bfloat16)
    zero = 8.0 if symmetric else rng.integers(0, 16, (K // g, N)).astype(np.float32)
    offset = (-zero * scale.astype(jnp.float32)).astype(jnp.bfloat16)
    want = qr.int4_matmul_reference(x.astype(jnp.float32), jnp.asarray(packed), scale, offset, group_size=g)
    for cfg in (None, T.Config(16, 64, g, 2, True, 4, 3)):     # default, and the tensor-core form at every M
        got = T.int4_matmul_nk(x, jnp.asarray(packed.T), scale, offset, group_size=g, cfg=cfg)
        assert got.shape == (M, N)
        assert rel_err(got.astype(jnp.float32), want) < BF16_BOUND


def test_engine_path_takes_the_kernel_on_large_weights():
    """'xla-nk' runs the Pallas kernel on weights >= LARGE_WEIGHT at M <= 16 (here: in a jitted call)."""
    from jaxinfer.models import quant_paths

    assert quant_paths.path_for("int8", "xla-nk", 1, K=4096, N=28672) == "pallas-nk"
    assert quant_paths.path_for("int8", "xla-nk", 1, K=4096, N=4096) == "pallas-nk"
    assert quant_paths.path_for("int8", "xla-nk", 64, K=4096, N=28672) == "convert-nk"
    assert quant_paths.path_for("int4", "triton-int4", 16, K=4096, N=4096, group_size=128) == "pallas-int4-nk"
    rng = np.random.default_rng(0)
    q = rng.integers(-127, 128, (4096, 8192)).astype(np.int8)
    scale = rng.uniform(1e-3, 1e-2, 8192).astype(np.float32)
    x = jnp.asarray(rng.standard_normal((1, 4096)), jnp.bfloat16)
    f = jax.jit(lambda x, q_t, s: quant_paths.quantized_matmul(x, "int8", q_t, s, backend="xla-nk"))
    got = f(x, jnp.asarray(q.T), jnp.asarray(scale))
    want = qr.int8_matmul_reference(x.astype(jnp.float32), jnp.asarray(q), jnp.asarray(scale))
    assert rel_err(got.astype(jnp.float32), want) < BF16_BOUND


@pytest.mark.parametrize("M", [1, 3, 16])
@pytest.mark.parametrize("K,N", [(4096, 6144), (14336, 4096), (4096, 28672)])
def test_pallas_int8_nk_matches_reference(M, K, N):
    """The engine's Pallas-Triton port (kernel_nk.py) with the default configuration, bf16 activations."""
    from pallas_kernels.quantized_matmul import kernel_nk

    rng = np.random.default_rng(M + K + N)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    q = rng.integers(-127, 128, (K, N)).astype(np.int8)
    scale = rng.uniform(1e-3, 1e-2, N).astype(np.float32)
    got = kernel_nk.int8_matmul_nk(x, jnp.asarray(q.T), jnp.asarray(scale))
    want = qr.int8_matmul_reference(x.astype(jnp.float32), jnp.asarray(q), jnp.asarray(scale))
    assert got.dtype == jnp.bfloat16 and rel_err(got.astype(jnp.float32), want) < BF16_BOUND


@pytest.mark.parametrize("M", [1, 5, 16])
@pytest.mark.parametrize("K,N,g", [(4096, 6144, 128), (14336, 4096, 128), (4096, 4096, 32)])
def test_pallas_int4_nk_matches_reference(M, K, N, g):
    """The Pallas port of the int4 kernel (kernel_nk.int4_matmul_nk), default configuration, bf16 activations;
    the tensor-core form needs g = 128, so g = 32 runs at M = 1 only."""
    from pallas_kernels.quantized_matmul import kernel_nk

    if g != 128 and M > 1:
        assert not kernel_nk.int4_supports(M, K, N, g, kernel_nk.int4_config_for(M, K, N, g))
        return
    rng = np.random.default_rng(M * 5 + K + g)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    packed = qr.pack_int4(rng.integers(0, 16, (K, N)).astype(np.uint8), g)
    scale = jnp.asarray(rng.uniform(0.01, 0.1, (K // g, N)), jnp.bfloat16)
    offset = (-8 * scale.astype(jnp.float32)).astype(jnp.bfloat16)
    got = kernel_nk.int4_matmul_nk(x, jnp.asarray(packed.T), scale, offset, group_size=g)
    want = qr.int4_matmul_reference(x.astype(jnp.float32), jnp.asarray(packed), scale, offset, group_size=g)
    assert rel_err(got.astype(jnp.float32), want) < BF16_BOUND


@pytest.mark.parametrize("M", [1, 3, 16])
@pytest.mark.parametrize("K,N", [(4096, 6144), (14336, 4096)])
def test_pallas_nk_on_fp8_weights_matches_reference(M, K, N):
    """The fp8 model's small-M path (quant_paths: 'pallas-nk' on e4m3 [N, K] weights, weight-only): the kernel's
    e4m3 -> bf16 cast on the GPU against x @ (q * scale).T in float32."""
    from jaxinfer.models import quant_paths

    rng = np.random.default_rng(M + K + N + 8)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    # (within e4m3's +-448: larger values become NaN in float8_e4m3fn, as 12-07 j's GPU run found of x 100 unclipped)
    q = jnp.asarray(np.clip(rng.standard_normal((N, K)) * 100, -448, 448), jnp.float8_e4m3fn)
    scale = jnp.asarray(rng.uniform(1e-3, 1e-2, N), jnp.float32)
    assert quant_paths.path_for("fp8", "xla", M, K, N) == "pallas-nk"
    got = jax.jit(lambda x, q, s: quant_paths.quantized_matmul(x, "fp8", q, s, backend="xla"))(x, q, scale)
    want = x.astype(jnp.float32) @ (q.astype(jnp.float32) * scale[:, None]).T
    assert got.dtype == jnp.bfloat16 and rel_err(got.astype(jnp.float32), want) < BF16_BOUND


@pytest.mark.parametrize("M", [512, 2048])
def test_w4a8_on_the_gpu_matches_its_cpu_form(M):
    """'mosaic-int4-w4a8''s many-token path (xla_fused.int4_native_nk_w4a8_xla) through the GPU's fp8 dot against
    the same function on the CPU (XLA's CPU fp8 dot): the same roundings, so agreement to bf16 output rounding."""
    from pallas_kernels.quantized_matmul import xla_fused as qf

    K, N, g = 4096, 6144, 128
    rng = np.random.default_rng(M)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    q = jnp.asarray(rng.integers(-8, 8, (N, K)), jnp.int4)
    scale = jnp.asarray(rng.uniform(0.01, 0.1, (K // g, N)), jnp.bfloat16)
    f = jax.jit(lambda x, q, s: qf.int4_native_nk_w4a8_xla(x, q, s, None, group_size=g))
    got = f(x, q, scale)
    cpu = jax.devices("cpu")[0]
    with jax.default_device(cpu):
        want = qf.int4_native_nk_w4a8_xla(*(jax.device_put(a, cpu) for a in (x, q, scale)), None, group_size=g,
                                          out_dtype=jnp.float32)
    assert got.dtype == jnp.bfloat16 and rel_err(got.astype(jnp.float32), np.asarray(want)) < BF16_BOUND
