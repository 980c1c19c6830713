"""Speculative decoding control on the host (never imports jax): who speculates, with how many drafts, and the
acceptance bookkeeping. The proposer (n-gram here in engine/, or a draft model on the device, injected) makes the
drafts; the scheduler turns them into one k+1-token chunk; the device verifies (runner/spec_decode.py).

Pipelining: host drafts can only be proposed from known tokens, and a step's number of accepted tokens is unknown
until it comes back. With a device draft source (`propose_device`: the draft model's cycle, the device n-gram lookup
of runner/ngram_device.py) steps pipeline through engine/spec_pipeline.py. Otherwise a step that speculates is not
pipelined: the engine finishes the step in flight before proposing,
and finishes a speculative step before scheduling the next. The cost is the host/device overlap of those steps
(the host work of one step — schedule, pack, propose, update — is added to each speculative step's latency).
Above `max_batch_size` running requests speculation is off and steps pipeline as usual.

Proposer protocol (duck-typed):
  propose([(request_id, all known token ids, k)]) -> {request_id: drafts (<= k, maybe [])}
  rollback(request_id, num_valid_tokens)   tokens [0, num_valid_tokens) of the request are final; the draft's own
                                           cache must forget anything computed beyond (rejected drafts)
  free(request_id)                         the request finished, was aborted or preempted
"""
from __future__ import annotations

import dataclasses
from typing import Any

from .spec_policy import agreement, tokens_per_cycle

_GREEDY_EPS = 1e-5  # = runner.sampler.GREEDY_EPS (kept here: this module never imports the device side)
_EMA = 0.3           # weight of the newest verification in a request's acceptance-rate average
# The batch policy's acceptance evidence (SpecControl.active): verified drafts and accepted drafts, both decayed by
# _WINDOW_DECAY every engine step and blended with a prior agreement of _PRIOR_AGREEMENT worth _PRIOR_DRAFTS
# drafts. The decay is what lets a policy that turned speculation off for low acceptance (no drafts, so no new
# evidence) try again: the estimate drifts back to the prior (half-way in ~34 steps) and the next verifications
# decide afresh. With lifetime counts, one stretch of unpredictable text turned it off for good.
_WINDOW_DECAY = 0.98
_PRIOR_AGREEMENT = 0.7
_PRIOR_DRAFTS = 16.0


@dataclasses.dataclass
class _ReqSpec:
    k: int                       # drafts asked for next time (adaptive)
    ema: float = 1.0             # moving average of accepted / drafted
    num_steps: int = 0           # verification steps
    num_draft: int = 0           # draft tokens verified
    num_accepted: int = 0        # of them accepted
    eligible: bool = True        # SpecControl.eligible(its params), decided once (params never change)


@dataclasses.dataclass
class SpecStats:
    num_steps: int = 0           # (request, step) verifications
    num_draft: int = 0
    num_accepted: int = 0
    num_emitted: int = 0         # tokens produced by verifications (accepted + 1 each)
    num_skipped_batch: int = 0   # engine steps with speculation off because the batch was too large

    def as_dict(self) -> dict:
        return {"num_verify_steps": self.num_steps, "num_draft_tokens": self.num_draft,
                "num_accepted_tokens": self.num_accepted, "num_emitted_tokens": self.num_emitted,
                "acceptance_rate": self.num_accepted / self.num_draft if self.num_draft else 0.0,
                "mean_accepted_length": self.num_emitted / self.num_steps if self.num_steps else 0.0,
                "num_steps_off_large_batch": self.num_skipped_batch}


class SpecControl:
    def __init__(self, proposer: Any, num_speculative_tokens: int, max_batch_size: int, adaptive: bool = True,
                 min_acceptance: float = 0.5, pipelined: bool = True, policy: Any = None):
        self.proposer = proposer
        # engine/spec_policy.SpecPolicy or None: per step, whether to speculate and the largest k, from the
        # measured speed-up at this batch size and the acceptance rate seen so far (None: max_batch_size only).
        self.policy = policy
        self._policy_k = num_speculative_tokens
        # Pipelined verification steps (engine/spec_pipeline.py) where the proposer has a device draft source
        # (`propose_device`); False, or a host-only proposer: every speculative step is finished before the next.
        self.pipelined = pipelined
        self.k_max = num_speculative_tokens
        self.max_batch_size = max_batch_size
        self.adaptive = adaptive
        self.min_acceptance = min_acceptance
        self.stats = SpecStats()
        self._req: dict[str, _ReqSpec] = {}
        self._win_draft = 0.0     # decayed drafts verified (the policy's evidence; _WINDOW_DECAY)
        self._win_accepted = 0.0  # decayed drafts accepted

    @staticmethod
    def eligible(params) -> bool:
        """Requests that can speculate: greedy, or plain temperature sampling (top-k / top-p / min-p would need
        the filtered target distribution in verification), and no per-token logprobs (verification returns only
        the chosen tokens' log-probs), and no presence / frequency / repetition penalties."""
        if params.logprobs is not None:
            return False
        if params.uses_penalties:  # verification scores drafts with the unpenalised distribution
            return False
        if params.temperature < _GREEDY_EPS:
            return True
        return params.top_k <= 0 and params.top_p >= 1.0 and params.min_p <= 0.0

    def active(self, num_running: int) -> bool:
        """Speculate this step? Off above max_batch_size running requests, and where the policy (if any) predicts
        no speed-up for this batch size and the recent agreement (it also caps k: _policy_k)."""
        if num_running == 0:
            return False
        if num_running > self.max_batch_size:
            self.stats.num_skipped_batch += 1
            return False
        if self.policy is not None:
            self._policy_k = self.policy.choose(num_running, self.window_agreement(), self.k_max)
            self._win_draft *= _WINDOW_DECAY
            self._win_accepted *= _WINDOW_DECAY
            if not self._policy_k:
                self.stats.num_skipped_batch += 1
                return False
        return True

    def window_agreement(self) -> float:
        """The per-position agreement the policy decides with: the recent accepted/drafted rate (decayed counts)
        blended with the prior (_PRIOR_AGREEMENT, worth _PRIOR_DRAFTS drafts), converted by spec_policy.agreement
        (k_max taken as the k the drafts were made with)."""
        k = self.k_max
        prior_rate = (tokens_per_cycle(_PRIOR_AGREEMENT, k) - 1.0) / k
        rate = (self._win_accepted + prior_rate * _PRIOR_DRAFTS) / (self._win_draft + _PRIOR_DRAFTS)
        return agreement(rate, k)

    def propose(self, running, params_of) -> int:
        """Put drafts on every decode-ready eligible request of `running` (Request objects whose tokens are all
        known). params_of(request_id) -> SamplingParams. Returns the number of requests given drafts."""
        want = []
        reqs = self._req
        for req in running:  # (lengths read directly, state looked up once: every request, every step)
            num_outputs = len(req.output_token_ids)
            if req.num_pending_tokens or req.num_computed_tokens != len(req.prompt_token_ids) + num_outputs - 1:
                continue  # mid-prefill, or a token still in flight
            st = reqs.get(req.request_id)
            if st is None:
                st = reqs[req.request_id] = _ReqSpec(self.k_max, eligible=self.eligible(params_of(req.request_id)))
            if not st.eligible:
                continue
            k = min(st.k, self._policy_k)
            if req.max_tokens is not None:
                k = min(k, req.max_tokens - num_outputs - 1)
            if k > 0:
                want.append((req, k))
        if not want:
            return 0
        drafts = self.proposer.propose([(req.request_id, req.all_token_ids, k) for req, k in want])
        n = 0
        for req, k in want:
            d = list(drafts.get(req.request_id) or ())[:k]
            req.spec_token_ids = d
            n += bool(d)
        return n

    def pipelined_k(self, req, params_of) -> int:
        """Drafts to ask the device draft source for, for a request whose tokens are known or pending (0: none)."""
        st = self._req.get(req.request_id)
        if st is None:
            st = self._req[req.request_id] = _ReqSpec(self.k_max, eligible=self.eligible(params_of(req.request_id)))
        if not st.eligible:
            return 0
        k = min(st.k, self._policy_k)
        if req.max_tokens is not None:
            k = min(k, req.max_tokens - len(req.output_token_ids) - req.num_pending_tokens - 1)
        return max(k, 0)

    def record(self, request_id: str, num_draft: int, num_accepted: int, num_valid_tokens: int) -> None:
        """A verification came back: num_accepted of num_draft drafts accepted; the request's first
        num_valid_tokens tokens have final KV (the proposer rolls its own cache back to that)."""
        st = self._req.get(request_id)
        if st is None:
            st = self._req[request_id] = _ReqSpec(self.k_max)
        st.num_steps += 1
        st.num_draft += num_draft
        st.num_accepted += num_accepted
        s = self.stats
        s.num_steps += 1
        s.num_draft += num_draft
        s.num_accepted += num_accepted
        self._win_draft += num_draft
        self._win_accepted += num_accepted
        s.num_emitted += num_accepted + 1
        rate = num_accepted / num_draft
        st.ema = (1 - _EMA) * st.ema + _EMA * rate
        if self.adaptive:
            if st.ema < self.min_acceptance:
                st.k = max(1, st.k - 1)
            elif st.ema > (1 + self.min_acceptance) / 2:
                st.k = min(self.k_max, st.k + 1)
        self.proposer.rollback(request_id, num_valid_tokens)

    def request_metrics(self, request_ids) -> dict:
        """Per-request acceptance counters (summed over the sequences of a request with n > 1)."""
        steps = drafts = acc = 0
        for rid in request_ids:
            st = self._req.get(rid)
            if st is not None:
                steps, drafts, acc = steps + st.num_steps, drafts + st.num_draft, acc + st.num_accepted
        return {"spec_verify_steps": steps, "spec_draft_tokens": drafts, "spec_accepted_tokens": acc,
                "spec_acceptance_rate": acc / drafts if drafts else None,
                "spec_mean_accepted_length": (acc + steps) / steps if steps else None}

    def free(self, request_id: str, forget: bool = False) -> None:
        """The request left the running set (finished, aborted or preempted): release the proposer's state.
        forget=True also drops its counters (after its last output was built)."""
        self.proposer.free(request_id)
        if forget:
            self._req.pop(request_id, None)
