"""What `generate()` / `LLM.generate()` return: plain dataclasses shaped like vLLM's outputs (no jax, no numpy).

One RequestOutput per prompt; it holds `n` CompletionOutputs. What a step reports depends on the request's
`SamplingParams.output_kind` (sampling_params.RequestOutputKind): CUMULATIVE (default) a snapshot of the request
so far (`finished=False`) every step it progressed; DELTA only what this step added; FINAL_ONLY one output at the
end. The last output has `finished=True` and every completion's `finish_reason` set (in DELTA mode: every
completion's finish_reason was set in exactly one output). In every kind, `delta_text` / `delta_token_ids` are
what this step added (the same as `text` / `token_ids` in DELTA mode).
"""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class Logprob:
    """Log-probability of one token (under the model's unmodified distribution, log_softmax of the logits)."""
    logprob: float
    rank: int | None = None           # 1 = the most likely token; None when unknown
    decoded_token: str | None = None  # the token's text, when detokenized


@dataclasses.dataclass
class CompletionOutput:
    """One generated sequence of a request."""
    index: int                      # which of the request's n completions (0..n-1)
    text: str                       # generated text (stop string removed unless include_stop_str_in_output)
    token_ids: list[int]            # generated token ids (including a final EOS / stop token, if any)
    cumulative_logprob: float | None = None  # sum of the sampled tokens' logprobs (None if not computed)
    # per generated token: {token_id: Logprob} for the sampled token plus the top-N (None unless requested)
    logprobs: list[dict[int, Logprob]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"; None while still running
    stop_reason: int | str | None = None  # the stop token id or stop string that ended it; None for eos/length
    delta_text: str = ""            # the text this step added (== text in DELTA mode)
    delta_token_ids: list[int] = dataclasses.field(default_factory=list)  # the token ids this step added

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclasses.dataclass
class RequestOutput:
    """All completions of one prompt (a snapshot while streaming, final when `finished`)."""
    request_id: str
    prompt: str | None               # the prompt text, when the request was given as text
    prompt_token_ids: list[int]
    # per prompt token: {token_id: Logprob} or None (the first token has no logprob); None unless requested
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]
    finished: bool
    metrics: dict[str, Any] | None = None  # timings (e.g. arrival/first-token/finish times), when recorded
    # Set (with finished=True, finish_reason "abort") when the engine ended this request because a step failed on
    # it; the other requests of that step went on.
    error: str | None = None
