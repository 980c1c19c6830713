"""The Triton small-M kernels (pallas_kernels/quantized_matmul/triton_small_m.py) on CPU: the kernel bodies run in
Triton's interpreter (TRITON_INTERPRET=1, set by tests/conftest.py where there is no GPU) with torch CPU tensors,
launched with the same grid / constexprs as the jax-triton entry points (`launch_params`) and, for int4, the
same derived inputs (`int4_kernel_inputs`), and compared with the jnp float32 references of reference.py on
ragged shapes (N not a multiple of the block, K not a multiple of BK x split), M in 1..20, both inner forms and
several split-K factors. The interpreter's bf16 dot is wrong (numpy has no bf16), so the dots run with F32_DOT
(f32 operands); the bf16-operand form is checked on the GPU (test_triton_small_m_gpu.py)."""
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from pallas_kernels.quantized_matmul import reference as qr
from pallas_kernels.quantized_matmul import triton_small_m as T
from tests.kernels.quant_cases import rel_err

assert os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available(), \
    "tests/conftest.py sets TRITON_INTERPRET=1 on machines without a GPU"
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter tests; the GPU runs *_gpu.py")


def _t(a):
    return torch.from_numpy(np.array(a, order="C"))                          # a writable row-major copy


def _run_int8(x, q_t, scale, cfg):
    """x f32 [M, K], q_t int8 [N, K], scale f32 [N] -> the summed partials [M, N] (float64 numpy)."""
    M, K = x.shape
    N = q_t.shape[0]
    grid, split, meta = T.launch_params("int8", M, N, K, cfg)
    part = torch.full((split, M, N), float("nan"))                          # poison: every element must be written
    T.int8_nk_kernel[grid](_t(x), _t(q_t), _t(scale), M, N, part, F32_DOT=True, **meta)
    assert not torch.isnan(part).any(), "a partial was left unwritten"
    return part.double().sum(0).numpy()


def _run_int4(x, p_t, scale, offset, g, cfg):
    M, K = x.shape
    N = p_t.shape[0]
    grid, split, meta = T.launch_params("int4", M, N, K, cfg, g)
    words, xs = T.int4_kernel_inputs(jnp.asarray(x), jnp.asarray(p_t), g)
    part = torch.full((split, M, N), float("nan"))
    T.int4_nk_kernel[grid](_t(x), _t(words), _t(scale), _t(offset), _t(xs), M, N, part, F32_DOT=True, **meta)
    assert not torch.isnan(part).any(), "a partial was left unwritten"
    return part.double().sum(0).numpy()


@pytest.mark.parametrize("M,K,N,dot,bn,bk,split", [
    (1, 256, 48, False, 32, 64, 2),     # FMA form, N ragged (48 = 1.5 blocks)
    (1, 200, 33, False, 16, 64, 2),     # K ragged (200 = 3.125 steps), N odd
    (3, 320, 40, True, 32, 64, 4),      # tensor-core form, M < 16 rows masked, 4 splits over 5 steps
    (16, 512, 64, True, 32, 128, 1),    # a whole 16-row block, no split
    (20, 192, 24, True, 16, 64, 2),     # two M blocks, the second ragged
])
def test_int8_kernel_matches_reference(M, K, N, dot, bn, bk, split):
    rng = np.random.default_rng(M * 1000 + K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    q = rng.integers(-127, 128, (K, N)).astype(np.int8)                       # the [K, N] layout of the reference
    scale = rng.uniform(1e-3, 1e-2, N).astype(np.float32)
    cfg = T.Config(16 if dot else 1, bn, bk, split, dot, 4, 2)
    got = _run_int8(x, q.T, scale, cfg)
    want = qr.int8_matmul_reference(jnp.asarray(x), jnp.asarray(q), jnp.asarray(scale))
    assert rel_err(got, want) < 1e-5


@pytest.mark.parametrize("M,K,N,g,symmetric,dot,bn,split", [
    (1, 256, 48, 32, True, False, 32, 2),
    (1, 384, 40, 64, False, False, 16, 3),    # 3 splits of 2 groups; N ragged
    (5, 384, 40, 64, True, True, 32, 2),
    (16, 512, 64, 128, False, True, 32, 4),   # split 4 of 4 groups: one group per split
    (18, 256, 24, 32, False, True, 16, 1),    # two M blocks
])
def test_int4_kernel_matches_reference(M, K, N, g, symmetric, dot, bn, split):
    rng = np.random.default_rng(M * 7 + K + g)
    x = rng.standard_normal((M, K)).astype(np.float32)
    u = rng.integers(0, 16, (K, N)).astype(np.uint8)
    packed = qr.pack_int4(u, g)                                                 # uint8 [K/2, N]
    scale = rng.uniform(0.01, 0.1, (K // g, N)).astype(np.float32)
    zero = 8.0 if symmetric else rng.integers(0, 16, (K // g, N)).astype(np.float32)
    offset = (-zero * scale).astype(np.float32)
    cfg = T.Config(16 if dot else 1, bn, g, split, dot, 4, 2)
    got = _run_int4(x, packed.T, scale, offset, g, cfg)
    want = qr.int4_matmul_reference(jnp.asarray(x), jnp.asarray(packed), jnp.asarray(scale), jnp.asarray(offset),
                                    group_size=g)
    # 128 + u is exact, but the dot accumulates x * (128 + u): 128x the magnitude of x * u in f32
    assert rel_err(got, want) < 2e-5


def test_int4_kernel_inputs_are_a_bitcast_and_group_sums():
    """words[n, i] holds bytes 4i..4i+3 of row n little-endian; xs[m, j] = sum of x[m] over group j."""
    rng = np.random.default_rng(3)
    p_t = rng.integers(0, 256, (6, 16)).astype(np.uint8)
    x = rng.standard_normal((2, 32)).astype(np.float32)
    words, xs = T.int4_kernel_inputs(jnp.asarray(x), jnp.asarray(p_t), 16)
    want = (p_t[:, 0::4].astype(np.int64) | p_t[:, 1::4].astype(np.int64) << 8 | p_t[:, 2::4].astype(np.int64) << 16
            | p_t[:, 3::4].astype(np.int64) << 24)
    np.testing.assert_array_equal(np.asarray(words).astype(np.int64) & 0xFFFFFFFF, want)
    np.testing.assert_allclose(np.asarray(xs), x.reshape(2, 2, 16).sum(2), rtol=1e-6)


def test_default_config_split_rule():
    """~TARGET_PROGRAMS programs per call, >= 2 K steps per split, int4 splits dividing the groups."""
    for K, N in ((4096, 28672), (14336, 4096), (4096, 6144), (4096, 4096), (4096, 128256)):
        for M in (1, 4, 16):
            for kind in ("int8", "int4"):
                cfg = T.default_config(kind, M, K, N, 128 if kind == "int4" else None)
                grid, split, meta = T.launch_params(kind, M, N, K, cfg, 128 if kind == "int4" else None)
                programs = grid[0] * grid[1] * grid[2]
                assert programs >= T.TARGET_PROGRAMS or split == 16 or K // (cfg.block_k * split * 2) < 2
                assert meta["K_PER_SPLIT"] * split >= K and meta["K_PER_SPLIT"] % cfg.block_k == 0
                if kind == "int4":
                    assert (K // 128) % split == 0
                assert cfg.dot == (kind == "int8" or M > 1)
    with pytest.raises(ValueError, match="FMA form"):
        T._check_cfg("int8", T.Config(1, 64, 128, 1, False, 4, 3), 2, 4096, None)
    with pytest.raises(ValueError, match="block_k == group_size"):
        T._check_cfg("int4", T.Config(16, 64, 64, 1, True, 4, 3), 16, 4096, 128)


def test_not_usable_on_cpu():
    """No GPU: the engine's Triton paths fall back to XLA (models/quant_paths.KERNEL_FALLBACK)."""
    from jaxinfer.models import quant_paths

    assert not T.usable()
    assert quant_paths.path_for("int8", "xla-nk", 1, K=4096, N=28672) == "convert-nk"     # pallas-nk on a GPU
    assert quant_paths.path_for("int4", "triton-int4", 1, K=4096, N=4096, group_size=128) == "xla-packed-nk"
    assert quant_paths.kernel_runs("pallas-int4-nk", 1, 4096, 4096, 128) is False


# ---- the Pallas-Triton port the engine runs (kernel_nk.py), in Pallas interpret mode ------------------------------
def _eqns(f, x):
    """The equations of f's jaxpr at x, through nested jits (the ops around the kernel and the pallas_call)."""
    todo = [jax.make_jaxpr(f)(x).jaxpr]
    while todo:
        for e in todo.pop().eqns:
            yield e
            if e.primitive.name in ("pjit", "jit"):
                todo.append(e.params["jaxpr"].jaxpr)


@pytest.mark.parametrize("M,K,N,bn,bk,split,exact", [(1, 512, 64, 32, 128, 2, True), (5, 256, 96, 32, 64, 2, True),
                                                     (3, 512, 64, 32, 64, 4, True), (3, 512, 64, 32, 64, 4, False),
                                                     (16, 384, 32, 16, 128, 1, True), (20, 256, 48, 16, 64, 4, True)])
def test_pallas_int8_nk_matches_reference(M, K, N, bn, bk, split, exact):
    """Below 16 rows x's last row read again (no pad), above them rows padded; rows past M cut, split partials
    summed, N in whole blocks; against the jnp reference."""
    from pallas_kernels.quantized_matmul import kernel_nk

    rng = np.random.default_rng(M + K + N)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    q = rng.integers(-127, 128, (K, N)).astype(np.int8)
    scale = jnp.asarray(rng.uniform(1e-3, 1e-2, N), jnp.float32)
    cfg = T.Config(16, bn, bk, split, True, 4, 3, exact_rows=exact)
    got = kernel_nk.int8_matmul_nk(x, jnp.asarray(q.T), scale, interpret=True, cfg=cfg)
    want = qr.int8_matmul_reference(x, jnp.asarray(q), scale)
    assert got.shape == (M, N) and rel_err(got, want) < 1e-5


@pytest.mark.parametrize("M", [1, 5, 16])
def test_pallas_nk_streams_fp8_weights(M):
    """The fp8 model's e4m3 [N, K] weights through the same kernel (weight-only, kernel_nk.NK_WEIGHT_DTYPES) against
    x @ (q * scale).T in float32; and it lowers to Triton for the GPU (the e4m3 -> bf16 cast needs SM 8.9+)."""
    from pallas_kernels.quantized_matmul import kernel_nk

    K, N = 512, 64
    rng = np.random.default_rng(M)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    q = jnp.asarray(rng.standard_normal((N, K)) * 100, jnp.float8_e4m3fn)
    scale = jnp.asarray(rng.uniform(1e-3, 1e-2, N), jnp.float32)
    cfg = T.Config(16, 32, 128, 2, True, 4, 3)
    got = kernel_nk.int8_matmul_nk(x, q, scale, interpret=True, cfg=cfg)
    want = np.asarray(x, np.float64) @ (np.asarray(q.astype(jnp.float32), np.float64) * np.asarray(scale)[:, None]).T
    assert got.shape == (M, N) and rel_err(got, want) < 1e-5
    xb = jax.ShapeDtypeStruct((M, 4096), jnp.bfloat16)
    lowered = jax.jit(lambda x, q, s: kernel_nk.int8_matmul_nk(x, q, s)).trace(
        xb, jax.ShapeDtypeStruct((6144, 4096), jnp.float8_e4m3fn), jax.ShapeDtypeStruct((6144,), jnp.float32)
    ).lower(lowering_platforms=("cuda",))
    assert "triton" in lowered.as_text().lower()
    with pytest.raises(TypeError, match="int8 or float8_e4m3fn"):
        kernel_nk.int8_matmul_nk(x, q.astype(jnp.bfloat16), scale, interpret=True, cfg=cfg)


@pytest.mark.parametrize("M,exact,rows", [(1, True, 4), (5, True, 20), (5, False, 64), (16, True, 64)])
def test_pallas_nk_partials_have_only_xs_rows(M, exact, rows):
    """Below 16 rows the split partials the kernel writes (and XLA sums) are [split * M, N]: not 16 rows a split of
    which M are used (the form before 12-06 i, kept as Config.exact_rows=False); 16 rows and more stay blocked."""
    from pallas_kernels.quantized_matmul import kernel_nk

    cfg = T.Config(16, 32, 64, 4, True, 4, 3, exact_rows=exact)
    q, s = jnp.ones((64, 256), jnp.int8), jnp.ones((64,), jnp.float32)
    f = lambda x: kernel_nk.int8_matmul_nk(x, q, s, interpret=True, cfg=cfg)  # noqa: E731
    (call,) = [e for e in _eqns(f, jnp.ones((M, 256), jnp.float32)) if e.primitive.name == "pallas_call"]
    assert math.prod(call.outvars[0].aval.shape) == rows * 64


@pytest.mark.parametrize("M,pads", [(1, False), (8, False), (16, False), (20, True)])
def test_pallas_nk_pads_x_only_above_16_rows(M, pads):
    """A decode bucket of 1..16 rows calls the kernel on x as it is: no pad op before the pallas_call (the kernel
    reads x's last row again instead); only a ragged M above 16 is padded to whole blocks."""
    from pallas_kernels.quantized_matmul import kernel_nk

    cfg = T.Config(16, 32, 64, 1, True, 4, 3)
    q, s = jnp.ones((64, 128), jnp.int8), jnp.ones((64,), jnp.float32)
    p4, sc = jnp.ones((64, 64), jnp.uint8), jnp.ones((1, 64), jnp.float32)
    for f in (lambda x: kernel_nk.int8_matmul_nk(x, q, s, interpret=True, cfg=cfg),
              lambda x: kernel_nk.int4_matmul_nk(x, p4, sc, sc, group_size=128, interpret=True,
                                                 cfg=T.Config(16, 32, 128, 1, True, 4, 3))):
        names = {e.primitive.name for e in _eqns(f, jnp.ones((M, 128), jnp.float32))}
        assert "pallas_call" in names and ("pad" in names) == pads, names


def test_pallas_int8_nk_refuses_partial_blocks():
    from pallas_kernels.quantized_matmul import kernel_nk

    x = jnp.ones((1, 256), jnp.float32)
    with pytest.raises(ValueError, match="N % 32 == 0"):
        kernel_nk.int8_matmul_nk(x, jnp.ones((40, 256), jnp.int8), jnp.ones((40,)), interpret=True,
                                 cfg=T.Config(16, 32, 64, 1, True, 4, 3))
    assert not kernel_nk.supports(200, 64, T.Config(16, 32, 64, 1, True, 4, 3))      # K ragged


@pytest.mark.parametrize("M,K,N,g,symmetric,dot,bn,split", [
    (1, 256, 64, 32, True, False, 32, 2),      # FMA form, 4 groups in 2 splits
    (1, 384, 32, 64, False, False, 16, 3),
    (1, 512, 32, 128, False, False, 32, 1),
    (5, 512, 48, 128, True, True, 16, 2),      # tensor-core form (g = 128), M < 16: last row repeated
    (18, 256, 32, 128, False, True, 16, 1),    # two M blocks
])
def test_pallas_int4_nk_matches_reference(M, K, N, g, symmetric, dot, bn, split):
    """The Pallas port of the int4 kernel (kernel_nk.int4_matmul_nk) in interpret mode against the reference."""
    from pallas_kernels.quantized_matmul import kernel_nk

    rng = np.random.default_rng(M * 11 + K + g)
    x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
    u = rng.integers(0, 16, (K, N)).astype(np.uint8)
    packed = qr.pack_int4(u, g)
    scale = rng.uniform(0.01, 0.1, (K // g, N)).astype(np.float32)
    zero = 8.0 if symmetric else rng.integers(0, 16, (K // g, N)).astype(np.float32)
    offset = jnp.asarray(-zero * scale, jnp.float32)
    cfg = T.Config(16 if dot else 1, bn, g, split, dot, 4, 3)
    got = kernel_nk.int4_matmul_nk(x, jnp.asarray(packed.T), jnp.asarray(scale), offset, group_size=g,
                                   interpret=True, cfg=cfg)
    want = qr.int4_matmul_reference(x, jnp.asarray(packed), jnp.asarray(scale), offset, group_size=g)
    assert got.shape == (M, N) and rel_err(got, want) < 2e-5
    assert not kernel_nk.int4_supports(4, K, N, 64, T.Config(16, bn, 64, 1, True, 4, 3))   # dot needs g = 128
