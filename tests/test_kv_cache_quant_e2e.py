"""kv_cache_dtype="fp8" | "int8" end to end: the tiny model generates with quantized KV (reference and Pallas
backends), the page budget grows by the byte ratio, the prefix-cache hash is bound to the KV dtype, and on the real
SmolLM2-135M-Instruct the perplexity of the shipped text stays within the issue's bounds of float KV."""
import math

import numpy as np
import pytest

import jaxinfer
from jaxinfer import SamplingParams
from jaxinfer.config import ConfigError
from jaxinfer.engine.kv_cache import root_hash
from jaxinfer.quality import perplexity, token_nll

GREEDY = dict(temperature=0.0, ignore_eos=True)
OPTS = dict(max_model_len=256, max_num_batched_tokens=64, max_num_seqs=4, warmup=False, progress=False)


def _prompts(n=4, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 512, size=int(rng.integers(5, 90))).tolist() for _ in range(n)]


@pytest.fixture(scope="module")
def float_llm(tiny_llama_dir):
    return jaxinfer.LLM(tiny_llama_dir, num_pages=64, **OPTS)


def _fake_quant(x, kind):
    """torch: quantize-dequantize [B, KVH, T, D] per (token, head) as the KV cache stores it (independent of
    kv_quant.py: torch's own float8_e4m3fn cast / round-half-even)."""
    import torch

    qmax = 448.0 if kind == "fp8" else 127.0
    scale = x.abs().amax(-1, keepdim=True) / qmax
    y = x / torch.where(scale > 0, scale, torch.ones_like(scale))
    y = y.clamp(-qmax, qmax)
    y = y.to(torch.float8_e4m3fn).float() if kind == "fp8" else torch.round(y)
    return y * scale


@pytest.fixture(scope="module")
def hf_quant_kv(tiny_llama_dir):
    """The tiny model in transformers (float32) with an attention function that sees K (after RoPE) and V
    quantized per token and KV head: the independent reference for the engine with kv_cache_dtype set."""
    import torch
    import transformers as tf
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    state = {"kind": None}

    def attn(module, query, key, value, attention_mask, **kw):
        return sdpa_attention_forward(module, query, _fake_quant(key, state["kind"]),
                                      _fake_quant(value, state["kind"]), attention_mask, **kw)

    tf.AttentionInterface.register("jaxinfer_kv_quant", attn)
    model = tf.AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32,
                                                    attn_implementation="jaxinfer_kv_quant").eval()
    return model, state


def _hf_nll_and_greedy(hf, kind, ids, n_new):
    import torch

    model, state = hf
    state["kind"] = kind
    with torch.no_grad():
        x = torch.tensor([ids])
        logp = torch.log_softmax(model(x).logits[0].double(), -1)
        nll = -logp[torch.arange(len(ids) - 1), x[0, 1:]].numpy()
        out = model.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n_new,
                             min_new_tokens=n_new, pad_token_id=0)
    return nll, out[0, len(ids):].tolist()


@pytest.mark.parametrize("kind", ["fp8", "int8"])
def test_tiny_model_generates_with_quantized_kv(tiny_llama_dir, float_llm, hf_quant_kv, kind):
    """Prompt log-likelihoods and greedy tokens equal transformers' with K/V quantized the same way (1e-3 nats),
    while they differ visibly from float KV (this random tiny model has very peaked attention)."""
    llm = jaxinfer.LLM(tiny_llama_dir, num_pages=64, kv_cache_dtype=kind, **OPTS)
    assert llm.runner.kv_caches[0][0].data.dtype.name == {"fp8": "float8_e4m3fn", "int8": "int8"}[kind]
    for ids in _prompts(n=2):
        want_nll, want_tokens = _hf_nll_and_greedy(hf_quant_kv, kind, ids, 6)
        got = llm.generate([ids], SamplingParams(max_tokens=6, **GREEDY), use_tqdm=False)[0].outputs[0].token_ids
        assert got == want_tokens
        nll = token_nll(llm, ids)
        np.testing.assert_allclose(nll, want_nll, atol=1e-3)
        assert np.abs(token_nll(float_llm, ids) - nll).max() > 1e-2  # the KV really is quantized


def test_pallas_backend_with_int8_kv_matches_reference(tiny_llama_dir):
    """The kernel (interpret mode) reading int8 pages + scales gives the reference backend's greedy tokens."""
    prompts = _prompts(n=3, seed=1)
    params = SamplingParams(max_tokens=6, **GREEDY)
    ref = jaxinfer.LLM(tiny_llama_dir, num_pages=64, kv_cache_dtype="int8", **OPTS)
    pal = jaxinfer.LLM(tiny_llama_dir, num_pages=64, kv_cache_dtype="int8", attention_backend="pallas", **OPTS)
    want = ref.generate(prompts, params, use_tqdm=False)
    got = pal.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in want]


def test_page_budget_and_prefix_hash(tiny_llama_dir, float_llm):
    """Same memory budget -> pages in the ratio of bytes per token: float32 head_dim 16 takes 64 bytes per token
    and head, fp8 / int8 16 + a 4-byte scale. The prefix-cache chain is rooted in the KV dtype.
    On CPU the pool is sized for the request limits (max_num_seqs x max_model_len, runner/cpu_defaults.py) up to a
    1 GiB budget: 32768 sequences of 16 pages exceed it (fp8 too), so the budget decides here."""
    cfg = float_llm.model_config
    small = jaxinfer.LLM(tiny_llama_dir, **OPTS)  # 4 sequences x 256 tokens: 4 x 16 pages + the reserved page 0
    assert small.runner.num_pages == 4 * 16 + 1
    big = dict(OPTS, max_num_seqs=32768)
    fp8 = jaxinfer.LLM(tiny_llama_dir, kv_cache_dtype="fp8", **big)  # num_pages from the (CPU: 1 GiB) budget
    flt = jaxinfer.LLM(tiny_llama_dir, **big)
    per_tok = lambda b: 2 * cfg.num_layers * cfg.num_kv_heads * b  # noqa: E731  bytes of K+V of all layers
    assert fp8.runner.bytes_per_page == per_tok(cfg.head_dim + 4) * 16
    assert flt.runner.bytes_per_page == per_tok(4 * cfg.head_dim) * 16
    assert fp8.runner.num_pages == (1 << 30) // fp8.runner.bytes_per_page
    assert fp8.runner.num_pages / flt.runner.num_pages == pytest.approx(4 * cfg.head_dim / (cfg.head_dim + 4),
                                                                        rel=1e-3)
    assert fp8.runner.kv_cache_bytes <= 1 << 30
    assert fp8.engine.kv.extra_key != flt.engine.kv.extra_key
    assert root_hash(fp8.engine.kv.extra_key) != root_hash(flt.engine.kv.extra_key)


def test_bad_kv_cache_dtype_is_a_clear_error(tiny_llama_dir):
    with pytest.raises(ConfigError, match=r"kv_cache_dtype must be 'auto', 'fp8' or 'int8', got 'fp4'"):
        jaxinfer.LLM(tiny_llama_dir, kv_cache_dtype="fp4", **OPTS)


@pytest.mark.slow
def test_smollm2_perplexity_with_quantized_kv(smollm2_gguf):
    """Real SmolLM2-135M-Instruct, float32 weights, the first 512 tokens of the shipped quality text.

    Measured (CPU): float KV 31.29, int8 31.35 (+0.2%), fp8 31.61 (+1.0%); on the whole 2,183-token text fp8 is
    +0.94% (benchmarks/quality.py). int8 is held to the issue's +1%; fp8 to +1.5% on this short prefix, where
    its measured +1.0% leaves no margin for platform rounding differences (see the benchmark for the full text)."""
    opts = dict(dtype="float32", num_pages=40, max_model_len=520, max_num_batched_tokens=512, max_num_seqs=1,
                warmup=False, progress=False)
    ppl = {}
    for kind in ("auto", "int8", "fp8"):
        llm = jaxinfer.LLM(smollm2_gguf, kv_cache_dtype=kind, **opts)
        ppl[kind] = perplexity(llm, num_tokens=512)
        del llm
    assert 10 < ppl["auto"] < 60 and math.isfinite(ppl["fp8"])
    # Each quantized cache changes the result (its path is on) and stays within its bound of the float cache's. Not
    # "worse than float": int8's rounding noise is within XLA:CPU's own rounding differences (at the suite's -O0,
    # tests/conftest.py, int8 read 31.282 against float 31.292).
    assert ppl["int8"] != ppl["auto"] and abs(ppl["int8"] / ppl["auto"] - 1) <= 0.01, ppl
    assert ppl["fp8"] != ppl["auto"] and abs(ppl["fp8"] / ppl["auto"] - 1) <= 0.015, ppl
