"""quantization='gguf' (jaxinfer/weights/gguf_quant.py): a GGUF file's Q4_0 / Q4_1 linear weights stay int4.

References, independent of the kept-quantized path:
  * gguf-py's own dequantizer (`gguf.quants.dequantize`) for the values of every kept tensor;
  * the float model of the same file (quantization=None: every tensor dequantized, a path tested against
    transformers in test_gguf_loader.py) for the fused device weights, the prompt log-probs and greedy tokens.
Tiny files are written with gguf.GGUFWriter + gguf.quants.quantize, mixing types so that every rule is hit:
a fused module with Q4_0 and Q4_1 parts (kept), a Q8_0 down projection (float), a Q8_0 v next to Q4_1 q/k (the
whole fused qkv float), a Q4_0 untied LM head (float), and llama's RoPE row permutation (qwen2: biases, tied).
"""
import logging

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import jaxinfer
from jaxinfer import SamplingParams
from jaxinfer.config import ConfigError, KeepGGUFQuantization, QuantizationError
from jaxinfer.weights.gguf_quant import keep_gguf_quantization
from jaxinfer.weights.loader import resolve_model
from jaxinfer.weights.prequantized import gguf_to_quantized
from jaxinfer.weights.quant_tensor import QuantizedTensor
from pallas_kernels.quantized_matmul.reference import dequantize_int4
from tests.numerics.gguf_blocks import q4_k_raw

HIDDEN, INTER, VOCAB, HEADS, KV_HEADS = 64, 128, 128, 4, 2
# Per layer: GGUF type of q, k, v, o, gate, up, down.
LAYER_TYPES = [
    dict(attn_q=QT.Q4_0, attn_k=QT.Q4_0, attn_v=QT.Q4_0, attn_output=QT.Q4_1, ffn_gate=QT.Q4_0, ffn_up=QT.Q4_1,
         ffn_down=QT.Q8_0),
    dict(attn_q=QT.Q4_1, attn_k=QT.Q4_1, attn_v=QT.Q8_0, attn_output=QT.Q4_0, ffn_gate=QT.Q4_1, ffn_up=QT.Q4_1,
         ffn_down=QT.Q4_1),
]
KEPT = {("layers", 0, "attn", "qkv"), ("layers", 0, "attn", "o"), ("layers", 0, "mlp", "gate_up"),
        ("layers", 1, "attn", "o"), ("layers", 1, "mlp", "gate_up"), ("layers", 1, "mlp", "down")}
FLOAT = {("layers", 0, "mlp", "down"), ("layers", 1, "attn", "qkv")}
HF_NAMES = dict(attn_q="self_attn.q_proj.weight", attn_k="self_attn.k_proj.weight", attn_v="self_attn.v_proj.weight",
                attn_output="self_attn.o_proj.weight", ffn_gate="mlp.gate_proj.weight", ffn_up="mlp.up_proj.weight",
                ffn_down="mlp.down_proj.weight")


def _shapes(hidden, inter):
    return dict(attn_q=(hidden, hidden), attn_k=(hidden * KV_HEADS // HEADS, hidden),
                attn_v=(hidden * KV_HEADS // HEADS, hidden), attn_output=(hidden, hidden), ffn_gate=(inter, hidden),
                ffn_up=(inter, hidden), ffn_down=(hidden, inter))
KW = dict(dtype="float32", max_model_len=64, num_pages=16, warmup=False, progress=False)


def _llamacpp_permute(w, n_head):
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute (HF rows -> the file's row order)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _q4_k_raw(rng, n_out, n_in):
    """Random Q4_K super-blocks (small d; scale 0 allowed: a constant sub-block, kept exactly)."""
    return q4_k_raw(rng, n_out, n_in, d_range=(1e-4, 1e-3), min_scale=0)


def _write(path, arch, *, tied, layer_types=LAYER_TYPES, hidden=HIDDEN, inter=INTER):
    """A model in llama.cpp's conventions, one layer per entry of layer_types. Returns {HF name: float32 [out, in]}
    of the linear weights as gguf-py dequantizes them from the file (RoPE permutation undone): what a correct
    loader must reproduce."""
    rng = np.random.default_rng(0)
    head_dim = hidden // HEADS
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny {arch}")
    for add, v in ((w.add_block_count, len(layer_types)), (w.add_context_length, 256),
                   (w.add_embedding_length, hidden), (w.add_feed_forward_length, inter), (w.add_head_count, HEADS),
                   (w.add_head_count_kv, KV_HEADS), (w.add_layer_norm_rms_eps, 1e-6),
                   (w.add_rope_freq_base, 10000.0), (w.add_vocab_size, VOCAB), (w.add_rope_dimension_count, head_dim),
                   (w.add_bos_token_id, 1), (w.add_eos_token_id, 2)):
        add(v)
    w.add_tokenizer_model("gpt2")  # a byte-level vocabulary of single characters: prompts here are token ids
    w.add_token_list([chr(0x41 + i) if i < 26 else chr(0x100 + i) for i in range(VOCAB)])
    w.add_token_types([1] * VOCAB)

    def add_tensor(name, x, qtype):
        if qtype == QT.F32:
            w.add_tensor(name, np.ascontiguousarray(x, np.float32))
            return x
        if qtype == QT.Q4_K:  # x only gives the shape
            raw = _q4_k_raw(rng, *x.shape)
        else:
            raw = gguf.quants.quantize(np.ascontiguousarray(x, np.float32), qtype)
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        return gguf.quants.dequantize(raw, qtype).reshape(x.shape)

    want = {}
    shapes = _shapes(hidden, inter)
    add_tensor("token_embd.weight", rng.standard_normal((VOCAB, hidden)), QT.Q8_0)
    for i, types in enumerate(layer_types):
        add_tensor(f"blk.{i}.attn_norm.weight", 1 + 0.1 * rng.standard_normal(hidden), QT.F32)
        add_tensor(f"blk.{i}.ffn_norm.weight", 1 + 0.1 * rng.standard_normal(hidden), QT.F32)
        for kind, qtype in types.items():
            x = 0.2 * rng.standard_normal(shapes[kind])
            heads = {"attn_q": HEADS, "attn_k": KV_HEADS}.get(kind) if arch == "llama" else None
            stored = add_tensor(f"blk.{i}.{kind}.weight", _llamacpp_permute(x, heads) if heads else x, qtype)
            # gguf-py's dequantization of the file's tensor, back in HF row order (the inverse permutation)
            want[f"model.layers.{i}.{HF_NAMES[kind]}"] = (
                stored.reshape(heads, -1, 2, hidden).swapaxes(1, 2).reshape(stored.shape) if heads else stored)
        if arch == "qwen2":
            for kind, n in (("attn_q", HEADS), ("attn_k", KV_HEADS), ("attn_v", KV_HEADS)):
                add_tensor(f"blk.{i}.{kind}.bias", 0.1 * rng.standard_normal(n * head_dim), QT.F32)
    add_tensor("output_norm.weight", 1 + 0.1 * rng.standard_normal(hidden), QT.F32)
    if not tied:
        add_tensor("output.weight", rng.standard_normal((VOCAB, hidden)), QT.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return want


@pytest.fixture(scope="module", params=[("llama", False), ("qwen2", True)], ids=["llama-untied", "qwen2-tied"])
def tiny_gguf(request, tmp_path_factory):
    arch, tied = request.param
    path = tmp_path_factory.mktemp("gguf_kept") / f"tiny-{arch}.gguf"
    want = _write(path, arch, tied=tied)
    return str(path), want


def test_kept_tensors_dequantize_like_gguf(tiny_gguf):
    """The plan keeps exactly the modules whose parts are all Q4_0 / Q4_1, and each kept QuantizedTensor
    dequantizes to gguf-py's values (Q4_0 exactly, Q4_1 to float32 rounding of zero = -m / d)."""
    path, want = tiny_gguf
    spec, stream = keep_gguf_quantization(resolve_model(path), KeepGGUFQuantization())
    assert (spec.method, spec.group_size, spec.symmetric, spec.lm_head) == ("int4", 32, False, False)
    assert spec.float_modules == FLOAT
    kept = {name: t for name, t in stream if isinstance(t, QuantizedTensor)}
    kept_kinds = {f"model.layers.{i}.{HF_NAMES[k]}": q for i, types in enumerate(LAYER_TYPES) for k, q in
                  types.items() if not (i == 0 and k == "ffn_down") and not (i == 1 and k in ("attn_q", "attn_k",
                                                                                             "attn_v"))}
    assert set(kept) == set(kept_kinds)
    for name, qt in kept.items():
        ref = want[name]
        assert qt.kind == "int4" and qt.group_size == 32 and qt.shape == ref.T.shape
        if kept_kinds[name] == QT.Q4_0:  # in zero-point form (this file also has Q4_1): zero 8, exact
            assert np.all(qt.zero == 8.0)
            np.testing.assert_array_equal(qt.dequantize().T, ref, err_msg=name)
        else:
            np.testing.assert_allclose(qt.dequantize().T, ref, rtol=1e-6, atol=1e-6 * np.abs(ref).max(),
                                       err_msg=name)


def test_kept_model_equals_the_dequantized_model(tiny_gguf):
    """The kept-quantized model's fused device weights, prompt log-probs and greedy tokens equal the float model's
    of the same file (float32: the only difference is float32 rounding of the Q4_1 zero points)."""
    _compare_with_float_model(tiny_gguf[0], FLOAT)


def test_q4_k_model_equals_the_dequantized_model(tmp_path):
    """Q4_K (256-value super-blocks, 8 sub-block scales and mins, some scales 0) kept as int4 group 32: same check,
    on a 1-layer llama 256 wide (Q4_K rows need a multiple of 256 inputs)."""
    path = tmp_path / "q4k.gguf"
    _write(path, "llama", tied=True, layer_types=[{k: QT.Q4_K for k in LAYER_TYPES[0]}], hidden=256, inter=256)
    _compare_with_float_model(str(path), set())


def _compare_with_float_model(path, float_modules):
    # min_bucket_tokens=16: the 8-token prefill and the decodes run in one bucket (one step program per engine;
    # on CPU the quantized matmul's formulation does not depend on the step size: quant_paths 'reference')
    kw = {**KW, "min_bucket_tokens": 16}
    quant = jaxinfer.LLM(path, quantization="gguf", **kw)
    assert quant.model.quantization.float_modules == float_modules
    ref = jaxinfer.LLM(path, **kw)
    qm, fm = quant.model.module(), ref.model.module()
    for i, layer in enumerate(qm.layers):
        for parent, attr in (("attn", "qkv"), ("attn", "o"), ("mlp", "gate_up"), ("mlp", "down")):
            lin = getattr(getattr(layer, parent), attr)
            w_ref = np.asarray(getattr(getattr(fm.layers[i], parent), attr).w[...])
            if ("layers", i, parent, attr) in float_modules:
                assert type(lin).__name__ == "Linear"
                np.testing.assert_array_equal(np.asarray(lin.w[...]), w_ref)
            else:
                assert type(lin).__name__ == "QuantLinear" and lin.method == "int4"
                w = np.asarray(dequantize_int4(lin.q[...], lin.scale[...], lin.offset[...], 32))
                np.testing.assert_allclose(w, w_ref, rtol=1e-6, atol=1e-6 * np.abs(w_ref).max())
    assert quant.model.num_bytes < ref.model.num_bytes

    sp = SamplingParams(max_tokens=8, temperature=0.0, prompt_logprobs=0, ignore_eos=True)
    prompt = [3, 17, 5, 99, 42, 7, 64, 12]
    got = quant.generate([prompt], sp, use_tqdm=False)[0]
    want = ref.generate([prompt], sp, use_tqdm=False)[0]
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    for a, b in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:]):
        (ta, la), = a.items()
        (tb, lb), = b.items()
        assert ta == tb and abs(la.logprob - lb.logprob) < 1e-4


def test_gguf_request_errors(tmp_path, tiny_llama_dir, caplog):
    with pytest.raises(QuantizationError, match="not a \\*.gguf file"):
        jaxinfer.LLM(tiny_llama_dir, quantization="gguf", **KW)
    with pytest.raises(ConfigError, match="quantize_lm_head=True does not combine with quantization='gguf'"):
        jaxinfer.LLM(tiny_llama_dir, quantization="gguf", quantize_lm_head=True, **KW)
    # A file with no keepable projection (all Q8_0) loads as the float model, with a warning naming the types.
    path = tmp_path / "q8.gguf"
    _write(path, "llama", tied=True, layer_types=[{k: QT.Q8_0 for k in LAYER_TYPES[0]}] * 2)
    with caplog.at_level(logging.WARNING, logger="jaxinfer"):
        spec, _ = keep_gguf_quantization(resolve_model(str(path)), KeepGGUFQuantization())
    assert spec is None and "Q8_0" in caplog.text


def test_constant_blocks_are_kept_exactly():
    """A Q4_1 block with d = 0 holds the constant m (and a Q4_K sub-block with scale 0 the constant -dmin * m):
    q = 0, scale 1, zero = -m reproduces it; gguf-py's dequantizer is the reference."""
    from gguf.quants import dequantize

    rng = np.random.default_rng(1)
    n_out, n_in = 3, 64
    d = rng.uniform(0.01, 0.1, (n_out, 2)).astype(np.float16)
    m = rng.uniform(-0.5, 0.5, (n_out, 2)).astype(np.float16)
    d[1, 0] = 0.0  # block (1, 0): the constant m[1, 0]
    q = rng.integers(0, 16, (n_out, 2, 32)).astype(np.uint8)
    qs = (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)
    raw = np.concatenate([d[..., None].view(np.uint8), m[..., None].view(np.uint8), qs], -1).reshape(n_out, -1)
    ref = dequantize(raw, QT.Q4_1).reshape(n_out, n_in)
    assert np.all(ref[1, :32] == np.float32(m[1, 0]))
    got = gguf_to_quantized("Q4_1", raw, n_out, n_in).dequantize().T
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    assert np.array_equal(got[1, :32], ref[1, :32])


def test_real_smollm2_kept_quantized(smollm2_gguf):
    """SmolLM2-135M-Instruct's Q4_1 projections (all 210) kept as int4, served by the engine, give finite prompt
    log-probs within 1e-3 of the dequantized float32 model's (a dense forward of the float model loaded the
    default way: cheaper than a second engine)."""
    from jaxinfer.weights.awq import dense_forward
    from jaxinfer.weights.loader import load_model

    quant = jaxinfer.LLM(smollm2_gguf, quantization="gguf", **dict(KW, max_model_len=128))
    assert quant.model.quantization.float_modules == frozenset()
    ids = quant.tokenizer.encode("The capital of France is Paris. The capital of Germany is Berlin, and the")
    out = quant.generate([ids], SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0), use_tqdm=False)[0]
    got = np.array([-out.prompt_logprobs[i][t].logprob for i, t in enumerate(ids) if i > 0])
    ref_model = load_model(resolve_model(smollm2_gguf), "float32", progress=False)
    want, _ = dense_forward(ref_model.module(), ids)
    assert np.all(np.isfinite(got)) and np.abs(got - want).max() < 1e-3, np.abs(got - want).max()
