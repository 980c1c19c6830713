"""`cond`: lax.cond, or both branches computed and one selected by jnp.where (the default on GPU).

Why two forms: XLA GPU runs a conditional whose branches are not cheap (cheap ones become selects) as a
ConditionalThunk that copies the predicate to the host and waits for it. A step program with such a wait cannot be
dispatched ahead of the device: the call returns only when the device has reached the conditional, i.e. after
the previous step and this step's forward pass. Measured on the H200 (benchmarks/probes/step_dispatch.py,
results/step-dispatch-2026-12-02.json, 8B decode at context 512, batch 64): the compiled call took 9.7 ms of a
9.8 ms device step with the sampler's lax.conds, 2.6 ms with them traced as selects (device step 8.5 ms: the
selects cost less device time than the conditionals' host round trips; command buffers of type CONDITIONAL did
not capture them: 9.1 ms). On the CPU the conditionals stay (they skip real work there and block nothing that
matters).
"""
from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
from jax import lax

_SELECT: list[bool | None] = [None]  # None: select on GPU, lax.cond elsewhere


@contextlib.contextmanager
def select_branches(on: bool | None = True):
    """Within this block `cond` traces as selects (on=True), as lax.cond (False) or by backend (None). Use it
    around a fresh trace (a new jax.jit object): jit caches its traces, and this flag is not part of the key."""
    prev = _SELECT[0]
    _SELECT[0] = on
    try:
        yield
    finally:
        _SELECT[0] = prev


def cond(pred, true_fn, false_fn):
    """lax.cond(pred, true_fn, false_fn), or where(pred, true_fn(), false_fn()) under select_branches()."""
    select = _SELECT[0] if _SELECT[0] is not None else jax.default_backend() == "gpu"
    if not select:
        return lax.cond(pred, true_fn, false_fn)
    a, b = true_fn(), false_fn()
    return jax.tree.map(lambda x, y: jnp.where(pred, x, y), a, b)
