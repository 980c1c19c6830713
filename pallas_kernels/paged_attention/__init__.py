"""Ragged paged attention over a paged KV cache: `kernel.py` (Pallas, Triton backend, GPU) and `reference.py`
(pure jnp: the specification and the CPU path). Same signature, same metadata."""
from pallas_kernels.paged_attention.kernel import ragged_paged_attention
from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference, write_kv_pages

__all__ = ["ragged_paged_attention", "ragged_paged_attention_reference", "write_kv_pages"]
