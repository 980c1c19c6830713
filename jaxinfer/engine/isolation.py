"""Find the rows that make a batched step fail (host only, never imports jax).

One request whose row cannot be packed or run (an integer past int32 that got past validation, a bad penalty
slot, ...) makes the runner's dispatch raise for the whole batch. Instead of failing every request, the engine
bisects the batch with probe dispatches of sub-batches (`failing_rows`), ends the requests of the rows that fail
on their own, and runs the step without them.

Why probe dispatches are safe: a probe computes exactly the KV that the step would have written for its rows, into
the same slots of pages those rows own (never a cached shared page: hits are whole pages), so writing it twice
changes nothing; probes do not count sampled tokens into the penalty table (the engine probes with
penalty_slot=-1; penalty_init rewrites a row from known tokens, idempotent). Their sampled tokens are discarded.
"""
from __future__ import annotations

from typing import Callable, Sequence


def failing_rows(n: int, ok: Callable[[Sequence[int]], bool]) -> list[int]:
    """Rows of a failing n-row batch that fail on their own, by bisection: `ok(rows)` runs a probe of those rows
    and says whether it succeeded. The whole batch is known to fail (it is not probed again). Returns the rows
    (ascending) whose single-row probe failed; [] when every half passes (a failure of the combination, or a
    transient one: the caller then gives up). Probes: about 2 k log2(n) for k failing rows."""
    bad: list[int] = []

    def visit(rows: list[int], known_bad: bool) -> None:
        if not known_bad and ok(rows):
            return
        if len(rows) == 1:
            bad.append(rows[0])
            return
        mid = len(rows) // 2
        visit(rows[:mid], False)
        visit(rows[mid:], False)

    if n:
        visit(list(range(n)), True)
    return sorted(bad)
