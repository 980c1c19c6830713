"""Quantized weights and KV cache under tensor parallelism on real GPUs (`pytest -m gpu tests/parallel`): TP = 2
(and 4 with 4 GPUs) gives one GPU's greedy tokens and prompt log-probs. One GPU runs the Pallas quantized-matmul
kernel, TP the XLA dequantize + dot (weights/quantize.py), so the tolerance is the GPU float32 one (1e-3)."""
import jax
import pytest

from tests.parallel.test_tensor_parallel import _assert_same, _results
from tests.parallel.tp_cases import ENGINE_OPTIONS

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("quant,kv", [("int8", "fp8"), ("int4-g32-asym", "int8"), ("fp8", "auto")])
def test_quantized_tp_on_gpus_matches_one_gpu(gqa_many_kv_dir, tp, quant, kv):
    from jaxinfer import LLM

    if jax.default_backend() != "gpu" or len(jax.devices()) < tp:
        pytest.skip(f"needs {tp} GPUs, found {len(jax.devices())} {jax.default_backend()} device(s)")
    kw = dict(quantization=quant, kv_cache_dtype=kv, attention_backend="pallas", **ENGINE_OPTIONS)
    with jax.default_matmul_precision("highest"):
        want = _results(LLM(gqa_many_kv_dir, **kw))
        got = _results(LLM(gqa_many_kv_dir, tensor_parallel_size=tp, **kw))
    _assert_same(got, want, atol=1e-3)
