"""N-gram (prompt lookup) draft proposer: host only, numpy, no model.

Match the last n tokens of a sequence (n from max_n down to min_n) against its earlier tokens (prompt and output
so far); at the most recent earlier occurrence, propose the k tokens that followed it. Works well when the output
quotes its input (summaries, code edits, extraction) and costs nothing when it does not: no match, no draft.
The drafts are deterministic (a point mass), which verification accounts for (runner/spec_decode.py).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def ngram_propose(tokens: Sequence[int], k: int, min_n: int = 1, max_n: int = 4,
                  max_lookback: int = 4096) -> list[int]:
    """Up to k draft tokens continuing `tokens`, or [] when no n-gram of the tail recurs.

    Only the last max_lookback tokens are searched (bounds the host cost per step for long contexts).
    """
    if k <= 0:
        return []
    arr = np.asarray(tokens[-max_lookback:] if len(tokens) > max_lookback else tokens, dtype=np.int64)
    N = arr.shape[0]
    for n in range(min(max_n, N - 1), min_n - 1, -1):
        tail = arr[N - n:]
        # windows starting at 0 .. N-n-1 (the tail itself, at N-n, is excluded); [N-n, n]
        win = np.lib.stride_tricks.sliding_window_view(arr[:N - 1], n)
        hits = np.flatnonzero((win == tail).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n  # the most recent occurrence; propose what followed it
            return arr[start:start + k].tolist()
    return []


class NgramProposer:
    """Proposer interface (see engine/spec_control.py): propose / rollback / free. Holds no per-request state."""

    needs_model = False

    def __init__(self, min_n: int = 1, max_n: int = 4):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"ngram sizes min_n={min_n}, max_n={max_n} must satisfy 1 <= min_n <= max_n")
        self.min_n, self.max_n = min_n, max_n

    def propose(self, seqs: Sequence[tuple[str, Sequence[int], int]]) -> dict[str, list[int]]:
        """seqs: (request id, all known token ids, number of drafts wanted) -> request id -> drafts (maybe [])."""
        return {rid: ngram_propose(toks, k, self.min_n, self.max_n) for rid, toks, k in seqs}

    def rollback(self, request_id: str, num_valid_tokens: int) -> None:
        pass

    def free(self, request_id: str) -> None:
        pass
