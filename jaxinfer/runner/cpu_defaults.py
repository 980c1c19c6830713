"""The CPU configuration: what the engine picks by itself when `jax.default_backend() == "cpu"`.

Each choice was measured on a 2-core x86 box with the default model (SmolLM2-135M-Instruct) — issue 19,
benchmarks/cpu_decode.py, benchmarks/results/cpu-decode-cpu-*.json:
  * compute dtype float32 for dtype="auto": XLA:CPU has no fast bfloat16 dot (bf16 decode ~0.45 tok/s, float32
    ~5 tok/s at the same 16-token bucket). Weights kept quantized lose too: each step dequantizes them to float32
    before the dot (2026-12-02, same run: float32 46.3 tok/s, GGUF Q4_1 kept int4 7.3, int8 7.5; a 30-layer
    gemv chain of bf16 or int8 weights converted in the step was ~10x slower than float32 weights).
  * decode buckets of 1 and 4 tokens, then x4 steps (1, 4, 16, 64, ...): on a compute-bound CPU a 16-token
    bucket did 16x the matmul work of a one-token decode; x4 keeps the ladder (and warm-up compiles) short.
  * a KV pool sized for the request limits (max_num_seqs full-length sequences), at most CPU_KV_BUDGET_BYTES,
    instead of a fixed share of host RAM: zero-filling and holding a pool the requests cannot use is waste.
Other backends get none of this (None from every function here), except one extra 1-token bucket (GPU_LADDER).
"""
from __future__ import annotations

import math

import jax

CPU_COMPUTE_DTYPE = "float32"
CPU_KV_BUDGET_BYTES = 1 << 30  # upper bound of the CPU KV pool (no device memory statistics on CPU)
CPU_LADDER = dict(min_tokens=1, growth=4)  # buckets 1, 4, 16, 64, ... up to max_num_batched_tokens
# GPU: 1, 16, 32, 64, ...: batch-1 decode in a 1-token bucket instead of padded to 16 rows (H200, 8B bf16,
# results/latency-b1-mb*-2026-12-03.json: 232.6 vs 215.7 tok/s, device step 4.37 vs 4.75 ms; the plain-XLA loop
# 231.1 in the same call). The matmuls cost the same (weight streaming); the 16-row norms, RoPE, KV scatters and
# attention tiles do not. One bucket more, not the full 1, 2, 4, 8 ladder: each costs cold compiles at start-up.
GPU_LADDER = dict(small_buckets=(1,))


def on_cpu() -> bool:
    return jax.default_backend() == "cpu"


def compute_dtype(dtype: str) -> str:
    """The dtype to load and compute in: "auto" becomes float32 on CPU; anything explicit is kept."""
    return CPU_COMPUTE_DTYPE if dtype == "auto" and on_cpu() else dtype


def ladder_args(min_bucket_tokens: int | None = None, small_buckets: bool = True) -> dict:
    """Extra BucketLadder.build arguments for this backend (CPU: 1-token and 4-token decode buckets; elsewhere a
    1-token bucket below the 16, 32, ... ladder: GPU_LADDER); min_bucket_tokens (KernelConfig) makes that the
    smallest bucket on any backend (then growth 2 above it on GPU); small_buckets=False: none below min_tokens."""
    args = dict(CPU_LADDER) if on_cpu() else dict(GPU_LADDER)
    if min_bucket_tokens is not None:
        args["min_tokens"] = min_bucket_tokens
    if min_bucket_tokens is not None or not small_buckets:
        args.pop("small_buckets", None)
    return args


def cpu_kv_pages(bytes_per_page: int, max_num_seqs: int, max_model_len: int, page_size: int) -> int:
    """KV pages on CPU: enough for max_num_seqs sequences of max_model_len tokens (+ the reserved page 0), capped
    at CPU_KV_BUDGET_BYTES."""
    limit = max_num_seqs * math.ceil(max_model_len / page_size) + 1
    return min(limit, CPU_KV_BUDGET_BYTES // bytes_per_page)
