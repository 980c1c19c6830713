"""Activation-aware weight scaling (AWQ, Lin et al. 2023) for int4 weights, searched on CPU on a small calibration
text shipped with the package (`jaxinfer/data/calibration_text.txt`; a different text from the quality one).

Round-to-nearest int4 spends the same precision on every input channel, but a few input channels carry much
larger activations and dominate the output error. AWQ multiplies the weight rows of those channels by s > 1
before quantizing (their relative rounding error shrinks) and divides the activations by s, which is free when
1/s is folded into whatever produced the activations:

  group of linears       their input                     1/s folded into
  attn.qkv               attn_norm(x)                    attn_norm.weight
  mlp.gate_up            mlp_norm(x)                     mlp_norm.weight
  mlp.down               silu(gate) * up                 the `up` half of gate_up's output columns
  attn.o                 softmax(q k) v                  not scaled: with GQA the q heads sharing a V head would
                                                         need equal scales (AutoAWQ also skips it then); RTN

Search (per group, as AutoAWQ's auto_scale): s = mean|x|^alpha per input channel, normalised by
sqrt(max * min); alpha on a grid in [0, 1]; keep the alpha whose quantized output X (s W)_q / s is closest (mean
square) to X W on the calibration activations. alpha = 0 is plain RTN, so the search is never worse than RTN on
its own objective. Activations come from one dense (non-paged) float forward of the model's own modules.
AutoAWQ's weight-clipping search is not implemented.

Everything runs on the host CPU (jax for the forward, numpy for the search), before the weights go to the device.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxinfer.models.layers import apply_rope, rope_cos_sin, rope_inv_freq
from jaxinfer.weights.quant_tensor import QuantizedTensor

CALIBRATION_TEXT_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data",
                                     "calibration_text.txt")
ALPHA_GRID = tuple(np.round(np.linspace(0.0, 1.0, 11), 2))


def calibration_text() -> str:
    with open(CALIBRATION_TEXT_PATH, encoding="utf-8") as f:
        return f.read()


# ---------------------------------------------------------------------------------------------------------------
# round-to-nearest int4 (the quantizer AWQ scales are searched for)
# ---------------------------------------------------------------------------------------------------------------
def rtn_int4(w: np.ndarray, group_size: int = 128) -> QuantizedTensor:
    """Asymmetric int4 RTN of a float [in, out] weight: per group of `group_size` input rows and output column,
    scale = (max - min) / 15, integer zero point in [0, 15]."""
    n_in, n_out = w.shape
    if n_in % group_size:
        raise ValueError(f"int4 group_size {group_size} does not divide the input dimension {n_in}; use 32, 64 "
                         "or 128 dividing it")
    wg = np.asarray(w, np.float32).reshape(n_in // group_size, group_size, n_out)
    lo, hi = np.minimum(wg.min(1), 0.0), np.maximum(wg.max(1), 0.0)     # [G, out]; 0 exactly representable
    scale = (hi - lo) / 15.0
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    zero = np.clip(np.round(-lo / scale), 0, 15).astype(np.float32)
    q = np.clip(np.round(wg / scale[:, None]) + zero[:, None], 0, 15).astype(np.int8)
    return QuantizedTensor("int4", q.reshape(n_in, n_out), scale, zero, group_size)


def fake_quant(w: np.ndarray, group_size: int) -> np.ndarray:
    return rtn_int4(w, group_size).dequantize()


# ---------------------------------------------------------------------------------------------------------------
# dense float forward of the model's own modules (calibration statistics, and perplexity of fake-quant weights)
# ---------------------------------------------------------------------------------------------------------------
def _attention_dense(q, k, v, cfg):
    """q [T, H, D], k/v [T, KVH, D] -> [T, H * D]; causal (+ sliding window), float32 softmax."""
    T = q.shape[0]
    g = cfg.num_heads // cfg.num_kv_heads
    k, v = jnp.repeat(k, g, axis=1), jnp.repeat(v, g, axis=1)
    s = jnp.einsum("thd,shd->hts", q, k, preferred_element_type=jnp.float32) * cfg.head_dim ** -0.5
    pos = jnp.arange(T)
    mask = pos[None, :] <= pos[:, None]
    if cfg.sliding_window is not None:
        mask &= pos[None, :] > pos[:, None] - cfg.sliding_window
    p = jax.nn.softmax(jnp.where(mask[None], s, -jnp.inf), axis=-1)
    return jnp.einsum("hts,shd->thd", p.astype(v.dtype), v).reshape(T, -1)


def _layer(layer, cfg, x, cos, sin):
    """One decoder layer; also returns the inputs of its linear groups: {qkv, o, gate_up, down} -> [T, in]."""
    T, g, D = x.shape[0], cfg.q_per_kv, cfg.head_dim
    h = layer.attn_norm(x)
    qkv = layer.attn.qkv(h).reshape(T, cfg.num_kv_heads, g + 2, D)
    q, k, v = qkv[:, :, :g].reshape(T, cfg.num_heads, D), qkv[:, :, g], qkv[:, :, g + 1]
    if layer.attn.q_norm is not None:
        q, k = layer.attn.q_norm(q), layer.attn.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    a = _attention_dense(q, k, v, cfg)
    x = x + layer.attn.o(a)
    h2 = layer.mlp_norm(x)
    gate, up = jnp.split(layer.mlp.gate_up(h2), 2, axis=-1)
    m = jax.nn.silu(gate) * up
    x = x + layer.mlp.down(m)
    return x, {"qkv": h, "o": a, "gate_up": h2, "down": m}


def dense_forward(module, ids, *, collect: int = 0):
    """Float forward over token ids [T] -> (log-probs of tokens 1..T-1 [T-1] float64, activations).

    collect > 0: also return, per layer, the first `collect` rows of each linear group's input (numpy f32)."""
    cfg = module.cfg
    ids = jnp.asarray(ids, jnp.int32)
    x = module.embed[...][ids]
    cos, sin = rope_cos_sin(jnp.arange(ids.shape[0]), jnp.asarray(np.asarray(rope_inv_freq(cfg), np.float32)),
                            x.dtype)
    acts = []
    for layer in module.layers:
        x, inputs = _layer(layer, cfg, x, cos, sin)
        if collect:
            acts.append({k: np.asarray(v[:collect], np.float32) for k, v in inputs.items()})
    logp = jax.nn.log_softmax(module.logits(x[:-1]), axis=-1)
    nll = -np.asarray(jnp.take_along_axis(logp, ids[1:, None], axis=-1)[:, 0], np.float64)
    return nll, acts


# ---------------------------------------------------------------------------------------------------------------
# search + fold
# ---------------------------------------------------------------------------------------------------------------
def search_scale(x: np.ndarray, w: np.ndarray, group_size: int, grid=ALPHA_GRID):
    """x: [N, in] activations, w: [in, out] float weight -> (s [in], alpha, error, rtn error).

    error = mean((x w - x (s w)_q / s)^2); s = 1 (alpha 0) is RTN."""
    x = np.asarray(x, np.float32)
    w = np.asarray(w, np.float32)
    ref = x @ w
    x_mean = np.abs(x).mean(0) + 1e-8                    # [in]
    best = None
    rtn_err = None
    for alpha in grid:
        s = x_mean ** alpha
        s = s / np.sqrt(s.max() * s.min())
        s = np.maximum(s, 1e-4).astype(np.float32)
        wq = fake_quant(w * s[:, None], group_size) / s[:, None]
        err = float(np.mean((x @ wq - ref) ** 2))
        if alpha == 0:
            rtn_err = err
        if best is None or err < best[2]:
            best = (s, float(alpha), err)
    return best[0], best[1], best[2], rtn_err


@dataclasses.dataclass
class AWQResult:
    alphas: dict[str, float]           # "layers.{i}.{group}" -> chosen alpha
    errors: dict[str, tuple[float, float]]  # same keys -> (awq output error, rtn output error)


def _set(param, value):
    param[...] = jnp.asarray(value, param[...].dtype)


def fold_scales(layer, group: str, s: np.ndarray, intermediate_size: int):
    """Multiply the input rows of `group`'s weight (qkv, gate_up or down) by s [in] and fold 1/s into what
    produces its input (attn_norm, mlp_norm, or the `up` half of gate_up's output columns), IN PLACE: the layer's
    function is unchanged up to float rounding. gate_up's columns are [gate | up] (one MLP block: single device)."""
    def scaled(param, rows=None, cols=None):
        w = np.array(param[...], np.float32)  # (a writable copy)
        if rows is not None:
            w = w * rows[:, None]
        if cols is not None:
            w[:, intermediate_size:] /= cols[None, :]
        _set(param, w)
    if group == "qkv":
        _set(layer.attn_norm.weight, np.asarray(layer.attn_norm.weight[...], np.float32) / s)
        scaled(layer.attn.qkv.w, rows=s)
    elif group == "gate_up":
        _set(layer.mlp_norm.weight, np.asarray(layer.mlp_norm.weight[...], np.float32) / s)
        scaled(layer.mlp.gate_up.w, rows=s)
    elif group == "down":
        scaled(layer.mlp.gate_up.w, cols=s)
        scaled(layer.mlp.down.w, rows=s)
    else:
        raise ValueError(f"no fold for {group!r}: qkv, gate_up or down")


def group_weight(layer, group: str):
    """The float weight [in, out] of a layer's scaling group: qkv, gate_up or down."""
    return {"qkv": layer.attn.qkv, "gate_up": layer.mlp.gate_up, "down": layer.mlp.down}[group].w[...]


def apply_awq(module, calib_ids, *, group_size: int = 128, max_rows: int = 512, grid=ALPHA_GRID) -> AWQResult:
    """Search AWQ scales on `calib_ids` and fold them into `module` IN PLACE (float weights; the model's
    function is unchanged up to float rounding). Quantize afterwards with `quantize_module`."""
    cfg = module.cfg
    _, acts = dense_forward(module, calib_ids, collect=max_rows)
    alphas, errors = {}, {}
    for i, (layer, a) in enumerate(zip(module.layers, acts)):
        for group in ("qkv", "gate_up", "down"):  # (each search reads the weight as the folds so far left it)
            s, al, e, e0 = search_scale(a[group], group_weight(layer, group), group_size, grid)
            fold_scales(layer, group, s, cfg.intermediate_size)
            alphas[f"layers.{i}.{group}"], errors[f"layers.{i}.{group}"] = al, (e, e0)
    return AWQResult(alphas, errors)


LINEAR_PATHS = ("attn.qkv", "attn.o", "mlp.gate_up", "mlp.down")


def _linear(layer, path):
    obj = layer
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def quantize_module(module, group_size: int = 128) -> dict[str, QuantizedTensor]:
    """RTN int4 of every decoder linear -> {"layers.{i}.attn.qkv": QuantizedTensor [in, out], ...}
    (run after apply_awq for AWQ; on the untouched module it is plain RTN)."""
    return {f"layers.{i}.{p}": rtn_int4(np.asarray(_linear(layer, p).w[...], np.float32), group_size)
            for i, layer in enumerate(module.layers) for p in LINEAR_PATHS}


def load_dequantized(module, quantized: dict[str, QuantizedTensor]):
    """Put dequantized weights back into the float module (fake quantization: measures quality on CPU)."""
    for name, qt in quantized.items():
        _, i, path = name.split(".", 2)
        _set(_linear(module.layers[int(i)], path).w, qt.dequantize())


def module_params(module):
    """(params list, treedef) of a module, in the LoadedModel layout (leaves of its nnx State)."""
    _, state = nnx.split(module)
    return jax.tree.flatten(state)
