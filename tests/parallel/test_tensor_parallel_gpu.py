"""Tensor parallelism on real GPUs (run on a multi-GPU host: `pytest -m gpu tests/parallel`): TP = 2 (and 4 when
there are 4 GPUs) with the Pallas kernel per shard gives one GPU's greedy tokens and prompt log-probs."""
import jax
import pytest

from tests.parallel.test_tensor_parallel import _assert_same, _results

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("backend", ["pallas", "reference"])
def test_tp_on_gpus_matches_one_gpu(build_llm, gqa_many_kv_dir, tp, backend):
    if jax.default_backend() != "gpu" or len(jax.devices()) < tp:
        pytest.skip(f"needs {tp} GPUs, found {len(jax.devices())} {jax.default_backend()} device(s)")
    # float32 matmuls at full precision (not TF32), so TP's different summation order is the only difference.
    with jax.default_matmul_precision("highest"):
        want = _results(build_llm(gqa_many_kv_dir, backend=backend))
        got = _results(build_llm(gqa_many_kv_dir, tp, backend=backend))
    _assert_same(got, want, atol=1e-3)
