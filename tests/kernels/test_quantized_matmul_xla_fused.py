"""The XLA formulations of xla_fused.py (int8 W8A8 through the int8 dot, mixed-type and convert int8 dots, native
int4 dequant / grouped forms) on CPU: tight bounds against the float32 / float64 reference on the same quantized
weights (and, for W8A8, the same quantized activations), relative-norm bounds against the float weights, on
ragged shapes (K, N not multiples of any tile; M in 1..16 and 64..2048); the native int4 layout against the
packed one; the per-M path table of models/quant_paths.py."""
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.models import quant_paths
from jaxinfer.models.quant_linear import QuantLinear
from jaxinfer.weights.quantize import quantize_rtn, tensor_leaves
from jaxinfer.config import QuantizationError, parse_quantization
from pallas_kernels.quantized_matmul import reference as qr
from pallas_kernels.quantized_matmul import xla_fused as qf
from tests.kernels.quant_cases import outlier_weights as _weights, rel_err as _rel

M_RAGGED = [1, 3, 16, 64, 130, 2048]


def _x(M, K, dtype=jnp.bfloat16, seed=1):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(M, K)), dtype)


# ---- int8 activations ---------------------------------------------------------------------------------------
def test_int8_activation_quantization_matches_numpy():
    x = _x(9, 77, jnp.float32).at[4].set(0.0)                                 # one all-zero (padding) row
    xq, xs = qr.quantize_activations_int8(x)
    xn = np.asarray(x, np.float32)
    s = np.maximum(np.abs(xn).max(axis=1), np.float32(1e-12)) / np.float32(127)
    want = np.clip(np.round(xn / s[:, None]), -127, 127).astype(np.int8)
    np.testing.assert_array_equal(np.asarray(xq), want)
    np.testing.assert_allclose(np.asarray(xs), s, rtol=1e-7)
    assert np.abs(np.asarray(xq)).max() == 127 and not np.asarray(xq)[4].any()
    # round-to-nearest: each activation is within half a step of its value
    assert np.all(np.abs(want * s[:, None] - xn) <= s[:, None] / 2 * (1 + 1e-6))


# ---- int8 paths ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("M", M_RAGGED)
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_int8_w8a8_matches_reference(M, layout):
    """W8A8: exact integer dot (int32) vs an independent float64 dot of the same integers; vs float weights and
    activations the error is that of rounding both to 8 bits (bounded, and larger than weight-only int8)."""
    K, N = 200, 77                                                            # no tile divides these
    w = _weights(K, N, seed=M)
    L = tensor_leaves(quantize_rtn(w, "int8"), jnp.float32)
    q = L["q"] if layout == "kn" else L["q"].T
    x = _x(M, K)
    got = qf.int8_w8a8_xla(x, q, L["scale"], layout=layout, out_dtype=jnp.float32)
    assert got.shape == (M, N)
    xq, xs = qr.quantize_activations_int8(x)
    exact = (np.asarray(xq, np.float64) @ np.asarray(L["q"], np.float64)) * np.asarray(xs, np.float64)[:, None] \
        * np.asarray(L["scale"], np.float64)[None, :]
    assert _rel(got, exact) < 1e-6            # int32 accumulation is exact; only the f32 scaling rounds
    ref = qr.int8_w8a8_matmul_reference(x, L["q"], L["scale"], out_dtype=jnp.float32)
    assert _rel(ref, exact) < 1e-5
    xf = np.asarray(x, np.float64)
    err_f = _rel(got, xf @ w)
    assert err_f < 2e-2                       # both operands rounded to 8 bits (measured ~1%)
    weight_only = qr.int8_matmul_reference(x, L["q"], L["scale"], out_dtype=jnp.float32)
    assert _rel(weight_only, xf @ w) < err_f  # the activation rounding is what W8A8 adds
    bf = qf.int8_w8a8_xla(x, q, L["scale"], layout=layout)
    assert bf.dtype == jnp.bfloat16 and _rel(bf, exact) < 1e-2


@pytest.mark.parametrize("M", [1, 16, 64, 2048])
@pytest.mark.parametrize("fn", [qf.int8_mixed_xla, qf.int8_convert_xla])
@pytest.mark.parametrize("layout", ["kn", "nk"])
def test_int8_weight_only_xla_matches_reference(M, fn, layout):
    K, N = 200, 77
    w = _weights(K, N, seed=3)
    L = tensor_leaves(quantize_rtn(w, "int8"), jnp.float32)
    q = L["q"] if layout == "kn" else L["q"].T
    for dtype in (jnp.float32, jnp.bfloat16):
        x = _x(M, K, dtype)
        ref = qr.int8_matmul_reference(x, L["q"], L["scale"], out_dtype=jnp.float32)
        got = fn(x, q, L["scale"], layout=layout, out_dtype=jnp.float32)
        assert got.shape == (M, N) and _rel(got, ref) < 1e-5      # same integers, f32 accumulation
        assert _rel(got, np.asarray(x, np.float64) @ w) < 1e-2


def test_int8_xla_bad_inputs():
    L = tensor_leaves(quantize_rtn(_weights(64, 32), "int8"), jnp.float32)
    with pytest.raises(ValueError, match="layout must be one of"):
        qf.int8_w8a8_xla(_x(2, 64), L["q"], L["scale"], layout="nn")
    with pytest.raises(ValueError, match=r"x must be \[\.\.\., 64\]"):
        qf.int8_mixed_xla(_x(2, 32), L["q"], L["scale"])


# ---- native int4 --------------------------------------------------------------------------------------------
def _int4_native(w, group, symmetric, dtype=jnp.float32):
    qt = quantize_rtn(w, "int4", group_size=group, symmetric=symmetric)
    return qt, tensor_leaves(qt, dtype, layout="native")


@pytest.mark.parametrize("group,symmetric", [(32, True), (64, False), (128, True), (32, False)])
def test_native_int4_layout_is_the_tensor_and_the_packed_layout(group, symmetric):
    K, N = 384, 50
    qt, L = _int4_native(_weights(K, N, seed=group), group, symmetric)
    assert L["q"].dtype == jnp.int4 and L["q"].shape == (K, N)
    assert ("offset" in L) == (not symmetric)                                  # symmetric: no offset bytes
    deq = np.asarray(qr.dequantize_int4_native(L["q"], L["scale"], L.get("offset"), group))
    np.testing.assert_allclose(deq, qt.dequantize(), rtol=1e-6, atol=1e-7)
    P = tensor_leaves(qt, jnp.float32)                                         # packed layout, same tensor
    u = qr.unpack_int4(P["q"], group)
    q4, s4, o4 = qr.int4_native_from_u(u, P["scale"], P["offset"])
    np.testing.assert_array_equal(np.asarray(q4, np.int8), np.asarray(L["q"], np.int8))
    np.testing.assert_allclose(np.asarray(qr.dequantize_int4_native(q4, s4, o4, group)),
                               np.asarray(qr.dequantize_int4(P["q"], P["scale"], P["offset"], group)),
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("M", M_RAGGED)
@pytest.mark.parametrize("group,symmetric", [(32, True), (64, False), (128, False)])
def test_native_int4_paths_match_reference(M, group, symmetric):
    K, N = 3 * 128, 77                                                         # N ragged; K whole groups
    w = _weights(K, N, seed=M + group)
    _, L = _int4_native(w, group, symmetric, jnp.bfloat16)
    off = L.get("offset")
    x = _x(M, K)
    ref = qr.int4_native_matmul_reference(x, L["q"], L["scale"], off, group_size=group, out_dtype=jnp.float32)
    xf = np.asarray(x, np.float64)
    exact = xf @ np.asarray(qr.dequantize_int4_native(L["q"], L["scale"], off, group), np.float64)
    assert _rel(ref, exact) < 1e-5
    for mixed in (False, True):
        g = qf.int4_native_grouped_xla(x, L["q"], L["scale"], off, group_size=group, out_dtype=jnp.float32,
                                       mixed=mixed)
        assert g.shape == (M, N) and _rel(g, exact) < 1e-5   # raw integers exact in bf16, f32 group sums
    d = qf.int4_native_dequant_xla(x, L["q"], L["scale"], off, group_size=group, out_dtype=jnp.float32)
    assert _rel(d, exact) < 5e-3                             # dequantized weights rounded once to bf16
    assert _rel(d, xf @ w) < 0.13 and _rel(ref, xf @ w) < 0.13


def test_native_int4_grouped_falls_back_past_its_memory_bound(monkeypatch):
    K, N, M = 256, 64, 40
    _, L = _int4_native(_weights(K, N), 32, True, jnp.bfloat16)
    x = _x(M, K)
    monkeypatch.setattr(qf, "GROUPED_MAX_BYTES", 1024)                         # force the dequant form
    got = qf.int4_native_grouped_xla(x, L["q"], L["scale"], None, group_size=32, out_dtype=jnp.float32)
    want = qf.int4_native_dequant_xla(x, L["q"], L["scale"], None, group_size=32, out_dtype=jnp.float32)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_native_int4_bad_inputs():
    _, L = _int4_native(_weights(64, 32), 32, False)
    with pytest.raises(TypeError, match="native int4 weights must be int4"):
        qf.int4_native_dequant_xla(_x(2, 64), L["q"].astype(jnp.int8), L["scale"], L["offset"], group_size=32)
    with pytest.raises(ValueError, match="scale \\(and offset\\) must be"):
        qf.int4_native_grouped_xla(_x(2, 64), L["q"], L["scale"][:1], L["offset"], group_size=32)
    with pytest.raises(ValueError, match="group_size 48 must divide K=64"):
        qf.int4_native_dequant_xla(_x(2, 64), L["q"], L["scale"], L["offset"], group_size=48)


# ---- the path table and the model backends ------------------------------------------------------------------
def test_path_table_picks_by_m(monkeypatch):
    monkeypatch.setitem(quant_paths.PATHS, ("int8", "auto"), ((16, "w8a8"), (256, "xla-mixed"),
                                                             (quant_paths.ANY_M, "pallas")))
    quant_paths.check_tables()
    assert [quant_paths.path_for("int8", "auto", m) for m in (1, 16, 17, 256, 2048)] == \
        ["w8a8", "w8a8", "xla-mixed", "xla-mixed", "pallas"]
    assert quant_paths.path_for("int8", "auto", 4096, K=4096, N=4096) == "pallas"
    assert quant_paths.path_for("int8", "auto", 4096, K=4096, N=4104) == "xla"   # N % 16: no kernel
    assert quant_paths.path_for("int8", "w8a8", 1) == "w8a8"
    assert quant_paths.path_for("fp8", "auto", 1) == "xla"
    monkeypatch.setitem(quant_paths.PATHS, ("int4", "auto"), ((16, "int4-dequant"), (quant_paths.ANY_M, "xla")))
    with pytest.raises(ValueError, match="not paths of the int4 packed layout"):
        quant_paths.check_tables()
    monkeypatch.setitem(quant_paths.PATHS, ("int4", "auto"), ((16, "xla"),))
    with pytest.raises(ValueError, match="end with ANY_M"):
        quant_paths.check_tables()


def test_no_kernel_paths_without_kernels(monkeypatch):
    """kernels=False (a layer under tensor parallelism) turns every small-M kernel pick into its XLA fallback,
    even where the kernel would run (GPU, JAXINFER_TRITON unset: simulated here by kernels_enabled)."""
    from pallas_kernels.quantized_matmul import triton_small_m

    monkeypatch.setattr(triton_small_m, "kernels_enabled", lambda: True)
    for method, backend, g, kernel in (("int8", "xla-nk", None, "pallas-nk"),
                                       ("int4", "triton-int4", 128, "pallas-int4-nk")):
        for M in (1, 16):
            assert quant_paths.path_for(method, backend, M, 4096, 4096, g) == kernel
            assert quant_paths.path_for(method, backend, M, 4096, 4096, g, kernels=False) == \
                quant_paths.KERNEL_FALLBACK[kernel]
        assert quant_paths.path_for(method, backend, 64, 4096, 4096, g) == \
            quant_paths.path_for(method, backend, 64, 4096, 4096, g, kernels=False)


def test_fp8_runs_weight_only_through_the_small_m_kernel(monkeypatch):
    """fp8 ('xla', its GPU backend): at M <= 16 the e4m3 weights through the int8 small-M kernel, weight-only (x not
    rounded to e4m3); above, W8A8 through XLA's fp8 dot; XLA's dot at every M where the kernel cannot run or under
    tensor parallelism (kernels=False). The kernel runs in interpret mode here (kernels_enabled simulated)."""
    import functools

    from pallas_kernels.quantized_matmul import kernel_nk, triton_small_m

    K, N = 512, 64
    assert quant_paths.path_for("fp8", "xla", 1, K, N) == "xla"               # CPU: no kernel
    monkeypatch.setattr(triton_small_m, "kernels_enabled", lambda: True)
    assert [quant_paths.path_for("fp8", "xla", m, K, N) for m in (1, 16, 17)] == ["pallas-nk", "pallas-nk", "xla"]
    assert quant_paths.path_for("fp8", "xla", 1, K, N, kernels=False) == "xla"
    assert quant_paths.path_for("fp8", "reference", 1, K, N) == "reference"
    monkeypatch.setattr(kernel_nk, "int8_matmul_nk", functools.partial(kernel_nk.int8_matmul_nk, interpret=True))
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.standard_normal((N, K)) * 100, jnp.float8_e4m3fn)
    scale = jnp.asarray(rng.uniform(1e-3, 1e-2, N), jnp.float32)
    w = np.asarray(q.astype(jnp.float32), np.float64) * np.asarray(scale)[:, None]      # [N, K]
    for M in (3, 17):
        x = jnp.asarray(rng.standard_normal((M, K)), jnp.float32)
        got = quant_paths.quantized_matmul(x, "fp8", q, scale, backend="xla")
        weight_only = _rel(got, np.asarray(x, np.float64) @ w.T)
        assert (weight_only < 1e-5) == (M <= 16), (M, weight_only)      # above 16 the activations are rounded


@pytest.mark.parametrize("quantization,backend", [("int8", "w8a8"), ("int4-g32", "xla-int4"),
                                                  ("int4-g64-asym", "xla-int4"), ("int4-g32", "triton-int4"),
                                                  ("int4-g64-asym", "triton-int4"), ("int4", "mosaic-int4"),
                                                  ("int4-asym", "mosaic-int4"), ("int4-g64", "mosaic-int4-w4a8")])
def test_quant_linear_backends(quantization, backend):
    """QuantLinear with the new backends: leaves in the backend's layout, output = the path's own reference,
    for M on both sides of the xla-int4 / triton-int4 tables' switch (triton-int4 on CPU: its XLA fallback on
    the [N, K/2] layout)."""
    K, N = 256, 48
    spec = parse_quantization(quantization, backend=backend)
    lin = QuantLinear(K, N, bias=False, dtype=jnp.float32, spec=spec, backend=backend)
    w = _weights(K, N, seed=7)
    qt = quantize_rtn(w, spec.method, group_size=spec.group_size, symmetric=spec.symmetric)
    layout = {"xla-int4": "native", "triton-int4": "packed-nk", "mosaic-int4": "native-nk",
              "mosaic-int4-w4a8": "native-nk"}.get(backend, "packed")
    leaves = tensor_leaves(qt, jnp.float32, layout=layout)
    assert leaves["q"].shape == lin.q.shape and leaves["q"].dtype == lin.q.dtype
    assert (lin.offset is None) == ("offset" not in leaves)
    for k, v in leaves.items():
        getattr(lin, k)[...] = v
    for M in (2, 40):
        x = _x(M, K, jnp.float32)
        got = lin(x)
        if backend == "w8a8":
            ref = qr.int8_w8a8_matmul_reference(x, leaves["q"], leaves["scale"])
        elif backend == "triton-int4":
            assert leaves["q"].shape == (N, K // 2)
            ref = qr.int4_matmul_reference(x, leaves["q"].T, leaves["scale"], leaves["offset"],
                                           group_size=spec.group_size)
        elif backend in ("mosaic-int4", "mosaic-int4-w4a8"):   # (both M below W4A8_MIN_TOKENS)
            assert leaves["q"].shape == (N, K) and leaves["q"].dtype == jnp.int4
            ref = qr.int4_native_matmul_reference(x, leaves["q"].T, leaves["scale"], leaves.get("offset"),
                                                  group_size=spec.group_size)
        else:
            ref = qr.int4_native_matmul_reference(x, leaves["q"], leaves["scale"], leaves.get("offset"),
                                                  group_size=spec.group_size)
        assert _rel(got, ref) < 1e-5
        assert _rel(got, np.asarray(x, np.float64) @ w) < 0.13


@pytest.mark.parametrize("symmetric", [True, False])
def test_int4_channel_bound_is_the_channels_largest_weight(symmetric):
    """xla_fused.int4_channel_bound: from the scales / offsets alone, >= every |w| of the channel; equal to the
    largest for asymmetric RTN (codes 0..15 all reachable), 8/7 of it for symmetric RTN (max|w| / 7 scales: the
    code -8 is never used, but a GGUF Q4_0 weight may use it). The fp8 rounding's relative precision does not
    depend on that factor."""
    K, N, g = 256, 48, 64
    w = _weights(K, N, seed=5)
    qt = quantize_rtn(w, "int4", group_size=g, symmetric=symmetric)
    L = tensor_leaves(qt, jnp.float32, layout="native-nk")
    wq = np.asarray(qr.dequantize_int4_native(L["q"].T, L["scale"], L.get("offset"), g))      # [K, N]
    bound = np.asarray(qf.int4_channel_bound(L["scale"], L.get("offset")))
    np.testing.assert_allclose(bound, np.abs(wq).max(axis=0) * (8 / 7 if symmetric else 1), rtol=1e-6)


@pytest.mark.parametrize("symmetric,M", [(True, 3), (False, 33)])
def test_w4a8_matches_an_independent_emulation(symmetric, M):
    """int4_native_nk_w4a8_xla against the same rounding done in numpy float64 with ml_dtypes' e4m3 (the weights
    per output channel, the activations per token), and against the exact int4 product: the second rounding of
    the weights and the activations' cost at most a few percent."""
    import ml_dtypes

    K, N, g = 256, 48, 64
    w = _weights(K, N, seed=9)
    qt = quantize_rtn(w, "int4", group_size=g, symmetric=symmetric)
    L = tensor_leaves(qt, jnp.float32, layout="native-nk")
    x = _x(M, K, jnp.float32)
    got = qf.int4_native_nk_w4a8_xla(x, L["q"], L["scale"], L.get("offset"), group_size=g, out_dtype=jnp.float32)

    def e4m3(a):
        return np.asarray(a, np.float32).astype(ml_dtypes.float8_e4m3fn).astype(np.float64)

    def emulate(x):
        wq = np.asarray(qr.dequantize_int4_native(L["q"].T, L["scale"], L.get("offset"), g), np.float64).T  # [N, K]
        sc = np.asarray(L["scale"], np.float64)                                                           # [K/g, N]
        if symmetric:   # the largest |q s + o| a channel's codes can reach, q in [-8, 7]
            c = 8 * np.abs(sc).max(axis=0) / 448.0
        else:
            o = np.asarray(L["offset"], np.float64)
            c = np.maximum(np.abs(o - 8 * sc), np.abs(o + 7 * sc)).max(axis=0) / 448.0
        xf = np.asarray(x, np.float64)
        xs = np.abs(xf).max(axis=1) / 448.0
        return (e4m3(xf / xs[:, None]) @ e4m3(wq / c[:, None]).T) * xs[:, None] * c[None, :]
    # (symmetric RTN puts many scaled weights exactly halfway between two e4m3 values, 56 q for the extreme group:
    # whether (q s) / c or q (s / c) is rounded decides a few ties by one e4m3 step, ~2e-3 here)
    assert _rel(got, emulate(x)) < (3e-3 if symmetric else 1e-5)
    exact = qr.int4_native_matmul_reference(x, L["q"].T, L["scale"], L.get("offset"), group_size=g)
    assert 1e-3 < _rel(got, exact) < 0.06
    x16 = x.astype(jnp.bfloat16)       # a bf16 result: the dot's output in bf16 too
    got16 = qf.int4_native_nk_w4a8_xla(x16, L["q"], L["scale"], L.get("offset"), group_size=g)
    assert got16.dtype == jnp.bfloat16 and _rel(got16.astype(jnp.float32), emulate(x16.astype(jnp.float32))) < 2 ** -7


def test_mosaic_int4_w4a8_paths(monkeypatch):
    """'mosaic-int4-w4a8': 'mosaic-int4''s paths below W4A8_MIN_TOKENS (kernels simulated as running), W4A8 from
    it; on CPU the kernels' XLA fallback below; any int4 group size (the kernels take 128 only); int4 only."""
    from pallas_kernels.quantized_matmul import mosaic_int4, mosaic_int4_wide, triton_small_m

    t = quant_paths.W4A8_MIN_TOKENS
    cpu = [quant_paths.path_for("int4", "mosaic-int4-w4a8", m, 4096, 4096, 128) for m in (1, t - 1, t, 4 * t)]
    assert cpu == ["int4-dequant-nk", "int4-dequant-nk", "w4a8-nk", "w4a8-nk"]
    monkeypatch.setattr(triton_small_m, "kernels_enabled", lambda: True)
    monkeypatch.setattr(mosaic_int4, "usable", lambda: True)
    monkeypatch.setattr(mosaic_int4_wide, "usable", lambda: True)
    gpu = [quant_paths.path_for("int4", "mosaic-int4-w4a8", m, 4096, 4096, 128) for m in (1, 16, 17, t - 1, t)]
    assert gpu == ["mosaic-int4-nk", "mosaic-int4-nk", "mosaic-int4-wide-nk", "mosaic-int4-wide-nk", "w4a8-nk"]
    assert quant_paths.path_for("int4", "mosaic-int4-w4a8", 1, 4096, 4096, 64) == "int4-dequant-nk"
    assert parse_quantization("int4-g64-asym", backend="mosaic-int4-w4a8").backend == "mosaic-int4-w4a8"
    with pytest.raises(QuantizationError, match="'mosaic-int4-w4a8' is for int4 models only"):
        parse_quantization("int8", backend="mosaic-int4-w4a8")


def test_mosaic_int4_paths(monkeypatch):
    """'mosaic-int4': the Mosaic kernel at M <= 16 where it runs (a Hopper GPU: simulated here), XLA's dequantize +
    dot on the [N, K] layout above, and the XLA path wherever the kernel cannot run (CPU, a shape it does not
    take, a layer under tensor parallelism, JAXINFER_TRITON=0)."""
    from pallas_kernels.quantized_matmul import mosaic_int4, triton_small_m

    assert quant_paths.path_for("int4", "mosaic-int4", 1, 4096, 4096, 128) == "int4-dequant-nk"   # CPU
    monkeypatch.setattr(triton_small_m, "kernels_enabled", lambda: True)
    monkeypatch.setattr(mosaic_int4, "usable", lambda: True)
    assert quant_paths.path_for("int4", "mosaic-int4", 1, 4096, 4096, 128) == "mosaic-int4-nk"
    assert quant_paths.path_for("int4", "mosaic-int4", 16, 14336, 4096, 128) == "mosaic-int4-nk"
    # from 17 tokens the many-token kernel (mosaic_int4_wide.py; not simulated usable here: XLA's form)
    assert quant_paths.path_for("int4", "mosaic-int4", 17, 4096, 4096, 128) == "int4-dequant-nk"
    assert quant_paths.path_for("int4", "mosaic-int4", 129, 4096, 4096, 128) == "int4-dequant-nk"
    assert quant_paths.path_for("int4", "mosaic-int4", 1, 4096, 4100, 128) == "int4-dequant-nk"
    assert quant_paths.path_for("int4", "mosaic-int4", 1, 4096, 4096, 128, kernels=False) == "int4-dequant-nk"
    assert quant_paths.weight_layout_of("int4", "mosaic-int4") == "native-nk"
    with pytest.raises(QuantizationError, match="group 128 weights only"):
        parse_quantization("int4-g64", backend="mosaic-int4")


def test_backend_method_mismatch_is_a_clear_error():
    with pytest.raises(QuantizationError, match="'w8a8' is for int8 models only"):
        parse_quantization("int4", backend="w8a8")
    with pytest.raises(QuantizationError, match="'xla-int4' is for int4 models only"):
        parse_quantization("fp8", backend="xla-int4")


# ---- the int8 [N, K] backend 'xla-nk' -----------------------------------------------------------------------
def test_xla_nk_table_picks_by_weight_size_and_m(monkeypatch):
    """Small weights take PATHS[('int8', 'xla-nk')] by M, weights of >= LARGE_WEIGHT elements the 'large' table."""
    monkeypatch.setitem(quant_paths.PATHS, ("int8", "xla-nk"), ((1, "mixed-nk"), (quant_paths.ANY_M, "convert-nk")))
    monkeypatch.setitem(quant_paths.PATHS, ("int8", "xla-nk", "large"), ((16, "w8a8-nk"),
                                                                        (quant_paths.ANY_M, "convert-nk")))
    monkeypatch.setattr(quant_paths, "LARGE_WEIGHT", 4096 * 6144 + 1)
    quant_paths.check_tables()
    pick = lambda M, K, N: quant_paths.path_for("int8", "xla-nk", M, K=K, N=N)  # noqa: E731
    assert [pick(m, 4096, 6144) for m in (1, 2, 16)] == ["mixed-nk", "convert-nk", "convert-nk"]
    assert [pick(m, 4096, 28672) for m in (1, 16, 17, 2048)] == ["w8a8-nk", "w8a8-nk", "convert-nk", "convert-nk"]
    assert quant_paths.weight_layout_of("int8", "xla-nk") == "nk" and quant_paths.weight_layout_of("int8", "xla") == "kn"
    monkeypatch.setitem(quant_paths.PATHS, ("int8", "xla-nk", "large"), ((quant_paths.ANY_M, "xla"),))
    with pytest.raises(ValueError, match="not paths of the int8 nk layout"):
        quant_paths.check_tables()


@pytest.mark.parametrize("large", [False, True])
def test_quant_linear_xla_nk(monkeypatch, large):
    """QuantLinear(backend='xla-nk'): q is int8 [N, K] (the transpose of the 'kn' leaves of the same weights) and
    the output is the weight-only int8 reference for small weights, the W8A8 reference for large ones (a W8A8
    'large' table set here: the shipped one is weight-only), at M on
    both sides of the small table's switch; both within the int8 bound of the float weights."""
    K, N = 200, 72                                                   # not multiples of any tile
    monkeypatch.setattr(quant_paths, "LARGE_WEIGHT", 1 if large else K * N + 1)
    monkeypatch.setitem(quant_paths.PATHS, ("int8", "xla-nk", "large"), ((quant_paths.ANY_M, "w8a8-nk"),))
    spec = parse_quantization("int8", backend="xla-nk")
    lin = QuantLinear(K, N, bias=False, dtype=jnp.float32, spec=spec, backend="xla-nk")
    w = _weights(K, N, seed=3)
    qt = quantize_rtn(w, "int8")
    kn = tensor_leaves(qt, jnp.float32, layout="kn")
    nk = tensor_leaves(qt, jnp.float32, layout="nk")
    assert lin.q.shape == (N, K) and nk["q"].shape == (N, K) and nk["q"].dtype == jnp.int8
    np.testing.assert_array_equal(np.asarray(nk["q"]), np.asarray(kn["q"]).T)
    for k, v in nk.items():
        getattr(lin, k)[...] = v
    for M in (1, 5, 64):
        x = _x(M, K, jnp.float32, seed=M)
        got = lin(x)
        if large:
            ref = qr.int8_w8a8_matmul_reference(x, kn["q"], kn["scale"])
        else:
            ref = qr.int8_matmul_reference(x, kn["q"], kn["scale"])
        assert _rel(got, ref) < 1e-5
        assert _rel(got, np.asarray(x, np.float64) @ w) < (0.03 if large else 0.02)


def test_gpu_defaults_resolve_to_measured_backends():
    """On GPU, 'auto' int8 resolves to the [out, in] weight-only backend, int4 to the [out, in/2] one (on one
    Hopper GPU to the Mosaic kernel's [out, in] int4), and an int4
    model's default int8 LM head follows int8's (head_spec keeps 'auto'); on CPU all stay the jnp reference."""
    from jaxinfer.models.quant_linear import resolve_backend, weight_layout

    i8 = parse_quantization("int8")
    assert resolve_backend(i8, "gpu") == "xla-nk" and weight_layout(i8, "gpu") == "nk"
    assert resolve_backend(i8, "cpu") == "reference" and weight_layout(i8, "cpu") == "kn"
    head = parse_quantization("int4", quantize_lm_head=None).head_spec()
    assert head.method == "int8" and resolve_backend(head, "gpu") == "xla-nk"
    i4 = parse_quantization("int4")
    assert resolve_backend(i4, "gpu", hopper=False) == "triton-int4"
    assert weight_layout(i4, "gpu", hopper=False) == "packed-nk"
    # one Hopper GPU: the Mosaic kernel's signed int4 [out, in]; a parallel plan keeps the packed layout
    assert resolve_backend(i4, "gpu", hopper=True) == "mosaic-int4"
    assert weight_layout(i4, "gpu", hopper=True) == "native-nk"
    assert resolve_backend(i4, "gpu", hopper=True, distributed=True) == "triton-int4"
    assert resolve_backend(i4, "gpu") == "triton-int4"   # this test's devices: not a Hopper GPU
    assert resolve_backend(i4, "cpu", hopper=True) == "reference" and weight_layout(i4, "cpu") == "packed"
    assert resolve_backend(head, "gpu", hopper=True) == "xla-nk"   # the int8 head of an int4 model
    for g in (32, 64):   # the batched kernel form takes g = 128 only: other groups keep the [K/2, N] kernel
        i4g = parse_quantization(f"int4-g{g}")
        assert resolve_backend(i4g, "gpu", hopper=True) == "auto" and weight_layout(i4g, "gpu") == "packed"
        assert quant_paths.path_for("int4", "auto", 16, 4096, 4096, g) == "pallas"


def test_mosaic_int8_paths(monkeypatch):
    """'mosaic-int8' (opt-in): 'xla-nk''s [N, K] int8 weights with the Mosaic int8 kernel at M <= 16 where it runs
    (a Hopper GPU: simulated here), XLA's convert + dot above and wherever the kernel cannot run."""
    from pallas_kernels.quantized_matmul import mosaic_int8, triton_small_m

    assert quant_paths.path_for("int8", "mosaic-int8", 1, 4096, 4096) == "convert-nk"   # CPU
    monkeypatch.setattr(triton_small_m, "kernels_enabled", lambda: True)
    monkeypatch.setattr(mosaic_int8, "usable", lambda: True)
    assert quant_paths.path_for("int8", "mosaic-int8", 1, 4096, 4096) == "mosaic-nk"
    assert quant_paths.path_for("int8", "mosaic-int8", 16, 14336, 4096) == "mosaic-nk"
    assert quant_paths.path_for("int8", "mosaic-int8", 32, 4096, 4096) == "convert-nk"
    assert quant_paths.path_for("int8", "mosaic-int8", 1, 4096, 4100) == "convert-nk"      # N not whole tiles
    assert quant_paths.path_for("int8", "mosaic-int8", 1, 4096, 4096, kernels=False) == "convert-nk"
    assert quant_paths.weight_layout_of("int8", "mosaic-int8") == "nk"
    with pytest.raises(QuantizationError, match="for int8 models only"):
        parse_quantization("int4", backend="mosaic-int8")


@pytest.mark.parametrize("M", [1, 16, 17, 130])
def test_xla_nk_w8a8_is_weight_only_up_to_16_tokens_and_w8a8_above(M):
    """'xla-nk-w8a8' (opt-in): int8 [N, K] weights; up to 16 tokens the weight-only int8 matmul (the small-M kernel,
    XLA's convert + dot on the CPU), above it W8A8 (activations quantized per token): each against its own float32
    reference on the same weights, and the two references differ (the paths are really different)."""
    from jaxinfer.models.quant_paths import quantized_matmul

    K, N = 96, 80
    w = _weights(K, N, seed=M)
    qt = quantize_rtn(w, "int8")
    q_nk = jnp.asarray(qt.q).T                                                           # [N, K]
    x = _x(M, K, jnp.float32, seed=M + 1)
    got = quantized_matmul(x, "int8", q_nk, jnp.asarray(qt.scale), backend="xla-nk-w8a8")
    weight_only = qr.int8_matmul_reference(x, jnp.asarray(qt.q), jnp.asarray(qt.scale))
    w8a8 = qr.int8_w8a8_matmul_reference(x, jnp.asarray(qt.q), jnp.asarray(qt.scale))
    want, other = (weight_only, w8a8) if M <= 16 else (w8a8, weight_only)
    assert quant_paths.path_for("int8", "xla-nk-w8a8", M, K, N) == ("convert-nk" if M <= 16 else "w8a8-nk")
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    assert _rel(np.asarray(got), np.asarray(other)) > 1e-4
    assert quant_paths.weight_layout_of("int8", "xla-nk-w8a8") == "nk"
    with pytest.raises(QuantizationError, match="for int8 models only"):
        parse_quantization("int4", backend="xla-nk-w8a8")


def test_xla_nk_w8a8_takes_the_small_m_kernel_where_it_runs(monkeypatch):
    """On a GPU (simulated) the weight-only side is 'xla-nk''s small-M kernel; never above 16 tokens."""
    from pallas_kernels.quantized_matmul import triton_small_m

    monkeypatch.setattr(triton_small_m, "kernels_enabled", lambda: True)
    assert quant_paths.path_for("int8", "xla-nk-w8a8", 1, 4096, 4096) == "pallas-nk"
    assert quant_paths.path_for("int8", "xla-nk-w8a8", 16, 4096, 28672) == "pallas-nk"
    assert quant_paths.path_for("int8", "xla-nk-w8a8", 17, 4096, 28672) == "w8a8-nk"
    assert quant_paths.path_for("int8", "xla-nk-w8a8", 1, 4096, 4096, kernels=False) == "convert-nk"
