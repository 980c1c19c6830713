"""Tiny GQA checkpoints for the tensor/data-parallel tests and a cache of engines built on them (each build
compiles one bucket, ~5-10 s on the CI machine, so every (model, tp, dp, backend) is built once per session)."""
import pytest

from tests.parallel.tp_cases import ENGINE_OPTIONS, save_tiny


@pytest.fixture(scope="session")
def gqa_few_kv_dir(tmp_path_factory):
    """8 query heads, 2 KV heads (head_dim 8): KV heads fewer than TP for TP = 4, 8."""
    return save_tiny(tmp_path_factory.mktemp("gqa_8x2"), 0, num_attention_heads=8, num_key_value_heads=2)


@pytest.fixture(scope="session")
def gqa_many_kv_dir(tmp_path_factory):
    """8 query heads, 4 KV heads (head_dim 16, so the Pallas kernel accepts it): KV heads more than TP = 2."""
    return save_tiny(tmp_path_factory.mktemp("gqa_8x4"), 1, num_attention_heads=8, num_key_value_heads=4,
                      head_dim=16)


_ENGINES: dict = {}


@pytest.fixture(scope="session")
def build_llm():
    def build(path, tp=1, dp=1, backend="reference"):
        from jaxinfer import LLM

        key = (path, tp, dp, backend)
        if key not in _ENGINES:
            _ENGINES[key] = LLM(path, tensor_parallel_size=tp, data_parallel_size=dp, attention_backend=backend,
                                **ENGINE_OPTIONS)
        return _ENGINES[key]

    yield build
    _ENGINES.clear()
