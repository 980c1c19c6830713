"""Bad input fails early with an actionable message: it names the bad value and says what to do instead.

Loader / config errors are raised before any program is compiled (warmup=False keeps the few that get as far as
building the engine cheap); request errors use one shared tiny engine, which must keep serving afterwards.
"""
import json
import os
import re
import shutil

import pytest

import jaxinfer
from jaxinfer import SamplingParams
from jaxinfer.config import ConfigError
from jaxinfer.weights.loader import ModelNotFoundError

NO_ENGINE = dict(progress=False, warmup=False)
SMALL = dict(max_model_len=128, num_pages=64, max_num_batched_tokens=64, max_num_seqs=4, progress=False)
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def llm(tiny_llama_dir):
    return jaxinfer.LLM(tiny_llama_dir, **SMALL)


def _variant(src, dst, edit=None):
    """Copy checkpoint `src` to `dst`, applying `edit(config_dict)` to its config.json."""
    shutil.copytree(src, dst)
    if edit is not None:
        path = os.path.join(dst, "config.json")
        with open(path) as f:
            cfg = json.load(f)
        edit(cfg)
        with open(path, "w") as f:
            json.dump(cfg, f)
    return str(dst)


# ---- where the model is ------------------------------------------------------------------------------------
def test_missing_path():
    with pytest.raises(ModelNotFoundError, match=r"'/no/such/dir' not found.*directory with config\.json"):
        jaxinfer.LLM("/no/such/dir", **NO_ENGINE)
    assert issubclass(ModelNotFoundError, FileNotFoundError)


def test_config_without_safetensors(tiny_llama_dir, tmp_path):
    d = tmp_path / "nost"
    d.mkdir()
    shutil.copy(os.path.join(tiny_llama_dir, "config.json"), d)
    with pytest.raises(FileNotFoundError, match=re.escape(repr(str(d))) + r" has config\.json but no "
                       r"\*\.safetensors.*save_pretrained\(safe_serialization=True\)"):
        jaxinfer.LLM(str(d), **NO_ENGINE)


def test_directory_without_config(tiny_llama_dir, tmp_path):
    d = tmp_path / "nocfg"
    d.mkdir()
    shutil.copy(os.path.join(tiny_llama_dir, "model.safetensors"), d)
    with pytest.raises(FileNotFoundError, match=re.escape(repr(str(d))) + r" has no config\.json.*"
                       r"needs config\.json plus \*\.safetensors"):
        jaxinfer.LLM(str(d), **NO_ENGINE)


def test_file_that_is_not_gguf(tmp_path):
    f = tmp_path / "model.bin"
    f.write_bytes(b"\0" * 64)
    with pytest.raises(FileNotFoundError, match=r"is a file but not a GGUF file; pass a \*\.gguf file"):
        jaxinfer.LLM(str(f), **NO_ENGINE)


def test_hub_id_while_offline():
    assert os.environ.get("HF_HUB_OFFLINE") == "1"
    with pytest.raises(FileNotFoundError, match=r"(?s)'someorg/somemodel'.*offline.*local directory"):
        jaxinfer.LLM("someorg/somemodel", **NO_ENGINE)


# ---- what the config asks for ------------------------------------------------------------------------------
def _gpt2(c):
    c["model_type"], c["architectures"] = "gpt2", ["GPT2LMHeadModel"]


def _gpt2_arch_only(c):
    c["architectures"] = ["GPT2LMHeadModel"]


def _yarn(c):  # transformers >= 5 layout
    c["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "yarn", "factor": 4.0,
                            "original_max_position_embeddings": 256}


def _yarn_legacy(c):  # transformers < 5 layout
    c.pop("rope_parameters", None)
    c["rope_theta"], c["rope_scaling"] = 10000.0, {"type": "yarn", "factor": 4.0}


def _gelu(c):
    c["hidden_act"] = "gelu"


@pytest.mark.parametrize("edit, pattern", [
    (_gpt2, r"unsupported model_type 'gpt2' \(architectures \['GPT2LMHeadModel'\]\); jaxinfer supports llama"),
    (_gpt2_arch_only, r"unsupported architecture 'GPT2LMHeadModel'; jaxinfer supports .*LlamaForCausalLM"),
    (_yarn, r"unsupported rope scaling type 'yarn'; jaxinfer implements default, linear, llama3"),
    (_yarn_legacy, r"unsupported rope scaling type 'yarn'; jaxinfer implements default, linear, llama3"),
    (_gelu, r"unsupported hidden_act 'gelu': only 'silu'"),
], ids=["model_type", "architecture", "rope_yarn", "rope_yarn_legacy", "hidden_act"])
def test_unsupported_config(tiny_llama_dir, tmp_path, edit, pattern):
    d = _variant(tiny_llama_dir, tmp_path / "m", edit)
    with pytest.raises(ConfigError, match=pattern):
        jaxinfer.LLM(d, **NO_ENGINE)


def test_max_model_len_beyond_the_model(tiny_llama_dir):
    with pytest.raises(ConfigError, match=r"max_model_len=4096 exceeds the model's max_position_embeddings="
                                          r"1024; lower max_model_len"):
        jaxinfer.LLM(tiny_llama_dir, max_model_len=4096, **NO_ENGINE)


def test_bad_engine_option_value(tiny_llama_dir):
    with pytest.raises(ConfigError, match=r"dtype must be 'auto', 'float32', 'bfloat16' or 'float16', got 'int8'"):
        jaxinfer.LLM(tiny_llama_dir, dtype="int8", **NO_ENGINE)
    with pytest.raises(ConfigError, match=r"page_size must be a power of two >= 1, got 12"):
        jaxinfer.LLM(tiny_llama_dir, page_size=12, **NO_ENGINE)


def test_unknown_option_fails_before_loading(tiny_llama_dir, monkeypatch):
    import jaxinfer.weights.loader as loader

    def boom(*a, **k):
        raise AssertionError("the model was resolved/loaded before the options were checked")

    monkeypatch.setattr(loader, "resolve_model", boom)
    monkeypatch.setattr(loader, "load_model", boom)
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['not_an_option'\]; valid engine options are "
                                          r"\[.*'max_model_len'.*'num_pages'.*\]"):
        jaxinfer.LLM(tiny_llama_dir, not_an_option=1)


# ---- damaged weights ---------------------------------------------------------------------------------------
def test_truncated_safetensors(tiny_llama_dir, tmp_path):
    d = _variant(tiny_llama_dir, tmp_path / "m")
    f = os.path.join(d, "model.safetensors")
    os.truncate(f, os.path.getsize(f) // 2)
    with pytest.raises(ValueError, match=r"model\.safetensors'.*corrupted or truncated.*re-download"):
        jaxinfer.LLM(d, **NO_ENGINE)


def test_corrupted_safetensors_header(tiny_llama_dir, tmp_path):
    d = _variant(tiny_llama_dir, tmp_path / "m")
    with open(os.path.join(d, "model.safetensors"), "r+b") as f:
        f.write(b"\xff" * 8)  # the little-endian u64 header length
    with pytest.raises(ValueError, match=r"model\.safetensors'.*corrupted or truncated.*re-download"):
        jaxinfer.LLM(d, **NO_ENGINE)


def test_config_does_not_match_weights(tiny_llama_dir, tmp_path):
    d = _variant(tiny_llama_dir, tmp_path / "m", lambda c: c.update(hidden_size=128))
    with pytest.raises(ValueError, match=r"tensor '\S+' has shape \(\d+, \d+\) but config\.json implies \(\d+, \d+\) "
                                         r"\(hidden_size=128.*config\.json does not match the weights"):
        jaxinfer.LLM(d, **NO_ENGINE)
    d = _variant(tiny_llama_dir, tmp_path / "m2", lambda c: c.update(intermediate_size=256))
    with pytest.raises(ValueError, match=r"tensor '\S+mlp\S+' has shape .*256.*config\.json does not match"):
        jaxinfer.LLM(d, **NO_ENGINE)


def test_config_does_not_match_weights_without_head_dim(tiny_llama_dir, tmp_path):
    """Older configs (Llama 2, Mistral, most of the hub) have no head_dim: it is hidden_size // heads, so a wrong
    hidden_size also changes head_dim; the error must still name the tensor and the config fields, not be numpy's
    bare reshape failure from fusing Q/K/V."""
    def edit(c):
        c.pop("head_dim", None)
        c["hidden_size"] = 128

    d = _variant(tiny_llama_dir, tmp_path / "m", edit)
    with pytest.raises(ValueError) as exc:
        jaxinfer.LLM(d, **NO_ENGINE)
    msg = str(exc.value)
    assert re.search(r"weight|tensor", msg) and "shape" in msg and "does not match" in msg, (
        f"a config/weights mismatch must name the tensor and its shapes and say config.json does not match it; "
        f"got {msg!r}")


# ---- requests ----------------------------------------------------------------------------------------------
def test_prompt_longer_than_context(llm):
    reference = llm.generate([[5, 6, 7]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    with pytest.raises(ValueError, match=r"needs 201 tokens \(prompt 197 \+ max_tokens 4\) but max_model_len is "
                                         r"128; shorten the prompt or lower max_tokens"):
        llm.generate([list(range(3, 200))], SamplingParams(max_tokens=4))
    # a good prompt in the same batch is not left queued, and the engine keeps serving
    with pytest.raises(ValueError, match="max_model_len is 128"):
        llm.generate([[5, 6, 7], list(range(3, 200))], SamplingParams(max_tokens=4))
    assert not llm.engine.has_unfinished()
    out = llm.generate([[5, 6, 7], [8, 9]], GREEDY, use_tqdm=False)
    assert out[0].outputs[0].token_ids == reference and len(out[1].outputs[0].token_ids) == 4


def test_prompt_token_out_of_vocabulary(llm):
    with pytest.raises(ValueError, match=r"prompt token ids \[512\] are outside the vocabulary \[0, 512\)"):
        llm.generate([[1, 512]], GREEDY)
    with pytest.raises(ValueError, match="prompt is empty"):
        llm.generate([[]], GREEDY)


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(temperature=-0.5), r"temperature must be >= 0 .*got -0\.5"),
    (dict(top_p=0), r"top_p must be in \(0, 1\], got 0"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1\.5"),
    (dict(max_tokens=0), r"max_tokens must be >= 1 or None, got 0"),
    (dict(top_k=-5), r"top_k must be -1 \(off\) or >= 1, got -5"),
])
def test_invalid_sampling_values(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        SamplingParams(**kwargs)


def test_prompt_of_the_wrong_type(llm):
    with pytest.raises(TypeError, match=r"prompt 0 must be a string or a list of token ids, got float"):
        llm.generate([3.5])
    with pytest.raises(TypeError, match=r"prompt 1 must be a string or a list of token ids, got list"):
        llm.generate([[1, 2], [1, "2"]])
    with pytest.raises(TypeError, match=r"prompt 1 must be a string or a list of token ids, got dict"):
        llm.generate([[1, 2], {"prompt": [1, 2]}])
    assert not llm.engine.has_unfinished()


@pytest.mark.parametrize("prompts", [42, None, {"prompt": [5, 6, 7]}], ids=["int", "None", "dict"])
def test_non_sequence_prompts(llm, prompts):
    """An int or None must not surface as Python's bare "'int' object is not iterable", and a dict must not be
    iterated into its keys (the string prompt "prompt", which a model with a tokenizer would generate for)."""
    try:
        llm.generate(prompts, GREEDY, use_tqdm=False)
        err = None
    except Exception as e:  # noqa: BLE001 - the assertion below reports whatever came out
        err = e
    assert isinstance(err, TypeError) and "string or a list of token ids" in str(err), (
        f"generate({prompts!r}) must raise TypeError saying what a prompt may be; got {type(err).__name__}: {err}")
    assert not llm.engine.has_unfinished()


def test_mismatched_sampling_params(llm):
    with pytest.raises(ValueError, match=r"got 3 SamplingParams for 2 prompts; pass one, or one per prompt"):
        llm.generate([[1, 2], [3, 4]], [GREEDY] * 3)
    assert not llm.engine.has_unfinished()
    assert len(llm.generate([[1, 2], [3, 4]], [GREEDY] * 2, use_tqdm=False)) == 2
