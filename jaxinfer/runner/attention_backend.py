"""Which attention backend a runner's steps use (KernelConfig.attention_backend): what 'auto' means on this
device, and whether cuDNN's paged attention applies to this engine (models/attention.py runs the choice).
Device-side code: reads jax's backend, never the scheduler."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.config import EngineConfig
from jaxinfer.weights.loader import LoadedModel
from pallas_kernels.paged_attention import cudnn_paged

# 'auto' picks cuDNN's paged attention for the decode-shaped buckets of at least AUTO_CUDNN_MIN_TOKENS tokens where
# it applies (cudnn_attention_problem is None, one device, no speculation). Measured in the engine on an H100 (12-06 c,
# 8B shape, cuDNN vs the Pallas kernel in one call each, benchmarks/README.md): latency batch 256 16,983 vs 13,790
# tok/s, batch 64 7,735 vs 7,541, batch 1 175.2 vs 175.6 (equal); offline 1000 x 512/256 8,910 vs 8,607 output
# tok/s. Not for speculation (a reasoned choice, not measured): a verification bucket of <= max_num_seqs tokens is
# decode-shaped, and each of a sequence's k + 1 tokens would re-read its KV as a row of its own. (A spec run with
# cuDNN in 'auto', 12-06 c, gave the 1B int8 draft 1.23x against 1.54x on another H100, but its steps ran in buckets
# of more tokens than sequences, i.e. on the Pallas kernel: that gap is not cuDNN's and is not yet explained.)
# The minimum was 64 until 12-06 g: latency batch 16 / 32 (one H100 call, 65dcd08, results/latency-mid-*) ran 2,497
# vs 2,405 and 4,562 vs 4,301 tok/s with cuDNN (+3.8%, +6.1%); below 16 tokens nothing is measured but batch 1 (equal).
AUTO_CUDNN = True
AUTO_CUDNN_MIN_TOKENS = 16


def auto_attention_backend(loaded: LoadedModel, config: EngineConfig, single_device: bool = True) -> str:
    """The backend attention_backend='auto' means here: on a GPU the Pallas kernel (faster than the jnp reference
    everywhere it was measured on the H200: benchmarks/results/step-breakdown-*.json, throughput-*.json), or cuDNN
    (its decode-shaped buckets of >= cudnn_min_tokens) under AUTO_CUDNN without speculation; the jnp reference
    elsewhere."""
    if jax.default_backend() != "gpu":
        return "reference"
    if (AUTO_CUDNN and single_device and config.speculative is None and cudnn_paged.available()
            and cudnn_attention_problem(loaded, config) is None):
        return "cudnn"
    return "pallas"


def cudnn_min_tokens(config: EngineConfig) -> int:
    """The fewest tokens a bucket needs for cuDNN to run its attention (AttentionOptions.cudnn_min_tokens): an
    explicit attention_backend='cudnn' takes every decode-shaped bucket, 'auto' those where it measured faster."""
    return AUTO_CUDNN_MIN_TOKENS if config.kernels.attention_backend == "auto" else 1


def cudnn_attention_problem(loaded: LoadedModel, config: EngineConfig) -> str | None:
    """What keeps attention_backend='cudnn' (models/attention.py) from this engine, as the error to raise naming
    what to use instead; None: it applies (a CUDA GPU, a bf16 / fp16 model and KV cache, no sliding window)."""
    if jax.default_backend() != "gpu":
        return (f"attention_backend='cudnn' needs a CUDA GPU (this backend: {jax.default_backend()}); "
                "use attention_backend='auto'")
    if jnp.dtype(loaded.dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
        return (f"attention_backend='cudnn' computes in bf16 / fp16, the model is {loaded.dtype}; "
                "use dtype='bfloat16' or attention_backend='pallas'")
    kv, window = config.cache.kv_cache_dtype, loaded.cfg.sliding_window
    if kv != "auto" or window is not None:
        return ("attention_backend='cudnn' takes bf16 / fp16 KV pages without a sliding window (got "
                f"kv_cache_dtype={kv!r}, sliding_window={window}); use attention_backend='pallas'")
    problem = cudnn_paged.runtime_problem(loaded.cfg.head_dim)
    if problem:
        return f"attention_backend='cudnn': {problem}; use attention_backend='pallas'"
    return None


def resolve(loaded: LoadedModel, config: EngineConfig, single_device: bool = True) -> str:
    """The configured backend, 'auto' resolved (auto_attention_backend); an explicit 'cudnn' that cannot apply is
    a ValueError naming what to use instead."""
    backend = config.kernels.attention_backend
    if backend == "auto":
        return auto_attention_backend(loaded, config, single_device)  # (cuDNN only where no problem was found)
    if backend == "cudnn":
        problem = cudnn_attention_problem(loaded, config)
        if problem:
            raise ValueError(problem)
    return backend
