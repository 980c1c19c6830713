"""Pipelined speculative steps on the host (never imports jax): step n+1 is scheduled, packed and dispatched while
step n (which may verify drafts) is still on the device, as plain decoding is (engine.py).

Optimistic scheduling. Before schedule() for step n+1, every request that samples in step n (it is in step n's
`rows`) is treated as if all of its k_n drafts were accepted: `prepare` adds k_n to its num_pending_tokens (the
tokens step n may emit: k_n + 1 instead of 1) and, when it may speculate, gives it k placeholder drafts (-1). The
scheduler then makes it a chunk [placeholder, k placeholders] at the worst-case positions, with pages for the worst
case (scheduler.py). The device draft source (`proposer.propose_device`, duck-typed like the runner) is launched
right after schedule() to write the real drafts into step n's device carry (runner/spec_carry.py), and step n+1's
program reads its input tokens, drafts and position shift from that carry. Nothing waits for the device.

Late reconcile, once step n is fetched (engine._finish_step): `unbump` takes the k_n back off num_pending_tokens
before Scheduler.update(step n) (which appends the accepted tokens and rolls num_computed_tokens back by step n's
rejected drafts: the worst case it had counted for step n+1 becomes the truth); `reconcile` then moves step n+1's
ScheduledSeq of each such request down by the same rejected count (start_pos, output_index) so that update(step n+1)
sees it where the device ran it. Pages: update(step n) truncates the request's pages to its new num_computed_tokens,
which still covers step n+1's chunk at its real (shifted) positions, so over-allocated pages go back one step late.

Requests preempted or finished between the two are simply skipped (their step n+1 results are dropped, as in
plain pipelining). Only one step is ever in flight, so a request carries at most one bump.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class PipePlan:
    bumps: dict[str, int]               # request id -> k_n added to num_pending_tokens (k_n > 0 only)
    rows: dict[str, tuple[int, int]]     # request id -> (its row in step n, worst-case token count before drafts)


def can_pipeline(spec, async_scheduling: bool) -> bool:
    return (async_scheduling and spec is not None and getattr(spec, "pipelined", False)
            and callable(getattr(spec.proposer, "propose_device", None))
            and getattr(spec.proposer, "can_pipeline", True))


def prepare(spec, running, in_flight, params_of, row_of) -> PipePlan:
    """Bump the pending tokens of step n's sampling requests to the worst case and give placeholder drafts to those
    that may speculate (spec: SpecControl; in_flight: the engine's _Step of step n; row_of(request id): its output
    row in step n, None when it did not sample there)."""
    k_n = {s.request_id: s.num_spec_tokens for s in in_flight.sched.scheduled if s.num_spec_tokens}
    plan = PipePlan({}, {})
    for req in running:
        rid = req.request_id
        row = row_of(rid)
        if row is None or req.num_pending_tokens != 1:
            continue  # not sampled by step n (mid-prefill, or admitted since): no drafts this step
        k = k_n.get(rid, 0)
        if k:
            req.num_pending_tokens += k
            plan.bumps[rid] = k
        n = req.num_tokens_with_pending
        if req.num_computed_tokens != n - 1:
            continue
        want = spec.pipelined_k(req, params_of)
        if want > 0:
            req.spec_token_ids = [-1] * want
            plan.rows[rid] = (row, n)
    return plan


def device_drafts(proposer, plan: PipePlan, sched, flight, get_request):
    """Launch the device draft source for the chunks that got placeholder drafts; returns the flight step n+1
    reads its carry from. todo rows: (request id, row in step n, worst-case tokens before the drafts, k, k_n = the
    drafts step n verifies for it (0: the count is exact), a function returning its known token ids (called
    only by a drafter that needs to catch up from the host))."""
    todo = []
    for s in sched.scheduled:
        rid = s.request_id
        if s.num_spec_tokens and rid in plan.rows:
            req = get_request(rid)
            todo.append((rid, *plan.rows[rid], s.num_spec_tokens, plan.bumps.get(rid, 0),
                         lambda req=req: req.all_token_ids))
    if not todo:
        return flight
    return proposer.propose_device(flight, todo)


def unbump(plan: PipePlan | None, scheduler) -> None:
    if plan is None:
        return
    for rid, k in plan.bumps.items():
        req = scheduler.get(rid)
        if req is not None and req.num_pending_tokens > k:  # (preempted: reset to 0 already)
            req.num_pending_tokens -= k


def reconcile(plan: PipePlan | None, done_sched, sampled: dict[str, list[int]], next_sched) -> None:
    """After update(step n): shift step n+1's chunks of bumped requests by step n's rejected drafts."""
    if plan is None or next_sched is None or not plan.bumps:
        return
    k_n = plan.bumps
    for s in next_sched.scheduled:
        rid = s.request_id
        if rid in k_n and rid in sampled:
            rejected = k_n[rid] + 1 - len(sampled[rid])
            s.start_pos -= rejected
            s.output_index -= rejected
