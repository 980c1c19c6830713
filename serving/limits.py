"""Operator limits of the server (flags of `jaxinfer serve`), checked before a request reaches the engine.

Every limit refuses with an OpenAI-style 400 whose message names the flag that sets it, so a client knows what to
change and an operator knows what to raise; `/metrics` counts the refusals by reason
(`jaxinfer_rejected_requests_total{reason="limit_<name>"}`).
"""
from __future__ import annotations

import dataclasses

from serving.protocol import ProtocolError


@dataclasses.dataclass
class ServerLimits:
    max_body_bytes: int = 4 * 2**20         # request bodies above this get a 413 before they are read
    max_prompts_per_request: int = 256      # prompts in one /v1/completions request
    max_n: int = 64                         # completions per prompt (`n`)
    max_request_tokens: int | None = 2**17  # sum over prompts of prompt tokens + max_tokens * n; None: no limit
    default_max_tokens: int = 1024          # generated-token cap of a request that gives none (chat)
    request_timeout_s: float | None = None  # a request still running after this ends with finish_reason "length"

    def __post_init__(self):
        for f in ("max_body_bytes", "max_prompts_per_request", "max_n", "default_max_tokens"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{f} must be an int >= 1, got {v!r}")
        if self.max_request_tokens is not None and self.max_request_tokens < 1:
            raise ValueError(f"max_request_tokens must be >= 1 or None, got {self.max_request_tokens!r}")
        if self.request_timeout_s is not None and not self.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0 or None, got {self.request_timeout_s!r}")

    def check(self, num_prompts: int, n: int, prompt_lens: list[int] | None, max_tokens: int, param: str) -> None:
        """Raise a ProtocolError (reason limit_<name>) if a request of `num_prompts` prompts of `prompt_lens` tokens
        (None: not tokenized yet, counted as 0) with `n` and `max_tokens` exceeds a limit; `param` names its
        prompt field."""
        if num_prompts > self.max_prompts_per_request:
            raise ProtocolError(f"the request has {num_prompts} prompts; this server takes at most "
                                f"{self.max_prompts_per_request} per request (--max-prompts-per-request); send "
                                f"several requests", param, reason="limit_prompts")
        if n > self.max_n:
            raise ProtocolError(f"'n' is {n}; this server allows at most {self.max_n} (--max-n)", "n",
                                reason="limit_n")
        if self.max_request_tokens is not None:
            total = sum(prompt_lens or [0] * num_prompts) + num_prompts * max_tokens * n
            if total > self.max_request_tokens:
                raise ProtocolError(f"the request needs up to {total} tokens (prompt tokens + max_tokens {max_tokens} "
                                    f"x n {n}, over {num_prompts} prompt(s)); this server allows "
                                    f"{self.max_request_tokens} per request (--max-request-tokens); lower max_tokens "
                                    f"or n, or split it", "max_tokens", reason="limit_tokens")


def add_limit_args(p) -> None:
    """The limits as `jaxinfer serve` flags (defaults from ServerLimits)."""
    d = ServerLimits()
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes,
                   help="refuse larger request bodies with 413 before reading them")
    p.add_argument("--max-prompts-per-request", type=int, default=d.max_prompts_per_request)
    p.add_argument("--max-n", type=int, default=d.max_n, help="largest `n` (completions per prompt)")
    p.add_argument("--max-request-tokens", type=int, default=d.max_request_tokens,
                   help="largest prompt tokens + max_tokens x n of one request (0: no limit)")
    p.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens,
                   help="generated-token cap of a request that gives no max_tokens")
    p.add_argument("--request-timeout", type=float, default=None, metavar="S",
                   help="end requests still running after S seconds with finish_reason 'length' (default: never)")


def limits_from_args(a) -> ServerLimits:
    return ServerLimits(max_body_bytes=a.max_body_bytes, max_prompts_per_request=a.max_prompts_per_request,
                        max_n=a.max_n, max_request_tokens=a.max_request_tokens or None,
                        default_max_tokens=a.default_max_tokens, request_timeout_s=a.request_timeout)
