"""The `jaxinfer` command line: in-process through `jaxinfer.cli.main(argv)`, and as real processes through the
`jaxinfer` console script and `python -m jaxinfer.cli` to prove both entry points work.

The generate runs pass a small engine (--max-model-len/--num-pages/...): with the CLI defaults (max_model_len
8192 on CPU, 2048-token batches, 256 sequences) the warm-up alone takes ~100 s on a 2-core CPU.
"""
import json
import os
import shutil
import subprocess
import sys

import pytest

import jaxinfer
from jaxinfer import SamplingParams
from jaxinfer.cli import main

PROMPT = "The capital of France is"
SMALL_ARGS = ["--max-model-len", "256", "--num-pages", "64", "--max-num-batched-tokens", "64",
              "--max-num-seqs", "4"]
SMALL = dict(max_model_len=256, num_pages=64, max_num_batched_tokens=64, max_num_seqs=4)


def _run(argv, capsys):
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


def _console_script() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "jaxinfer")
    if not os.path.isfile(exe):
        exe = shutil.which("jaxinfer")
    assert exe, "the `jaxinfer` console script is not installed (pip install -e .)"
    return [exe]


def _subprocess(cmd, timeout=300, **env_overrides):
    env = dict(os.environ)  # conftest set HF_HUB_OFFLINE=1 and JAXINFER_CACHE (where the default GGUF is cached)
    env.update(env_overrides)
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)


# ---- info --------------------------------------------------------------------------------------------------
def test_info_checkpoint_dir(tiny_llama_dir, capsys):
    from transformers import AutoModelForCausalLM

    want = AutoModelForCausalLM.from_pretrained(tiny_llama_dir).num_parameters()
    for argv in (["info", "--model", tiny_llama_dir], ["info", tiny_llama_dir]):
        rc, out, _ = _run(argv, capsys)
        assert rc == 0
        info = json.loads(out)
        assert info["source"] == "hf" and info["path"] == tiny_llama_dir
        assert info["config"]["num_layers"] == 2 and info["config"]["num_kv_heads"] == 2
        assert info["config"]["model_type"] == "llama" and info["config"]["vocab_size"] == 512
        assert info["parameters"] == want
        assert info["kv_cache_bf16_bytes_per_token"] == 2 * 2 * 2 * 16 * 2  # K+V, layers, kv heads, head_dim, bf16


def test_info_preset_loads_no_weights(capsys, monkeypatch):
    import jaxinfer.weights.loader as loader

    def boom(*a, **k):
        raise AssertionError("info must not load weights")

    monkeypatch.setattr(loader, "load_model", boom)
    rc, out, _ = _run(["info", "llama3-8b", "--load-format", "dummy"], capsys)
    assert rc == 0
    info = json.loads(out)
    assert info["source"] == "dummy" and info["config"]["num_layers"] == 32
    assert info["parameters"] == pytest.approx(8.03e9, rel=0.01)
    assert info["weights_bf16_GB"] == pytest.approx(16.06, rel=0.01)


def test_info_preset_without_dummy_is_an_error(capsys):
    rc, out, err = _run(["info", "llama3-8b"], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("jaxinfer: error: 'llama3-8b' is a preset") and "load_format='dummy'" in err


# ---- generate ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def expected_text(smollm2_gguf):
    llm = jaxinfer.LLM(smollm2_gguf, progress=False, **SMALL)
    return llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)[0].outputs[0].text


def test_generate_streams_the_greedy_text(smollm2_gguf, expected_text, capsys):
    assert expected_text.strip()
    rc, out, err = _run(["generate", PROMPT, "--model", smollm2_gguf, "--max-tokens", "8", "--quiet",
                         *SMALL_ARGS], capsys)
    assert rc == 0, err
    assert out == expected_text + "\n"


def test_generate_chat(smollm2_gguf, capsys):
    rc, out, err = _run(["generate", "What is the capital of France?", "--model", smollm2_gguf, "--chat",
                         "--max-tokens", "8", "--quiet", *SMALL_ARGS], capsys)
    assert rc == 0, err
    assert out.strip(), "--chat produced no text"
    assert "<|im_start|>" not in out and "<|im_end|>" not in out


def test_default_model_subprocess(smollm2_gguf):
    """No --model: the default SmolLM2 GGUF (already cached under $JAXINFER_CACHE by the smollm2_gguf fixture)."""
    from jaxinfer.weights.default_model import default_model_path

    assert default_model_path() == smollm2_gguf  # the run below must not need the network
    proc = _subprocess([sys.executable, "-m", "jaxinfer.cli", "generate", "Hello", "--max-tokens", "4", "--quiet",
                        *SMALL_ARGS])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip(), f"no output; stderr: {proc.stderr[-3000:]}"
    assert "downloading" not in proc.stderr
    assert proc.stderr.strip() == "", f"--quiet printed on stderr: {proc.stderr[-3000:]}"


NOISE = ("libtpu", "Unable to initialize backend", "PyTorch was not found")


def test_first_run_stderr_reads_well(smollm2_gguf):
    """Without --quiet: jaxinfer's own progress and log lines only (no jax backend probing, no transformers
    advice), and the loading bar knows its total (the default model has 272 tensors). (The prepared-weights cache
    is off, as on a first run: a warm start reads the weights back without a loading bar.)"""
    proc = _subprocess([sys.executable, "-m", "jaxinfer.cli", "generate", "Hello", "--max-tokens", "2",
                        *SMALL_ARGS], JAXINFER_PREPARED_CACHE="0")
    assert proc.returncode == 0, proc.stderr[-3000:]
    for noise in NOISE:
        assert noise not in proc.stderr, proc.stderr[-3000:]
    assert "engine ready" in proc.stderr
    assert "/272" in proc.stderr, proc.stderr[-3000:]


# ---- bad input ---------------------------------------------------------------------------------------------
def test_missing_model_in_process(capsys):
    rc, out, err = _run(["generate", "hi", "--model", "/no/such", "--quiet"], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("jaxinfer: error: model '/no/such' not found")


def test_missing_model_console_script():
    proc = _subprocess(_console_script() + ["generate", "hi", "--model", "/no/such", "--quiet"], timeout=120)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    assert proc.stdout == ""
    assert proc.stderr.startswith("jaxinfer: error:") and "/no/such" in proc.stderr, proc.stderr[-3000:]


def test_invalid_sampling_flag(capsys):
    rc, out, err = _run(["generate", "hi", "--max-tokens", "0", "--quiet"], capsys)
    assert rc == 2 and out == ""
    assert err.startswith("jaxinfer: error: max_tokens must be >= 1")


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["generate"])  # no prompt: argparse's own usage error
    assert exc.value.code == 2
    assert "required: prompt" in capsys.readouterr().err
