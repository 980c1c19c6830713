"""runner/input_slots.py: the staged inputs are the host values bit for bit, keep their device addresses, and a
program enqueued before the next write reads its own values; the engine's tokens are the same staged or not."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxinfer.runner.input_slots import InputSlots, stable_inputs_default


def _pointers(arrays):
    return [[s.data.unsafe_buffer_pointer() for s in a.addressable_shards] for a in arrays]


def _host(rng, n_int=37, n_float=11):
    ints = rng.integers(-2**31, 2**31 - 1, n_int, dtype=np.int64).astype(np.int32)
    floats = rng.standard_normal(n_float).astype(np.float32)
    floats[:4] = [-0.0, np.inf, np.nan, np.float32(1e-45)]  # sign of zero, specials, a subnormal: bits must survive
    return ints, floats


@pytest.mark.parametrize("n_devices", [1, 2])
def test_values_bitwise_and_addresses_fixed(n_devices):
    sharding = None
    if n_devices > 1:
        sharding = NamedSharding(Mesh(np.array(jax.devices()[:n_devices]), ("x",)), PartitionSpec())
    slots = InputSlots(sharding, enabled=True)
    rng = np.random.default_rng(0)
    first = slots.put(*_host(rng))
    ptrs = _pointers(first)
    for _ in range(4):
        ints, floats = _host(rng)
        got = slots.put(ints, floats)
        assert _pointers(got) == ptrs  # written in place: the same buffers on every device
        assert np.asarray(got[0]).tobytes() == ints.tobytes()
        assert np.asarray(got[1]).tobytes() == floats.tobytes()
        if sharding is not None:
            assert got[0].sharding == sharding
    other = slots.put(np.zeros(5, np.int32), np.zeros(3, np.float32))  # other shapes: their own buffers
    assert _pointers(other) != ptrs and len(slots) == 2


def test_reader_enqueued_before_the_next_write_sees_its_values():
    slots = InputSlots(enabled=True)
    read = jax.jit(lambda a, b: jnp.sum(a.astype(jnp.float32) * 2.0) + jnp.sum(b))  # a program reading the slots
    rng = np.random.default_rng(1)
    expected, results = [], []
    for _ in range(6):
        ints = rng.integers(-1000, 1000, 4096).astype(np.int32)
        floats = rng.standard_normal(4096).astype(np.float32)
        results.append(read(*slots.put(ints, floats)))  # not waited for: the next put is enqueued behind it
        expected.append(np.sum(ints.astype(np.float32) * 2.0) + np.sum(floats))
    np.testing.assert_allclose(np.asarray(results), np.asarray(expected), rtol=1e-5)


def test_rejects_fields_that_are_not_4_bytes():
    with pytest.raises(ValueError, match="4-byte fields only"):
        InputSlots(enabled=True).put(np.zeros(3, np.int64))


def test_off_is_a_plain_transfer(monkeypatch):
    slots = InputSlots(enabled=False)
    a = slots.put(np.arange(4, dtype=np.int32))
    assert np.asarray(a[0]).tolist() == [0, 1, 2, 3] and len(slots) == 0
    monkeypatch.setenv("JAXINFER_STABLE_INPUTS", "1")
    assert stable_inputs_default()
    monkeypatch.setenv("JAXINFER_STABLE_INPUTS", "0")
    assert not stable_inputs_default()
    monkeypatch.delenv("JAXINFER_STABLE_INPUTS")
    assert stable_inputs_default() == (jax.default_backend() == "gpu")


def _generate(monkeypatch, staged: bool):
    from jaxinfer import LLM, SamplingParams

    monkeypatch.setenv("JAXINFER_STABLE_INPUTS", "1" if staged else "0")
    llm = LLM("tiny-llama", load_format="dummy", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=32,
              num_pages=64, warmup=False, progress=False)
    assert llm.runner.input_slots.enabled == staged
    prompts = [[1, 5, 9, 2, 7], [3, 3, 8], [4, 11, 2, 6, 6, 1, 9]]
    params = [SamplingParams(max_tokens=12, temperature=0.0),
              SamplingParams(max_tokens=9, temperature=0.9, top_p=0.9, seed=7),
              SamplingParams(max_tokens=14, temperature=0.7, top_k=5, seed=3)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], llm


def test_engine_tokens_same_staged_or_not(monkeypatch):
    plain, _ = _generate(monkeypatch, staged=False)
    staged, llm = _generate(monkeypatch, staged=True)
    assert staged == plain and all(len(t) > 0 for t in staged)
    assert len(llm.runner.input_slots) >= 1  # the steps went through the slots


@pytest.mark.gpu
def test_gpu_staged_by_default_same_tokens(monkeypatch):
    """On the GPU (`python benchmarks/gpu_tests.py tests/runner/test_input_slots.py`): staging is the default and
    changes no token, where the step programs run as CUDA graphs."""
    monkeypatch.delenv("JAXINFER_STABLE_INPUTS", raising=False)
    assert stable_inputs_default()
    test_engine_tokens_same_staged_or_not(monkeypatch)
    test_reader_enqueued_before_the_next_write_sees_its_values()
