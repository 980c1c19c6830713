"""Quantized matmul: RTN quantization error bounds, int4 packing, the Pallas kernel (interpret mode) and the XLA
paths against the float32 reference on the same quantized weights (tight), and against the float weights
(relative-norm bound); the kernel also lowers to Triton for the GPU (checked on CPU, no GPU needed)."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from jaxinfer.weights.quantize import quantize_rtn, tensor_leaves
from jaxinfer.config import QuantizationError
from jaxinfer.weights.quant_tensor import QuantizedTensor
from pallas_kernels.quantized_matmul import kernel as qk
from pallas_kernels.quantized_matmul import reference as qr
from pallas_kernels.quantized_matmul import xla as qx
from tests.kernels.quant_cases import outlier_weights as _weights, rel_err as _rel


# ---- RTN ----------------------------------------------------------------------------------------------------
def test_int8_rtn_error_is_half_a_step():
    w = _weights(256, 96)
    qt = quantize_rtn(w, "int8")
    assert qt.q.dtype == np.int8 and qt.scale.shape == (96,) and np.abs(qt.q).max() == 127
    err = np.abs(qt.dequantize() - w)
    assert np.all(err <= qt.scale[None, :] / 2 * (1 + 1e-5))


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [True, False])
def test_int4_rtn_error_bound(group, symmetric):
    w = _weights(256, 64, seed=group)
    qt = quantize_rtn(w, "int4", group_size=group, symmetric=symmetric)
    assert qt.scale.shape == (256 // group, 64) and (qt.zero is None) == symmetric
    lo, hi = (-8, 7) if symmetric else (0, 15)
    assert qt.q.min() >= lo and qt.q.max() <= hi
    step = np.repeat(qt.scale, group, axis=0)
    # Symmetric: no value is clipped (max|w| maps to 7), so the error is half a step; asymmetric: the rounded
    # zero point shifts the grid by up to half a step, so the ends may lose one more half step.
    bound = 0.5 if symmetric else 1.0
    assert np.all(np.abs(qt.dequantize() - w) <= step * bound * (1 + 1e-5))
    assert _rel(qt.dequantize(), w) < 0.13


def test_fp8_rtn_error_bound():
    w = _weights(128, 64)
    qt = quantize_rtn(w, "fp8")
    assert qt.q.dtype == ml_dtypes.float8_e4m3fn
    err = np.abs(qt.dequantize() - w)
    # e4m3: 3 mantissa bits -> relative rounding error <= 2^-4 for normals; subnormals: absolute 2^-10 * scale.
    assert np.all(err <= np.abs(w) * 2.0 ** -4 + qt.scale[None, :] * 2.0 ** -10)


def test_int4_pack_roundtrip_and_layout():
    rng = np.random.default_rng(3)
    u = rng.integers(0, 16, size=(128, 48)).astype(np.uint8)
    for g in (32, 64, 128):
        p = qr.pack_int4(u, g)
        assert p.shape == (64, 48) and p.dtype == np.uint8
        np.testing.assert_array_equal(qr.unpack_int4(p, g), u)
        np.testing.assert_array_equal(np.asarray(qr.unpack_int4(jnp.asarray(p), g)), u)
        # byte j of group 0 holds row j (low nibble) and row j + g/2 (high nibble)
        assert p[1, 5] == u[1, 5] | (u[1 + g // 2, 5] << 4)


@pytest.mark.parametrize("method,kw", [("int8", {}), ("int4", dict(group_size=64, symmetric=True)),
                                       ("int4", dict(group_size=32, symmetric=False)), ("fp8", {})])
def test_device_leaves_dequantize_to_the_tensor(method, kw):
    """The device layout (reference.py) represents exactly the QuantizedTensor's weights (float32 leaves)."""
    w = _weights(128, 64, seed=5)
    qt = quantize_rtn(w, method, **kw)
    L = tensor_leaves(qt, jnp.float32)
    if method == "int8":
        deq = np.asarray(L["q"], np.float32) * np.asarray(L["scale"])[None, :]
    elif method == "fp8":
        deq = np.asarray(L["q"].astype(jnp.float32)).T * np.asarray(L["scale"])[None, :]
    else:
        deq = np.asarray(qr.dequantize_int4(L["q"], L["scale"], L["offset"], kw["group_size"]))
    np.testing.assert_allclose(deq, qt.dequantize(), rtol=1e-6, atol=1e-7)


# ---- kernels vs reference -----------------------------------------------------------------------------------
def _x(M, K, dtype, seed=1):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(M, K)), dtype)


@pytest.mark.parametrize("M,dtype", [(1, jnp.bfloat16), (5, jnp.float32), (16, jnp.bfloat16), (40, jnp.float32)])
def test_int8_kernel_matches_reference(M, dtype):
    K, N = 512, 96
    qt = quantize_rtn(_weights(K, N), "int8")
    L = tensor_leaves(qt, dtype)
    x = _x(M, K, dtype)
    ref = qr.int8_matmul_reference(x, L["q"], L["scale"], out_dtype=jnp.float32)
    got = qk.int8_matmul(x, L["q"], L["scale"], out_dtype=jnp.float32, interpret=True)
    assert got.shape == (M, N)
    assert _rel(got, ref) < 1e-5  # same integers, f32 accumulation: only the summation order differs
    xf = np.asarray(x, np.float64)
    assert _rel(got, xf @ _weights(K, N)) < 1e-2  # vs the float weights
    bf = qk.int8_matmul(x, L["q"], L["scale"], interpret=True)  # default: the activation dtype out
    assert bf.dtype == dtype and _rel(bf, ref) < 1e-2


@pytest.mark.parametrize("group,symmetric,M", [(32, True, 1), (64, False, 16), (128, True, 33), (64, True, 3)])
def test_int4_kernel_matches_reference(group, symmetric, M):
    K, N = 256, 64
    w = _weights(K, N, seed=group)
    qt = quantize_rtn(w, "int4", group_size=group, symmetric=symmetric)
    L = tensor_leaves(qt, jnp.bfloat16)
    x = _x(M, K, jnp.bfloat16)
    ref = qr.int4_matmul_reference(x, L["q"], L["scale"], L["offset"], group_size=group, out_dtype=jnp.float32)
    got = qk.int4_matmul(x, L["q"], L["scale"], L["offset"], group_size=group, out_dtype=jnp.float32,
                         interpret=True)
    assert _rel(got, ref) < 1e-5
    xf = np.asarray(x, np.float64)
    assert _rel(got, xf @ w) < 0.13


def test_split_k_and_large_m_configs():
    """Explicit split-K (f32 partials summed outside) and the large-M tile configuration."""
    K, N = 1024, 128
    qt = quantize_rtn(_weights(K, N), "int8")
    L = tensor_leaves(qt, jnp.bfloat16)
    x = _x(3, K, jnp.bfloat16)
    ref = qr.int8_matmul_reference(x, L["q"], L["scale"], out_dtype=jnp.float32)
    split = qk.int8_matmul(x, L["q"], L["scale"], out_dtype=jnp.float32, interpret=True, split_k=4, block_k=64,
                           block_n=32)
    assert _rel(split, ref) < 1e-5
    assert qk._config("int8", 3, K, N, None, 132).split_k > 1   # small M splits K to fill the GPU
    big = qk._config("int8", 2048, 4096, 4096, None, 132)       # 16 x 32 output tiles fill 132 SMs
    assert big.block_m == 128 and big.split_k == 1
    q4 = quantize_rtn(_weights(K, N), "int4", group_size=128)
    L4 = tensor_leaves(q4, jnp.bfloat16)
    x = _x(130, K, jnp.bfloat16)
    ref4 = qr.int4_matmul_reference(x, L4["q"], L4["scale"], L4["offset"], group_size=128, out_dtype=jnp.float32)
    got4 = qk.int4_matmul(x, L4["q"], L4["scale"], L4["offset"], group_size=128, out_dtype=jnp.float32,
                          interpret=True, block_m=64)
    assert _rel(got4, ref4) < 1e-5


def test_xla_paths_match_reference():
    K, N, M = 256, 64, 7
    w = _weights(K, N)
    x = _x(M, K, jnp.bfloat16)
    xf = np.asarray(x, np.float64)
    L8 = tensor_leaves(quantize_rtn(w, "int8"), jnp.bfloat16)
    ref8 = qr.int8_matmul_reference(x, L8["q"], L8["scale"], out_dtype=jnp.float32)
    assert _rel(qx.int8_matmul_xla(x, L8["q"], L8["scale"], out_dtype=jnp.float32), ref8) < 1e-5
    L4 = tensor_leaves(quantize_rtn(w, "int4", group_size=64), jnp.bfloat16)
    ref4 = qr.int4_matmul_reference(x, L4["q"], L4["scale"], L4["offset"], group_size=64, out_dtype=jnp.float32)
    # XLA dequantizes into bf16 (one rounding of each weight), the reference into f32.
    assert _rel(qx.int4_matmul_xla(x, L4["q"], L4["scale"], L4["offset"], group_size=64,
                                   out_dtype=jnp.float32), ref4) < 5e-3
    L8f = tensor_leaves(quantize_rtn(w, "fp8"), jnp.bfloat16)
    ref_f = qr.fp8_matmul_reference(x, L8f["q"], L8f["scale"], out_dtype=jnp.float32)
    assert _rel(qx.fp8_matmul_xla(x, L8f["q"], L8f["scale"], out_dtype=jnp.float32), ref_f) < 1e-5
    assert _rel(ref_f, xf @ w) < 0.06  # W8A8 vs float: weights and activations both rounded to e4m3
    # a bf16 result: the dot's output is bf16 too (half the bytes the scaling reads back), one rounding more
    got16 = qx.fp8_matmul_xla(x, L8f["q"], L8f["scale"])
    assert got16.dtype == jnp.bfloat16 and _rel(got16.astype(jnp.float32), ref_f) < 2 ** -7
    dots = [e for e in jax.make_jaxpr(qx.fp8_matmul_xla)(x, L8f["q"], L8f["scale"]).eqns
            if e.primitive.name == "dot_general"]
    assert [e.outvars[0].aval.dtype for e in dots] == [jnp.bfloat16]


def test_fp8_quant_barrier_keeps_the_numbers(monkeypatch):
    """JAXINFER_FP8_FUSED_QUANT=0 (an A/B): the activations pass an optimization barrier before their e4m3
    quantization; the result is bit-identical to the fused form, and the barrier is in the traced program."""
    rng = np.random.default_rng(5)
    x = jnp.asarray(rng.standard_normal((48, 256)), jnp.bfloat16)
    L = tensor_leaves(quantize_rtn(jnp.asarray(rng.standard_normal((256, 384)) * 0.05, jnp.float32), "fp8"),
                      jnp.bfloat16)
    def fresh():  # a new function each time: jax caches a function's trace, and the switch is read when tracing
        return lambda *a: qx.fp8_matmul_xla(*a)

    fused = np.asarray(jax.jit(fresh())(x, L["q"], L["scale"]).astype(jnp.float32))
    assert "optimization_barrier" not in {e.primitive.name for e in jax.make_jaxpr(fresh())(x, L["q"], L["scale"]).eqns}
    monkeypatch.setenv("JAXINFER_FP8_FUSED_QUANT", "0")
    assert "optimization_barrier" in {e.primitive.name for e in jax.make_jaxpr(fresh())(x, L["q"], L["scale"]).eqns}
    barrier = np.asarray(jax.jit(fresh())(x, L["q"], L["scale"]).astype(jnp.float32))
    np.testing.assert_array_equal(barrier, fused)


@pytest.mark.parametrize("kind,M", [("int8", 1), ("int8", 48), ("int8", 256), ("int4", 4), ("int4", 2048)])
def test_kernel_lowers_to_triton_for_gpu(kind, M):
    """Both configurations of the 8B shape pass the Pallas Triton lowering (block sizes, dtypes, ops) on CPU."""
    K, N = 4096, 6144
    x = jax.ShapeDtypeStruct((M, K), jnp.bfloat16)
    if kind == "int8":
        w, s, o, g = (jax.ShapeDtypeStruct((K, N), jnp.int8), jax.ShapeDtypeStruct((N,), jnp.float32), None, None)
    else:
        g = 128
        w, s = jax.ShapeDtypeStruct((K // 2, N), jnp.uint8), jax.ShapeDtypeStruct((K // g, N), jnp.bfloat16)
        o = s
    cfg = qk._config(kind, M, K, N, g, 132)
    lowered = qk._quantized_matmul.trace(x, w, s, o, kind=kind, cfg=cfg, out_dtype=jnp.dtype(jnp.bfloat16),
                                         interpret=False).lower(lowering_platforms=("cuda",))
    assert "triton" in lowered.as_text().lower()


# ---- errors -------------------------------------------------------------------------------------------------
def test_bad_inputs_are_clear_errors():
    with pytest.raises(QuantizationError, match="group size 128 does not divide its input dimension 96"):
        quantize_rtn(np.zeros((96, 16), np.float32), "int4", group_size=128)
    with pytest.raises(QuantizationError, match="unknown quantization method 'int3'"):
        quantize_rtn(np.zeros((64, 16), np.float32), "int3")
    L = tensor_leaves(quantize_rtn(_weights(64, 32), "int8"), jnp.bfloat16)
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., 64\]"):
        qk.int8_matmul(jnp.zeros((2, 32), jnp.bfloat16), L["q"], L["scale"], interpret=True)
    with pytest.raises(TypeError, match="q must be int8"):
        qk.int8_matmul(jnp.zeros((2, 64), jnp.bfloat16), L["q"].astype(jnp.int32), L["scale"], interpret=True)
    with pytest.raises(ValueError, match="block_n must be a power of two"):
        qk.int8_matmul(jnp.zeros((2, 64), jnp.bfloat16), L["q"], L["scale"], interpret=True, block_n=24)
    L4 = tensor_leaves(quantize_rtn(_weights(64, 32), "int4", group_size=32), jnp.bfloat16)
    with pytest.raises(ValueError, match="scale and offset must be"):
        qk.int4_matmul(jnp.zeros((2, 64), jnp.bfloat16), L4["q"], L4["scale"][:1], L4["offset"], group_size=32,
                       interpret=True)
    with pytest.raises(QuantizationError, match=r"int4 values must lie in \[-8, 7\]"):
        tensor_leaves(QuantizedTensor("int4", np.full((64, 16), 9, np.int8), np.ones((2, 16), np.float32),
                                      None, 32), jnp.bfloat16)
