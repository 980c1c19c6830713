"""InFlight: one dispatched step of a ModelRunner whose results are not yet on the host (runner/model_runner.py
dispatch() makes it, fetch() reads it; the speculative carries read `out.carry` / `carry` for the next step)."""
from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from typing import Any

import numpy as np


@dataclasses.dataclass
class InFlight:
    """A dispatched step: device arrays not yet copied to the host."""

    _out: Any                   # StepOutput of device arrays, or a Future of it (the call thread): read `out`
    prompt: Any                 # (lp, top ids, top lp) device arrays, or None
    prompt_targets: dict[int, np.ndarray]
    token_offsets: np.ndarray
    num_seqs: int
    want_top: bool = False      # some sequence asked for logprobs: fetch the top-20 arrays too
    spec_seqs: list[int] = dataclasses.field(default_factory=list)  # sequence index of each verify row
    # The carry the next step reads (runner/spec_carry.py); None: out.carry. A device draft source replaces it with
    # one whose draft columns it filled.
    carry: Any = None
    packed: Any = None          # the HostBatch of its inputs, released (runner/batch.release) once fetched

    @property
    def out(self):
        """The StepOutput (waits for the call to return when it runs on the call thread; raises its error)."""
        o = self._out
        if isinstance(o, Future):
            o = self._out = o.result()
        return o
