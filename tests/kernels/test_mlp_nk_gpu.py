"""The fused int8 decode MLP (pallas_kernels/quantized_matmul/mlp_nk.py) on the GPU, compiled by Triton: the 1B
draft's and the 8B's MLP shapes, bf16 activations, against the float32 SwiGLU of the same quantized weights with
the model's bf16 roundings; and the model taking it under JAXINFER_FUSED_MLP=1. `pytest -m gpu` on the device."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from pallas_kernels.quantized_matmul import mlp_nk
from tests.kernels.quant_cases import rel_err
from tests.kernels.test_mlp_nk import _int8_mlp, _swiglu64, _weights

pytestmark = pytest.mark.gpu
BF16_BOUND = 1e-2      # bf16 activations, gate_up / silu / product rounded to bf16 as the unfused model does


@pytest.mark.parametrize("M", [1, 5, 16])
@pytest.mark.parametrize("K,I", [(2048, 8192), (4096, 14336)])
@pytest.mark.parametrize("blocks", [dict(), dict(bi=32), dict(bi=128, bk=256, bn=128), dict(atomic=True)])
def test_fused_mlp_on_gpu(M, K, I, blocks):
    w = _weights(K, I, seed=M + K)
    x = jnp.asarray(np.random.default_rng(M).standard_normal((M, K)), jnp.bfloat16)
    got = mlp_nk.int8_mlp_nk(x, *map(jnp.asarray, w), **blocks)
    assert got.shape == (M, K) and got.dtype == jnp.bfloat16
    assert rel_err(got.astype(jnp.float32), _swiglu64(np.asarray(x, np.float32), *w)) < BF16_BOUND


def test_model_mlp_takes_it_on_gpu(monkeypatch):
    """llama.MLP of int8 'xla-nk' layers, jitted: the fused kernel is in the program with the switch on (not off),
    and both outputs are within bf16 rounding of the float64 SwiGLU."""
    K, I = 2048, 8192
    mlp, w = _int8_mlp(K, I, seed=3)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((3, K)), jnp.bfloat16)
    want = _swiglu64(np.asarray(x, np.float32), *w)
    graphdef, state = nnx.split(mlp)
    for on in ("1", "0"):
        monkeypatch.setenv("JAXINFER_FUSED_MLP", on)
        f = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x))
        assert ("int8_mlp_nk" in f.lower(state, x).as_text()) == (on == "1")
        assert rel_err(f(state, x).astype(jnp.float32), want) < BF16_BOUND
