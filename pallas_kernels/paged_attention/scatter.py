"""Row scatters whose indices are unique, padding rows included.

An XLA scatter whose indices may repeat is emitted on the GPU with atomic updates (for 16-bit types a
compare-and-swap loop per element); when padding points many rows at one dummy row, those rows also serialise on
the same addresses. Here every padding row gets an index of its own past the end of the destination: the scatter
drops it, the indices are unique, and XLA emits plain stores. Used for the KV write (padding tokens), the
reference's output scatter, and the Pallas kernel's slot of each token (kernel.tiles_to_tokens: empty tile slots).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def set_rows(dst: jax.Array, idx: jax.Array, rows: jax.Array, padding: jax.Array) -> jax.Array:
    """dst[idx[i]] = rows[i] for every i where padding[i] is False; padding rows write nothing.

    dst: [N, ...]; idx: i32[R] (unique over the non-padding rows: the caller guarantees it); rows: [R, ...];
    padding: bool[R]."""
    n = dst.shape[0]
    unique = jnp.where(padding, n + jnp.arange(idx.shape[0], dtype=idx.dtype), idx)  # n + i: out of range
    return dst.at[unique].set(rows.astype(dst.dtype), mode="drop", unique_indices=True)
