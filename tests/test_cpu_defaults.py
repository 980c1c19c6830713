"""runner/cpu_defaults.py compiler_options: the CPU step programs' per-executable XLA options are applied on CPU
only, reach the runner's step compiles, and never override an option the user set in XLA_FLAGS."""
import jax

from jaxinfer.runner import cpu_defaults, model_runner
from jaxinfer.runner.buckets import BucketLadder

KEY = "xla_backend_optimization_level"


def _bucket():
    ladder = BucketLadder.build(max_num_batched_tokens=16, max_num_seqs=1, max_model_len=64, page_size=16,
                                query_tile=16, kv_chunk_pages=4, **cpu_defaults.CPU_LADDER)
    return ladder.pick(1, 1)


def test_cpu_options_applied_on_cpu(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    assert jax.default_backend() == "cpu"
    assert cpu_defaults.compiler_options() == {KEY: 1}
    assert model_runner.step_compiler_options(_bucket()) == {KEY: 1}


def test_user_xla_flags_win(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", f"--xla_force_host_platform_device_count=2 --{KEY}=3")
    assert cpu_defaults.compiler_options() == {}
    assert model_runner.step_compiler_options(_bucket()) is None
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")  # other flags: still applied
    assert cpu_defaults.compiler_options() == {KEY: 1}


def test_no_cpu_options_elsewhere(monkeypatch):
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    assert cpu_defaults.compiler_options() == {}
    assert model_runner.step_compiler_options(_bucket()) is None  # a small GPU bucket keeps its command buffers


def test_options_compile_and_agree():
    """A program compiled with the CPU options computes what the default compile does (same math, less LLVM)."""
    f = jax.jit(lambda x: jax.numpy.tanh(x @ x.T).sum(axis=0))
    x = jax.numpy.arange(64.0).reshape(8, 8) / 64
    lowered = f.lower(x)
    ref = lowered.compile()(x)
    out = model_runner.compile_lowered(lowered, cpu_defaults.CPU_COMPILER_OPTIONS)(x)
    assert jax.numpy.allclose(out, ref, rtol=1e-6)
