"""The plain types that cross the engine's two walls (no jax; numpy only in annotations).

The user wall: what `generate()` / `LLM.generate()` return, dataclasses shaped like vLLM's outputs. One RequestOutput per prompt; it holds `n` CompletionOutputs. What a step reports depends on the request's
`SamplingParams.output_kind` (sampling_params.RequestOutputKind): CUMULATIVE (default) a snapshot of the request
so far (`finished=False`) every step it progressed; DELTA only what this step added; FINAL_ONLY one output at the
end. The last output has `finished=True` and every completion's `finish_reason` set (in DELTA mode: every
completion's finish_reason was set in exactly one output). In every kind, `delta_text` / `delta_token_ids` are
what this step added (the same as `text` / `token_ids` in DELTA mode).

The host/device wall: the engine (jaxinfer/engine/, host only) hands the runner (jaxinfer/runner/, device) a
`StepBatch` per step (columns, built from engine/input_batch.py's persistent per-slot state; the draft model's
paths and tests still hand a list of `SeqInput`) and gets a `RunnerOutput` back; `Runner` is the protocol the engine calls. Neither
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


# ---- the host/device wall --------------------------------------------------------------------------------------

@dataclasses.dataclass
class SeqInput:
    """One sequence's share of a step: the tokens to compute, where they start, its pages and sampling settings.
    Invariant: page_table covers positions [0, start_pos + len(token_ids))."""
    # Built positionally (runner/draft_proposer.py; engine.py did until the StepBatch): add new fields at the end.
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
class StepBatch:
    """One step's sequences as columns (engine/input_batch.InputBatch.make_step builds it, runner/batch.pack_step
    packs it into the same arrays as runner/batch.pack of the equivalent SeqInput list).

    n = sequences of the step, N = their tokens, S x W = the engine's persistent slot tables. Sequence i lives in
    row rows[i] of the slot tables; those tables belong to the engine and change at its next make_step, so a
    StepBatch is packed during the dispatch it is given to and never kept.
    Invariants: page_table[r, :num_pages[r]] are row r's pages in token order and page_table[r, num_pages[r]:] is 0;
    every sequence's pages cover starts[i] + lens[i] tokens."""
    token_ids: np.ndarray      # i64[N] the sequences' tokens, concatenated (a placeholder's value is ignored)
    lens: np.ndarray           # i64[n] tokens of each sequence (>= 1)
    starts: np.ndarray         # i64[n] position of each sequence's first token
    rows: np.ndarray           # i64[n] slot row of each sequence
    prev_row: np.ndarray       # i64[n] >= 0: the last token is a placeholder filled from that row of the previous step
    step: np.ndarray           # i32[n] index of the token each sequence samples
    num_spec: np.ndarray       # i64[n] draft tokens at the end of each sequence (0: none)
    penalty_slot: np.ndarray   # i32[n] penalty-table row of a penalised sampling sequence, else -1
    page_table: np.ndarray     # i32[S, W] slot rows' pages (see invariants)
    num_pages: np.ndarray      # i32[S]
    # slot columns [S]: temperature top_p min_p presence_penalty frequency_penalty repetition_penalty (f32),
    # top_k want_logprobs (i32), seed (u32)
    sampling: dict[str, np.ndarray]
    penalty_inits: dict[int, tuple] = dataclasses.field(default_factory=dict)  # seq -> (slot, prompt, outputs)
    # A steady decode step made from the step before (InputBatch.make_step's continuation): `serial` numbers the
    # step (0: none), `base` is the serial of the step it continues (0: none) and `changed` the batch indices whose
    # page row changed since it. A continuation equals its base in everything but starts, step, prev_row,
    # penalty_slot and the `changed` page rows (same rows, one placeholder token each, no drafts, the same slot
    # columns), so that pack_step may patch the base's packed arrays instead of packing anew.
    serial: int = 0
    base: int = 0
    changed: np.ndarray | None = None
    root: int = 0  # the serial of the first step of its line of continuations (itself for that one)

    @property
    def num_seqs(self) -> int:
        return len(self.lens)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def select(self, idx: Sequence[int], drop_penalty_slots: bool = False) -> "StepBatch":
        """The step restricted to sequences `idx` (in that order); drop_penalty_slots: their samples are not
        counted into the penalty table (probe dispatches, engine/isolation.py)."""
        import numpy as np

        idx = np.asarray(idx, np.int64)
        offsets = np.concatenate([[0], np.cumsum(self.lens)])
        tok = (np.concatenate([np.arange(offsets[i], offsets[i + 1]) for i in idx.tolist()]) if idx.size
               else np.zeros(0, np.int64))
        pos = {int(i): k for k, i in enumerate(idx.tolist())}
        return StepBatch(self.token_ids[tok], self.lens[idx], self.starts[idx], self.rows[idx], self.prev_row[idx],
                         self.step[idx], self.num_spec[idx],
                         np.full(len(idx), -1, np.int32) if drop_penalty_slots else self.penalty_slot[idx],
                         self.page_table, self.num_pages, self.sampling,
                         {pos[i]: v for i, v in self.penalty_inits.items() if i in pos})


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

    def dispatch(self, seqs: "StepBatch | Sequence[SeqInput]", prev: Any = None,
                 prompt_logprob_targets: dict[int, Any] | None = None) -> Any: ...

    def fetch(self, flight: Any) -> RunnerOutput: ...
