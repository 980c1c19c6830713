"""Host bookkeeping of the device penalty table's rows ("slots"); plain Python, never imports jax.

A sequence that uses presence / frequency / repetition penalties holds one slot of the runner's token-count
table (runner/penalties.py) while it runs. It gets the slot when it is scheduled without one (new, or
re-admitted after a preemption, when none of its tokens is in flight, so its known tokens are all of its
tokens) and the runner writes the row from them; the device then counts every token it samples, the in-flight
ones included. The slot is freed when the sequence finishes, is aborted or is preempted (the scheduler reports
these at the next schedule()), so at most max_num_seqs slots are ever held: one per running sequence.
A freed slot may still be counted into by a step in flight; the next holder's row write is ordered after that
step on the device (it takes the table that step returns), so it starts clean.
"""
from __future__ import annotations


class PenaltySlots:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # pop() hands out 0, 1, 2, ...
        self._held: dict[str, int] = {}

    def get(self, seq_id: str) -> int | None:
        return self._held.get(seq_id)

    def acquire(self, seq_id: str) -> int:
        assert seq_id not in self._held, f"{seq_id!r} already holds penalty slot {self._held[seq_id]}"
        if not self._free:
            raise RuntimeError(f"all {self.num_slots} penalty slots are held ({sorted(self._held)[:5]}...); the "
                               f"runner must have one slot per sequence that can run at once (max_num_seqs)")
        slot = self._held[seq_id] = self._free.pop()
        return slot

    def release(self, seq_id: str) -> None:
        slot = self._held.pop(seq_id, None)
        if slot is not None:
            self._free.append(slot)

    @property
    def num_held(self) -> int:
        return len(self._held)
