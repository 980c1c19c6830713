"""`cond`: lax.cond, or (traced under `select_branches()`) both branches computed and one selected by jnp.where.

Why two forms: XLA GPU runs a conditional whose predicate lives on the device by copying the predicate to the
host and waiting for it, unless the conditional is captured in a command buffer (CUDA graph conditional node). A
step program with such a wait cannot be dispatched ahead of the device: the host blocks in the call until the
device reaches the conditional (benchmarks/probes/step_dispatch.py measures it). The select form never waits and
costs the work of both branches.
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
from jax import lax

_SELECT = [False]


@contextlib.contextmanager
def select_branches(on: bool = True):
    """Within this block, `cond` traces both branches and selects (use around a fresh trace: jit caches traces)."""
    prev = _SELECT[0]
    _SELECT[0] = on
    try:
        yield
    finally:
        _SELECT[0] = prev


def cond(pred, true_fn, false_fn):
    """lax.cond(pred, true_fn, false_fn), or where(pred, true_fn(), false_fn()) under select_branches()."""
    if not _SELECT[0]:
        return lax.cond(pred, true_fn, false_fn)
    a, b = true_fn(), false_fn()
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), a, b)
