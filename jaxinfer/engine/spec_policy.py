"""Batch-aware speculation policy (host only, never imports jax): is speculation worth it this step, and with
which k, given the running batch size, the per-position draft agreement seen so far and the kind of drafter.

The decision is read from MEASURED speed-ups (speculative tokens/s over plain decoding of the same engine
settings, benchmarks/spec_speed.py on the H200, 8B target), one table per (drafter kind, k):
  SPEEDUP[(kind, k)][batch] = {acceptance: speed-up}
kinds: "free"  drafts that cost nothing on the device (n-gram, the benchmark's oracle);
       "host"  drafts made on the host (n-gram lookup; today the same cost as "free" on the device);
       "model" a draft model of the Llama-3.2-1B shape (method "draft"; layer_skip is counted here too).
A table entry of None is UNMEASURED: it is never used as evidence. Where the entries the lookup needs are missing,
the policy falls back to a cost model (`estimate`; scaled to agree with a measurement at another k of the same
batch and acceptance where there is one): tokens per cycle at acceptance a with k drafts,
(1 - a^(k+1)) / (1 - a), over the cost of a cycle in plain steps, `CYCLE_COST[kind]` (measured at batch 1 only;
its growth with the batch is an assumption, `_COST_PER_DOUBLING`, stated as such). The model is conservative:
a speed-up it predicts must exceed 1 + `margin` for speculation to be on.

Lookup: the batch row is the smallest table batch >= the running batch (a larger batch is never faster to
speculate: verification's k extra tokens per request weigh more as decoding turns compute-bound); between two
measured acceptances the speed-up is interpolated linearly; below the smallest measured acceptance it is
extrapolated as that entry (an over-estimate only where the table itself is optimistic); above the largest, the
largest. Invariant: `choose` never returns k > k_max, and returns 0 (off) whenever no candidate k has a predicted
speed-up above 1 + margin.
"""
from __future__ import annotations

import math

KINDS = ("free", "host", "model")
UNMEASURED = None

# Keys: batch -> {per-position draft agreement a: speed-up} (a = the probability that each draft equals the target's
# token, as benchmarks/spec_speed.py --accept; `agreement` converts an accepted/drafted rate into it).
# The PIPELINED path (engine/spec_pipeline.py, the default), k = 4, H200, 8B target, prompt 128, 128 new tokens.
# The grid is results/spec-speed-981b94b-2026-12-02.json (batch 1 / 8 / 32 x a = 0.5 / 0.7 / 0.9, both kinds, one
# call). Later runs replace the cells they measured again after a change that moved them: the draft model's
# a = 0.7 at batch 1 (1.202, results/spec-speed-stable1-d967165-2026-12-04.json: after its programs sampled
# greedily, 2e4ce03, and with stable command-buffer addresses, the defaults since; 1.334 on another machine, 1.068
# on a third) and at batch 8 / 32 (0.787 / 0.614, results/spec-speed-79bf89b-2026-12-04.json); its a = 0.5 / 0.9
# cells predate the sampler fix, so they are low. Batch 64 / 128 (free drafts, a = 0.7) are UNPIPELINED runs of
# 12-01 (results/spec-speed-threshold-2026-12-01.json); max_batch_size (64) stops speculation above 64 anyway.
# "free" also stands for pipelined n-gram drafts (the prompt lookup runs on the device from the step in flight:
# runner/ngram_device.py, the same cost as the benchmark's device oracle); "host" (n-gram drafts with
# pipelined=False) has no measurement of its own and takes the cost model.
SPEEDUP: dict[tuple[str, int], dict[int, dict[float, float | None]]] = {
    ("free", 4): {
        1: {0.5: 1.758, 0.7: 2.612, 0.9: 3.975},
        8: {0.5: 1.405, 0.7: 1.95, 0.9: 2.232},
        32: {0.5: 1.037, 0.7: 1.261, 0.9: 1.53},
        64: {0.5: UNMEASURED, 0.7: 1.237, 0.9: UNMEASURED},
        128: {0.5: UNMEASURED, 0.7: 0.949, 0.9: UNMEASURED},
    },
    ("host", 4): {
        1: {0.5: UNMEASURED, 0.7: UNMEASURED, 0.9: UNMEASURED},
        8: {0.5: UNMEASURED, 0.7: UNMEASURED, 0.9: UNMEASURED},
        32: {0.5: UNMEASURED, 0.7: UNMEASURED, 0.9: UNMEASURED},
    },
    ("model", 4): {
        1: {0.5: 0.73, 0.7: 1.202, 0.9: 1.652},
        8: {0.5: 0.652, 0.7: 0.787, 0.9: 0.991},
        32: {0.5: 0.45, 0.7: 0.614, 0.9: 0.651},
    },
}

# Cycle cost in plain decode steps at batch 1, k = 4 (H200, 8B): free drafts 7.8 / 4.7 ms; the 1B draft adds
# one catch-up + 4 draft dispatches of ~2.7 ms each (issue 21). Per extra draft token a cycle is assumed to cost
# 1/8 of a plain step more (UNMEASURED assumption), and each doubling of the batch 5% more (UNMEASURED assumption:
# fitted to make 1.24x at 64 and 0.95x at 128 roughly agree with the batch-1 cost).
CYCLE_COST = {"free": 7.8 / 4.7, "host": 7.8 / 4.7, "model": (7.8 + 5 * 2.7) / 4.7}
_COST_PER_DRAFT = 0.125
_COST_PER_DOUBLING = 0.05


def tokens_per_cycle(acceptance: float, k: int) -> float:
    """Mean tokens a verification emits with k drafts each accepted with probability a: 1 + a + ... + a^k."""
    a = min(max(acceptance, 0.0), 1.0)
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def agreement(rate: float, k: int) -> float:
    """The per-position agreement a whose accepted/drafted rate with k drafts is `rate`:
    (a + a^2 + ... + a^k) / k = rate (bisection; monotone in a)."""
    rate = min(max(rate, 0.0), 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if (tokens_per_cycle(mid, k) - 1.0) / k < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def estimate(kind: str, batch: int, acceptance: float, k: int) -> float:
    """The cost model's speed-up (used only where the table has no measurement; see the module docstring)."""
    cost = CYCLE_COST[kind] + _COST_PER_DRAFT * (k - 4) + _COST_PER_DOUBLING * math.log2(max(batch, 1))
    return tokens_per_cycle(acceptance, k) / max(cost, 1e-6)


def measured(kind: str, batch: int, acceptance: float, k: int) -> float | None:
    """The table's speed-up at (batch, acceptance), or None if the entries it needs are UNMEASURED or absent."""
    table = SPEEDUP.get((kind, k))
    if not table:
        return None
    rows = [b for b in sorted(table) if b >= batch]
    if not rows:
        return None  # larger than any measured batch: no evidence
    pts = sorted((a, s) for a, s in table[rows[0]].items() if s is not None)
    if not pts:
        return None
    if acceptance <= pts[0][0]:
        return pts[0][1] if acceptance == pts[0][0] else None  # below every measurement: no evidence
    for (a0, s0), (a1, s1) in zip(pts, pts[1:]):
        if a0 <= acceptance <= a1:
            return s0 + (s1 - s0) * (acceptance - a0) / (a1 - a0)
    return pts[-1][1]


class SpecPolicy:
    """choose(batch, acceptance, k_max) -> k in [0, k_max] (0: speculation off this step)."""

    def __init__(self, kind: str, margin: float = 0.05):
        if kind not in KINDS:
            raise ValueError(f"spec policy kind {kind!r} is unknown; use one of {list(KINDS)}")
        self.kind = kind
        self.margin = margin

    def speedup(self, batch: int, acceptance: float, k: int) -> tuple[float, bool]:
        """(predicted speed-up, whether it is measured)."""
        m = measured(self.kind, batch, acceptance, k)
        if m is not None:
            return m, True
        est = estimate(self.kind, batch, acceptance, k)
        # Calibrated by a measurement at another k of the same (batch, acceptance), if there is one: the model then
        # only supplies the ratio between k values, the level is measured.
        for kind, kk in SPEEDUP:
            ref = measured(kind, batch, acceptance, kk) if kind == self.kind and kk != k else None
            if ref is not None:
                return est * ref / estimate(self.kind, batch, acceptance, kk), False
        return est, False

    @staticmethod
    def agreement(rate: float, k: int) -> float:
        return agreement(rate, k)

    def choose(self, batch: int, acceptance: float, k_max: int) -> int:
        best_k, best = 0, 1.0 + self.margin
        for k in range(1, k_max + 1):
            s, _ = self.speedup(batch, acceptance, k)
            if s > best:
                best_k, best = k, s
        return best_k
