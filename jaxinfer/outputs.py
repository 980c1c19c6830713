"""The plain types that cross the engine's two walls (no jax; numpy only in annotations).

The user wall: what `generate()` / `LLM.generate()` return, dataclasses shaped like vLLM's outputs. One
RequestOutput per prompt; it holds `n` CompletionOutputs. While streaming, a RequestOutput is a snapshot of the
request so far (`finished=False`); the last one has `finished=True` and every completion's `finish_reason` set.

The host/device wall: the engine (jaxinfer/engine/, host only) hands the runner (jaxinfer/runner/, device) a
list of `SeqInput` per step and gets a `RunnerOutput` back; `Runner` is the protocol the engine calls. Neither
package imports the other: both import these types from here, and jaxinfer/api.py wires a runner into an engine.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol, Sequence

if TYPE_CHECKING:  # annotations only: the host side never imports numpy for these types
    import numpy as np


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


# ---- the host/device wall --------------------------------------------------------------------------------------

@dataclasses.dataclass
class SeqInput:
    """One sequence's share of a step: the tokens to compute, where they start, its pages and sampling settings.
    Invariant: page_table covers positions [0, start_pos + len(token_ids))."""
    # engine.py builds it positionally up to prev_row (hot path): add new fields at the end.
    token_ids: Sequence[int]   # tokens computed this step (prefill chunk, or the one decode token)
    start_pos: int             # position of token_ids[0]
    page_table: Sequence[int]  # all pages of the sequence (cover start_pos + len(token_ids) tokens)
    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int = 0
    step: int = 0              # index of the token being sampled (number generated so far)
    want_logprobs: bool = False  # the request asked for logprobs: the step computes the top-20 (else skipped)
    prev_row: int = -1         # >= 0: the last token is a placeholder (-1), sampled by the previous step (still in
                               # flight) in its output row `prev_row`; the device fills it in
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    penalty_slot: int = -1     # >= 0: row of the device token-count table that penalises this row's sample and
                               # counts it (only rows that sample; -1 for the others)
    penalty_init: tuple | None = None  # (slot, prompt ids, known output ids): write that row before this step
    num_spec: int = 0          # speculative decoding: the last num_spec tokens are drafts to verify (needs a
                               # verify row: bucket.spec_rows > 0)


@dataclasses.dataclass
class RunnerOutput:
    """What one step sends back to the host: only small arrays (one row per sequence of the step)."""
    tokens: np.ndarray        # i32[num_seqs]
    logprobs: np.ndarray      # f32[num_seqs]
    top_ids: np.ndarray | None       # i32[num_seqs, 20]; None when no sequence of the step asked for logprobs
    top_logprobs: np.ndarray | None  # f32[num_seqs, 20]; likewise
    prompt_logprobs: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]  # seq index -> (lp[n], ids[n,20], lp[n,20])
    # speculative decoding, per sequence (zeros for sequences that did not verify drafts):
    spec_tokens: np.ndarray | None = None     # i32[num_seqs, K+1]: the first num_accepted + 1 are emitted
    num_accepted: np.ndarray | None = None    # i32[num_seqs]
    spec_logprobs: np.ndarray | None = None   # f32[num_seqs, K+1]


class Runner(Protocol):
    """What the engine needs from a device runner (runner/model_runner.ModelRunner implements it).

    dispatch launches one step and returns at once with a handle (`prev`: the previous step's handle, whose
    sampled tokens fill the placeholders of `seqs`); fetch waits for that step and returns its RunnerOutput."""
    num_pages: int
    page_size: int

    def dispatch(self, seqs: Sequence[SeqInput], prev: Any = None,
                 prompt_logprob_targets: dict[int, Any] | None = None) -> Any: ...

    def fetch(self, flight: Any) -> RunnerOutput: ...
