"""int8 weight-only matmul at large M (prefill steps) on Hopper tensor cores: y = (x @ q^T) * scale.

Shapes: x [M, K] bf16 activations, q [N, K] int8 weights (the `xla-nk` layout: K contiguous), scale [N] (per output
channel), y [M, N]. f32 accumulation.

Backend and why (issue 20, item 2: "large M never slower than the bf16 dot"). XLA's weight-only forms at M = 2048
run the int8 -> bf16 convert in a Triton GEMM's prologue or as a separate pass, and were 0.82-0.86x the bf16 dot on
every 8B projection (results/kernel-quantized-matmul-nk-2026-12-02.json); W8A8 is faster but rounds the activations
(+3.2% perplexity). JAX ships a Mosaic GPU mixed-type matmul for Hopper
(`jax.experimental.pallas.ops.gpu.hopper_mixed_type_matmul_mgpu`: TMA loads in a warp-specialised pipeline, the
int8 operand converted to bf16 in registers right before each wgmma). Its int8 operand must be the left-hand
side, so this module runs the transposed problem, y^T [N, M] = q [N, K] @ x^T [K, M], and scales and transposes
back in one XLA fusion (N x M bf16 read and written once: ~8% of the GEMM's time at M = 2048 on gate_up).
The engine takes it per bucket at compile time (models/quant_paths.py, path 'mosaic-nk'); where it cannot run
(not a Hopper GPU, a shape its tiles do not divide, JAX without the module) the path falls back to XLA's
convert-nk. Tile configurations and their measured times: CONFIGS and benchmarks/kernels/quantized_matmul.py.

No interpret mode: Mosaic GPU kernels need the GPU. The CPU tests check the wrapper's algebra through `_transposed`
(the same transposes and scaling around a jnp stand-in for the kernel); the kernel itself is checked against
reference.int8_matmul_reference by tests/kernels/test_mosaic_large_m_gpu.py on the H200.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

# (tile_m, tile_n, tile_k, stages, wg_dimension): kernel M = the weight's N (output channels), kernel N = tokens.
# wg_dimension "M": the CTA's two compute warpgroups split the output channels (cta tile 2 * tile_m x tile_n).
CONFIGS = {
    "a": (128, 128, 64, 4, "M"),
    "b": (128, 64, 128, 4, "M"),
    "c": (64, 128, 64, 4, "N"),
    "d": (128, 128, 128, 3, "M"),
}
DEFAULT_CONFIG = "a"
PREFERENCE = ("a", "b", "c", "d")  # config_for: the first that divides the problem


@dataclasses.dataclass(frozen=True)
class Tiles:
    tile_m: int
    tile_n: int
    tile_k: int
    stages: int
    wg_dimension: str

    @property
    def cta_m(self) -> int:
        return self.tile_m * (2 if self.wg_dimension == "M" else 1)

    @property
    def cta_n(self) -> int:
        return self.tile_n * (2 if self.wg_dimension == "N" else 1)


def tiles(name: str = DEFAULT_CONFIG) -> Tiles:
    return Tiles(*CONFIGS[name])


def divides(M: int, K: int, N: int, config: str) -> bool:
    """Whether a configuration's tiles divide this problem (tokens M, contraction K, output channels N)."""
    t = tiles(config)
    return M > 0 and N % t.cta_m == 0 and M % t.cta_n == 0 and K % t.tile_k == 0


def config_for(M: int, K: int, N: int) -> str | None:
    return next((c for c in PREFERENCE if divides(M, K, N, c)), None)


def supports(M: int, K: int, N: int) -> bool:
    return config_for(M, K, N) is not None


@functools.lru_cache(maxsize=None)
def _module():
    try:
        from jax.experimental.pallas.ops.gpu import hopper_mixed_type_matmul_mgpu as m
    except ImportError:  # a JAX without the Hopper examples
        return None
    return m


def usable() -> bool:
    """A Hopper GPU as the default backend and JAX's kernel importable (read at trace time)."""
    if jax.default_backend() != "gpu" or _module() is None:
        return False
    return str(getattr(jax.devices()[0], "compute_capability", "")) == "9.0"


def _transposed(x2, q, scale, out_dtype, matmul_t):
    """y [M, N] from matmul_t(q [N, K] int8, x^T [K, M] bf16) -> y^T [N, M] bf16: scaled per output channel and
    transposed back in one fusion."""
    y_t = matmul_t(q, x2.T)
    return (y_t.astype(jnp.float32) * scale.astype(jnp.float32)[:, None]).T.astype(out_dtype)


def int8_matmul_large_m(x, q, scale, *, out_dtype=None, config: str | None = None):
    """x [..., K] bf16, q [N, K] int8, scale [N] -> [..., N] (see the module docstring). config: a CONFIGS name
    (None: config_for). ValueError where the kernel cannot take the shape (callers check `supports` first)."""
    m = _module()
    if m is None:
        raise ValueError("JAX's Mosaic GPU mixed-type matmul (hopper_mixed_type_matmul_mgpu) is not available here")
    N, K = q.shape
    if x.shape[-1] != K or q.dtype != jnp.int8 or scale.shape != (N,):
        raise ValueError(f"int8_matmul_large_m wants x [..., {K}], q int8 [N, K], scale [N]; got x {x.shape}, "
                         f"q {q.dtype} {q.shape}, scale {scale.shape}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K).astype(jnp.bfloat16)
    M = x2.shape[0]
    config = config or config_for(M, K, N)
    if config is None or not divides(M, K, N, config):
        raise ValueError(f"no tile configuration of {CONFIGS} (asked: {config!r}) divides M={M}, K={K}, N={N}")
    t = tiles(config)
    dim = m.MatmulDimension
    cfg = m.TuningConfig(tile_m=t.tile_m, tile_n=t.tile_n, tile_k=t.tile_k, max_concurrent_steps=t.stages,
                         epi_tile_n=64, epi_tile_m=64, grid_minor_dim=dim.N, grid_tile_width=8,
                         wg_dimension=dim.M if t.wg_dimension == "M" else dim.N)
    kernel = functools.partial(m.mixed_matmul_kernel, out_dtype=jnp.bfloat16, config=cfg)
    y = _transposed(x2, q, scale, out_dtype or x.dtype, kernel)
    return y.reshape(*lead, N)
