"""Weight quantization on load.

Round-to-nearest (RTN) quantization of float weights into `QuantizedTensor`s (the numpy contract shared with the
pre-quantized checkpoint readers, weights/quant_tensor.py), the device form of each kind (layouts documented in
pallas_kernels/quantized_matmul/reference.py), and `quantize_module`, which puts a `QuantLinear` (the network's
quantized layer, models/quant_linear.py) in place of `Linear` for the decoder projections (and the LM head when
asked). Embeddings and norms stay in the model dtype.

A head tied to the embedding (cfg.tie_word_embeddings: the float model has no `lm_head`) gets, when the spec
quantizes the head, a QuantLinear `lm_head` of its own: [H, V] with the logical axes ("embed", "vocab") of an
untied head (so it shards the same way), filled from the loaded embedding's transpose by `Quantizer.put` at the
embedding, which stays float for the token lookups. Its float source is the embedding as the model holds it
(model dtype), so the quantized logits approximate the float tied model's h @ embed.T.

  int8  per-output-channel symmetric:  scale = max|w| / 127 over the input rows of each output column
  int4  group-wise over g input rows:  symmetric scale = max|w| / 7, q in [-8, 7];
                                       asymmetric (GPTQ-style range that includes 0) scale = (max - min) / 15,
                                       zero = round(-min / scale), q in [0, 15]
  fp8   e4m3, per-channel:             scale = max|w| / 448; activations get a dynamic per-token scale (W8A8)

Which matmul runs is fixed when the module is built (a static attribute, so the split-once-at-load graph
carries it) and, for the 'auto' / 'xla-int4' backends, per traced step size M from the table in
models/quant_paths.py (the Pallas kernel on GPU for int8/int4 by default, XLA's fp8 dot for fp8, the jnp
reference on CPU). The 'xla-int4' backend stores int4 weights in the XLA-native layout (jnp.int4 [in, out]).

Tensor parallelism (jaxinfer/parallel.py). Every leaf of a QuantLinear declares the logical axes of the float
weight it replaces, so the one RULES table splits q / scale / offset exactly like the float weight: column-
parallel layers (qkv, gate_up) split the output columns (q, scale, offset and bias alike), row-parallel ones
(o, down) split the input rows (q's rows, int4's groups; per-channel scales stay whole). int4 packs two rows of
the same group per byte (reference.pack_int4), so a row split at a group boundary splits the packed rows too;
`quantize_module` refuses a group size that would straddle two devices. Under tensor parallelism the Pallas
kernels are NOT used: the layers run the XLA path (dequantize + dot), which XLA's SPMD partitioner splits like
the float matmul (column-parallel: local; row-parallel: partial sums all-reduced), while a pallas_call would be
gathered whole onto every device. (A per-shard shard_map of the kernel would need each replica's mesh inside
the module, which data-parallel replicas sharing one graphdef cannot carry.) W8A8 ('w8a8') is plain XLA and
runs under TP as is; the native int4 layout ('xla-int4') is refused under TP / DP for now (Quantizer: sharded
int4 arrays come out with another sub-byte layout than the compiled step expects).
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxinfer.config import QuantizationError, QuantSpec
from jaxinfer.models.layers import Linear
from jaxinfer.models.quant_linear import (QuantLinear, check_quantized_shape, resolve_backend,  # noqa: F401
                                          weight_layout)
from jaxinfer.models.quant_paths import quantized_matmul  # noqa: F401  (re-exported: the layers' entry point)
from jaxinfer.weights.quant_tensor import QuantizedTensor, concat_out
from pallas_kernels.quantized_matmul import reference as qmm_ref

log = logging.getLogger("jaxinfer")

# Linear modules of one decoder layer that are quantized (module path inside layers[i]).
LAYER_LINEARS = (("attn", "qkv"), ("attn", "o"), ("mlp", "gate_up"), ("mlp", "down"))


# ---- round-to-nearest ---------------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("method", "group_size", "symmetric"))
def _rtn(w, *, method: str, group_size: int | None, symmetric: bool):
    """w [K, N] (any float dtype) -> (q, scale, zero or None) in QuantizedTensor's conventions."""
    w = w.astype(jnp.float32)
    if method == "int8":
        amax = jnp.max(jnp.abs(w), axis=0)
        scale = jnp.where(amax > 0, amax / 127.0, 1.0)
        return jnp.clip(jnp.round(w / scale), -127, 127).astype(jnp.int8), scale, None
    if method == "fp8":
        amax = jnp.max(jnp.abs(w), axis=0)
        scale = jnp.where(amax > 0, amax / qmm_ref.FP8_MAX, 1.0)
        return (w / scale).astype(qmm_ref.FP8), scale, None
    K, N = w.shape
    g = group_size
    wg = w.reshape(K // g, g, N)
    if symmetric:
        amax = jnp.max(jnp.abs(wg), axis=1)                                   # [G, N]
        scale = jnp.where(amax > 0, amax / 7.0, 1.0)
        q = jnp.clip(jnp.round(wg / scale[:, None]), -8, 7)
        return q.reshape(K, N).astype(jnp.int8), scale, None
    lo = jnp.minimum(jnp.min(wg, axis=1), 0.0)                                # the range always holds 0
    hi = jnp.maximum(jnp.max(wg, axis=1), 0.0)
    scale = jnp.where(hi > lo, (hi - lo) / 15.0, 1.0)
    zero = jnp.clip(jnp.round(-lo / scale), 0, 15)
    q = jnp.clip(jnp.round(wg / scale[:, None]) + zero[:, None], 0, 15)
    return q.reshape(K, N).astype(jnp.int8), scale, zero


def quantize_rtn(w, method: str, *, group_size: int | None = None, symmetric: bool = True) -> QuantizedTensor:
    """Round-to-nearest quantization of a float weight w [in, out] (numpy or jax) into a QuantizedTensor."""
    check_quantized_shape(np.shape(w), method, group_size)
    g = group_size if method == "int4" else None
    q, scale, zero = jax.device_get(_rtn(jnp.asarray(w), method=method, group_size=g, symmetric=symmetric))
    return QuantizedTensor(method, np.asarray(q), np.asarray(scale, np.float32),
                           None if zero is None else np.asarray(zero, np.float32), g)


# ---- device form --------------------------------------------------------------------------------------------
@functools.partial(jax.jit, static_argnames=("method", "group_size", "dtype", "layout"))
def _device_leaves(q, scale, zero, *, method: str, group_size: int | None, dtype, layout: str = "packed"):
    """(q, scale, zero) in QuantizedTensor conventions -> the QuantLinear leaves (reference.py layouts).
    layout: int4 'packed' (uint8 [K/2, N], the Pallas kernel's), 'packed-nk' (its transpose [N, K/2], the Triton
    kernel's), 'native' (int4 [K, N], XLA's packed s4) or 'native-nk' (its transpose, int4 [N, K]: the Mosaic
    kernel's;
    no offset leaf for symmetric weights: W = q * scale); int8 'kn' ([K, N]) or 'nk' ([N, K], backend 'xla-nk')."""
    if method == "int4" and layout in ("native", "native-nk"):
        scale = scale.astype(jnp.float32)
        t = (lambda a: a.T) if layout == "native-nk" else (lambda a: a)       # native-nk: q int4 [N, K]
        if zero is None:
            return {"q": t(q.astype(jnp.int4)), "scale": scale.astype(dtype)}
        q4 = (q.astype(jnp.int32) - 8).astype(jnp.int4)                       # u - 8; W = (q4 + 8 - zero) * s
        offset = (8.0 - zero.astype(jnp.float32)) * scale
        return {"q": t(q4), "scale": scale.astype(dtype), "offset": offset.astype(dtype)}
    if method == "int8":
        q8 = q.astype(jnp.int8)
        return {"q": q8.T if layout == "nk" else q8, "scale": scale.astype(jnp.float32)}
    if method == "fp8":
        return {"q": q.astype(qmm_ref.FP8).T, "scale": scale.astype(jnp.float32)}
    scale = scale.astype(jnp.float32)
    if zero is None:                          # symmetric: store u = q + 8, offset = -8 * scale
        u, offset = q.astype(jnp.int32) + 8, -8.0 * scale
    else:
        u, offset = q.astype(jnp.int32), -zero.astype(jnp.float32) * scale
    packed = qmm_ref.pack_int4(u.astype(jnp.uint8), group_size)                # [K/2, N]
    if layout == "packed-nk":                                                    # [N, K/2]: K contiguous
        packed = packed.T
    return {"q": packed, "scale": scale.astype(dtype), "offset": offset.astype(dtype)}


@functools.lru_cache(maxsize=None)
def _sharded_leaves_fn(rtn: bool, method: str, group_size: int | None, symmetric: bool, dtype, shardings: tuple,
                       layout: str = "packed"):
    """A jitted (w) -> leaves (rtn) or (q, scale, zero) -> leaves whose outputs land in `shardings` (a tuple of
    (leaf name, NamedSharding)): from sharded inputs each device computes only its own block of every leaf.
    Cached per layer kind, so a model compiles one program per distinct projection shape, as without TP."""

    def fn(*args):
        if rtn:
            args = _rtn(args[0], method=method, group_size=group_size, symmetric=symmetric)
        return _device_leaves(*args, method=method, group_size=group_size, dtype=dtype, layout=layout)

    return jax.jit(fn, out_shardings=dict(shardings))


def quantized_leaves(w, spec: QuantSpec, dtype, shardings: dict | None = None,
                     layout: str | None = None) -> dict[str, jax.Array]:
    """Float weight [in, out] (numpy or device array) -> the QuantLinear leaves, quantized on the device.
    shardings (leaf name -> NamedSharding): w is a jax.Array already split like the float weight (see
    `Quantizer`) and the leaves come out split by their logical axes (a row-parallel weight's per-channel amax
    is the only cross-device step: an all-reduce of [out]). layout: int4 'packed' | 'native' (default: the one
    the spec's backend runs on, `weight_layout`)."""
    check_quantized_shape(np.shape(w), spec.method, spec.group_size)
    layout = layout or weight_layout(spec)
    if shardings is not None:
        fn = _sharded_leaves_fn(True, spec.method, spec.group_size, spec.symmetric, dtype,
                                tuple(sorted(shardings.items())), layout)
        return fn(w)
    q, scale, zero = _rtn(jnp.asarray(w), method=spec.method, group_size=spec.group_size,
                          symmetric=spec.symmetric)
    return _device_leaves(q, scale, zero, method=spec.method, group_size=spec.group_size, dtype=dtype,
                          layout=layout)


def tensor_leaves(qt: QuantizedTensor, dtype, shardings: dict | None = None, in_shardings=None,
                  layout: str = "packed") -> dict[str, jax.Array]:
    """A QuantizedTensor (RTN or a checkpoint reader) -> the QuantLinear leaves on the device.
    shardings (leaf name -> NamedSharding) with in_shardings (the NamedShardings of qt's q [in, out] and of its
    scale / zero): each device is sent only its block of q, scale and zero (host -> device), then converts it."""
    if qt.kind == "int4":
        lo, hi = (-8, 7) if qt.zero is None else (0, 15)
        if qt.q.size and (qt.q.min() < lo or qt.q.max() > hi):
            raise QuantizationError(
                f"int4 values must lie in [{lo}, {hi}] ({'symmetric' if qt.zero is None else 'with zero points'}),"
                f" got [{qt.q.min()}, {qt.q.max()}]")
    if shardings is not None:
        q_sharding, scale_sharding = in_shardings
        put = lambda a, sh: jax.make_array_from_callback(a.shape, sh, lambda idx: a[idx])  # noqa: E731
        args = (put(qt.q, q_sharding), put(qt.scale, scale_sharding),
                None if qt.zero is None else put(qt.zero, scale_sharding))
        fn = _sharded_leaves_fn(False, qt.kind, qt.group_size, True, dtype, tuple(sorted(shardings.items())),
                                layout)
        return fn(*args)
    zero = None if qt.zero is None else jnp.asarray(qt.zero)
    return _device_leaves(jnp.asarray(qt.q), jnp.asarray(qt.scale), zero, method=qt.kind,
                          group_size=qt.group_size, dtype=dtype, layout=layout)


def quantize_module(model, spec: QuantSpec, dtype, backend: str | None = None, tp: int = 1,
                    distributed: bool | None = None):
    """Replace the decoder projections (and the LM head if spec.lm_head) of a LlamaForCausalLM by QuantLinears
    of the same shapes and logical axes, in place, except those in spec.float_modules. Run inside nnx.eval_shape at
    load: nothing is allocated.
    tp: the tensor-parallel degree: the Pallas backends become the XLA path (module docstring), and int4 groups
    must not straddle the devices of a row-parallel layer (QuantizationError otherwise). distributed: the weights
    are placed by a parallel plan (default: tp > 1; data parallelism too), which 'auto' resolves for
    (quant_linear.resolve_backend)."""
    distributed = tp > 1 if distributed is None else distributed

    def tp_backend(b: str) -> str:
        if tp > 1 and (b.startswith("pallas") or b == "auto"):  # 'auto': its table may pick Pallas
            log.info("tensor_parallel_size=%d: quantized layers use the XLA matmul, not the Pallas kernel", tp)
            return "xla"
        return b

    layer_backend = tp_backend(backend or resolve_backend(spec, distributed=distributed))
    log.info("quantization %s: quantized_matmul=%r runs as %r", spec.name, spec.backend, layer_backend)

    def swap(lin: Linear, name: str, spec: QuantSpec = spec, backend: str = layer_backend) -> QuantLinear:
        K, N = lin.w.shape
        axes = tuple(lin.w.get_metadata().get("logical_axes") or (None, None))
        if spec.method == "int4" and tp > 1:
            _check_groups_per_shard(name, K, axes[0], spec.group_size, tp, "" if spec.symmetric else "-asym")
        return QuantLinear(K, N, bias=lin.b is not None, dtype=dtype, spec=spec, backend=backend, name=name,
                           axes=axes, kernels=tp == 1)

    for i, layer in enumerate(model.layers):
        for parent, attr in LAYER_LINEARS:
            if ("layers", i, parent, attr) in spec.float_modules:  # e.g. a GGUF layer whose type is not kept
                continue
            owner = getattr(layer, parent)
            setattr(owner, attr, swap(getattr(owner, attr), f"layers.{i}.{parent}.{attr}"))
    if spec.lm_head:
        head = spec.head_spec()
        head_backend = layer_backend if head is spec else tp_backend(resolve_backend(head, distributed=distributed))
        # A tied model (no head of its own) gets one shaped like the untied head, [H, V] with axes ("embed",
        # "vocab"): the quantized copy of embed.T that Quantizer.put fills at the embedding.
        lin = model.lm_head if model.lm_head is not None else Linear(
            model.cfg.hidden_size, model.cfg.vocab_size, bias=False, dtype=dtype, axes=("embed", "vocab"))
        # (nnx.data: a tied model's `lm_head = None` is a static attribute until it holds a module)
        model.lm_head = nnx.data(swap(lin, "lm_head", head, head_backend))
    return model


def _check_groups_per_shard(name: str, K: int, in_axis, group_size: int, tp: int, suffix: str = ""):
    """A row-parallel int4 weight gives each device K / tp input rows: they must hold whole groups."""
    from jaxinfer.parallel import RULES

    if in_axis is None or RULES.get(in_axis) is None or K % tp or (K // tp) % group_size == 0:
        return
    groups = [g for g in (32, 64, 128) if (K // tp) % g == 0]
    sizes = [d for d in range(1, K + 1) if K % d == 0 and (K // d) % group_size == 0 and d < tp]
    raise QuantizationError(
        f"{name}: int4 group size {group_size} straddles tensor-parallel shards: tensor_parallel_size={tp} "
        f"gives each device {K // tp} of its {K} input rows, not a multiple of {group_size}; "
        + (f"use a group size dividing {K // tp} (quantization='int4-g{groups[-1]}{suffix}')" if groups
           else f"no int4 group size (32, 64, 128) divides {K // tp}; use int8 or fp8")
        + (f", or tensor_parallel_size in {sizes}" if sizes else ""))


def quantized_module_paths(cfg, spec: QuantSpec) -> set[tuple]:
    """Paths (in the nnx pure dict) of the QuantLinear modules: ('layers', i, 'attn', 'qkv'), ..., ('lm_head',)
    (tied or not: quantize_module gives a tied model its own quantized head)."""
    paths = {("layers", i) + p for i in range(cfg.num_layers) for p in LAYER_LINEARS} - spec.float_modules
    if spec.lm_head:
        paths.add(("lm_head",))
    return paths


class Quantizer:
    """The loader's hook: `put(path, value)` returns the device leaves for one weight of the float model.

    A float weight at '<quantized module>/w' is RTN-quantized on the device; a QuantizedTensor there is moved to
    the device as is; everything else (embeddings, norms, biases, unquantized heads) is cast to the model dtype.
    A quantized head tied to the embedding (`tied_head`) has no weight of its own in any source: `put` of the
    embedding returns its leaves too, RTN of the embedding's transpose [H, V] as placed (model dtype).

    place: the loader's sharded placer (tensor / data parallelism; None: one device). Host values (numpy,
    QuantizedTensor) are then in the canonical layout: re-laid out for TP (jaxinfer.parallel), and each device
    is sent only its block, which it quantizes / converts itself. Device values (jax.Array: dummy weights,
    generated in `input_sharding(path)`) are taken as already in the run layout.
    """

    def __init__(self, cfg, spec: QuantSpec, dtype, place=None):
        self.distributed = place is not None  # 'auto' resolves as quantize_module did for the same plan
        if place is not None and self._layout(spec) in ("native", "native-nk"):
            # jax (0.10, CPU) hands out sharded int4 arrays unpacked while the step compiled for their shardings
            # wants them packed (a layout mismatch at the first call); not yet verified on the GPU either.
            raise QuantizationError(
                f"quantized_matmul='{spec.backend}' (native int4 weights) does not run with tensor or data "
                "parallelism yet; use quantized_matmul='auto' (packed int4) or 'xla', or a single device")
        self.spec, self.dtype, self.place = spec, dtype, place
        self.modules = quantized_module_paths(cfg, spec)
        self.tied_head = cfg.tie_word_embeddings and ("lm_head",) in self.modules

    def _layout(self, spec: QuantSpec) -> str:
        return weight_layout(spec, distributed=self.distributed)

    def _spec(self, module: tuple) -> QuantSpec:
        """The LM head's own spec (QuantSpec.head_spec: int8 for int4 models by default), else the model's."""
        return self.spec.head_spec() if module == ("lm_head",) else self.spec

    def _leaf_shardings(self, module: tuple) -> dict:
        return {k: s for k in ("q", "scale", "offset") if (s := self.place.shardings.get(module + (k,))) is not None}

    def input_sharding(self, path: tuple):
        """The sharding the float value at `path` has before `put` (None without a plan): a quantized module's
        float weight [in, out] is split like its q (fp8's, 'xla-nk' int8's and 'triton-int4' int4's q are [out, in]
        or [out, in/2]: reversed)."""
        if self.place is None:
            return None
        module, leaf = path[:-1], path[-1]
        if module in self.modules and leaf == "w":
            q = self.place.shardings[module + ("q",)]
            if self._layout(self._spec(module)) not in ("nk", "packed-nk", "native-nk"):
                return q
            return type(q)(q.mesh, type(q.spec)(*tuple(q.spec)[::-1]))
        return self.place.shardings[path]

    def put(self, path: tuple, value) -> dict[tuple, Any]:
        module, leaf = path[:-1], path[-1]
        name = "/".join(map(str, path))
        place = self.place
        if module in self.modules and leaf == "w":
            spec = self._spec(module)
            shardings = None if place is None else self._leaf_shardings(module)
            if isinstance(value, QuantizedTensor):
                if (value.kind, value.group_size if value.kind == "int4" else None) != (
                        spec.method, spec.group_size):
                    raise QuantizationError(
                        f"{name}: checkpoint tensor is {value.kind} (group {value.group_size}) but the model is "
                        f"being built as {spec.name}")
                in_shardings = None
                if place is not None:
                    from jaxinfer.parallel import relayout_quantized_for_tp

                    value = relayout_quantized_for_tp(path, value, place.layout)
                    in_shardings = (self.input_sharding(path), shardings["scale"])  # qt.q is [in, out]
                leaves = tensor_leaves(value, self.dtype, shardings, in_shardings, layout=self._layout(spec))
            else:
                if place is not None and not isinstance(value, jax.Array):
                    from jaxinfer.parallel import relayout_for_tp

                    host = relayout_for_tp(path, np.asarray(value), place.layout)
                    value = jax.make_array_from_callback(host.shape, self.input_sharding(path),
                                                         lambda idx: host[idx])
                leaves = quantized_leaves(value, spec, self.dtype, shardings, layout=self._layout(spec))
            return {module + (k,): v for k, v in leaves.items()}
        if isinstance(value, QuantizedTensor):
            raise QuantizationError(
                f"{name} is quantized in the checkpoint but this model keeps it in {jnp.dtype(self.dtype).name}"
                + ("; pass quantize_lm_head=True" if module == ("lm_head",) else ""))
        if isinstance(value, jax.Array):
            out = {path: value.astype(self.dtype)}
        elif place is not None:
            out = {path: place(path, value)}
        else:
            out = {path: jax.device_put(np.asarray(value).astype(self.dtype))}
        if self.tied_head and path == ("embed",):
            # embed [V, H] (split on "vocab" under TP) -> its transpose [H, V], re-placed like the float head's
            # weight would be (columns on "vocab"), then quantized like an untied head: a temporary float copy.
            head = jax.device_put(out[path].T, self.input_sharding(("lm_head", "w")))
            out.update(self.put(("lm_head", "w"), head))
        return out


# ---- fusing quantized projections (checkpoint readers) ------------------------------------------------------
def take_out(qt: QuantizedTensor, cols) -> QuantizedTensor:
    """Reorder (or select) output columns; scales and zero points follow their columns."""
    cols = np.asarray(cols)
    return QuantizedTensor(qt.kind, qt.q[:, cols], qt.scale[..., cols],
                           None if qt.zero is None else qt.zero[..., cols], qt.group_size)


def fuse_qkv_quantized(q: QuantizedTensor, k: QuantizedTensor, v: QuantizedTensor, cfg) -> QuantizedTensor:
    """q/k/v projections ([in, out] each) -> the fused QKV weight grouped per KV head, as loader._assemble does
    for float weights: [q heads of kv 0, k0, v0, q heads of kv 1, k1, v1, ...]."""
    g, kvh, hd = cfg.q_per_kv, cfg.num_kv_heads, cfg.head_dim
    nq = cfg.num_heads * hd
    cols = []
    for j in range(kvh):
        cols.append(np.arange(j * g * hd, (j + 1) * g * hd))
        cols.append(nq + np.arange(j * hd, (j + 1) * hd))
        cols.append(nq + kvh * hd + np.arange(j * hd, (j + 1) * hd))
    return take_out(concat_out([q, k, v]), np.concatenate(cols))


# ---- pre-quantized tensors (the readers' entry point) -------------------------------------------------------
def spec_of_tensors(tensors: Mapping[str, Any], backend: str = "auto") -> QuantSpec:
    """The QuantSpec a dict of Hugging Face names -> (QuantizedTensor | np.ndarray) implies: one kind and group
    size for all quantized tensors; lm_head quantized iff 'lm_head.weight' is a QuantizedTensor."""
    kinds = {(t.kind, t.group_size if t.kind == "int4" else None, t.zero is None)
             for t in tensors.values() if isinstance(t, QuantizedTensor)}
    if not kinds:
        raise QuantizationError("no QuantizedTensor among the tensors; load a float checkpoint with load_model")
    if len(kinds) > 1:
        raise QuantizationError(f"mixed quantized tensor kinds {sorted(kinds, key=str)}: one kind per model")
    (kind, group, symmetric), = kinds
    return QuantSpec(kind, group, symmetric=symmetric,
                     lm_head=isinstance(tensors.get("lm_head.weight"), QuantizedTensor), backend=backend)
