"""SamplingParams: how to generate one request's completion(s), validated at construction.

Every field is checked in `__post_init__`; a bad value raises ValueError and a value of the wrong type raises
TypeError, both naming the field, the value and what is allowed, so a typo in a request fails at `generate()`
time instead of deep inside a jitted sampler. Values are normalised (ints/floats coerced from numpy scalars,
`stop` -> list[str], `stop_token_ids` -> list[int]) so downstream code never re-checks them.

The dataclass is mutable (like vLLM's), but assignments after construction are not re-validated: derive a
modified copy with `clone(**changes)`, which validates again.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import numbers
from typing import Any

# Top-N logprobs the device returns per token (the sampler's lax.top_k width); `logprobs` and
# `prompt_logprobs` may ask for at most this many.
MAX_LOGPROBS = 20
# Integers that become int32 on the device (top_k, token ids) or are compared with int32 counters (n, max_tokens,
# min_tokens) must fit it: a larger one would pass validation and then fail the whole batch's step when packed.
INT32_MAX = 2**31 - 1
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38  # the smallest normal float32: a smaller top_p would be 0 on the device


class RequestOutputKind(enum.IntEnum):
    """What `LLMEngine.step()` reports for a request (vLLM's RequestOutputKind).

    CUMULATIVE: every step that produced something, the whole output so far (text, token_ids, logprobs).
    DELTA:      every step that produced something, only the new part: text / token_ids / logprobs are what this
                step added (concatenating a request's outputs gives the CUMULATIVE final); a completion appears only
                in the steps where it produced tokens or text or finished; prompt_logprobs only in the first one.
    FINAL_ONLY: one output per request, once every completion has finished (the CUMULATIVE final).
    """
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


def _as_output_kind(value: Any) -> RequestOutputKind:
    if isinstance(value, RequestOutputKind):
        return value
    if isinstance(value, str) and value.upper() in RequestOutputKind.__members__:
        return RequestOutputKind[value.upper()]
    names = ", ".join(k.name for k in RequestOutputKind)
    if isinstance(value, str):
        raise ValueError(f"output_kind must be one of {names} (a RequestOutputKind or its name), got {value!r}")
    raise TypeError(f"output_kind must be a RequestOutputKind ({names}), got {value!r} ({_type_name(value)})")


def _type_name(value: Any) -> str:
    return type(value).__name__


def _as_int(name: str, value: Any) -> int:
    # bool is an int subclass, but `n=True` is a bug, not a count.
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r} ({_type_name(value)})")
    return int(value)


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {value!r} ({_type_name(value)})")
    value = float(value)
    if math.isnan(value):
        raise ValueError(f"{name} must be a number, got nan")
    return value


def _as_bool(name: str, value: Any) -> bool:
    # Accept numpy bools too, but not 0/1 or strings ("false" would be truthy).
    if isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_")):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {value!r} ({_type_name(value)})")


def _as_opt_int(name: str, value: Any) -> int | None:
    return None if value is None else _as_int(name, value)


@dataclasses.dataclass
class SamplingParams:
    n: int = 1                               # completions per prompt (>= 1)
    max_tokens: int | None = 16              # >= 1; None = until the context window is full
    temperature: float = 1.0                 # >= 0; 0 means greedy (argmax)
    top_p: float = 1.0                       # (0, 1]; 1 = off
    top_k: int = -1                          # -1 = off, else >= 1 (0 is accepted as "off" -> -1)
    min_p: float = 0.0                       # [0, 1]; 0 = off
    seed: int | None = None                  # per-request PRNG seed (any int: its low 32 bits); None = engine picks
    stop: str | list[str] | None = None      # stop strings -> normalised to list[str]
    stop_token_ids: list[int] | None = None  # extra stop tokens -> normalised to list[int]
    ignore_eos: bool = False                 # keep generating past EOS (benchmarks)
    logprobs: int | None = None              # top-N logprobs per generated token, 0..MAX_LOGPROBS (0 = sampled only)
    prompt_logprobs: int | None = None       # top-N logprobs per prompt token, 0..MAX_LOGPROBS
    presence_penalty: float = 0.0            # [-2, 2]
    frequency_penalty: float = 0.0           # [-2, 2]
    repetition_penalty: float = 1.0          # (0, 2]; 1 = off
    skip_special_tokens: bool = True         # drop special tokens from the output text
    include_stop_str_in_output: bool = False  # keep the matched stop string at the end of the text
    min_tokens: int = 0                      # EOS / stop tokens / stop strings are ignored before this many tokens
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE  # what step() reports (RequestOutputKind)

    def __post_init__(self) -> None:
        self.n = _as_int("n", self.n)
        if not 1 <= self.n <= INT32_MAX:
            raise ValueError(f"n must be >= 1 (and <= {INT32_MAX}), got {self.n}")

        self.max_tokens = _as_opt_int("max_tokens", self.max_tokens)
        if self.max_tokens is not None and not 1 <= self.max_tokens <= INT32_MAX:
            raise ValueError(f"max_tokens must be >= 1 (and <= {INT32_MAX}) or None, got {self.max_tokens}")

        self.temperature = _as_float("temperature", self.temperature)
        if not 0.0 <= self.temperature <= FLOAT32_MAX:
            raise ValueError(f"temperature must be >= 0 (0 means greedy), got {self.temperature} (and at most "
                             f"{FLOAT32_MAX:.4g}, float32's largest)")

        self.top_p = _as_float("top_p", self.top_p)
        if not FLOAT32_TINY <= self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p} (and at least {FLOAT32_TINY:.4g}, "
                             f"float32's smallest normal)")

        self.top_k = _as_int("top_k", self.top_k)
        if self.top_k == 0:  # vLLM spells "off" as 0 or -1; keep one spelling downstream
            self.top_k = -1
        if not -1 <= self.top_k <= INT32_MAX:
            raise ValueError(f"top_k must be -1 (off) or in [1, {INT32_MAX}] (it is int32 on the device), "
                             f"got {self.top_k}")

        self.min_p = _as_float("min_p", self.min_p)
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")

        self.seed = _as_opt_int("seed", self.seed)

        self.stop = self._normalise_stop(self.stop)
        self.stop_token_ids = self._normalise_stop_token_ids(self.stop_token_ids)
        self.ignore_eos = _as_bool("ignore_eos", self.ignore_eos)

        for name in ("logprobs", "prompt_logprobs"):
            value = _as_opt_int(name, getattr(self, name))
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}] or None, got {value}")
            setattr(self, name, value)

        for name in ("presence_penalty", "frequency_penalty"):
            value = _as_float(name, getattr(self, name))
            if not -2.0 <= value <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {value}")
            setattr(self, name, value)

        self.repetition_penalty = _as_float("repetition_penalty", self.repetition_penalty)
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")

        self.skip_special_tokens = _as_bool("skip_special_tokens", self.skip_special_tokens)
        self.include_stop_str_in_output = _as_bool("include_stop_str_in_output", self.include_stop_str_in_output)

        self.min_tokens = _as_int("min_tokens", self.min_tokens)
        if not 0 <= self.min_tokens <= INT32_MAX:
            raise ValueError(f"min_tokens must be >= 0 (and <= {INT32_MAX}), got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise ValueError(f"min_tokens must be <= max_tokens, got min_tokens={self.min_tokens} "
                             f"> max_tokens={self.max_tokens}")

        self.output_kind = _as_output_kind(self.output_kind)

    @property
    def uses_penalties(self) -> bool:
        """Any of presence / frequency / repetition penalty away from its neutral value."""
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    # ---- normalisation helpers ----------------------------------------------------------------------
    @staticmethod
    def _normalise_stop(stop: Any) -> list[str]:
        if stop is None:
            return []
        if isinstance(stop, str):
            stop = [stop]
        elif not isinstance(stop, (list, tuple)):
            raise TypeError(f"stop must be a str, a list of str or None, got {stop!r} ({_type_name(stop)})")
        out = []
        for i, s in enumerate(stop):
            if not isinstance(s, str):
                raise TypeError(f"stop[{i}] must be a str, got {s!r} ({_type_name(s)})")
            if not s:
                raise ValueError(f"stop[{i}] is an empty string; stop strings must be non-empty")
            out.append(s)
        return out

    @staticmethod
    def _normalise_stop_token_ids(ids: Any) -> list[int]:
        if ids is None:
            return []
        if isinstance(ids, (str, bytes)) or not isinstance(ids, (list, tuple)):
            raise TypeError(f"stop_token_ids must be a list of int or None, got {ids!r} ({_type_name(ids)})")
        out = []
        for i, t in enumerate(ids):
            t = _as_int(f"stop_token_ids[{i}]", t)
            if not 0 <= t <= INT32_MAX:
                raise ValueError(f"stop_token_ids[{i}] must be a token id >= 0 (and <= {INT32_MAX}), got {t}")
            out.append(t)
        return out

    # ---- conveniences -------------------------------------------------------------------------------
    @property
    def greedy(self) -> bool:
        """True when sampling is argmax (temperature == 0); top_p/top_k/min_p/seed are then irrelevant."""
        return self.temperature == 0.0

    def clone(self, **changes: Any) -> "SamplingParams":
        """A validated copy with `changes` applied (unknown field names raise TypeError)."""
        return dataclasses.replace(self, **changes)
