"""Ragged paged attention over a paged KV cache."""
from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference, write_kv_pages

__all__ = ["ragged_paged_attention_reference", "write_kv_pages"]
