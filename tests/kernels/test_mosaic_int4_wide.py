"""mosaic_int4_wide.py on the CPU: the tile / split / stage arithmetic, the kernel tracing and lowering for CUDA
(Mosaic GPU's layout and copy checks run at lowering) for each config family, and the wrapper's algebra around the
kernel (token padding to whole tiles, the split sum, the transpose) with a jnp stand-in of the kernel's contract
against the float32 reference. The kernel's numbers: tests/kernels/test_mosaic_int4_wide_gpu.py."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import export

from jaxinfer.models import quant_paths
from pallas_kernels.quantized_matmul import mosaic_int4_wide as MW
from tests.kernels.quant_cases import rel_err
from tests.kernels.test_mosaic_int4 import native_nk_case


def dequant_bf16(q, scale, offset):
    """The kernel's weight, [N, K] float32: q * scale (+ offset) rounded once to bf16 (q * scale is exact in f32;
    the GPU may round the product before the offset's add or fuse them: the GPU tests bound only the symmetric
    case tightly against this)."""
    s = jnp.repeat(scale.astype(jnp.float32).T, MW.GROUP, axis=1)                    # [N, K]
    w = q.astype(jnp.float32) * s
    if offset is not None:
        w = w + jnp.repeat(offset.astype(jnp.float32).T, MW.GROUP, axis=1)
    return w.astype(jnp.bfloat16).astype(jnp.float32)


def kernel_standin(x_p, q, scale, offset, *, cfg, out_dtype):
    """The kernel's contract in jnp: y [M_pad, N] (split 1, out_dtype) or part f32 [split, M_pad, N], part[s] =
    the split's K range of x_p @ dequant_bf16(q)^T (transposed where cfg.transpose_out is off)."""
    w = dequant_bf16(q, scale, offset)
    N, K = w.shape
    ks = K // cfg.split
    part = jnp.stack([w[:, s * ks:(s + 1) * ks] @ x_p[:, s * ks:(s + 1) * ks].astype(jnp.float32).T
                      for s in range(cfg.split)])
    if cfg.transpose_out:
        part = jnp.swapaxes(part, 1, 2)
    return part[0].astype(out_dtype) if cfg.split == 1 else part


def test_config_arithmetic():
    # many tokens: 128-token tiles, two row blocks, no split on the large 8B weights, 2 stages (two CTAs an SM)
    assert MW.default_config(2048, 4096, 28672) == MW.WideConfig(tile_m=128, row_blocks=2, split=1, stages=2)
    assert MW.default_config(2048, 4096, 28672, smem_bytes=200 << 10).stages == 4
    # down at 256 tokens: 2 row blocks would leave 32 x 2 CTAs, so 1 (64 x 2) and the smallest divisor of its 112
    # groups reaching 264 CTAs, 4 (512); gate_up keeps 2 row blocks (224 x 2 = 448 CTAs unsplit)
    assert MW.default_config(256, 14336, 4096) == MW.WideConfig(128, 1, 4, 2)
    assert MW.default_config(256, 4096, 28672) == MW.WideConfig(128, 2, 1, 2)
    assert MW.default_config(2048, 4096, 4096).row_blocks == 2 and MW.default_config(512, 4096, 4096).row_blocks == 1
    # 256-token tiles: past the two-CTA budget already at one stage, but never fewer than 2 stages
    assert MW.default_config(512, 4096, 28672, max_tile_m=256) == MW.WideConfig(256, 2, 1, 2)
    assert MW.default_config(256, 4096, 6144, max_tile_m=64) == MW.WideConfig(64, 1, 1, 4)
    assert MW.default_config(1, 256, 64) == MW.WideConfig(8, 1, 1, 2)     # 2 groups: 2 stages
    assert MW.default_config(5, 4096, 4096).tile_m == 8 and MW.default_config(100, 4096, 4096).tile_m == 128
    assert MW.default_config(300, 4096, 64).row_blocks == 1                  # N = 64: one row block
    for M, K, N in [(1, 512, 128), (129, 4096, 6144), (700, 14336, 4096), (2048, 4096, 128256)]:
        c = MW.default_config(M, K, N)
        groups = K // MW.GROUP
        assert groups % c.split == 0 and 1 <= c.stages <= groups // c.split
        out = 64 * c.tile_m * (2 if c.split == 1 else 4)
        assert c.stages * MW.stage_bytes(c.tile_m, c.row_blocks) + out <= MW.SMEM_BYTES or c.stages == 2
    assert [MW.tile_m_for(m) for m in (1, 9, 128, 129, 256, 3000)] == [8, 16, 128, 128, 128, 128]
    assert [MW.tile_m_for(m, 256) for m in (129, 256, 3000)] == [256, 256, 256]
    assert MW.supports(3000, 4096, 6144, 128) and not MW.supports(300, 4096, 6144, 64)
    assert not MW.supports(300, 4096, 6100, 128) and not MW.supports(0, 4096, 6144, 128)


@pytest.mark.parametrize("M,K,N,offset,kw", [(1, 512, 128, True, {}), (129, 512, 256, False, {}),
                                             (300, 1024, 128, True, {}), (256, 512, 256, False, dict(max_tile_m=256)),
                                             (64, 512, 192, False, {}), (200, 512, 128, True, dict(row_blocks=1)),
                                             (256, 512, 256, True, dict(max_stages=3)),
                                             (130, 512, 128, False, dict(row_blocks=1))])
@pytest.mark.parametrize("transpose_out", [True, False])
def test_kernel_lowers_for_cuda(M, K, N, offset, kw, transpose_out):
    cfg = dataclasses.replace(MW.default_config(M, K, N, **kw), transpose_out=transpose_out)
    f = functools.partial(MW.forward, cfg=cfg, out_dtype=jnp.bfloat16)
    sd = jax.ShapeDtypeStruct
    args = (sd((M, K), jnp.bfloat16), sd((N, K), jnp.int4), sd((K // 128, N), jnp.bfloat16),
            sd((K // 128, N), jnp.bfloat16) if offset else None)
    module = export.export(jax.jit(f), platforms=["cuda"])(*args).mlir_module()
    assert "mosaic_gpu" in module


@pytest.mark.parametrize("transpose_out", [True, False])
@pytest.mark.parametrize("M,K,N,offset,split", [(1, 512, 192, True, 1), (130, 1024, 128, False, 2),
                                                (300, 384, 64, True, 3), (256, 512, 256, False, 1)])
def test_wrapper_algebra_matches_reference(M, K, N, offset, split, transpose_out):
    x, q, scale, off, want = native_nk_case(M, K, N, seed=M + K + N, offset=offset)
    cfg = MW.WideConfig(tile_m=MW.tile_m_for(M), row_blocks=1, split=split, stages=1, transpose_out=transpose_out)
    got = MW.forward(x, q, scale, off, cfg=cfg, out_dtype=jnp.float32, call=kernel_standin)
    # only the bf16 rounding of each dequantized weight separates it from the float32 reference
    assert got.shape == (M, N) and rel_err(got, want) < 5e-3
    # the bound can fail: scales applied along the wrong axis are far off
    bad = MW.forward(x, q, scale[::-1], off, cfg=cfg, out_dtype=jnp.float32, call=kernel_standin)
    assert rel_err(bad, want) > 0.05


def test_bad_shapes_are_refused():
    x, q, scale, off, _ = native_nk_case(1, 256, 64, seed=0)
    with pytest.raises(ValueError, match="g = 128"):
        MW.int4_matmul_mosaic_wide(x, q, scale[:1], off[:1], group_size=256)
    with pytest.raises(ValueError, match="q int4 \\[N, K\\]"):
        MW.int4_matmul_mosaic_wide(x, q.astype(jnp.int8), scale, off)
    with pytest.raises(ValueError, match="offset must be"):
        MW.int4_matmul_mosaic_wide(x, q, scale, off[:, :32])


def test_the_int4_default_routes_many_tokens_to_it_only_where_it_runs():
    rows = quant_paths.PATHS[("int4", "mosaic-int4")]
    assert quant_paths._lookup(rows, 17) == "mosaic-int4-wide-nk" and quant_paths._lookup(rows, 4096) == rows[-1][1]
    assert quant_paths._lookup(rows, 16) == "mosaic-int4-nk"   # decode batches up to 16 (from 17 on: 12-05 d)
    # on the CPU the kernel cannot run: the path falls back to XLA's dequantize + dot on the same weights
    assert quant_paths.path_for("int4", "mosaic-int4", 256, 4096, 4096, 128) == "int4-dequant-nk"


@pytest.mark.parametrize("M,K,N", [(1, 512, 64), (300, 1024, 128), (256, 512, 256)])
def test_int8_form_lowers_for_cuda(M, K, N):
    sd = jax.ShapeDtypeStruct
    cfg = MW.default_config(M, K, N, weight_bits=8)
    f = functools.partial(MW.int8_matmul_mosaic_wide, cfg=cfg)
    module = export.export(jax.jit(f), platforms=["cuda"])(sd((M, K), jnp.bfloat16), sd((N, K), jnp.int8),
                                                           sd((N,), jnp.float32)).mlir_module()
    assert "mosaic_gpu" in module


def int8_case(M, K, N, seed):
    """x bf16 [M, K], q int8 [N, K], scale f32 [N], and the float32 reference x @ (q * scale).T."""
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    q = jnp.asarray(rng.integers(-127, 128, (N, K)), jnp.int8)
    scale = jnp.asarray(rng.uniform(1e-3, 1e-2, N), jnp.float32)
    want = x.astype(jnp.float32) @ (q.astype(jnp.float32) * scale[:, None]).T
    return x, q, scale, want


def int8_standin(x_p, q, scale, offset, *, cfg, out_dtype):
    """The kernel's contract for int8 weights: scale [1, N] the same for every K step (so the int4 stand-in with
    the row repeated over the K / 128 steps)."""
    return kernel_standin(x_p, q, jnp.repeat(scale, q.shape[1] // MW.GROUP, axis=0), offset, cfg=cfg,
                          out_dtype=out_dtype)


@pytest.mark.parametrize("M,K,N,split", [(1, 512, 64, 1), (300, 1024, 128, 2)])
def test_int8_wrapper_algebra_matches_reference(M, K, N, split, monkeypatch):
    x, q, scale, want = int8_case(M, K, N, seed=M + N)
    cfg = MW.WideConfig(tile_m=MW.tile_m_for(M), row_blocks=1, split=split, stages=1)
    monkeypatch.setattr(MW, "_wide_jit", functools.partial(MW.forward, call=int8_standin))
    got = MW.int8_matmul_mosaic_wide(x, q, scale, out_dtype=jnp.float32, cfg=cfg)
    assert got.shape == (M, N) and rel_err(got, want) < 5e-3
    with pytest.raises(ValueError, match="scale \\[N\\]"):
        MW.int8_matmul_mosaic_wide(x, q, scale[:-1])


def test_transpose_out_default_follows_the_module_switch(monkeypatch):
    assert MW.default_config(300, 4096, 6144).transpose_out           # on since its GPU tests and A/B (12-05 d)
    monkeypatch.setattr(MW, "TRANSPOSE_OUT", False)                   # what quantized_decode.py's "@yt" sets
    assert not MW.default_config(300, 4096, 6144).transpose_out
