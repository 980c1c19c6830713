"""The XLA options and caches of the runners' compiles: which buckets get command buffers (CUDA graphs), per-
executable options at compile time, JAX's persistent compilation cache. Shared by the target's runner
(model_runner.py) and the draft's step programs (draft_steps.py, draft_cycle.py)."""
from __future__ import annotations

import os

import jax

# XLA's command buffers (CUDA graphs): with them the step's call is one graph launch (plus an update of the graph's
# buffer addresses); without them it is ~1,000 kernel launches of host work (8.2 ms at 64 tokens, and at 256 tokens
# the call fills the launch queue and waits for the device). Measured on the H200 (benchmarks/probes/step_dispatch.py,
# results/step-dispatch-2026-12-02.json, 8B decode at context 512), with / without: 64 tokens call 3.5 / 8.2 ms,
# device step 8.7 / 8.6 ms; 256 tokens call 2.1 / 16.7 ms, device 16.7 / 16.9 ms. (Before the sampler's conditionals
# became selects they split the graphs and command buffers cost device time at 256 tokens: 18.4 vs 15.1 ms, which
# is why buckets above 128 tokens compiled without them.) Larger (prefill) buckets are not measured: they keep the
# launches, whose cost is small beside their compute.
COMMAND_BUFFER_MAX_TOKENS = 256


def step_compiler_options(bucket) -> dict | None:
    """Per-executable XLA options of a bucket's step: command buffers off on the GPU above
    COMMAND_BUFFER_MAX_TOKENS tokens (other backends: none)."""
    if jax.default_backend() == "gpu" and bucket.num_tokens > COMMAND_BUFFER_MAX_TOKENS:
        return {"xla_gpu_enable_command_buffer": ""}
    return None


def compile_lowered(lowered, compiler_options: dict | None):
    """lowered.compile() with per-executable XLA options (None: the defaults)."""
    return lowered.compile(compiler_options=compiler_options) if compiler_options else lowered.compile()


def enable_compilation_cache(cache_dir: str | None):
    """JAX's persistent compilation cache, so a second start skips XLA compilation."""
    cache_dir = cache_dir or os.path.join(
        os.environ.get("JAXINFER_CACHE", os.path.expanduser("~/.cache/jaxinfer")), "xla")
    os.makedirs(cache_dir, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", cache_dir)
    # Small programs are cached too (the default skips compiles under 1 s).
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
