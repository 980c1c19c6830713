"""Process-wide XLA settings the engine wants on a GPU, applied at `import jaxinfer` before jax starts a backend.

Stable command-buffer addresses (issue 17, item 2). XLA runs each step program's kernels as a CUDA graph (a
"command buffer") and must update the graph's nodes whenever an allocation they use moved since the last call.
The step's temporaries are one executable-owned allocation, and with the next step dispatched while the previous
one runs (the engine's overlap) they move on every call: `benchmarks/probes/call_trace.py` on the H200 (8B,
results/call-trace-79bf89b-2026-12-04.json) shows `command_buffer::update` taking 1.4 ms of the 2.1 ms call at
batch 64 and 4.2 ms of 5.2 ms at batch 256, where the cuBLAS gemms are re-captured by stream tracing on every call.
`--xla_gpu_command_buffer_update_mode=SKIP_TEMP` (jaxlib >= 0.11) makes the GPU client use XLA's VMM allocator and
gives each executable's temporaries one reserved virtual range, so only the commands that touch the step's inputs
and outputs are updated (results/gpu-cb-modes-0a4f929-2026-12-04.log: same tokens under moving addresses; the
figures are in benchmarks/README.md). With the VMM allocator `Device.memory_stats()` is empty: the KV budget then
comes from the CUDA driver (runner/device_memory.py).

Applied only where it can matter and cannot break: a CUDA plugin installed, jaxlib >= 0.11 (jaxlib 0.10.2's
binaries do not contain SKIP_TEMP: XLA would reject the flag's value at start), JAX_PLATFORMS not forcing another
platform, and the user has chosen neither an allocator (XLA_PYTHON_CLIENT_ALLOCATOR) nor an update mode.
JAXINFER_STABLE_GRAPH_ADDRESSES=0 turns it off. Setting it after jax has started a backend changes nothing (XLA
reads XLA_FLAGS once). Never imports jax.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from collections.abc import Mapping

from jaxinfer.env_switch import switch

SKIP_TEMP_FLAG = "--xla_gpu_command_buffer_update_mode=SKIP_TEMP"
OPT_OUT = "JAXINFER_STABLE_GRAPH_ADDRESSES"
_CUDA_PLUGIN_MODULES = ("jax_cuda13_plugin", "jax_cuda12_plugin", "jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")


def stable_address_flags(environ: Mapping[str, str], jaxlib_version: tuple[int, ...] | None,
                         has_cuda_plugin: bool) -> str | None:
    """The XLA_FLAGS value to set for stable command-buffer temporaries, or None to leave the environment alone."""
    if not switch(OPT_OUT, environ=environ):
        return None
    if not has_cuda_plugin or jaxlib_version is None or jaxlib_version < (0, 11):
        return None
    platforms = environ.get("JAX_PLATFORMS", "").strip().lower()
    if platforms and not any(p.strip() in ("cuda", "gpu") for p in platforms.split(",")):
        return None
    if environ.get("XLA_PYTHON_CLIENT_ALLOCATOR"):
        return None  # the user chose an allocator; SKIP_TEMP would replace it with VMM
    flags = environ.get("XLA_FLAGS", "")
    if "xla_gpu_command_buffer_update_mode" in flags:
        return None
    return f"{flags} {SKIP_TEMP_FLAG}".strip()


def _jaxlib_version() -> tuple[int, ...] | None:
    try:
        v = importlib.metadata.version("jaxlib")
    except importlib.metadata.PackageNotFoundError:
        return None
    parts = []
    for p in v.split(".")[:3]:
        digits = "".join(c for c in p if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def _has_cuda_plugin() -> bool:
    for name in _CUDA_PLUGIN_MODULES:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except (ImportError, ValueError):  # a parent package missing
            continue
    return False


def configure(environ: dict | None = None) -> bool:
    """Apply the settings to `environ` (default os.environ); True when XLA_FLAGS was changed."""
    environ = os.environ if environ is None else environ
    flags = stable_address_flags(environ, _jaxlib_version(), _has_cuda_plugin())
    if flags is None:
        return False
    environ["XLA_FLAGS"] = flags
    return True
