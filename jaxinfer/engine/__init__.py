"""Host-side engine: requests, paged KV-cache bookkeeping, scheduler, detokenizer, engine loop (never imports jax)."""
