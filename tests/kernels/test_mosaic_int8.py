"""mosaic_int8.py on the CPU: the split arithmetic, the kernel tracing and lowering for CUDA (Mosaic GPU's layout
and copy checks run at lowering), and the wrapper's algebra (padding, the split sum, the per-channel scale and the
transpose, around a jnp stand-in of the kernel's contract) against the float32 reference of the engine's int8
[N, K] layout. The kernel's numbers: tests/kernels/test_mosaic_int8_gpu.py."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from pallas_kernels.quantized_matmul import mosaic_int8 as M8
from pallas_kernels.quantized_matmul import reference as qr
from tests.kernels.quant_cases import rel_err


def int8_nk_case(M, K, N, seed):
    """x bf16 [M, K], q int8 [N, K], scale f32 [N], and the float32 reference output."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    q = jnp.asarray(rng.integers(-127, 128, (N, K)), jnp.int8)
    scale = jnp.asarray(rng.uniform(1e-3, 1e-2, (N,)), jnp.float32)
    want = qr.int8_matmul_reference(x.astype(jnp.float32), q.T, scale, out_dtype=jnp.float32)
    return x, q, scale, want


def kernel_standin(x_p, q, *, cfg):
    """The kernel's contract in jnp: part[s, n, m] = sum over split s's K range of q[n, k] * x_p[m, k]."""
    mp, K = x_p.shape
    N = q.shape[0]
    qs = q.astype(jnp.float32).reshape(N, cfg.split, K // cfg.split)
    xs = x_p.astype(jnp.float32).reshape(mp, cfg.split, K // cfg.split)
    return jnp.einsum("nsk,msk->snm", qs, xs)


def test_config_arithmetic():
    for K, N in [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (4096, 128256)]:
        cfg = M8.default_config(1, K, N)
        steps = K // M8.TILE_K
        assert steps % cfg.split == 0 and steps // cfg.split >= 2 and 1 <= cfg.stages <= steps // cfg.split
    assert M8.default_config(1, 4096, 28672).split * (28672 // 64) >= M8.TARGET_CTAS
    assert M8.default_config(1, 256, 64).split == 1
    assert M8.supports(1, 4096, 6144) and M8.supports(128, 14336, 4096)
    assert not M8.supports(129, 4096, 6144) and not M8.supports(1, 4096, 6100) and not M8.supports(1, 4000, 6144)


@pytest.mark.parametrize("M,K,N", [(1, 512, 128), (16, 1024, 192), (100, 512, 64)])
def test_kernel_lowers_for_cuda(M, K, N):
    f = functools.partial(M8.forward, cfg=M8.default_config(M, K, N), out_dtype=jnp.bfloat16)
    sd = jax.ShapeDtypeStruct
    args = (sd((M, K), jnp.bfloat16), sd((N, K), jnp.int8), sd((N,), jnp.float32))
    module = export.export(jax.jit(f), platforms=["cuda"])(*args).mlir_module()
    assert "mosaic_gpu" in module


@pytest.mark.parametrize("M,K,N", [(1, 512, 192), (5, 1024, 64), (16, 384, 128), (77, 512, 128)])
def test_wrapper_algebra_matches_reference(M, K, N):
    x, q, scale, want = int8_nk_case(M, K, N, seed=M + K + N)
    cfg = M8.default_config(M, K, N)
    got = M8.forward(x, q, scale, cfg=cfg, out_dtype=jnp.float32, call=kernel_standin)
    assert got.shape == (M, N) and rel_err(got, want) < 1e-5
    # the bound can fail: the scale applied along the wrong axis (tokens instead of channels) is far off
    bad = M8.forward(x, q, scale[::-1], cfg=cfg, out_dtype=jnp.float32, call=kernel_standin)
    assert rel_err(bad, want) > 0.05


def test_bad_shapes_are_refused():
    x, q, scale, _ = int8_nk_case(1, 256, 64, seed=0)
    with pytest.raises(ValueError, match="M <= 128"):
        M8.int8_matmul_mosaic(jnp.zeros((129, 256), jnp.bfloat16), q, scale)
    with pytest.raises(ValueError, match="q int8 \\[N, K\\]"):
        M8.int8_matmul_mosaic(x, q.astype(jnp.int4), scale)
    with pytest.raises(ValueError, match="scale \\[N\\]"):
        M8.int8_matmul_mosaic(x, q, scale[:32])


def test_not_usable_on_cpu():
    assert not M8.usable()
