"""The draft model of speculative decoding, assembled: its weights, its own ModelRunner and its own page allocator.

Methods "draft" (a separate, smaller checkpoint with the target's tokenizer) and "layer_skip" (the target's first
layers) both propose with runner/draft_proposer.ModelProposer. It runs on the device (runner/) and allocates its
cache pages with the host's KVCacheManager (engine/); this module sits above both, beside api.py, so neither of
those packages imports the other.
"""
from __future__ import annotations

import dataclasses

import jax
from flax import nnx

from jaxinfer.config import EngineConfig, SpeculativeConfig
from jaxinfer.config.quantization import parse_quantization
from jaxinfer.weights.head_cut import prune_head
from jaxinfer.engine.kv_cache import KVCacheManager
from jaxinfer.weights.loader import LoadedModel, load_model, resolve_model
from jaxinfer.runner.draft_proposer import ModelProposer
from jaxinfer.runner.model_runner import ModelRunner


def layer_skip_model(target: LoadedModel, num_layers: int) -> LoadedModel:
    """A LoadedModel of the target's first num_layers layers + final norm + head, sharing the weight arrays."""
    total = target.cfg.num_layers
    if not 1 <= num_layers < total:
        raise ValueError(f"num_draft_layers={num_layers} must be in [1, {total - 1}] for a target of {total} layers")
    module = target.module()  # merged from the same arrays: nothing is copied
    module.layers = nnx.List(list(module.layers)[:num_layers])
    module.cfg = dataclasses.replace(target.cfg, num_layers=num_layers)
    graphdef, state = nnx.split(module)
    leaves, treedef = jax.tree.flatten(state)
    return LoadedModel(module.cfg, target.source, graphdef, leaves, treedef, target.dtype)


def model_proposer(draft: LoadedModel, config: EngineConfig, max_model_len: int, num_pages: int,
                   fused_steps: bool = True) -> ModelProposer:
    """A ModelProposer over `draft`: its own runner (config without speculation, `num_pages` KV pages) and its
    own page allocator over that cache (no prefix caching)."""
    runner = ModelRunner(draft, config.replace(speculative_config=None, num_pages=num_pages), max_model_len,
                         small_buckets=False, draft=True)  # (a draft step drafts for every speculating sequence)
    kv = KVCacheManager(runner.num_pages, runner.page_size)
    sc = config.speculative
    k = sc.num_speculative_tokens if sc is not None else 0
    return ModelProposer(runner, kv, k, max_model_len, fused_steps=fused_steps)


def build_model_proposer(sc: SpeculativeConfig, target: LoadedModel, config: EngineConfig, max_model_len: int,
                         target_num_pages: int, progress: bool = True) -> ModelProposer:
    """The draft for method "draft" (load sc.draft_model) or "layer_skip" (a view of the target)."""
    if sc.method == "layer_skip":
        n = sc.num_draft_layers or max(1, target.cfg.num_layers // 4)
        draft = layer_skip_model(target, n)
    elif sc.method == "draft":
        backend = config.kernels.quantized_matmul
        draft = load_model(resolve_model(sc.draft_model, sc.draft_load_format), target.dtype, seed=config.seed + 1,
                           progress=progress, matmul_backend=backend,
                           quantization=parse_quantization(sc.draft_quantization, backend=backend,
                                                           quantize_lm_head=sc.draft_quantize_lm_head))
        if draft.cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(f"draft model {sc.draft_model!r} has vocab_size {draft.cfg.vocab_size} but the target "
                             f"has {target.cfg.vocab_size}; the draft must share the target's tokenizer")
        if sc.draft_head_vocab is not None:
            draft = prune_head(draft, sc.draft_head_vocab)
    else:
        raise ValueError(f"method {sc.method!r} has no draft model")
    return model_proposer(draft, config, max_model_len, sc.draft_num_pages or target_num_pages)
