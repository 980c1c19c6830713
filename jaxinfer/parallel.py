"""Tensor and data parallelism: the device mesh, the ONE logical-axis rules table, and the weight layouts that
let tensor parallelism split fused projections without communication.

Mesh. Every engine replica runs on a `Mesh` with axes ("data", "model") of shape (1, tp): the devices of one
replica. `data_parallel_size` replicas take disjoint rows of a (dp, tp) grid of `jax.devices()` (with several
hosts, `jax.devices()` lists every process's devices, host by host, so a replica of tp <= devices-per-host stays
on one host). Replicas never talk to each other; a host-side router (engine/router.py) spreads requests.

Logical axes. Each weight declares names for its dimensions where it is created (models/layers.py, llama.py:
`nnx.Param(..., logical_axes=("embed", "qkv"))`); `RULES` maps names to mesh axes. Megatron-style:
  column parallel (split the output): fused QKV ("qkv"), fused gate/up ("mlp")      -> no communication
  row parallel (split the input):     o ("heads"), down ("mlp")                     -> XLA all-reduces [T, hidden]
  vocab parallel: embedding rows and LM-head columns ("vocab")                      -> masked gather + all-reduce
KV cache: [pages, page, kv_heads, head_dim] split on "kv_heads" (a quantized cache's per-token scales
[pages, page, kv_heads] too); attention runs per shard (shard_map).
Quantized layers (models/quant_linear.py QuantLinear) give q / scale / offset the logical axes of the float weight
they replace, so these rules split them the same way (int4 groups must not straddle a row-parallel split).

Layouts (applied once at load; see `relayout_for_tp` and its inverse `canonical_layout`):
  * fused QKV is grouped per KV head, [q.. k v] per group, so splitting its columns in tp equal parts hands each
    device whole groups. With fewer KV heads than tp (tp = r * kv_heads), each KV head is *replicated* r times
    and its g query heads divided between the copies: group (kv, copy j) = [q heads kv*g + j*g/r ... , k_kv,
    v_kv]. The model then runs with num_kv_heads = tp and q_per_kv = g / r: the same math (query head h still
    meets KV head h // g), the KV cache holds r copies (per device: one KV head, as without replication).
  * fused gate/up [gate | up] is interleaved in tp blocks [gate_0 up_0 | gate_1 up_1 | ...], so each device's
    contiguous column block holds matching gate and up columns; the MLP reads it as [T, blocks, 2, I/blocks].
"""
from __future__ import annotations

import dataclasses
import logging
import os
import re

import numpy as np

from jaxinfer.config import ConfigError, ModelConfig

log = logging.getLogger("jaxinfer")

DATA, MODEL = "data", "model"  # mesh axis names

# The rules table: logical axis name -> mesh axis (None: replicated). The only place that decides placement.
RULES: dict[str, str | None] = {
    "vocab": MODEL,      # embedding rows, LM-head columns
    "embed": None,       # the hidden (residual) dimension: replicated activations, Megatron style
    "qkv": MODEL,        # fused QKV output columns (whole KV-head groups per device)
    "heads": MODEL,      # o-projection input rows: num_heads * head_dim
    "mlp": MODEL,        # fused gate/up output columns, down-projection input rows
    "head_dim": None,    # q/k norm weights
    "kv_heads": MODEL,   # KV cache
    "kv_pages": None,
    "page": None,
}

KV_CACHE_AXES = ("kv_pages", "page", "kv_heads", "head_dim")  # [num_pages, page_size, kv_heads, head_dim]


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def check_tensor_parallel(cfg: ModelConfig, tp: int):
    """Raise ConfigError if the model's heads / MLP cannot be split over tp devices."""
    if tp == 1:
        return
    valid = [d for d in _divisors(cfg.num_heads)
             if cfg.intermediate_size % d == 0 and (cfg.num_kv_heads % d == 0 or d % cfg.num_kv_heads == 0)]
    why = None
    if cfg.num_heads % tp:
        why = f"it must divide num_attention_heads={cfg.num_heads}"
    elif cfg.num_kv_heads % tp and tp % cfg.num_kv_heads:
        why = (f"it must divide num_key_value_heads={cfg.num_kv_heads} or be a multiple of it (KV heads are "
               "then replicated)")
    elif cfg.intermediate_size % tp:
        why = f"it must divide intermediate_size={cfg.intermediate_size}"
    if why:
        raise ConfigError(f"tensor_parallel_size={tp} does not fit this model: {why}; valid sizes are {valid}")


@dataclasses.dataclass(frozen=True)
class TPLayout:
    """How the loaded weights differ from the canonical (single-device) layout."""

    num_kv_heads: int    # of the checkpoint
    q_per_kv: int        # of the checkpoint
    head_dim: int
    kv_replicas: int     # copies of each KV head (tp // num_kv_heads when tp > num_kv_heads, else 1)
    mlp_blocks: int      # gate/up interleave blocks (= tp)


def tp_model_config(cfg: ModelConfig, tp: int) -> tuple[ModelConfig, TPLayout]:
    """The config the model runs with under tensor parallelism tp (KV heads replicated up to tp) and its layout."""
    check_tensor_parallel(cfg, tp)
    reps = tp // cfg.num_kv_heads if tp > cfg.num_kv_heads else 1
    layout = TPLayout(cfg.num_kv_heads, cfg.q_per_kv, cfg.head_dim, reps, tp)
    run = dataclasses.replace(cfg, num_kv_heads=cfg.num_kv_heads * reps) if reps > 1 else cfg
    return run, layout


def _replicate_kv(x: np.ndarray, lay: TPLayout) -> np.ndarray:
    """Fused QKV [..., kvh * (g + 2) * d] -> [..., kvh * r * (g / r + 2) * d] (see the module docstring)."""
    kvh, g, d, r = lay.num_kv_heads, lay.q_per_kv, lay.head_dim, lay.kv_replicas
    lead = x.shape[:-1]
    x = x.reshape(*lead, kvh, g + 2, d)
    q = x[..., :g, :].reshape(*lead, kvh, r, g // r, d)
    k = np.broadcast_to(x[..., None, g:g + 1, :], (*lead, kvh, r, 1, d))
    v = np.broadcast_to(x[..., None, g + 1:g + 2, :], (*lead, kvh, r, 1, d))
    return np.concatenate([q, k, v], axis=-2).reshape(*lead, kvh * r * (g // r + 2) * d)


def _unreplicate_kv(x: np.ndarray, lay: TPLayout) -> np.ndarray:
    kvh, g, d, r = lay.num_kv_heads, lay.q_per_kv, lay.head_dim, lay.kv_replicas
    lead = x.shape[:-1]
    x = x.reshape(*lead, kvh, r, g // r + 2, d)
    q = x[..., :g // r, :].reshape(*lead, kvh, g, d)
    kv = x[..., 0, g // r:, :]  # the first copy's k, v: [..., kvh, 2, d]
    return np.concatenate([q, kv], axis=-2).reshape(*lead, kvh * (g + 2) * d)


def _interleave(x: np.ndarray, blocks: int) -> np.ndarray:
    """[..., 2I] = [gate | up] -> [gate_0 up_0 | gate_1 up_1 | ...] with blocks of I / blocks columns."""
    lead, two_i = x.shape[:-1], x.shape[-1]
    x = x.reshape(*lead, 2, blocks, two_i // (2 * blocks))
    return np.swapaxes(x, -3, -2).reshape(*lead, two_i)


def _deinterleave(x: np.ndarray, blocks: int) -> np.ndarray:
    lead, two_i = x.shape[:-1], x.shape[-1]
    x = x.reshape(*lead, blocks, 2, two_i // (2 * blocks))
    return np.swapaxes(x, -3, -2).reshape(*lead, two_i)


def relayout_for_tp(path: tuple, x: np.ndarray, lay: TPLayout | None) -> np.ndarray:
    """Canonical weight (as the single-device model holds it) -> the layout the tp-sharded model holds."""
    if lay is None:
        return x
    if path[-2:] in (("qkv", "w"), ("qkv", "b")) and lay.kv_replicas > 1:
        return _replicate_kv(x, lay)
    if path[-2:] == ("gate_up", "w") and lay.mlp_blocks > 1:
        return _interleave(x, lay.mlp_blocks)
    return x


def canonical_layout(path: tuple, x: np.ndarray, lay: TPLayout | None) -> np.ndarray:
    """Inverse of `relayout_for_tp` (saving a checkpoint that loads at any tp)."""
    if lay is None:
        return x
    if path[-2:] in (("qkv", "w"), ("qkv", "b")) and lay.kv_replicas > 1:
        return _unreplicate_kv(x, lay)
    if path[-2:] == ("gate_up", "w") and lay.mlp_blocks > 1:
        return _deinterleave(x, lay.mlp_blocks)
    return x


def relayout_quantized_for_tp(path: tuple, qt, lay: TPLayout | None):
    """The same re-layout for a quantized weight (weights/quant_tensor.QuantizedTensor, [in, out] with per-output-
    column scales): the layouts only move (or copy) output columns, so q, scale and zero take the same column
    permutation, and the quantized weight then splits over the devices exactly like the float one."""
    if lay is None:
        return qt
    cols = relayout_for_tp(path, np.arange(qt.q.shape[1]), lay)  # source column of every output column
    return dataclasses.replace(qt, q=qt.q[:, cols], scale=qt.scale[..., cols],
                               zero=None if qt.zero is None else qt.zero[..., cols])


class ShardingPlan:
    """The mesh of one engine replica and the shardings derived from logical axes through RULES."""

    def __init__(self, mesh, replica: int = 0):
        from jax.sharding import NamedSharding, PartitionSpec

        self.mesh = mesh
        self.replica = replica
        self.tp = int(mesh.shape[MODEL])
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self._P, self._NS = PartitionSpec, NamedSharding

    @property
    def devices(self) -> list:
        return list(self.mesh.devices.flat)

    def spec(self, logical_axes, shape):
        """PartitionSpec of an array with these logical axes. A dimension that the mesh axis does not divide
        stays replicated (jax arrays need equal shards); only "vocab" can hit this after check_tensor_parallel."""
        if logical_axes is None:
            return self._P()
        if len(logical_axes) != len(shape):
            raise ValueError(f"logical axes {logical_axes} do not match shape {tuple(shape)}")
        out = []
        for name, dim in zip(logical_axes, shape):
            if name is not None and name not in RULES:
                raise KeyError(f"logical axis {name!r} has no rule in jaxinfer.parallel.RULES")
            axis = RULES.get(name) if name is not None else None
            if axis is not None and dim % self.mesh.shape[axis]:
                log.warning("axis %r of size %d is not divisible by %s=%d: replicated", name, dim, axis,
                            self.mesh.shape[axis])
                axis = None
            out.append(axis)
        return self._P(*out)

    def sharding(self, logical_axes, shape):
        return self._NS(self.mesh, self.spec(logical_axes, shape))

    def __repr__(self):
        return f"ShardingPlan(replica={self.replica}, tp={self.tp}, devices={[d.id for d in self.devices]})"


def make_plans(tensor_parallel_size: int = 1, data_parallel_size: int = 1, devices=None) -> list[ShardingPlan]:
    """One ShardingPlan per data-parallel replica, on disjoint groups of tensor_parallel_size devices."""
    import jax
    from jax.sharding import Mesh

    tp, dp = int(tensor_parallel_size), int(data_parallel_size)
    if tp < 1 or dp < 1:
        raise ConfigError(f"tensor_parallel_size ({tp}) and data_parallel_size ({dp}) must be >= 1")
    devices = list(jax.devices() if devices is None else devices)
    need = tp * dp
    if need > len(devices):
        raise ConfigError(
            f"tensor_parallel_size={tp} x data_parallel_size={dp} needs {need} devices but only {len(devices)} "
            f"are visible ({devices[0].platform}: {len(devices)} device(s)); lower the sizes, or on CPU set "
            "XLA_FLAGS=--xla_force_host_platform_device_count=N before jax starts")
    grid = np.array(devices[:need], dtype=object).reshape(dp, tp)
    return [ShardingPlan(Mesh(grid[i:i + 1], (DATA, MODEL)), replica=i) for i in range(dp)]


def replicate_model(loaded, plan: ShardingPlan):
    """The same weights for another data-parallel replica: each array copied device-to-device into the same
    PartitionSpec on `plan`'s devices (no second read of the checkpoint)."""
    import dataclasses as dc

    import jax
    from jax.sharding import NamedSharding

    params = [jax.device_put(p, NamedSharding(plan.mesh, p.sharding.spec)) for p in loaded.params]
    return dc.replace(loaded, params=params, plan=plan)


# ---- multi-host -------------------------------------------------------------------------------------------

_ENV = {"coordinator_address": "JAXINFER_COORDINATOR_ADDRESS", "num_processes": "JAXINFER_NUM_PROCESSES",
        "process_id": "JAXINFER_PROCESS_ID"}


def initialize_distributed(coordinator_address: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None) -> bool:
    """Join a multi-process JAX job (several hosts) before any device is touched.

    Arguments default to JAXINFER_COORDINATOR_ADDRESS / JAXINFER_NUM_PROCESSES / JAXINFER_PROCESS_ID. Nothing
    set: single process, returns False. Every process then sees all devices of the job (`jax.devices()`) and
    must run the same program: the same LLM options and the same prompts (the scheduler is deterministic, so
    every process packs the same batches). On CPU the cross-process collectives use gloo.
    """
    import jax

    coordinator_address = coordinator_address or os.environ.get(_ENV["coordinator_address"])
    if num_processes is None and os.environ.get(_ENV["num_processes"]):
        num_processes = int(os.environ[_ENV["num_processes"]])
    if process_id is None and os.environ.get(_ENV["process_id"]):
        process_id = int(os.environ[_ENV["process_id"]])
    if coordinator_address is None and num_processes is None and process_id is None:
        return False
    if coordinator_address is None or num_processes is None or process_id is None:
        raise ConfigError(
            "multi-host needs all three of coordinator address, number of processes and process id (flags "
            "--coordinator-address/--num-processes/--process-id or env " + ", ".join(_ENV.values()) + f"); got "
            f"coordinator_address={coordinator_address!r}, num_processes={num_processes}, process_id={process_id}")
    if not 0 <= process_id < num_processes:
        raise ConfigError(f"process_id={process_id} must be in [0, num_processes={num_processes})")
    # Cross-process collectives of the CPU backend (tests, CPU-only hosts); GPUs use NCCL regardless.
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address, num_processes=num_processes, process_id=process_id)
    log.info("process %d of %d; %d local / %d global devices", jax.process_index(), jax.process_count(),
             jax.local_device_count(), jax.device_count())
    return True



# ---- communication volume ---------------------------------------------------------------------------------

_COLLECTIVE_RE = re.compile(
    r"=\s*(\([^=]*?\)|[a-z0-9]+\[[0-9,]*\](?:\{[^}]*\})?)\s+"
    r"(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)(?:-start)?\(")
_ARRAY_RE = re.compile(r"([a-z]+[0-9]*)\[([0-9,]*)\]")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
             "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}


def collective_bytes(hlo_text: str) -> dict[str, int]:
    """Bytes each device sends into every kind of collective of a compiled program (`compiled.as_text()`):
    the size of each collective's result, summed per kind. Read from the partitioned HLO, so it is exactly what
    the shardings made XLA insert. (Async "-start" ops are counted once; their "-done" halves are skipped.)"""
    out: dict[str, int] = {}
    for kind, n in collective_ops(hlo_text):
        out[kind] = out.get(kind, 0) + n
    return out


def collective_ops(hlo_text: str) -> list[tuple[str, int]]:
    """(kind, result bytes) of every collective in a compiled program, in program order."""
    ops = []
    for m in _COLLECTIVE_RE.finditer(hlo_text):
        shape, kind = m.group(1), m.group(2)
        arrays = _ARRAY_RE.findall(shape)
        if shape.startswith("(") and kind != "all-reduce":
            arrays = arrays[-1:]  # async start tuples carry (operand, result): count the result
        n = 0
        for dtype, dims in arrays:
            size = 1
            for d in filter(None, dims.split(",")):
                size *= int(d)
            n += size * _ITEMSIZE.get(dtype, 4)
        ops.append((kind, n))
    return ops
