"""SmoothQuant for W8A8 (jaxinfer/weights/smoothquant.py): the scales' formula against numpy, folding leaves the
float model's function unchanged, smoothing cuts the W8A8 error where a few input channels carry outlier
activations (the case it is for), and `jaxinfer smoothquant` writes a checkpoint that reloads as the same float
model and runs under quantized_matmul='xla-nk-w8a8'."""
import dataclasses
import json
import os
import shutil

import jax.numpy as jnp
import numpy as np
import pytest

import jaxinfer
from jaxinfer import SamplingParams
from jaxinfer.cli import main as cli_main
from jaxinfer.config.quantization import SMOOTHQUANT_KEY, parse_quantization, smoothed_checkpoint_spec
from jaxinfer.weights import awq, smoothquant
from pallas_kernels.quantized_matmul import reference as qr


def _ids(n, seed=0):
    return np.random.default_rng(seed).integers(3, 512, n).tolist()


def test_smooth_scales_formula_and_edges():
    rng = np.random.default_rng(0)
    x, w = rng.normal(size=(32, 6)), rng.normal(size=(6, 5))
    x[:, 2] = 0.0                                                # a channel that never fires keeps s = 1
    s = smoothquant.smooth_scales(x, w, 0.4)
    want = np.abs(x).max(0) ** 0.4 / np.abs(w).max(1) ** 0.6
    np.testing.assert_allclose(np.delete(s, 2), np.delete(want, 2), rtol=1e-5)
    assert s[2] == 1.0
    np.testing.assert_allclose(smoothquant.smooth_scales(x, w, 0.0), np.where(np.arange(6) == 2, 1.0,
                                                                            1 / np.abs(w).max(1)), rtol=1e-5)
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\]"):
        smoothquant.smooth_scales(x, w, 1.5)


def _w8a8_rel_err(x, w):
    """W8A8 (per-token activations, per-channel weights) of x @ w against float64."""
    from jaxinfer.weights.quantize import quantize_rtn

    qt = quantize_rtn(w.astype(np.float32), "int8")
    got = np.asarray(qr.int8_w8a8_matmul_reference(jnp.asarray(x, jnp.float32), jnp.asarray(qt.q),
                                                   jnp.asarray(qt.scale)), np.float64)
    want = x @ w
    return np.linalg.norm(got - want) / np.linalg.norm(want)


def test_smoothing_cuts_the_w8a8_error_of_outlier_channels():
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(64, 96)), rng.normal(size=(96, 40)) * 0.05
    x[:, [3, 50]] *= 60.0                                        # two outlier channels, as in real LLM activations
    s = smoothquant.smooth_scales(x, w, 0.5)
    plain, smoothed = _w8a8_rel_err(x, w), _w8a8_rel_err(x / s, w * s[:, None])
    assert smoothed < 0.5 * plain, (smoothed, plain)
    np.testing.assert_allclose((x / s) @ (w * s[:, None]), x @ w, rtol=1e-9, atol=1e-9)   # the same product


def test_a_smoothed_checkpoint_runs_w8a8_under_auto_on_one_gpu_only():
    """config.smoothed_checkpoint_spec: int8 + 'auto' + the marker + one GPU -> 'xla-nk-w8a8'; every other case
    keeps the spec it was given (the same object)."""
    marked, plain = {"model_type": "llama", SMOOTHQUANT_KEY: {"alpha": 0.5}}, {"model_type": "llama"}
    int8 = parse_quantization("int8")
    assert smoothed_checkpoint_spec(int8, marked, "gpu").backend == "xla-nk-w8a8"
    assert smoothed_checkpoint_spec(int8, marked, "gpu") == dataclasses.replace(int8, backend="xla-nk-w8a8")
    for spec, cfg, platform, distributed in [
            (int8, plain, "gpu", False),                                       # not smoothed
            (int8, marked, "cpu", False),                                      # the CPU's weight-only reference
            (int8, marked, "gpu", True),                                       # a parallel plan
            (parse_quantization("int8", backend="xla-nk"), marked, "gpu", False),   # an explicit backend wins
            (parse_quantization("int4-g128"), marked, "gpu", False),           # W8A8 is int8's
            (None, marked, "gpu", False)]:                                     # float weights
        assert smoothed_checkpoint_spec(spec, cfg, platform, distributed=distributed) is spec


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    return jaxinfer.LLM(tiny_llama_dir, num_pages=32, max_model_len=256, max_num_batched_tokens=128,
                        max_num_seqs=2, warmup=False, progress=False)


def test_folding_keeps_the_float_model(tiny):
    module = tiny.model.module()
    ids = _ids(120, seed=3)
    before, _ = awq.dense_forward(module, ids)
    log2s = smoothquant.apply_smoothquant(module, _ids(200, seed=4), alpha=0.5)
    after, _ = awq.dense_forward(module, ids)
    np.testing.assert_allclose(after, before, rtol=1e-4, atol=1e-4)   # float32 rounding only
    assert set(log2s) == {f"layers.{i}.{g}" for i in range(2) for g in ("qkv", "gate_up", "down")}
    assert any(abs(v) > 0.1 for v in log2s.values())                   # the weights really were rescaled


def _prompt_logprobs(llm, prompt):
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    return np.array([d[t].logprob for d, t in zip(out.prompt_logprobs[1:], prompt[1:])])


def _model_with_tokenizer(model_dir, tokenizer_dir, dst, torch_dtype=None):
    """A copy of the tiny checkpoint with the tiny tokenizer's files beside it (the CLI tokenizes the calibration
    text with the model's own tokenizer); torch_dtype: rewrite the config's."""
    shutil.copytree(model_dir, dst)
    for name in os.listdir(tokenizer_dir):
        shutil.copy2(os.path.join(tokenizer_dir, name), dst / name)
    if torch_dtype is not None:
        cfg = json.loads((dst / "config.json").read_text())
        (dst / "config.json").write_text(json.dumps(dict(cfg, torch_dtype=torch_dtype)))
    return dst


def test_cli_writes_a_smoothed_checkpoint(tiny_llama_dir, tiny_tokenizer_dir, tmp_path, capsys):
    src = _model_with_tokenizer(tiny_llama_dir, tiny_tokenizer_dir, tmp_path / "model")
    out = tmp_path / "smoothed"
    assert cli_main(["smoothquant", str(src), str(out), "--alpha", "0.5"]) == 0
    assert '"calibration_tokens"' in capsys.readouterr().out
    opts = dict(dtype="float32", num_pages=64, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=2,
                warmup=False, progress=False)
    prompt = _ids(48, seed=5)
    base = _prompt_logprobs(jaxinfer.LLM(str(src), **opts), prompt)
    smoothed = jaxinfer.LLM(str(out), **opts)
    np.testing.assert_allclose(_prompt_logprobs(smoothed, prompt), base, rtol=0, atol=1e-4)   # same float model
    assert smoothed.tokenizer is not None
    w8a8 = jaxinfer.LLM(str(out), quantization="int8", quantized_matmul="xla-nk-w8a8", **opts)
    got = _prompt_logprobs(w8a8, prompt)
    assert np.linalg.norm(got - base) / np.linalg.norm(base) < 0.04   # the 'w8a8' engine test's bound
    with open(out / "config.json") as f:                               # the marker 'auto' reads on a GPU
        assert json.load(f)[SMOOTHQUANT_KEY] == {"alpha": 0.5, "calibration_tokens": len(
            smoothed.tokenizer.encode(awq.calibration_text()))}
    assert cli_main(["smoothquant", str(src), str(out)]) == 2         # a non-empty OUT without --overwrite
    assert "not empty" in capsys.readouterr().err


def test_cli_saves_in_the_checkpoints_16_bit_dtype(tiny_llama_dir, tiny_tokenizer_dir, tmp_path):
    """A checkpoint whose config declares torch_dtype bfloat16 is saved smoothed in bfloat16 (half the bytes of the
    float32 one), and reloads as a bf16 model close to the float32 smoothed one."""
    def smoothed(dtype):
        src = _model_with_tokenizer(tiny_llama_dir, tiny_tokenizer_dir, tmp_path / f"model-{dtype}", dtype)
        out = tmp_path / f"smoothed-{dtype}"
        assert cli_main(["smoothquant", str(src), str(out)]) == 0
        return out, sum(f.stat().st_size for f in out.rglob("*") if f.is_file())

    (out32, size32), (out16, size16) = smoothed("float32"), smoothed("bfloat16")
    assert size16 < 0.6 * size32, (size16, size32)
    opts = dict(dtype="bfloat16", num_pages=32, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=2,
                warmup=False, progress=False)
    prompt = _ids(48, seed=6)
    got, want = (_prompt_logprobs(jaxinfer.LLM(str(o), **opts), prompt) for o in (out16, out32))
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 0.02   # bf16 rounding of the saved weights only
