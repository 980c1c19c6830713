"""The norm inside the int8 small-M kernel (JAXINFER_NORM_PROLOGUE=1, models/layers.NormedInput): the kernel given
RMSNorm's input and factors computes what it computes on the materialized norm, and RMSNorm's own numerics are
NormedInput.materialize's; through the engine, with every int8 matmul forced onto the kernel (Pallas interpret
mode on the CPU), the switch leaves the prompt log-probs and greedy outputs as they are. (GPU: the kernel's GPU
tests, tests/kernels/test_triton_small_m_gpu.py.)"""
import numpy as np
import pytest
import jax.numpy as jnp

from jaxinfer.models.layers import NormedInput, RMSNorm
from pallas_kernels.quantized_matmul import kernel_nk
from pallas_kernels.quantized_matmul import reference as qr
from pallas_kernels.quantized_matmul import triton_small_m as T
from tests.kernels.quant_cases import rel_err

SMALL = T.Config(16, 32, 32, 1, True, 4, 3)   # whole blocks at the tiny model's K, N (32..512)


def _norm(K, seed, dtype=jnp.float32):
    norm = RMSNorm(K, 1e-5, dtype)
    norm.weight.set_value(jnp.asarray(np.random.default_rng(seed).uniform(0.5, 1.5, K), dtype))
    return norm


@pytest.mark.parametrize("M,split,exact", [(1, 2, True), (3, 4, True), (3, 4, False), (16, 1, True), (20, 2, True)])
def test_kernel_normalizes_x_as_the_norm_does(M, split, exact):
    K, N = 256, 64
    rng = np.random.default_rng(M)
    x = jnp.asarray(rng.standard_normal((M, K)) * 3, jnp.float32)
    q = jnp.asarray(rng.integers(-127, 128, (N, K)), jnp.int8)
    s = jnp.asarray(rng.uniform(1e-3, 1e-2, N), jnp.float32)
    cfg = T.Config(16, 32, 64, split, True, 4, 3, exact_rows=exact)
    n = _norm(K, M).deferred(x)
    fused = kernel_nk.int8_matmul_nk(n.x, q, s, norm=(n.rstd, n.weight), interpret=True, cfg=cfg)
    plain = kernel_nk.int8_matmul_nk(n.materialize(), q, s, interpret=True, cfg=cfg)
    want = qr.int8_matmul_reference(_norm(K, M)(x), q.T, s)
    assert fused.shape == (M, N)
    np.testing.assert_allclose(np.asarray(fused), np.asarray(plain), rtol=1e-6, atol=1e-6)
    assert rel_err(fused, want) < 1e-5
    # the factors matter: a wrong rstd or weight is seen
    bad = kernel_nk.int8_matmul_nk(n.x, q, s, norm=(n.rstd * 1.01, n.weight), interpret=True, cfg=cfg)
    assert rel_err(bad, want) > 5e-3


def test_norm_shapes_are_checked():
    x, q, s = jnp.ones((2, 64), jnp.float32), jnp.ones((32, 64), jnp.int8), jnp.ones((32,), jnp.float32)
    with pytest.raises(ValueError, match="norm must be"):
        kernel_nk.int8_matmul_nk(x, q, s, norm=(jnp.ones((3, 1)), jnp.ones((64,))), interpret=True, cfg=SMALL)
    with pytest.raises(ValueError, match="norm must be"):
        kernel_nk.int8_matmul_nk(x, q, s, norm=(jnp.ones((2, 1)), jnp.ones((32,))), interpret=True, cfg=SMALL)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_rmsnorm_is_its_deferred_form_materialized(dtype):
    """RMSNorm.__call__ is deferred(x).materialize(), and both are Hugging Face's numerics: normalize in float32,
    cast back, then scale (checked against that formula written out in float64 where dtype is float32)."""
    x = jnp.asarray(np.random.default_rng(0).standard_normal((5, 64)) * 4, dtype)
    norm = _norm(64, 1, dtype)
    got = norm(x)
    n = norm.deferred(x)
    assert isinstance(n, NormedInput) and n.shape == x.shape and n.dtype == x.dtype and n.rstd.shape == (5, 1)
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(n.materialize(), np.float32))
    if dtype == jnp.float32:
        x64 = np.asarray(x, np.float64)
        want = np.asarray(norm.weight[...], np.float64) * x64 / np.sqrt((x64 ** 2).mean(-1, keepdims=True) + 1e-5)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


@pytest.fixture
def kernel_everywhere(monkeypatch):
    """Every int8 [N, K] matmul of an 'xla-nk' model on the small-M kernel in interpret mode, at any M; counts the
    calls that got the norm's factors."""
    from jaxinfer.models import quant_paths

    calls = {"norm": 0, "plain": 0}
    real = kernel_nk.int8_matmul_nk

    def kernel(x, q, s, *, out_dtype=None, norm=None, **_):
        calls["norm" if norm is not None else "plain"] += 1
        return real(x, q, s, out_dtype=out_dtype, norm=norm, interpret=True, cfg=SMALL)

    monkeypatch.setattr(kernel_nk, "int8_matmul_nk", kernel)
    monkeypatch.setattr(quant_paths, "path_for", lambda method, backend, *a, **k: "pallas-nk")
    monkeypatch.setenv("JAXINFER_PROGRAM_CACHE", "0")
    return calls


@pytest.fixture(scope="module")
def norm_llama_dir(tiny_llama_dir, tmp_path_factory):
    """tiny_llama_dir with random norm weights (transformers initializes them to ones, where a kernel that forgot
    the weight would pass)."""
    import torch
    import transformers as tf

    model = tf.LlamaForCausalLM.from_pretrained(tiny_llama_dir, torch_dtype=torch.float32)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand(p.shape, generator=g) + 0.5)
    path = tmp_path_factory.mktemp("norm_llama")
    model.save_pretrained(path)
    return str(path)


def test_engine_outputs_do_not_change_with_the_switch(norm_llama_dir, kernel_everywhere, monkeypatch):
    import jaxinfer
    from jaxinfer import SamplingParams

    opts = dict(dtype="float32", num_pages=64, max_model_len=128, max_num_batched_tokens=32, max_num_seqs=4,
                warmup=False, progress=False, quantization="int8", quantized_matmul="xla-nk")
    prompt = np.random.default_rng(3).integers(3, 512, size=24).tolist()
    prompts = [prompt, prompt[:9]]

    def run():
        llm = jaxinfer.LLM(norm_llama_dir, **opts)
        sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, prompt_logprobs=0)
        outs = llm.generate(prompts, sp, use_tqdm=False)
        lp = np.array([d[t].logprob for d, t in zip(outs[0].prompt_logprobs[1:], prompt[1:])])
        return lp, [o.outputs[0].token_ids for o in outs]

    monkeypatch.setenv("JAXINFER_NORM_PROLOGUE", "0")
    lp0, toks0 = run()
    assert kernel_everywhere["norm"] == 0 and kernel_everywhere["plain"] > 0
    monkeypatch.setenv("JAXINFER_NORM_PROLOGUE", "1")
    lp1, toks1 = run()
    # qkv, gate_up of each layer and the int8 head (quantize_lm_head) took the factors
    assert kernel_everywhere["norm"] > 0
    np.testing.assert_allclose(lp1, lp0, atol=1e-5, rtol=0)
    assert toks1 == toks0
