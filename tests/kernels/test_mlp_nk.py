"""The fused int8 decode MLP (pallas_kernels/quantized_matmul/mlp_nk.py) in interpret mode against a float64 numpy
SwiGLU of the same quantized weights, its errors, and the model's use of it (llama.MLP -> fused_int8_mlp)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.config import ModelConfig, parse_quantization
from jaxinfer.models import llama, quant_linear, quant_paths
from jaxinfer.models.quant_linear import QuantLinear, fused_int8_mlp
from pallas_kernels.quantized_matmul import mlp_nk
from tests.kernels.quant_cases import rel_err


def _weights(K, I, seed):
    rng = np.random.default_rng(seed)
    gu_q = rng.integers(-127, 128, (2 * I, K)).astype(np.int8)
    gu_s = (rng.uniform(0.5, 1.5, 2 * I) / (127 * np.sqrt(K))).astype(np.float32)
    d_q = rng.integers(-127, 128, (K, I)).astype(np.int8)
    d_s = (rng.uniform(0.5, 1.5, K) / (127 * np.sqrt(I))).astype(np.float32)
    return gu_q, gu_s, d_q, d_s


def _swiglu64(x, gu_q, gu_s, d_q, d_s):
    """float64: y = (silu(g) * u) @ dequant(d).T, g | u = x @ dequant(gu).T."""
    x = np.asarray(x, np.float64)
    gu = x @ (gu_q.astype(np.float64) * gu_s[:, None]).T
    I = d_q.shape[1]
    g, u = gu[:, :I], gu[:, I:]
    return (g / (1 + np.exp(-g)) * u) @ (d_q.astype(np.float64) * d_s[:, None]).T


@pytest.mark.parametrize("M", [1, 3, 5, 16])
@pytest.mark.parametrize("K,I,blocks", [(256, 128, dict()), (128, 192, dict(bi=64, bk=64, bn=32)),
                                        (256, 96, dict(bi=32, bk=128, bn=64)), (256, 128, dict(atomic=True)),
                                        (128, 192, dict(bi=32, bn=32, atomic=True))])
def test_fused_mlp_matches_float64(M, K, I, blocks):
    """float32 activations (every rounding to x's dtype is then exact-ish): within float32 accumulation error of
    the float64 SwiGLU, including the rows past M (x's last row repeated) never reaching the output; both
    reductions (partials summed by XLA, atomic adds)."""
    gu_q, gu_s, d_q, d_s = _weights(K, I, seed=M + K + I)
    x = np.random.default_rng(M).standard_normal((M, K)).astype(np.float32)
    got = mlp_nk.int8_mlp_nk(jnp.asarray(x), *map(jnp.asarray, (gu_q, gu_s, d_q, d_s)), interpret=True, **blocks)
    assert got.shape == (M, K) and got.dtype == jnp.float32
    assert rel_err(got, _swiglu64(x, gu_q, gu_s, d_q, d_s)) < 1e-5


def test_fused_mlp_bf16_within_rounding():
    """bf16 activations: gate_up, silu(gate) and the product rounded to bf16 as the unfused model does: ~2^-8."""
    K, I, M = 256, 128, 4
    w = _weights(K, I, seed=1)
    x = np.random.default_rng(2).standard_normal((M, K)).astype(np.float32)
    got = mlp_nk.int8_mlp_nk(jnp.asarray(x, jnp.bfloat16), *map(jnp.asarray, w), interpret=True)
    assert got.dtype == jnp.bfloat16
    assert rel_err(got.astype(jnp.float32), _swiglu64(np.asarray(jnp.asarray(x, jnp.bfloat16), np.float32), *w)) \
        < 1e-2


def test_fused_mlp_errors_name_the_fix():
    K, I = 256, 128
    w = list(map(jnp.asarray, _weights(K, I, seed=0)))
    with pytest.raises(ValueError, match="1..16 tokens.*unfused path"):
        mlp_nk.int8_mlp_nk(jnp.zeros((17, K)), *w, interpret=True)
    with pytest.raises(ValueError, match="I % 64"):
        mlp_nk.int8_mlp_nk(jnp.zeros((1, K)), w[0][:2 * 96], w[1][:2 * 96], w[2][:, :96], w[3], interpret=True)
    with pytest.raises(ValueError, match=r"gu_q must be \[2 \* 128, 256\]"):
        mlp_nk.int8_mlp_nk(jnp.zeros((1, K)), w[0][:128], w[1][:128], w[2], w[3], interpret=True)
    with pytest.raises(TypeError, match="2-D int8"):
        mlp_nk.int8_mlp_nk(jnp.zeros((1, K)), w[0].astype(jnp.float32), *w[1:], interpret=True)


def _int8_mlp(K, I, seed):
    """llama.MLP with both layers int8 QuantLinears in the 'nk' layout ('xla-nk', the GPU default), filled."""
    cfg = ModelConfig(model_type="llama", vocab_size=64, hidden_size=K, intermediate_size=I, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=K // 2)
    mlp = llama.MLP(cfg, jnp.float32)
    spec = parse_quantization("int8", backend="xla-nk")
    mlp.gate_up = QuantLinear(K, 2 * I, bias=False, dtype=jnp.float32, spec=spec, backend="xla-nk")
    mlp.down = QuantLinear(I, K, bias=False, dtype=jnp.float32, spec=spec, backend="xla-nk")
    gu_q, gu_s, d_q, d_s = _weights(K, I, seed)
    mlp.gate_up.q[...], mlp.gate_up.scale[...] = jnp.asarray(gu_q), jnp.asarray(gu_s)
    mlp.down.q[...], mlp.down.scale[...] = jnp.asarray(d_q), jnp.asarray(d_s)
    return mlp, (gu_q, gu_s, d_q, d_s)


def test_model_mlp_takes_the_fused_kernel_where_the_small_m_kernels_run(monkeypatch):
    """With JAXINFER_FUSED_MLP=1 and the paths a GPU picks (here: path_for says 'pallas-nk' up to 16 tokens, the
    kernel in interpret mode), llama.MLP's output is the fused kernel's and equals the float64 SwiGLU; above 16
    tokens, with the switch off, or with a second gate/up block (tensor parallelism) it is not taken."""
    K, I = 256, 128
    mlp, w = _int8_mlp(K, I, seed=5)
    real_path_for = quant_paths.path_for
    monkeypatch.setattr(quant_paths, "path_for", lambda method, backend, M, *a, **k: (
        "pallas-nk" if M <= 16 else real_path_for(method, backend, M, *a, **k)))
    calls, kernel = [], mlp_nk.int8_mlp_nk

    def interpreted(*args, **kw):
        calls.append(args[0].shape)
        return kernel(*args, interpret=True, **kw)

    monkeypatch.setattr(quant_linear.qmm_mlp, "int8_mlp_nk", interpreted)
    x = np.random.default_rng(0).standard_normal((5, K)).astype(np.float32)
    monkeypatch.setenv("JAXINFER_FUSED_MLP", "1")
    got = mlp(jnp.asarray(x))
    assert calls == [(5, K)]
    assert rel_err(got, _swiglu64(x, *w)) < 1e-5
    assert fused_int8_mlp(mlp.gate_up, mlp.down, jnp.zeros((17, K)), 1) is None      # above the small-M paths
    assert fused_int8_mlp(mlp.gate_up, mlp.down, jnp.zeros((1, K)), 2) is None       # interleaved TP blocks
    monkeypatch.setenv("JAXINFER_FUSED_MLP", "0")
    assert fused_int8_mlp(mlp.gate_up, mlp.down, jnp.zeros((1, K)), 1) is None
    assert calls == [(5, K)]


def test_fused_mlp_not_taken_on_cpu_paths(monkeypatch):
    """On the CPU (no GPU kernels) the switch changes nothing: the small-M path is not 'pallas-nk'."""
    monkeypatch.setenv("JAXINFER_FUSED_MLP", "1")
    mlp, w = _int8_mlp(256, 128, seed=6)
    assert jax.default_backend() == "cpu"
    assert fused_int8_mlp(mlp.gate_up, mlp.down, jnp.zeros((1, 256)), 1) is None
    x = np.random.default_rng(1).standard_normal((2, 256)).astype(np.float32)
    assert rel_err(mlp(jnp.asarray(x)), _swiglu64(x, *w)) < 1e-5
