"""Fixed-address device buffers for the packed inputs of the step programs (issue 17, item 2).

Why. XLA runs a step program's kernels as a CUDA graph (a command buffer) that records the device addresses they
read; before each launch it updates every command whose argument moved since the executable's last call. With
`runner/xla_env.py`'s stable temporaries, what still moves are the inputs: a fresh `jax.device_put` of the packed
batch every step. `benchmarks/probes/call_trace.py` on the H200 (8B; results/call-trace-inputs*-2026-12-04.json,
d03d2a6) with the same two input buffers every call instead: the compiled call (device_put included) 2.60 -> 1.46
ms at batch 1, 2.75 -> 1.19 at batch 64, 2.90 -> 1.35 at batch 256 (`command_buffer::update` 1.30 -> 0.72 ms,
device_put 0.56 ms). The same previous-token buffer on top changed nothing (1.45 ms), so only the batch is staged.

How. Each distinct tuple of input shapes owns one set of device buffers. A step's host arrays are concatenated into
one int32 vector (every field is 4 bytes: one transfer instead of one per array) and written into those buffers
by a tiny jitted program that donates them: XLA aliases a donated input to the output of the same shape, so the
write is in place and the buffers keep their addresses (tests/runner/test_input_slots.py checks the pointers).

Invariants. The programs that read the buffers never donate them. A write for step n+1 is enqueued after step n,
which read the buffers, on the same device stream, so step n reads its own values; the arrays `put` returned for
step n are invalid (donated) after the next `put` of the same shapes, and no caller keeps them. The first `put` of
new shapes allocates their buffers and compiles their writer (warm-up puts every bucket's placeholder batch, so no
step compiles one). Off (`enabled=False`, the CPU default: no command buffers there), `put` is
`jax.device_put`.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

OPT_OUT = "JAXINFER_STABLE_INPUTS"  # 0: a plain transfer per step on every backend; 1: staged on every backend


def stable_inputs_default() -> bool:
    """On where XLA runs command buffers (GPU), unless JAXINFER_STABLE_INPUTS says otherwise."""
    v = os.environ.get(OPT_OUT, "").strip().lower()
    if v in ("0", "false", "no", "off"):
        return False
    if v in ("1", "true", "yes", "on"):
        return True
    return jax.default_backend() == "gpu"


def _write(bufs: tuple, packed: jax.Array) -> tuple:
    """bufs with their contents replaced by consecutive pieces of packed (i32[sum of sizes]), bit for bit."""
    out, off = [], 0
    for b in bufs:
        part = packed[off:off + b.size].reshape(b.shape)
        off += b.size
        if b.dtype != jnp.int32:
            part = lax.bitcast_convert_type(part, b.dtype)
        # dynamic_update_slice of the whole buffer: an in-place write into the donated buffer (a plain `return part`
        # would be forwarded by jax as a new array, and the donated buffer dropped)
        out.append(lax.dynamic_update_slice(b, part, (0,) * b.ndim))
    return tuple(out)


class InputSlots:
    """put(*host arrays) -> device arrays of the same shapes, at the same device addresses on every call with the
    same shapes (see the module docstring). sharding: where the buffers live (None: the default device)."""

    def __init__(self, sharding=None, enabled: bool | None = None):
        self.enabled = stable_inputs_default() if enabled is None else enabled
        self._sharding = sharding
        self._bufs: dict[tuple, tuple] = {}  # ((shape, dtype), ...) -> device arrays
        kw = {} if sharding is None else dict(in_shardings=(sharding, sharding), out_shardings=sharding)
        self._writer = jax.jit(_write, donate_argnums=(0,), **kw)

    def put(self, *arrays: np.ndarray) -> tuple:
        if not self.enabled:
            return tuple(jax.device_put(arrays, self._sharding))
        key = tuple((a.shape, a.dtype.str) for a in arrays)
        bufs = self._bufs.get(key)
        if bufs is None:
            bad = [a.dtype.str for a in arrays if a.dtype.itemsize != 4]
            if bad:
                raise ValueError(f"InputSlots stages 4-byte fields only (int32 / float32), got dtypes {bad}: "
                                 "pack other fields into an int32 array first")
            # donors only: the writer's first output becomes the buffers (XLA-owned memory; a CPU transfer may
            # alias the numpy array, and such a buffer is copied rather than donated)
            bufs = tuple(jax.device_put(arrays, self._sharding))
        packed = np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.int32) for a in arrays])
        bufs = self._bufs[key] = self._writer(bufs, packed)
        return bufs

    def __len__(self) -> int:
        return len(self._bufs)
