"""Draft proposals from a model: a separate draft checkpoint ("draft") or the target's first layers ("layer_skip").

The draft runs on its own `ModelRunner` (same bucketed, ahead-of-time compiled step as the target) with its own
paged KV cache and its own page allocator (the host's `KVCacheManager`, no prefix caching). Both are built and
handed in by jaxinfer/draft_model.py, above runner/ and engine/: the runner never imports the engine. Per request it remembers how
many tokens of the sequence have draft KV (`_computed`). To propose k drafts for a sequence of N known tokens:
  catch-up   tokens [computed, N-1) in chunks of at most the largest bucket (prompt, and tokens accepted since);
  k steps    step 1 computes token N-1 and samples d_1 greedily; step j feeds d_{j-1} (a placeholder the device
             fills from step j-1's output, so the k steps are dispatched back to back without host syncs).
The k steps run as one compiled program (runner/draft_steps.py: one pack, copy and launch instead of k) when
the longest proposal wants k = num_speculative_tokens drafts (the usual case; sequences wanting fewer stop early
inside it; when adaptive k has lowered every request's k, the per-step path above). Afterwards the draft has KV
for positions < N + k - 1. rollback(n) forgets everything past the n tokens whose KV the target kept (the
accepted prefix) and releases the pages past it; later steps overwrite the stale slots.
Drafts are the draft's argmax (deterministic): verification treats q as a point mass (runner/spec_decode.py).

Layer skip: the draft is the target's first `num_draft_layers` layers + its final norm and head. The weights are
the target's own device arrays (no copy). Its KV is kept in its own cache: the target's KV of those layers at the
accepted positions is bit-for-bit what the draft would compute (same weights, same inputs), so it could be shared,
but the draft writes its k-1 speculative positions before the target has allocated pages for them, and the two
runners size and donate their caches separately; sharing would need one runner running both programs over one
cache. Cost of not sharing: num_draft_layers / num_layers of the target's KV memory, plus the catch-up compute.
"""
from __future__ import annotations

from typing import Protocol, Sequence

from jaxinfer.outputs import SeqInput
from jaxinfer.runner.draft_cycle import DraftCycle
from jaxinfer.runner.draft_steps import FusedDraftSteps
from jaxinfer.runner.model_runner import ModelRunner
from jaxinfer.runner.spec_carry import carry_width


class DraftPages(Protocol):
    """The draft cache's page allocator (engine/kv_cache.KVCacheManager without prefix caching)."""

    def allocate(self, request_id: str, num_tokens: int): ...
    def page_table(self, request_id: str) -> Sequence[int]: ...
    def truncate(self, request_id: str, num_tokens: int) -> None: ...
    def free(self, request_id: str) -> None: ...


class ModelProposer:
    needs_model = True

    def __init__(self, runner: ModelRunner, kv: DraftPages, num_speculative_tokens: int, max_model_len: int,
                 fused_steps: bool = True):
        """runner: the draft's own ModelRunner; kv: the page allocator of its cache (runner.num_pages pages of
        runner.page_size tokens). fused_steps=False: always the per-step path (else k draft steps in one program,
        on single-device runners)."""
        self.runner = runner
        k = num_speculative_tokens
        self.fused = FusedDraftSteps(runner, k) if fused_steps and k and runner.plan is None else None
        # Pipelined verification (engine/spec_pipeline.py): the whole proposal as one program reading the target's
        # device carry (runner/draft_cycle.py). Without it (per-step drafts, sharded drafts) steps are unpipelined.
        self.cycle = DraftCycle(runner, k) if fused_steps and k and runner.plan is None else None
        self.can_pipeline = self.cycle is not None  # (engine/spec_pipeline.can_pipeline reads it)
        self._piped: set[str] = set()  # requests whose _computed is a lower bound (pipelined cycles): no truncation
        self.kv = kv
        self.max_model_len = max_model_len
        self.max_tokens_per_step = runner.ladder.max_tokens
        self.max_seqs = runner.config.scheduler.max_num_seqs
        self.carry_shape = (self.max_seqs, carry_width(k))  # the target's carry (same max_num_seqs)
        self._computed: dict[str, int] = {}  # request id -> tokens with draft KV

    def warmup(self, progress: bool = True):
        self.runner.warmup(progress=progress)
        if self.fused is not None:
            self.fused.warmup()
        if self.cycle is not None and self.carry_shape is not None:
            self.cycle.warmup(self.carry_shape)

    # ---- proposer protocol (engine/spec_control.py) -----------------------------------------------------
    def propose(self, seqs: Sequence[tuple[str, Sequence[int], int]]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        live = []  # (rid, tokens, k)
        for rid, tokens, k in seqs:
            n = len(tokens)
            k = min(k, self.max_model_len - n)
            if k <= 0:
                continue
            if self.kv.allocate(rid, n + k - 1) is None:
                self.free(rid)  # the draft cache is full: no drafts for it now; recompute from scratch later
                out[rid] = []
                continue
            live.append((rid, tokens, k))
        if not live:
            return out
        self._catch_up(live)
        if self.fused is not None and max(k for _, _, k in live) == self.fused.num_steps:
            return self._propose_fused(live, out)
        flights, rows = [], []  # step j: (flight, {rid: row})
        prev = None
        for j in range(max(k for _, _, k in live)):
            inputs, row = [], {}
            for rid, tokens, k in live:
                if k <= j:
                    continue
                pos = len(tokens) - 1 + j
                prev_row = rows[-1][rid] if j else -1
                row[rid] = len(inputs)
                inputs.append(SeqInput(token_ids=[tokens[-1] if j == 0 else -1], start_pos=pos,
                                       page_table=self.kv.page_table(rid), temperature=0.0, prev_row=prev_row))
            prev = self.runner.dispatch(inputs, prev)
            flights.append(prev)
            rows.append(row)
        results = [self.runner.fetch(f).tokens for f in flights]  # one wait for the whole chain
        for rid, tokens, k in live:
            out[rid] = [int(results[j][rows[j][rid]]) for j in range(k)]
            self._computed[rid] = len(tokens) + k - 1
        return out

    def propose_device(self, flight, todo):
        """Pipelined proposal (engine/spec_pipeline.device_drafts' rows): one DraftCycle dispatch from the target
        step in flight's carry, plus a host catch-up for rows whose token count is exact (k_n == 0: not verified in
        that step). Returns the flight with the drafts in its carry; waits for nothing."""
        import dataclasses

        seqs, catch = [], []
        for rid, row, base, k, k_n, tokens in todo:
            k = min(k, self.max_model_len - base + 1)
            # (pages for one token more than written: the packed decode batch sits at position base even if k = 1)
            if k <= 0 or base < 2 or self.kv.allocate(rid, base + k) is None:
                self.free(rid)  # no drafts for it now (its verification rejects the carry's zeros); later from scratch
                continue
            if not k_n:  # exact count: catch up [computed, base - 2) from the known tokens
                self._piped.discard(rid)
                catch.append((rid, tokens(), k))
            elif rid not in self._piped:
                # verified in the step in flight without a cycle of ours before (its draft KV was dropped: cache
                # full): catch up what the host knows; the accepted drafts of that step stay uncomputed (worse
                # drafts for this request, never wrong outputs)
                catch.append((rid, tokens(), k))
            seqs.append((row, base, self.kv.page_table(rid), k, rid, k_n))
        if catch:
            self._catch_up(catch)
        if not seqs:
            return flight
        carry = flight.carry if flight.carry is not None else flight.out.carry
        carry = self.cycle.dispatch(carry, [(row, base, pt, k) for row, base, pt, k, _, _ in seqs])
        for row, base, pt, k, rid, k_n in seqs:
            # valid draft KV: positions < b + k - 1 with b >= base - k_n (the actual count is unknown here)
            self._computed[rid] = base - k_n + k - 1
            self._piped.add(rid)
        return dataclasses.replace(flight, carry=carry)

    def rollback(self, request_id: str, num_valid_tokens: int) -> None:
        if request_id not in self._computed or request_id in self._piped:
            return  # pipelined: _computed is a lower bound; its pages are kept until free()
        self._computed[request_id] = min(self._computed[request_id], num_valid_tokens)
        self.kv.truncate(request_id, self._computed[request_id])

    def free(self, request_id: str) -> None:
        self.kv.free(request_id)
        self._computed.pop(request_id, None)
        self._piped.discard(request_id)

    # ---- internals ----------------------------------------------------------------------------------------
    def _propose_fused(self, live, out: dict[str, list[int]]) -> dict[str, list[int]]:
        """The k draft steps of every live sequence in one dispatch (runner/draft_steps.py)."""
        inputs = [SeqInput([tokens[-1]], len(tokens) - 1, self.kv.page_table(rid), 0.0) for rid, tokens, _ in live]
        ks = [k for _, _, k in live]
        drafts = self.fused.fetch(self.fused.dispatch(inputs, ks))  # i32[k, max_num_seqs]; one wait
        per_seq = drafts.T.tolist()  # row i: sequence i's drafts (one conversion for all)
        for i, (rid, tokens, k) in enumerate(live):
            out[rid] = per_seq[i][:k]
            self._computed[rid] = len(tokens) + k - 1
        return out

    def _catch_up(self, live) -> None:
        """Compute draft KV for tokens [computed, N-1) of every live sequence, in as many steps as the largest
        bucket needs (results are not waited for: the draft steps that follow run after them on the device)."""
        todo = {rid: (self._computed.get(rid, 0), tokens) for rid, tokens, _ in live}
        while True:
            inputs, budget = [], self.max_tokens_per_step
            for rid, (c, tokens) in list(todo.items()):
                end = min(len(tokens) - 1, c + budget)
                if end <= c or len(inputs) == self.max_seqs:
                    continue
                inputs.append(SeqInput(token_ids=list(tokens[c:end]), start_pos=c,
                                       page_table=self.kv.page_table(rid), temperature=0.0))
                budget -= end - c
                todo[rid] = (end, tokens)
                if budget == 0:
                    break
            if not inputs:
                return
            self.runner.dispatch(inputs, None)  # (its flight is not waited for)

