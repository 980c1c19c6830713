"""Peer: JAX's bundled Triton decode kernel `jax.experimental.pallas.ops.gpu.paged_attention`, on our K/V.

Its contract (the same in jax 0.10.2 and 0.11.x; checked in the installed source and jax-ml/jax):
  paged_attention(q [B, H, D], k_pages [KVH, num_pages, page_size, D], v_pages (same),
                  block_tables i32[B, pages_per_seq], lengths i32[B], *, block_h=16, pages_per_compute_block=8,
                  k_splits=16, num_warps=8, num_stages=2, interpret=False) -> [B, H, D]
  * decode only: one query token per sequence, which sees the first lengths[b] tokens of its pages;
  * q head h belongs to KV head h // (H / KVH) (our convention too);
  * pages_per_seq must be a multiple of k_splits, and pages_per_seq / k_splits a multiple of
    min(pages_per_compute_block, pages_per_seq / k_splits) (it asserts): `block_tables` pads our page lists with
    page 0 up to the next multiple of k_splits * pages_per_compute_block. Padded entries past the length are
    masked (only partitions that hold real pages run their loop; a block's tail past the length is masked);
  * it applies no softmax scale (logits = q . k): `make_call` scales q by sm_scale first, inside the timed
    function (one more bf16 rounding of q);
  * each split's partial output is stored in q's dtype (bf16 here) before the merge: part of its error vs ours.
Our pools are [num_pages, page_size, KVH, D]: `to_peer_layout` transposes them once, outside any timing.
"""
from __future__ import annotations

import inspect
import math

import jax.numpy as jnp
import numpy as np

REQUIRED_KWARGS = ("block_h", "pages_per_compute_block", "k_splits", "num_warps", "num_stages", "interpret")
DEFAULTS = dict(block_h=16, pages_per_compute_block=8, k_splits=16, num_warps=8, num_stages=2)


def load():
    """The peer's `paged_attention`, or a string saying why it cannot run in this jax."""
    try:
        from jax.experimental.pallas.ops.gpu import paged_attention as mod
    except Exception as e:  # a jax without the module (or without the Triton backend it imports)
        return f"unavailable: {type(e).__name__}: {e}"
    fn = getattr(mod, "paged_attention", None)
    if fn is None:
        return "unavailable: jax.experimental.pallas.ops.gpu.paged_attention has no paged_attention"
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn  # a wrapper inspect cannot read: a call error will be recorded per variant
    missing = [k for k in REQUIRED_KWARGS if k not in params]
    if missing:
        return f"unavailable: its signature lacks {missing} (this script was written for jax 0.10 / 0.11)"
    return fn


def to_peer_layout(pages):
    """[num_pages, page_size, KVH, D] -> [KVH, num_pages, page_size, D] (a copy: delete `pages` afterwards)."""
    return jnp.transpose(pages, (2, 0, 1, 3))


def block_tables(page_lists: np.ndarray, k_splits: int, pages_per_compute_block: int) -> np.ndarray:
    """page_lists: i32[B, pages_per_seq] (every sequence's pages, in order). Returns i32[B, W'] with W' the next
    multiple of k_splits * pages_per_compute_block, padded with page 0 (a valid index; masked by the length)."""
    B, n = page_lists.shape
    unit = k_splits * pages_per_compute_block
    width = math.ceil(n / unit) * unit
    out = np.zeros((B, width), np.int32)
    out[:, :n] = page_lists
    return out


def variants(split_rule: int) -> list[dict]:
    """The peer's own defaults (what ANCHORS' 480 us at 64 x 4k used), plus the same with our split-K rule's
    k_splits when that differs (its 16 splits multiply the programs at large batch; 1 split may suit it better)."""
    out = [dict(DEFAULTS)]
    if split_rule != DEFAULTS["k_splits"]:
        out.append({**DEFAULTS, "k_splits": split_rule})
    return out


def name(v: dict) -> str:
    return f"peer_p{v['pages_per_compute_block']}_s{v['k_splits']}"


def make_call(fn, params: dict, sm_scale: float, interpret: bool):
    """(q [B, H, D], k_pages, v_pages (its layout), block_tables, lengths) -> [B, H, D], our semantics."""
    return lambda q, k, v, bt, ln: fn((q * sm_scale).astype(q.dtype), k, v, bt, ln, **params, interpret=interpret)
