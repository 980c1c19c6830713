"""AWQ-style activation-aware scaling (jaxinfer/weights/awq.py): the dense calibration forward equals the engine,
folding the scales leaves the float model's function unchanged, the search beats RTN on its objective (clearly so
when a few input channels carry outlier activations, the case AWQ is for), and RTN int4 is exact to its grid."""
import numpy as np
import pytest

import jaxinfer
from jaxinfer.weights import awq
from jaxinfer.quality import token_nll


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return jaxinfer.LLM(tiny_llama_dir, num_pages=32, max_model_len=256, max_num_batched_tokens=128,
                        max_num_seqs=2, warmup=False, progress=False)


def _ids(n, seed=0):
    return np.random.default_rng(seed).integers(3, 512, n).tolist()


def test_dense_forward_equals_engine(tiny):
    ids = _ids(100)
    nll, acts = awq.dense_forward(tiny.model.module(), ids, collect=16)
    np.testing.assert_allclose(nll, token_nll(tiny, ids), rtol=1e-4, atol=1e-4)
    assert len(acts) == 2 and acts[0]["down"].shape == (16, 128) and acts[0]["qkv"].shape == (16, 64)


def test_folded_scales_keep_the_float_model_and_beat_rtn(tiny):
    module = tiny.model.module()
    ids = _ids(120, seed=1)
    before, _ = awq.dense_forward(module, ids)
    res = awq.apply_awq(module, _ids(200, seed=2), group_size=32)
    after, _ = awq.dense_forward(module, ids)
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4)   # float32 rounding only
    assert set(res.alphas) == {f"layers.{i}.{g}" for i in range(2) for g in ("qkv", "gate_up", "down")}
    assert all(e <= e0 for e, e0 in res.errors.values())
    q = awq.quantize_module(module, 32)
    assert len(q) == 8 and q["layers.0.attn.qkv"].shape == (64, 128) and q["layers.1.mlp.down"].group_size == 32
    # the copy was scaled (this seed picks alpha 0.2 for layer 0's qkv), the LLM's own weights are untouched
    assert res.alphas["layers.0.qkv"] > 0
    assert not np.allclose(tiny.model.module().layers[0].attn_norm.weight[...], module.layers[0].attn_norm.weight[...])


def test_search_helps_with_outlier_channels():
    """Activations with 4 outlier input channels (x20): the searched scales cut the output error of RTN by more
    than half and pick alpha > 0; on isotropic activations alpha = 0 (plain RTN) is allowed to win."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 128)).astype(np.float32)
    x[:, [3, 50, 77, 120]] *= 20
    w = rng.standard_normal((128, 64)).astype(np.float32) * 0.05
    s, alpha, err, rtn_err = awq.search_scale(x, w, group_size=32)
    assert alpha > 0 and err < 0.5 * rtn_err
    assert s[[3, 50, 77, 120]].min() > np.median(s)
    s0, _, err0, rtn0 = awq.search_scale(rng.standard_normal((256, 128)).astype(np.float32), w, group_size=32)
    assert err0 <= rtn0


def test_rtn_int4_grid_and_errors():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 10)).astype(np.float32)
    qt = awq.rtn_int4(w, 32)
    assert qt.q.min() >= 0 and qt.q.max() <= 15 and np.all(qt.zero == np.round(qt.zero))
    err = np.abs(qt.dequantize() - w)
    assert np.all(err <= np.repeat(qt.scale, 32, 0) / 2 * (1 + 1e-5))
    with pytest.raises(ValueError, match="group_size 128 does not divide the input dimension 64"):
        awq.rtn_int4(w, 128)
