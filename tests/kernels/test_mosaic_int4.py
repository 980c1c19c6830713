"""mosaic_int4.py on the CPU: the split / tile arithmetic, the kernel tracing and lowering for CUDA (Mosaic GPU's
layout and copy checks run at lowering, so a kernel that cannot compile for the GPU fails here), and the wrapper's
algebra around the kernel (padding, the per-group sums, the split sum and transpose, with a jnp stand-in of the
kernel's contract) against the float32 reference. The kernel's numbers: tests/kernels/test_mosaic_int4_gpu.py."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from pallas_kernels.quantized_matmul import mosaic_int4 as MI
from pallas_kernels.quantized_matmul import reference as qr
from tests.kernels.quant_cases import rel_err


def native_nk_case(M, K, N, seed, offset=True):
    """x bf16 [M, K], q int4 [N, K], scale / offset [K/g, N] (or None), and the float32 reference output."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    q = jnp.asarray(rng.integers(-8, 8, (N, K)), jnp.int32).astype(jnp.int4)
    scale = jnp.asarray(rng.uniform(1e-3, 1e-2, (K // MI.GROUP, N)), jnp.bfloat16)
    off = jnp.asarray(rng.uniform(-1e-2, 1e-2, (K // MI.GROUP, N)), jnp.bfloat16) if offset else None
    want = qr.int4_native_matmul_reference(x.astype(jnp.float32), q.T, scale, off, group_size=MI.GROUP,
                                           out_dtype=jnp.float32)
    return x, q, scale, off, want


def kernel_standin(x_p, q, scale, offset, xs, *, cfg):
    """The kernel's contract in jnp: part[s, n, m] = sum over split s's groups j of
    scale[j, n] * (q_j @ x_p_j^T)[n, m] + offset[j, n] * xs[j, m]."""
    mp, K = x_p.shape
    N = q.shape[0]
    G = K // MI.GROUP
    qg = q.astype(jnp.float32).reshape(N, G, MI.GROUP)
    xg = x_p.astype(jnp.float32).reshape(mp, G, MI.GROUP)
    d = jnp.einsum("ngk,mgk->gnm", qg, xg) * scale.astype(jnp.float32)[:, :, None]     # [G, N, Mp]
    if offset is not None:
        d = d + offset.astype(jnp.float32)[:, :, None] * xs[:, None, :mp]
    return d.reshape(cfg.split, G // cfg.split, N, mp).sum(axis=1)


def test_config_arithmetic():
    for K, N in [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096), (4096, 128256)]:
        cfg = MI.default_config(1, K, N)
        groups = K // MI.GROUP
        assert groups % cfg.split == 0 and groups // cfg.split >= 2 and 1 <= cfg.stages <= groups // cfg.split
    assert MI.default_config(1, 4096, 28672).split * (28672 // 64) >= MI.TARGET_CTAS
    # long K (the 8B down projection, 112 groups): half the CTAs, each streaming twice the groups (measured faster)
    assert MI.default_config(1, 14336, 4096) == MI.Config(split=8, stages=4)
    assert MI.default_config(1, 14336, 4096, target_ctas=MI.TARGET_CTAS) == MI.Config(split=16, stages=4)
    assert MI.default_config(1, 4096, 4096) == MI.Config(split=16, stages=2)   # 32 groups: unchanged
    assert MI.default_config(1, 256, 64).split == 1                   # 2 groups: no split leaves 2 a split
    # from 64 padded tokens on, fewer splits (each writes a [64, Mp] f32 partial): gate_up 4 -> 1, down 8 -> 4
    assert MI.default_config(32, 4096, 28672) == MI.default_config(1, 4096, 28672)   # (33 pads to 64)
    assert MI.default_config(64, 4096, 28672).split == 1 and MI.default_config(128, 14336, 4096).split == 4
    assert MI.default_config(40, 4096, 6144) == MI.Config(split=4, stages=4)
    assert MI.supports(1, 4096, 6144, 128) and MI.supports(16, 14336, 4096, 128)
    assert MI.supports(128, 4096, 6144, 128) and not MI.supports(129, 4096, 6144, 128)
    assert not MI.supports(1, 4096, 6144, 64)
    assert not MI.supports(1, 4096, 6100, 128) and not MI.supports(1, 4000, 6144, 128)
    assert [MI.padded_m(m) for m in (1, 8, 9, 16, 17, 40, 64, 65, 128)] == [8, 8, 16, 16, 32, 64, 64, 128, 128]
    assert [MI.xs_width(mp) for mp in (8, 16, 32, 64, 128)] == [32, 32, 32, 64, 128]


@pytest.mark.parametrize("M,offset", [(1, True), (16, False), (40, True), (128, False)])
def test_kernel_lowers_for_cuda(M, offset):
    K, N = 512, 128
    cfg = MI.default_config(M, K, N)
    f = functools.partial(MI.forward, cfg=cfg, out_dtype=jnp.bfloat16)
    sd = jax.ShapeDtypeStruct
    args = (sd((M, K), jnp.bfloat16), sd((N, K), jnp.int4), sd((K // 128, N), jnp.bfloat16),
            sd((K // 128, N), jnp.bfloat16) if offset else None)
    module = export.export(jax.jit(f), platforms=["cuda"])(*args).mlir_module()
    assert "mosaic_gpu" in module


@pytest.mark.parametrize("M,K,N,offset", [(1, 512, 192, True), (5, 1024, 64, False), (16, 384, 128, True),
                                          (40, 512, 128, True), (128, 256, 64, False)])
def test_wrapper_algebra_matches_reference(M, K, N, offset):
    x, q, scale, off, want = native_nk_case(M, K, N, seed=M + K + N, offset=offset)
    cfg = MI.default_config(M, K, N)
    got = MI.forward(x, q, scale, off, cfg=cfg, out_dtype=jnp.float32, call=kernel_standin)
    assert got.shape == (M, N) and rel_err(got, want) < 1e-5
    # the bound can fail: scales applied along the wrong axis are far off
    bad = MI.forward(x, q, scale[::-1], off, cfg=cfg, out_dtype=jnp.float32, call=kernel_standin)
    assert rel_err(bad, want) > 0.05


def test_bad_shapes_are_refused():
    x, q, scale, off, _ = native_nk_case(1, 256, 64, seed=0)
    with pytest.raises(ValueError, match="M <= 128"):
        MI.int4_matmul_mosaic(jnp.zeros((129, 256), jnp.bfloat16), q, scale, off)
    with pytest.raises(ValueError, match="q int4 \\[N, K\\]"):
        MI.int4_matmul_mosaic(x, q.astype(jnp.int8), scale, off)
    with pytest.raises(ValueError, match="offset must be"):
        MI.int4_matmul_mosaic(x, q, scale, off[:, :32])


def test_not_usable_on_cpu():
    assert not MI.usable()
