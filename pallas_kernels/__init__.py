"""Pallas kernels for jaxinfer. One folder per op: `kernel.py` (Pallas, GPU) + `reference.py` (pure jnp: the
specification and the CPU path)."""
