"""Engine-side state of a request: one SeqState per sequence (one of a request's n samples), one Group per
request (what the user's request id names). Host code only."""
from __future__ import annotations

import dataclasses

from .detokenizer import IncrementalDetokenizer
from .request import Request
from ..outputs import Logprob
from ..sampling_params import RequestOutputKind, SamplingParams

_CUMULATIVE = RequestOutputKind.CUMULATIVE


@dataclasses.dataclass
class SeqState:
    """Engine-side bookkeeping of one sequence (one of the n samples of a request)."""

    request: Request
    params: SamplingParams
    seed: int
    detok: IncrementalDetokenizer | None
    logprobs: list[dict[int, Logprob]] | None
    cumulative_logprob: float = 0.0  # while it holds an InputBatch slot, the slot's cum_logprob is the value
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    num_prompt_logprobs_done: int = 0  # prompt positions whose logprob is known (survives preemption)
    group_id: str = ""  # the user's request id (several sequences when n > 1)
    # Read once, written into its InputBatch slot at each admission (input_batch.COLUMNS + penalised, prompt lps)
    sampling_row: tuple = ()
    penalised: bool = False  # params.uses_penalties
    # Reporting: output tokens (and logprobs: one per token) already reported, the text the detokenizer returned
    # since the last report, and whether the finish was reported (DELTA reports a completion's finish once).
    num_reported: int = 0
    text_delta: str = ""
    finish_reported: bool = False
    keep_deltas: bool = True  # False for FINAL_ONLY: reported once, with the whole text (no deltas accumulated)
    # A step that gave it a token must pass it to _outputs: always, except for a FINAL_ONLY group whose first-token
    # time is stamped (it reports only at its finish, which comes with `finished`). Offline batches then build
    # nothing per running request per step.
    report_progress: bool = True
    # The only sequence of its group, without logprobs or prompt logprobs: output_builder._single_outputs reports it
    single: bool = dataclasses.field(init=False, default=False)

    def __post_init__(self):
        p = self.params
        self.single = p.n == 1 and self.logprobs is None and self.prompt_logprobs is None
        self.penalised = p.uses_penalties
        self.sampling_row = (p.temperature, p.top_k, p.top_p, p.min_p, self.seed & 0xFFFFFFFF,
                             int(self.logprobs is not None), p.presence_penalty, p.frequency_penalty,
                             p.repetition_penalty, self.penalised, self.prompt_logprobs is not None)


@dataclasses.dataclass
class Group:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seq_ids: list[str]
    arrival_time: float
    first_token_time: float | None = None
    kind: RequestOutputKind = _CUMULATIVE  # what step() reports for it (SamplingParams.output_kind)
    reported: bool = False  # some output was reported (DELTA sends prompt_logprobs in the first one only)
