"""Shared benchmark plumbing: device ceilings measured in-process, result files, profiling."""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import subprocess
import time

import jax
import jax.numpy as jnp

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def device_name() -> str:
    d = jax.devices()[0]
    return getattr(d, "device_kind", d.platform)


def git_commit() -> str:
    # The device machine's copy of the tree may carry a stale .git: an explicit JAXINFER_COMMIT wins.
    if os.environ.get("JAXINFER_COMMIT"):
        return os.environ["JAXINFER_COMMIT"]
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       cwd=os.path.dirname(RESULTS_DIR)).strip()
    except Exception:
        # the device machine gets the tree without .git: pass JAXINFER_COMMIT=$(git rev-parse --short HEAD)
        return os.environ.get("JAXINFER_COMMIT", "unknown")


def measure_matmul_rate(n: int | None = None, iters: int | None = None) -> float:
    """FLOP/s of an XLA bf16 n x n x n dot on random inputs: the practical tensor-core ceiling.
    Defaults: 8192 x 10 on an accelerator, 512 x 2 on the CPU (a smoke run, not a figure)."""
    cpu = jax.default_backend() == "cpu"
    n = n or (512 if cpu else 8192)
    iters = iters or (2 if cpu else 10)
    x = jax.random.normal(jax.random.key(0), (n, n), jnp.bfloat16)
    f = jax.jit(lambda a: a @ a)
    f(x).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(iters):
        y = f(x)
    y.block_until_ready()
    return 2 * n ** 3 * iters / (time.perf_counter() - t0)


def measure_hbm_bandwidth(gib: float | None = None, iters: int | None = None) -> float:
    """Bytes/s of an XLA elementwise pass (read + write) over `gib` GiB: the practical memory ceiling.
    Defaults: 2 GiB x 20 passes on an accelerator, 0.125 GiB x 3 on the CPU (a smoke run, not a figure)."""
    cpu = jax.default_backend() == "cpu"
    gib = gib or (0.125 if cpu else 2.0)
    iters = iters or (3 if cpu else 20)
    n = int(gib * 2**30) // 4
    x = jnp.ones((n,), jnp.float32)
    f = jax.jit(lambda a: a * 2.0)
    f(x).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(iters):
        y = f(x)
    y.block_until_ready()
    dt = (time.perf_counter() - t0) / iters
    del x, y
    return 2 * n * 4 / dt


def measure_matmul_flops(n: int | None = None, iters: int | None = None) -> float:
    """FLOP/s of an n x n x n bf16 matmul (f32 accumulation), random operands: the practical compute ceiling
    (the H200 gave ~789 TFLOP/s at n = 8192). CPU default n = 512 (a smoke run, not a figure)."""
    cpu = jax.default_backend() == "cpu"
    n = n or (512 if cpu else 8192)
    iters = iters or (3 if cpu else 20)
    ka, kb = jax.random.split(jax.random.key(0))
    x = jax.random.normal(ka, (n, n), jnp.bfloat16)
    y = jax.random.normal(kb, (n, n), jnp.bfloat16)
    f = jax.jit(lambda p, q: jnp.dot(p, q, preferred_element_type=jnp.float32).astype(jnp.bfloat16))
    f(x, y).block_until_ready()
    t0 = time.perf_counter()
    for _ in range(iters):
        z = f(x, y)
    z.block_until_ready()
    dt = (time.perf_counter() - t0) / iters
    del x, y, z
    return 2 * n**3 / dt


def compilation_cache_entries() -> int:
    """Files in the persistent compilation cache jaxinfer will use (runner.compile_options.enable_compilation_cache:
    $JAXINFER_CACHE/xla, default ~/.cache/jaxinfer/xla): 0 before LLM() means a cold start."""
    d = os.path.join(os.environ.get("JAXINFER_CACHE", os.path.expanduser("~/.cache/jaxinfer")), "xla")
    return len(os.listdir(d)) if os.path.isdir(d) else 0


def program_cache_entries() -> int:
    """Compiled programs in jaxinfer's program cache ($JAXINFER_CACHE/programs; runner/program_cache.py)."""
    d = os.path.join(os.environ.get("JAXINFER_CACHE", os.path.expanduser("~/.cache/jaxinfer")), "programs")
    return len([f for f in os.listdir(d) if f.endswith(".jxp")]) if os.path.isdir(d) else 0


def write_result(name: str, payload: dict, tag: str = "") -> str:
    """Write benchmarks/results/<name>[-<tag>]-<commit>[-<backend>]-<date>.json (tag: a run's label, e.g. one A/B
    side; the commit as git_commit() says, left out when unknown), the name the recorded files carry, so a device
    call's files go into results/ as they come back."""
    if tag:
        name = f"{name}-{tag}"
    os.makedirs(RESULTS_DIR, exist_ok=True)
    commit = git_commit()
    payload = {"benchmark": name, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
               "device": device_name(), "jax": jax.__version__, "commit": commit,
               "xla_flags": os.environ.get("XLA_FLAGS", ""),  # e.g. runner/xla_env.py's command-buffer mode
               "allocator": os.environ.get("XLA_PYTHON_CLIENT_ALLOCATOR", "default"), **payload}
    stamp = datetime.date.today().isoformat()
    # CPU runs (smoke tests of the scripts) never overwrite the GPU results of the same day.
    suffix = "" if jax.default_backend() == "gpu" else f"-{jax.default_backend()}"
    commit_part = f"-{commit}" if commit and commit != "unknown" else ""
    path = os.path.join(RESULTS_DIR, f"{name}{commit_part}{suffix}-{stamp}.json")
    with open(path, "w") as f:
        json.dump(payload, f, indent=2)
    out = os.environ.get("OUT")
    if out:  # device machine: also hand the file back
        with open(os.path.join(out, os.path.basename(path)), "w") as f:
            json.dump(payload, f, indent=2)
    return path


@contextlib.contextmanager
def maybe_profile(profile_dir: str | None):
    if not profile_dir:
        yield
        return
    with jax.profiler.trace(profile_dir):
        yield


def add_profile_arg(ap) -> None:
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="write a jax.profiler trace of the whole run to DIR (open with TensorBoard / Perfetto)")


def start_profile(profile_dir: str | None) -> None:
    """Trace everything from here to process exit (for scripts whose work is not one block)."""
    if profile_dir:
        import atexit

        jax.profiler.start_trace(profile_dir)
        atexit.register(jax.profiler.stop_trace)


def add_engine_flags(ap, **defaults) -> None:
    """The engine's flags, generated from its config (jaxinfer/cli_args.py), with this script's own defaults
    (e.g. model="llama3-8b", load_format="dummy")."""
    from jaxinfer.cli_args import add_engine_args

    add_engine_args(ap, **defaults)


def engine_config(a, **overrides):
    """The EngineConfig of the parsed flags, with the options a script fixes per run (e.g. max_num_seqs=64)."""
    from jaxinfer.cli_args import config_from_args

    config = config_from_args(a)
    return config.replace(**overrides) if overrides else config
