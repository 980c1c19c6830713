"""Tensor-parallel weight layouts and mesh validation (numpy + jax.sharding only; no model compiled).

The replicated-KV layout is checked against a brute-force reading of what each device must hold: device i of
tp gets query heads [i*H/tp, (i+1)*H/tp) and the K/V head those query heads attend to (h // g).
"""
import jax
import numpy as np
import pytest

from jaxinfer.config import ConfigError, EngineConfig, ModelConfig
from jaxinfer.weights.quant_tensor import QuantizedTensor
from jaxinfer.parallel import (RULES, ShardingPlan, canonical_layout, check_tensor_parallel, make_plans,
                               relayout_for_tp, relayout_quantized_for_tp, tp_model_config)


def _cfg(heads, kv_heads, head_dim=4, hidden=16, inter=32):
    return ModelConfig(model_type="llama", vocab_size=64, hidden_size=hidden, intermediate_size=inter, num_layers=1,
                       num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim)


@pytest.mark.parametrize("heads,kv_heads,tp", [(8, 2, 8), (8, 2, 4), (8, 2, 2), (8, 4, 2), (8, 8, 8), (4, 1, 4),
                                               (16, 2, 8)])
def test_fused_qkv_splits_into_whole_head_groups(heads, kv_heads, tp):
    cfg = _cfg(heads, kv_heads)
    run, lay = tp_model_config(cfg, tp)
    g, d, hidden = cfg.q_per_kv, cfg.head_dim, cfg.hidden_size
    rng = np.random.default_rng(0)
    q = rng.standard_normal((hidden, heads, d))
    k = rng.standard_normal((hidden, kv_heads, d))
    v = rng.standard_normal((hidden, kv_heads, d))
    # Canonical fused layout (loader._assemble): per KV head j: [q heads j*g .. j*g+g-1, k_j, v_j].
    canon = np.concatenate([q.reshape(hidden, kv_heads, g, d), k[:, :, None], v[:, :, None]], 2).reshape(hidden, -1)
    w = relayout_for_tp(("layers", 0, "attn", "qkv", "w"), canon, lay)
    assert w.shape == (hidden, run.qkv_size)
    assert run.num_kv_heads == max(kv_heads, tp) and run.num_kv_heads % tp == 0
    shards = np.split(w, tp, axis=1)  # what a contiguous split of the columns hands each device
    hp = heads // tp  # query heads per device
    for i, shard in enumerate(shards):
        groups = shard.reshape(hidden, run.num_kv_heads // tp, run.q_per_kv + 2, d)
        got_q = groups[:, :, :run.q_per_kv].reshape(hidden, hp, d)
        np.testing.assert_array_equal(got_q, q[:, i * hp:(i + 1) * hp])
        for j in range(groups.shape[1]):
            first_q_head = i * hp + j * run.q_per_kv
            np.testing.assert_array_equal(groups[:, j, -2], k[:, first_q_head // g])
            np.testing.assert_array_equal(groups[:, j, -1], v[:, first_q_head // g])
    np.testing.assert_array_equal(canonical_layout(("layers", 0, "attn", "qkv", "w"), w, lay), canon)
    bias = canon[0]
    b = relayout_for_tp(("layers", 0, "attn", "qkv", "b"), bias, lay)
    np.testing.assert_array_equal(b, w[0])


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_gate_up_blocks_hold_matching_gate_and_up_columns(tp):
    cfg = _cfg(8, 8)
    _, lay = tp_model_config(cfg, tp)
    i_size = cfg.intermediate_size
    gate = np.arange(3 * i_size).reshape(3, i_size)
    up = -gate - 1
    w = relayout_for_tp(("layers", 0, "mlp", "gate_up", "w"), np.concatenate([gate, up], 1), lay)
    for i, shard in enumerate(np.split(w, tp, axis=1)):
        cols = slice(i * i_size // tp, (i + 1) * i_size // tp)
        np.testing.assert_array_equal(shard, np.concatenate([gate[:, cols], up[:, cols]], 1))
    np.testing.assert_array_equal(canonical_layout(("layers", 0, "mlp", "gate_up", "w"), w, lay),
                                  np.concatenate([gate, up], 1))


@pytest.mark.parametrize("heads,kv_heads,inter,tp,needle", [
    (8, 2, 32, 3, "num_attention_heads=8"),            # TP does not divide the heads
    (12, 4, 48, 6, "num_key_value_heads=4"),           # 6 neither divides nor is a multiple of 4 KV heads
    (8, 8, 36, 8, "intermediate_size=36"),
])
def test_invalid_tensor_parallel_size_is_named(heads, kv_heads, inter, tp, needle):
    with pytest.raises(ConfigError, match=f"tensor_parallel_size={tp}.*{needle}.*valid sizes"):
        check_tensor_parallel(_cfg(heads, kv_heads, inter=inter), tp)


def test_mesh_larger_than_the_machine_is_refused():
    n = len(jax.devices())
    with pytest.raises(ConfigError, match=rf"tensor_parallel_size=4 x data_parallel_size=4 needs 16 devices but "
                                          rf"only {n}"):
        make_plans(4, 4)
    with pytest.raises(ConfigError, match="tensor_parallel_size must be an integer >= 1"):
        EngineConfig.from_options(tensor_parallel_size=0)


def test_replicas_get_disjoint_devices_and_rules_map_logical_axes():
    assert len(jax.devices()) >= 8, "tests/conftest.py sets 8 simulated CPU devices"
    plans = make_plans(2, 4)
    ids = [sorted(d.id for d in p.devices) for p in plans]
    assert sum(len(i) for i in ids) == len(set(sum(ids, []))) == 8
    p = plans[1]
    assert p.spec(("embed", "qkv"), (16, 64)) == jax.sharding.PartitionSpec(None, "model")
    assert p.spec(("vocab", "embed"), (64, 16)) == jax.sharding.PartitionSpec("model", None)
    assert p.spec(("vocab", "embed"), (63, 16)) == jax.sharding.PartitionSpec(None, None)  # uneven: replicated
    assert set(v for v in RULES.values() if v) == {"model"}
    with pytest.raises(KeyError, match="no rule"):
        p.spec(("nonsense",), (4,))
    assert isinstance(p, ShardingPlan) and p.tp == 2


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("leaf", ["qkv", "gate_up"])
def test_quantized_weights_take_the_same_layout(kind, leaf):
    """Dequantize(relayout(quantized)) == relayout(dequantize(quantized)), exactly, for TP=8 over 2 KV heads."""
    cfg = _cfg(8, 2)
    _, lay = tp_model_config(cfg, 8)
    n_out = cfg.qkv_size if leaf == "qkv" else 2 * cfg.intermediate_size
    rng = np.random.default_rng(1)
    n_in, g = cfg.hidden_size, 8
    if kind == "int8":
        qt = QuantizedTensor("int8", rng.integers(-127, 128, (n_in, n_out)).astype(np.int8),
                             rng.random(n_out).astype(np.float32))
    else:
        qt = QuantizedTensor("int4", rng.integers(0, 16, (n_in, n_out)).astype(np.int8),
                             rng.random((n_in // g, n_out)).astype(np.float32),
                             rng.integers(0, 16, (n_in // g, n_out)).astype(np.float32), group_size=g)
    path = ("layers", 0, "attn" if leaf == "qkv" else "mlp", leaf, "w")
    got = relayout_quantized_for_tp(path, qt, lay)
    np.testing.assert_array_equal(got.dequantize(), relayout_for_tp(path, qt.dequantize(), lay))


def test_speculation_with_tensor_parallelism_is_a_clear_error():
    with pytest.raises(ConfigError, match="speculative_config with tensor_parallel_size"):
        EngineConfig.from_options(speculative_config={"method": "ngram", "num_speculative_tokens": 2},
                                  tensor_parallel_size=2)
