"""Which attention backend a runner's steps use (KernelConfig.attention_backend): what 'auto' means on this
device, and whether cuDNN's paged attention applies to this engine (models/attention.py runs the choice).
Device-side code: reads jax's backend, never the scheduler."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxinfer.config import EngineConfig
from jaxinfer.weights.loader import LoadedModel
from pallas_kernels.paged_attention import cudnn_paged, kv_quant

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


# The Pallas kernel loads one KV head's keys in blocks of whole pages, max(64, page_size) keys a block
# (models/attention._pages_per_block), software-pipelined in shared memory (~227 KB a block on an H100 / H200). A page
# of one KV head above 32 KB (page_size x head_dim x KV itemsize; 128 bf16 keys of D 128) is past what was seen to
# compile: 128 bf16 keys of D 128 at a 64-row query tile take ~147 KB (kernel.py's docstring), 128 float32 keys ~290
# KB (cannot launch), and 512 bf16 keys asked for 413,696 bytes (H100, 12-07 d, benchmarks/probes/
# cudnn_paged_attention.py --page-size 64 with 8 pages a block: RESOURCE_EXHAUSTED when the step compiles).
MAX_KERNEL_PAGE_BYTES = 128 * 128 * 2


def kernel_page_problem(page_size: int, head_dim: int, kv_itemsize: int) -> str | None:
    """What keeps the Pallas kernel from KV pages of this size (None: nothing), as the error to raise naming the
    fix: a page of one KV head above MAX_KERNEL_PAGE_BYTES."""
    page_bytes = page_size * head_dim * kv_itemsize
    if page_bytes <= MAX_KERNEL_PAGE_BYTES:
        return None
    fits = MAX_KERNEL_PAGE_BYTES // (head_dim * kv_itemsize)
    largest = 1 << (fits.bit_length() - 1) if fits else 0
    return (f"page_size={page_size} is too large for the GPU attention kernel: one page of one KV head is "
            f"{page_size} x {head_dim} x {kv_itemsize} B = {page_bytes // 1024} KiB, and the kernel's "
            f"shared-memory blocks take pages of at most {MAX_KERNEL_PAGE_BYTES // 1024} KiB; use "
            f"page_size <= {largest} (16, the default, or 64 are measured)")


def resolve(loaded: LoadedModel, config: EngineConfig, single_device: bool = True) -> str:
    """The configured backend, 'auto' resolved (auto_attention_backend); an explicit 'cudnn' that cannot apply, or
    pages too large for the GPU kernel (kernel_page_problem: 'pallas', and 'cudnn' whose prefill-shaped buckets
    run the kernel), is a ValueError naming what to use instead."""
    backend = config.kernels.attention_backend
    if backend == "auto":
        backend = auto_attention_backend(loaded, config, single_device)  # (cuDNN only where no problem was found)
    elif backend == "cudnn":
        problem = cudnn_attention_problem(loaded, config)
        if problem:
            raise ValueError(problem)
    if backend in ("pallas", "cudnn") and jax.default_backend() == "gpu":
        stored = kv_quant.cache_dtype(config.cache.kv_cache_dtype, loaded.dtype)
        problem = kernel_page_problem(config.cache.page_size, loaded.cfg.head_dim, jnp.dtype(stored).itemsize)
        if problem:
            raise ValueError(problem)
    return backend
