"""Request: the host-side state of one generation request (plain Python, never imports jax).

The scheduler "speaks tokens, not phases": a request is just a token list (prompt + outputs so far) and a
counter `num_computed_tokens` of how many of them already have KV entries in the cache. Prefill, chunked
prefill, decode, recompute after preemption, prefix-cache hits (and later speculative tokens) are all the
same case: compute tokens [num_computed_tokens, num_tokens). A prefix-cache hit simply starts a new request
with num_computed_tokens > 0.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class RequestStatus(enum.Enum):
    WAITING = "waiting"            # queued, holds no KV pages
    RUNNING = "running"            # admitted, holds KV pages for (at least) its computed tokens
    PREEMPTED = "preempted"        # evicted from the cache; queued again (front), will recompute prompt+outputs
    FINISHED_STOPPED = "finished_stopped"  # eos / stop token / stop string
    FINISHED_LENGTH = "finished_length"    # max_tokens or max_model_len reached
    FINISHED_ABORTED = "finished_aborted"  # aborted by the user / engine

    @property
    def is_finished(self) -> bool:
        # by value: an enum member's __hash__ is Python code (~0.3 µs), a str's is cached (asked per request per step)
        return self._value_ in _FINISHED_VALUES


_FINISHED = frozenset({RequestStatus.FINISHED_STOPPED, RequestStatus.FINISHED_LENGTH,
                       RequestStatus.FINISHED_ABORTED})
_FINISHED_VALUES = frozenset(s.value for s in _FINISHED)

# OpenAI / vLLM finish_reason strings.
_FINISH_REASON = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


# Request.stop_check: a sampled token may end the request by length only / by length or an eos id / always check
STOP_CHECK_LENGTH, STOP_CHECK_EOS, STOP_CHECK_ALWAYS = 0, 1, 2


# identity equality: two requests are never "equal". slots: the scheduler touches every running request several
# times per step, and a slotted object is one compact block (no per-instance __dict__ to look attributes up in).
@dataclass(eq=False, slots=True)
class Request:
    """Host state of one sequence.

    `sampling` is any object with `.max_tokens` (int | None), `.stop_token_ids` (list[int] | None) and
    `.ignore_eos` (bool) — normally a SamplingParams; the scheduler reads nothing else from it
    (plus an optional `.min_tokens`, default 0).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling: Any
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0          # tokens whose KV is in the cache or being computed by a step in flight
    num_pending_tokens: int = 0           # tokens sampled by a step in flight, not yet known on the host
    status: RequestStatus = RequestStatus.WAITING
    arrival_index: int = -1               # set by Scheduler.add_request (monotonic admission order)
    num_preemptions: int = 0
    stop_reason: int | str | None = None  # stop token id or stop string that ended it (None for eos/length)
    # Prefix caching. use_prefix_cache=False: admission never looks the request up in the cache (it computes
    # every token; the engine sets this for prompt_logprobs requests). Its finished pages are still cached.
    use_prefix_cache: bool = True
    # Chained hashes of the full pages of all_token_ids (filled lazily by the KVCacheManager; stable, since
    # tokens are only ever appended — preemption keeps the outputs).
    page_hashes: list = field(default_factory=list, repr=False)
    # Speculative decoding: draft tokens proposed for the next step (set by the engine right before
    # schedule(), consumed or dropped by it). A decode-ready request with drafts is scheduled as one chunk of
    # [last token] + drafts; update() rolls num_computed_tokens back past the rejected ones.
    spec_token_ids: list[int] = field(default_factory=list, repr=False)
    # Read from `sampling` once, in __post_init__.
    max_tokens: int | None = field(init=False, repr=False, default=None)
    stop_token_ids: frozenset = field(init=False, repr=False, default=frozenset())
    ignore_eos: bool = field(init=False, repr=False, default=False)
    min_tokens: int = field(init=False, repr=False, default=0)
    # Set by Scheduler.add_request: min(max_tokens, max_model_len - prompt), the output count that ends it by length.
    output_limit: int = field(init=False, repr=False, default=0)
    # Which sampled tokens may stop it, for the columnar stop checks (engine/decode_run.py): STOP_CHECK_* above.
    stop_check: int = field(init=False, repr=False, default=0)

    def __post_init__(self) -> None:
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.output_token_ids = list(self.output_token_ids)
        # The sampling knobs the scheduler reads every step, read once (the scheduler's per-step cost is per
        # request, so attribute lookups through `sampling` showed up in host profiles at batch 256).
        sp = self.sampling
        self.max_tokens = getattr(sp, "max_tokens", None)
        self.stop_token_ids = frozenset(getattr(sp, "stop_token_ids", None) or ())
        self.ignore_eos = bool(getattr(sp, "ignore_eos", False))
        self.min_tokens = int(getattr(sp, "min_tokens", 0) or 0)
        self.stop_check = (STOP_CHECK_ALWAYS if self.stop_token_ids else
                           STOP_CHECK_LENGTH if self.ignore_eos else STOP_CHECK_EOS)

    # ---- token views -------------------------------------------------------------------------------
    @property
    def all_token_ids(self) -> list[int]:
        """prompt + outputs (a new list each call; use num_tokens for the length)."""
        return self.prompt_token_ids + self.output_token_ids

    def token_slice(self, start: int, stop: int) -> list[int]:
        """all_token_ids[start:stop] without building the whole concatenation."""
        p = len(self.prompt_token_ids)
        if stop <= p:
            return self.prompt_token_ids[start:stop]
        if start >= p:
            return self.output_token_ids[start - p:stop - p]
        return self.prompt_token_ids[start:] + self.output_token_ids[:stop - p]

    @property
    def num_tokens_with_pending(self) -> int:
        """Known tokens plus those a step in flight is sampling (their ids arrive with update())."""
        return len(self.prompt_token_ids) + len(self.output_token_ids) + self.num_pending_tokens

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    # ---- status ------------------------------------------------------------------------------------
    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        """'stop' | 'length' | 'abort' once finished, else None."""
        return _FINISH_REASON.get(self.status)

    def __repr__(self) -> str:  # short: requests hold long token lists
        return (f"Request({self.request_id!r}, status={self.status.name}, prompt={self.num_prompt_tokens}, "
                f"outputs={self.num_output_tokens}, computed={self.num_computed_tokens})")
