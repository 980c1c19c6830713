"""runner/xla_env.py decides, before jax starts, whether the GPU gets stable command-buffer temporaries
(--xla_gpu_command_buffer_update_mode=SKIP_TEMP, which also selects XLA's VMM allocator); runner/device_memory.py
then sizes the KV cache from the CUDA driver, since jax reports no memory statistics under that allocator."""
import pytest

from jaxinfer.runner import device_memory, xla_env

FLAG = xla_env.SKIP_TEMP_FLAG
NEW, OLD = (0, 11, 2), (0, 10, 2)


def test_flag_added_on_a_cuda_install_of_jaxlib_0_11_and_keeps_the_users_flags():
    assert xla_env.stable_address_flags({}, NEW, True) == FLAG
    dump = "--xla_dump_to=/tmp/d"
    assert xla_env.stable_address_flags({"XLA_FLAGS": dump}, NEW, True) == f"{dump} {FLAG}"
    assert xla_env.stable_address_flags({"JAX_PLATFORMS": "cuda,cpu"}, NEW, True) == FLAG


@pytest.mark.parametrize("environ, version, plugin", [
    ({}, OLD, True),                                    # jaxlib 0.10 has no SKIP_TEMP: XLA would abort at start
    ({}, None, True),                                   # no jaxlib metadata
    ({}, NEW, False),                                   # no CUDA plugin (the CPU wheel, CI)
    ({"JAX_PLATFORMS": "cpu"}, NEW, True),              # the user forces the CPU
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "bfc"}, NEW, True),  # the user chose an allocator
    ({"XLA_FLAGS": "--xla_gpu_command_buffer_update_mode=ALWAYS_UPDATE"}, NEW, True),  # ... or a mode
    ({"JAXINFER_STABLE_GRAPH_ADDRESSES": "0"}, NEW, True),
    ({"JAXINFER_STABLE_GRAPH_ADDRESSES": "off"}, NEW, True),
])
def test_flag_left_out(environ, version, plugin):
    assert xla_env.stable_address_flags(environ, version, plugin) is None


def test_configure_changes_only_what_the_decision_says(monkeypatch):
    env = {"XLA_FLAGS": "--a"}
    monkeypatch.setattr(xla_env, "_jaxlib_version", lambda: NEW)
    monkeypatch.setattr(xla_env, "_has_cuda_plugin", lambda: True)
    assert xla_env.configure(env) and env["XLA_FLAGS"] == f"--a {FLAG}"
    assert not xla_env.configure(env) and env["XLA_FLAGS"] == f"--a {FLAG}"  # idempotent
    monkeypatch.setattr(xla_env, "_has_cuda_plugin", lambda: False)
    env = {}
    assert not xla_env.configure(env) and env == {}


def test_this_machines_jaxlib_version_parses():
    v = xla_env._jaxlib_version()
    assert v is not None and len(v) == 3 and v >= (0, 4, 0)


class _Device:
    def __init__(self, platform, stats, hw=0):
        self.platform, self._stats, self.local_hardware_id = platform, stats, hw

    def memory_stats(self):
        return self._stats


def test_memory_budget_from_jax_statistics_when_it_has_them():
    d = _Device("gpu", {"bytes_limit": 100, "bytes_in_use": 30, "peak_bytes_in_use": 70})
    assert device_memory.memory_budget(d) == (100, 30)


def test_memory_budget_none_on_cpu():
    assert device_memory.memory_budget(_Device("cpu", None)) is None
    assert device_memory.memory_budget(_Device("cpu", {})) is None


def test_memory_budget_from_the_driver_under_the_vmm_allocator(monkeypatch):
    """No statistics on a GPU (VMM allocator): the limit is the fraction BFC would have preallocated; in use is what
    jax's live arrays hold, unless the driver sees the device fuller than the rest of the device allows."""
    calls, live = [], [16 << 30]
    free_total = [(106 << 30, 140 << 30)]  # 34 GiB held on the device: weights + the allocator's cache
    monkeypatch.setattr(device_memory, "cuda_mem_info", lambda ordinal: calls.append(ordinal) or free_total[0])
    monkeypatch.setattr(device_memory, "live_bytes", lambda device: live[0])
    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    limit = int((140 << 30) * 0.75)
    assert device_memory.memory_budget(_Device("gpu", {}, hw=3)) == (limit, 16 << 30)  # as BFC would count
    assert calls == [3]
    free_total[0] = (20 << 30, 140 << 30)  # another process holds most of the device: 120 GiB used
    assert device_memory.memory_budget(_Device("gpu", {})) == (limit, (120 << 30) - (35 << 30))
    monkeypatch.setenv("XLA_CLIENT_MEM_FRACTION", "0.5")
    assert device_memory.memory_budget(_Device("gpu", {}))[0] == 70 << 30


def test_vmm_budget_never_passes_the_free_memory(monkeypatch):
    """budget = limit * utilisation - in use <= free - slack, whatever the driver reports."""
    monkeypatch.delenv("XLA_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
    monkeypatch.setattr(device_memory, "live_bytes", lambda device: 1 << 30)
    total = 140 << 30
    for free in (total, 120 << 30, 80 << 30, 30 << 30, 5 << 30):
        monkeypatch.setattr(device_memory, "cuda_mem_info", lambda ordinal, f=free: (f, total))
        limit, in_use = device_memory.memory_budget(_Device("gpu", {}))
        assert limit * 0.9 - in_use <= free - (1 - 0.75 * 0.9 - 0.25) * total + 1


def test_live_bytes_counts_each_buffer_of_this_device_once(monkeypatch):
    """A shard's .data is a live array over the same buffer: counted once; an array on another device not at all.
    (jax.live_arrays is replaced by a fixed list: the suite's process holds other tests' arrays, some made by
    background compile threads.)"""
    import jax
    import jax.numpy as jnp

    devs = jax.devices()
    x = jnp.ones((1000, 250), jnp.float32)  # 1,000,000 bytes on devs[0]
    view = x.addressable_shards[0].data
    assert device_memory.live_bytes(devs[0]) >= 1_000_000  # the real list holds x
    others = [jax.device_put(jnp.ones(1000, jnp.uint8), devs[-1])] if len(devs) > 1 else []
    monkeypatch.setattr(jax, "live_arrays", lambda: [x, view, *others])
    assert device_memory.live_bytes(devs[0]) == 1_000_000
    if others:
        assert device_memory.live_bytes(devs[-1]) == 1000


@pytest.mark.parametrize("raw", ["abc", "0", "1.5"])
def test_bad_mem_fraction_is_named(raw):
    with pytest.raises(ValueError, match="XLA_CLIENT_MEM_FRACTION"):
        device_memory.default_mem_fraction({"XLA_CLIENT_MEM_FRACTION": raw})


def test_driver_query_without_libcuda_names_the_way_out(monkeypatch):
    import ctypes

    def no_lib(name):
        raise OSError(f"{name}: cannot open shared object file")
    monkeypatch.setattr(ctypes, "CDLL", no_lib)
    with pytest.raises(RuntimeError, match="JAXINFER_STABLE_GRAPH_ADDRESSES=0"):
        device_memory.cuda_mem_info(0)
