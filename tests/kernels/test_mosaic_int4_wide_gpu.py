"""The many-token Mosaic GPU int4 kernel (pallas_kernels/quantized_matmul/mosaic_int4_wide.py) on a Hopper GPU:
against the float32 reference of the same quantized weights with each dequantized weight rounded to bf16 as the
kernel rounds it (tight: only summation order differs), and against the plain float32 reference (loose: that
rounding); 8B projection shapes, M from 1 to 2048 (ragged, not multiples of the tile), with and without offsets,
each config family. Run with `python benchmarks/gpu_tests.py tests/kernels/test_mosaic_int4_wide_gpu.py`."""
import dataclasses

import jax.numpy as jnp
import pytest
from jax import lax

from pallas_kernels.quantized_matmul import mosaic_int4_wide as MW
from tests.kernels.quant_cases import assert_engine_path_like_xla, rel_err
from tests.kernels.test_mosaic_int4 import native_nk_case
from tests.kernels.test_mosaic_int4_wide import dequant_bf16

pytestmark = pytest.mark.gpu

TIGHT = 1e-4     # the bf16-rounded weights in float32 (HIGHEST: no TF32) vs the kernel's f32 accumulation
LOOSE = 5e-3     # vs the unrounded float32 reference: the bf16 rounding of each weight


def check(M, K, N, offset, cfg=None, seed=0):
    x, q, scale, off, want = native_nk_case(M, K, N, seed=seed, offset=offset)
    got = MW.int4_matmul_mosaic_wide(x, q, scale, off, out_dtype=jnp.float32, cfg=cfg)
    assert got.shape == (M, N)
    if off is None:   # q * scale is exact in f32: one rounding to bf16, no model of mul-then-add vs FMA needed
        exact = jnp.dot(x.astype(jnp.float32), dequant_bf16(q, scale, None).T, precision=lax.Precision.HIGHEST)
        assert rel_err(got, exact) < TIGHT
    assert rel_err(got, want) < LOOSE


@pytest.mark.parametrize("M", [1, 16, 129, 256, 300, 2048])
@pytest.mark.parametrize("K,N", [(4096, 6144), (14336, 4096), (512, 64)])
@pytest.mark.parametrize("offset", [True, False])
def test_matches_reference(M, K, N, offset):
    check(M, K, N, offset, seed=M * 7 + K + N)


@pytest.mark.parametrize("kw", [dict(max_tile_m=256), dict(row_blocks=1), dict(target_ctas=1024),
                                dict(max_stages=2)])
def test_every_swept_config_matches(kw):
    M, K, N = 333, 4096, 1024
    check(M, K, N, True, cfg=MW.default_config(M, K, N, **kw), seed=11)


@pytest.mark.parametrize("M,K,N,offset", [(300, 4096, 6144, False), (2048, 14336, 4096, True), (16, 512, 128, False),
                                          (256, 4096, 4096, True)])
@pytest.mark.parametrize("row_blocks", [1, 2])
def test_transposed_output_matches(M, K, N, offset, row_blocks):
    """transpose_out: the kernel writes y [M, N] itself (a register relayout and a transposed shared-memory store);
    split (f32 partials) and unsplit (bf16 / f32 y) configs. Passed on an H200 at 2b5cd52 (2026-12-05 d)."""
    cfg = dataclasses.replace(MW.default_config(M, K, N, row_blocks=row_blocks), transpose_out=True)
    check(M, K, N, offset, cfg=cfg, seed=M + K + row_blocks)


def test_bf16_output():
    x, q, scale, off, want = native_nk_case(260, 1024, 256, seed=5)
    got = MW.int4_matmul_mosaic_wide(x, q, scale, off)
    assert got.dtype == jnp.bfloat16 and rel_err(got.astype(jnp.float32), want) < 1e-2


def test_the_int4_default_runs_it_for_long_prefills_and_matches_reference(g128_llama_dir):
    """quantization='int4' on one Hopper GPU: a 300-token prompt's prefill step (above 128 tokens) runs this
    kernel (models/quant_paths.PATHS[('int4', 'mosaic-int4')]); the engine agrees with XLA's dequantize + dot and the
    jnp reference on the same int4 weights (quant_cases.assert_engine_path_like_xla). Its float32 form failed on the
    GPU on 12-05 d: the kernel is exact per op at this model's shapes (1e-7 against the bf16-rounded weights), but
    rounds the activations to bf16, which moved a float32 model's prompt log-probs by 0.10 on average
    (benchmarks/probes/int4_wide_diag.py)."""
    from jaxinfer.models import quant_paths

    assert quant_paths.path_for("int4", "mosaic-int4", 300, 128, 256, 128) == "mosaic-int4-wide-nk"
    assert_engine_path_like_xla(g128_llama_dir, "int4", [(37 * i + 11) % 500 + 3 for i in range(300)],
                                max_model_len=512, num_pages=64, max_num_batched_tokens=512, warmup=False,
                                progress=False)


@pytest.mark.parametrize("M,K,N", [(1, 4096, 6144), (300, 4096, 6144), (2048, 14336, 4096), (256, 512, 128)])
@pytest.mark.parametrize("transpose_out", [False, True])
def test_int8_form_matches_reference(M, K, N, transpose_out):
    """int8_matmul_mosaic_wide: int8 -> bf16 exact, the f32 per-channel scale on the accumulator, so only the
    summation order separates it from x @ (q * scale).T in float32 (HIGHEST). Passed on an H200 at 2b5cd52."""
    from tests.kernels.test_mosaic_int4_wide import int8_case

    x, q, scale, _ = int8_case(M, K, N, seed=M + K)
    cfg = dataclasses.replace(MW.default_config(M, K, N, weight_bits=8), transpose_out=transpose_out)
    got = MW.int8_matmul_mosaic_wide(x, q, scale, out_dtype=jnp.float32, cfg=cfg)
    want = jnp.dot(x.astype(jnp.float32), (q.astype(jnp.float32) * scale[:, None]).T, precision=lax.Precision.HIGHEST)
    assert got.shape == (M, N) and rel_err(got, want) < TIGHT
