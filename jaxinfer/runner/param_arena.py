"""The step's norm scales in one buffer a dtype (single-device runners).

Every call of a compiled program costs host time per argument buffer: ~1.5 µs each on the H100 / H200 hosts
(benchmarks/probes/call_overhead.py, 2026-12-02: 512 buffers 0.78 ms, the same bytes as one buffer 32 µs), and the
step is called once per engine step. An 8B Llama's step takes 130 weight matrices, 64 KV pools and 65 vectors
(two RMSNorm scales a layer and the final norm's; Qwen3 adds q / k norms, Qwen2 q / k / v biases). `pack`
concatenates the norm scales of each dtype into one arena outside the step; `unpack`, at the start of the traced
step, slices them back out.
Static slices of a parameter are read in place by their consumers' fusions (the norms), so the step takes 1 buffer
where it took 65, with no copies and no extra kernels. Only norm scales are packed: other vectors (int8
per-channel scales, biases) feed kernels whose operands XLA would copy out of the arena first.

  Arena.big      indices (into the flat params list) passed as they are
  Arena.groups   per dtype: (dtype name, ((param index, offset, size), ...)) of the vectors packed in that arena
  packed form    (big: list of arrays, arenas: list of 1-D arrays, one per group)

A sharded runner (tensor / data parallel plans) does not pack: its weights keep their per-weight shardings.
"""
from __future__ import annotations

import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Arena:
    num_params: int
    big: tuple[int, ...]
    groups: tuple[tuple[str, tuple[tuple[int, int, int], ...]], ...]


_NORM_SCALE = re.compile(r"\['\w*norm'\]\['weight'\]")  # e.g. ['layers'][3]['attn_norm']['weight'].value


def norm_scales(treedef, params) -> list[bool]:
    """Which of the flat params (the leaves of an nnx State under `treedef`) are norm scales (1-D)."""
    state = jax.tree.unflatten(treedef, list(params))
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    return [len(p.shape) == 1 and bool(_NORM_SCALE.search(k)) for k, p in zip(paths, params)]


def plan(params, packable=None) -> Arena | None:
    """The arena layout of a flat params list (arrays or ShapeDtypeStructs); packable: bool per param (default:
    every 1-D one). None when fewer than two vectors would be packed (nothing to gain)."""
    packable = packable if packable is not None else [len(p.shape) == 1 for p in params]
    vectors = [i for i, (p, ok) in enumerate(zip(params, packable)) if ok and len(p.shape) == 1]
    if len(vectors) < 2:
        return None
    by_dtype: dict[str, list[tuple[int, int, int]]] = {}
    offsets: dict[str, int] = {}
    for i in vectors:
        dt = np.dtype(params[i].dtype).name
        size = int(params[i].shape[0])
        off = offsets.get(dt, 0)
        by_dtype.setdefault(dt, []).append((i, off, size))
        offsets[dt] = off + size
    packed = set(vectors)
    return Arena(len(params), tuple(i for i in range(len(params)) if i not in packed),
                 tuple((dt, tuple(items)) for dt, items in by_dtype.items()))


def pack(params, arena: Arena | None):
    """params (flat list) -> the packed form the step takes (params itself without an arena). Abstract params
    (ShapeDtypeStructs: a runner built from the weights' shapes) give abstract arenas."""
    if arena is None:
        return params
    if len(params) != arena.num_params:
        raise ValueError(f"the arena was planned for {arena.num_params} weights, got {len(params)}")
    big = [params[i] for i in arena.big]
    arenas = []
    for dt, items in arena.groups:
        parts = [params[i] for i, _, _ in items]
        if any(isinstance(p, jax.ShapeDtypeStruct) for p in parts):
            arenas.append(jax.ShapeDtypeStruct((sum(s for _, _, s in items),), jnp.dtype(dt)))
        else:
            arenas.append(jnp.concatenate(parts))
    return big, arenas


def unpack(packed, arena: Arena | None) -> list:
    """Inside the traced step: the packed form -> the flat params list (vectors as static slices of the arenas)."""
    if arena is None:
        return packed
    big, arenas = packed
    out = [None] * arena.num_params
    for i, p in zip(arena.big, big):
        out[i] = p
    for (_, items), a in zip(arena.groups, arenas):
        for i, off, size in items:
            out[i] = a[off:off + size]
    return out
