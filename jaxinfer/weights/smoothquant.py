"""SmoothQuant (Xiao et al. 2023) for W8A8 int8: per-token int8 activations lose most where a few input channels
carry activations far larger than the rest. Scaling those channels down by s and the matching weight rows up by s
leaves the float model's function unchanged and moves the range into the weights, which quantize per output
channel and tolerate it better:

  s_j = max|X_j|^alpha / max_k |W_jk|^(1 - alpha)     X [rows, in] calibration activations, W [in, out]

folded where AWQ folds its scales (awq.fold_scales: attn_norm for qkv, mlp_norm for gate_up, the `up` half of
gate_up for down; attn.o is not smoothed, for the same GQA reason). Activations come from one dense float forward
of the shipped calibration text (awq.dense_forward, awq.calibration_text).

Measured on SmolLM2-135M-Instruct (CPU, benchmarks/quality.py, results/quality-w8a8-smoothquant-cpu-2026-12-06.json):
W8A8 on every projection +2.63% perplexity over bf16 unsmoothed, **+0.85%** smoothed at alpha 0.5 (the int8 bound
is +1%); weight-only int8 of the smoothed weights +0.48% (+0.04% unsmoothed). So smoothing is for the W8A8 paths
('w8a8', 'xla-nk-w8a8'), not the weight-only default. Other alphas (0.3-0.7) all beat unsmoothed W8A8 but only 0.5
met the bound (0.45: +2.05%, 0.55: +1.09%; results/quality-sq-alpha-*-cpu-2026-12-06.json): measure a model's own
perplexity before serving it W8A8.

`smooth_checkpoint` writes the smoothed float model as an orbax checkpoint (`jaxinfer smoothquant MODEL OUT`) whose
config carries SMOOTHQUANT_KEY: loaded with quantization='int8' on one GPU it runs quantized_matmul='xla-nk-w8a8'
(config.smoothed_checkpoint_spec; an explicit quantized_matmul wins). Runs jax on the default device.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxinfer.config.quantization import SMOOTHQUANT_KEY
from jaxinfer.weights.awq import calibration_text, dense_forward, fold_scales, group_weight, module_params


def smooth_scales(x: np.ndarray, w: np.ndarray, alpha: float) -> np.ndarray:
    """s [in] for activations x [rows, in] and weight w [in, out]; channels that never fire (or whose weight
    row is zero) keep s = 1."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"SmoothQuant alpha must be in [0, 1], got {alpha}")
    ax = np.abs(np.asarray(x, np.float32)).max(axis=0)
    aw = np.abs(np.asarray(w, np.float32)).max(axis=1)
    s = np.where((ax > 0) & (aw > 0), np.maximum(ax, 1e-5) ** alpha / np.maximum(aw, 1e-5) ** (1 - alpha), 1.0)
    return s.astype(np.float32)


def apply_smoothquant(module, calib_ids, *, alpha: float = 0.5, max_rows: int = 512) -> dict[str, float]:
    """Scales of qkv, gate_up and down from one calibration forward (activations of the unsmoothed model),
    folded into `module` IN PLACE (float weights). Returns the mean log2 s of each group ("layers.{i}.{group}")."""
    _, acts = dense_forward(module, calib_ids, collect=max_rows)
    out = {}
    for i, (layer, a) in enumerate(zip(module.layers, acts)):
        for group in ("qkv", "gate_up", "down"):
            s = smooth_scales(a[group], group_weight(layer, group), alpha)
            fold_scales(layer, group, s, module.cfg.intermediate_size)
            out[f"layers.{i}.{group}"] = float(np.mean(np.log2(s)))
    return out


def smooth_checkpoint(model: str, out: str, tokenizer, *, alpha: float = 0.5, overwrite: bool = False) -> dict:
    """Load `model` (HF directory, GGUF file or orbax checkpoint) in float32, smooth it on the calibration text
    tokenized by `tokenizer` (its own: a jaxinfer Tokenizer), and save it to `out` (orbax, with its config and
    that tokenizer; in the config's torch_dtype where that is bfloat16 / float16, else float32). Returns a summary."""
    from jaxinfer.weights.checkpoint import save_checkpoint
    from jaxinfer.weights.loader import load_model, resolve_model

    src = resolve_model(model)
    loaded = load_model(src, "float32", progress=False)
    if loaded.quantization is not None:
        raise ValueError(f"{model!r} is already quantized ({loaded.quantization.name}); smooth its float weights")
    module = loaded.module()
    calib_ids = tokenizer.encode(calibration_text())
    log2s = apply_smoothquant(module, calib_ids, alpha=alpha)
    params, treedef = module_params(module)
    state = nnx.to_pure_dict(jax.tree.unflatten(treedef, params))
    # saved in the checkpoint's own float dtype where it declares a 16-bit one (an 8B model: 16 GB, not 32)
    half = {"bfloat16": jnp.bfloat16, "float16": jnp.float16}.get(str(src.hf_config.get("torch_dtype")))
    if half is not None:
        state = jax.tree.map(lambda a: a.astype(half) if jnp.issubdtype(a.dtype, jnp.floating) else a, state)
    # the marker by which loading it with quantization='int8' picks W8A8 on a GPU (config.smoothed_checkpoint_spec)
    marker = {SMOOTHQUANT_KEY: dict(alpha=alpha, calibration_tokens=len(calib_ids))}
    save_checkpoint(out, state, dict(src.hf_config, **marker), tokenizer.hf, overwrite=overwrite)
    return dict(alpha=alpha, calibration_tokens=len(calib_ids), mean_log2_scale=float(np.mean(list(log2s.values()))),
                max_log2_scale=float(np.max(list(log2s.values()))), path=os.path.abspath(out))
