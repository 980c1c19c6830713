"""How much device memory the KV-cache budget may count on: (limit, in use) in bytes, or None (CPU).

With jax's default (BFC) allocator `Device.memory_stats()` has both: `bytes_limit` is the pool jax preallocated
(XLA_CLIENT_MEM_FRACTION of the device, 0.75 by default) and `bytes_in_use` what jax's live buffers hold in it. With
the VMM allocator (which runner/xla_env.py selects on GPUs for stable command-buffer addresses) `memory_stats()` is
empty, so the same two figures are rebuilt: limit = the same fraction of the device's total memory (the pool BFC
would have taken), in use = the bytes of jax's live arrays on the device, as BFC counts them, or more where the CUDA
driver sees the device fuller than that pool's complement allows (other processes, the allocator's cache): in use >=
total - free - (1 - fraction) * total. The budget then never passes what is physically free, less a slack of
(1 - fraction * gpu_memory_utilization) - (1 - fraction) of the device (7.5% at 0.75 and 0.9).
"""
from __future__ import annotations

import ctypes
import os


def default_mem_fraction(environ=os.environ) -> float:
    """The fraction of device memory jax's BFC pool would take (its XLA_CLIENT_MEM_FRACTION default: 0.75)."""
    raw = environ.get("XLA_CLIENT_MEM_FRACTION") or environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION") or "0.75"
    try:
        fraction = float(raw)
    except ValueError:
        raise ValueError(f"XLA_CLIENT_MEM_FRACTION must be a number in (0, 1], got {raw!r}") from None
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"XLA_CLIENT_MEM_FRACTION must be in (0, 1], got {fraction}")
    return fraction


def memory_budget(device) -> tuple[int, int] | None:
    """(limit_bytes, in_use_bytes) for `device`, or None where neither jax nor the CUDA driver reports memory."""
    stats = device.memory_stats() or {}
    if "bytes_limit" in stats:
        return int(stats["bytes_limit"]), int(stats.get("bytes_in_use", 0))
    if device.platform != "gpu":
        return None
    free, total = cuda_mem_info(getattr(device, "local_hardware_id", None) or 0)
    fraction = default_mem_fraction()
    in_use = max(live_bytes(device), int(total - free - (1.0 - fraction) * total))
    return int(total * fraction), in_use


def live_bytes(device) -> int:
    """Bytes of jax's live arrays held on `device` (their shards there), what BFC's `bytes_in_use` counts. Each
    device buffer once: a shard's `.data` is itself a live array over the same buffer."""
    import jax

    n, seen = 0, set()
    for x in jax.live_arrays():
        for shard in x.addressable_shards:
            if shard.device != device:
                continue
            data = shard.data
            try:
                key = data.unsafe_buffer_pointer()
            except Exception:  # noqa: BLE001 - e.g. an empty buffer: count it by identity
                key = ("id", id(data))
            if key not in seen:
                seen.add(key)
                n += data.nbytes
    return n


def cuda_mem_info(ordinal: int) -> tuple[int, int]:
    """(free, total) bytes of CUDA device `ordinal` through the driver API, in its primary context (the one jax
    uses, so retaining it creates nothing)."""
    try:
        cu = ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise RuntimeError(f"jax reports no memory statistics and libcuda.so.1 cannot be loaded ({e}); set "
                           "JAXINFER_STABLE_GRAPH_ADDRESSES=0 to use jax's default allocator") from None

    def check(rc, what):
        if rc != 0:
            raise RuntimeError(f"CUDA driver call {what} failed with error {rc} (device {ordinal})")

    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    check(cu.cuInit(0), "cuInit")
    check(cu.cuDeviceGet(ctypes.byref(dev), ordinal), "cuDeviceGet")
    check(cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
    try:
        check(cu.cuCtxPushCurrent_v2(ctx), "cuCtxPushCurrent")
        try:
            check(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), "cuMemGetInfo")
        finally:
            cu.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
    finally:
        cu.cuDevicePrimaryCtxRelease_v2(dev)
    return free.value, total.value
