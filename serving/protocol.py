"""Request parsing and validation for the OpenAI-compatible endpoints (plain functions, no pydantic).

`parse_completion_request(body)` / `parse_chat_request(body)` take the decoded JSON object and return a
`CompletionRequest` / `ChatRequest`, or raise `ProtocolError(message, param)`; the server turns that into an
OpenAI-style 400 body `{"error": {"message", "type": "invalid_request_error", "param", "code": null}}`.
Unknown fields are ignored (clients send many we do not implement). Range checks that SamplingParams already
does (temperature >= 0, top_p in (0, 1], ...) are left to it: `to_sampling_params` maps its ValueError /
TypeError back to a ProtocolError naming the field.
"""
from __future__ import annotations

import dataclasses
import numbers
import re
from typing import Any

from jaxinfer.sampling_params import RequestOutputKind, SamplingParams


class ProtocolError(Exception):
    """A request the server refuses: HTTP `status` with an OpenAI-style body; `reason` labels the refusal in
    /metrics (jaxinfer_rejected_requests_total)."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 type: str = "invalid_request_error", reason: str = "invalid_request"):
        super().__init__(message)
        self.message, self.param, self.status, self.type, self.reason = message, param, status, type, reason


# Fields that change what the answer means but are not implemented: refused (naming them) rather than ignored,
# unless they hold their no-op value.
_UNSUPPORTED = {
    "response_format": lambda v: isinstance(v, dict) and v.get("type") == "text" and len(v) == 1,
    "tools": lambda v: v == [],
    "tool_choice": lambda v: v == "none",
    "functions": lambda v: v == [],
    "function_call": lambda v: v == "none",
    "logit_bias": lambda v: v == {},
    "suffix": lambda v: v == "",
}


def _refuse_unsupported(body: dict) -> None:
    for name, no_op in _UNSUPPORTED.items():
        v = body.get(name)
        if v is not None and not no_op(v):
            raise ProtocolError(f"'{name}' is not supported by this server (it would change the answer); leave it "
                                f"out", name, reason="unsupported_field")
    best_of, n = body.get("best_of"), body.get("n", 1)
    if best_of is not None and best_of != (n if n is not None else 1):
        raise ProtocolError("'best_of' is not supported by this server (only best_of == n); leave it out",
                            "best_of", reason="unsupported_field")


def _check_text(s: str, param: str) -> str:
    """Text must be valid Unicode (JSON escapes can smuggle in lone surrogates the tokenizer cannot encode)."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ProtocolError(f"'{param}' is not valid Unicode text ({e.reason} at character {e.start}); send UTF-8 "
                            f"text", param) from None
    return s


def error_body(message: str, param: str | None = None, type: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": None}}



def _is_int(v) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_num(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _get(body: dict, name: str, kind: str, default=None):
    """body[name] checked against kind ('int', 'num', 'bool', 'str'); None/absent -> default."""
    v = body.get(name, None)
    if v is None:
        return default
    ok = {"int": _is_int, "num": _is_num, "bool": lambda x: isinstance(x, bool),
          "str": lambda x: isinstance(x, str)}[kind](v)
    if not ok:
        want = {"int": "an integer", "num": "a number", "bool": "a boolean", "str": "a string"}[kind]
        raise ProtocolError(f"'{name}' must be {want}, got {type(v).__name__} {v!r}", name)
    if kind == "num":
        try:
            return float(v)
        except OverflowError:  # a 400-digit integer
            raise ProtocolError(f"'{name}' is out of range for a number, got an integer of {len(str(v))} digits",
                                name) from None
    return v


@dataclasses.dataclass
class _Common:
    model: str | None
    max_tokens: int | None
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    seed: int | None
    stop: list[str]
    n: int
    presence_penalty: float
    frequency_penalty: float
    user: str | None
    stream: bool
    include_usage: bool
    logprobs: int | None  # top-N per token for SamplingParams (None = off)
    ignore_eos: bool = False
    min_tokens: int = 0
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    repetition_penalty: float = 1.0  # vLLM extension (not in OpenAI's API)
    stop_token_ids: list | None = None  # vLLM extension

    def to_sampling_params(self) -> SamplingParams:
        kw = dict(n=self.n, max_tokens=self.max_tokens, temperature=self.temperature, top_p=self.top_p,
                  top_k=self.top_k, min_p=self.min_p, seed=self.seed, stop=self.stop, logprobs=self.logprobs,
                  presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
                  repetition_penalty=self.repetition_penalty, ignore_eos=self.ignore_eos, min_tokens=self.min_tokens,
                  skip_special_tokens=self.skip_special_tokens,
                  include_stop_str_in_output=self.include_stop_str_in_output, stop_token_ids=self.stop_token_ids,
                  # streams write what each step added; a plain answer needs only the end
                  output_kind=RequestOutputKind.DELTA if self.stream else RequestOutputKind.FINAL_ONLY)
        try:
            return SamplingParams(**kw)
        except (ValueError, TypeError) as e:
            msg = str(e)
            m = re.match(r"(\w+)", msg)
            param = m.group(1) if m and m.group(1) in kw else None
            raise ProtocolError(msg, param) from None


@dataclasses.dataclass
class CompletionRequest(_Common):
    prompts: list = dataclasses.field(default_factory=list)  # list of str | list[int]
    echo: bool = False


@dataclasses.dataclass
class ChatRequest(_Common):
    messages: list = dataclasses.field(default_factory=list)
    top_logprobs: int = 0
    want_logprobs: bool = False


def _common(body: dict, max_tokens: int | None, logprobs: int | None) -> dict:
    stop = body.get("stop")
    if stop is None:
        stop = []
    elif isinstance(stop, str):
        stop = [stop]
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        stop = [_check_text(s, "stop") for s in stop]
    else:
        raise ProtocolError("'stop' must be a string or a list of strings", "stop")
    if any(not s for s in stop):
        raise ProtocolError("'stop' strings must be non-empty", "stop")
    n = _get(body, "n", "int", 1)
    if n < 1:
        raise ProtocolError(f"'n' must be >= 1, got {n}", "n")
    if max_tokens is not None and max_tokens < 1:
        raise ProtocolError(f"'max_tokens' must be >= 1, got {max_tokens}", "max_tokens")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise ProtocolError("'stream_options' must be an object", "stream_options")
    include_usage = False
    if so:
        include_usage = bool(_get(so, "include_usage", "bool", False))
    stream = _get(body, "stream", "bool", False)
    model = _get(body, "model", "str", None)
    top_k = _get(body, "top_k", "int", -1)
    stop_ids = body.get("stop_token_ids")
    if stop_ids is not None and not (isinstance(stop_ids, list) and all(_is_int(t) for t in stop_ids)):
        raise ProtocolError("'stop_token_ids' must be a list of token ids (integers)", "stop_token_ids")
    return dict(
        model=model, max_tokens=max_tokens, temperature=float(_get(body, "temperature", "num", 1.0)),
        top_p=float(_get(body, "top_p", "num", 1.0)), top_k=top_k,
        min_p=float(_get(body, "min_p", "num", 0.0)), seed=_get(body, "seed", "int", None), stop=stop, n=n,
        presence_penalty=float(_get(body, "presence_penalty", "num", 0.0)),
        frequency_penalty=float(_get(body, "frequency_penalty", "num", 0.0)),
        user=_get(body, "user", "str", None), stream=stream, include_usage=include_usage, logprobs=logprobs,
        ignore_eos=_get(body, "ignore_eos", "bool", False), min_tokens=_get(body, "min_tokens", "int", 0),
        skip_special_tokens=_get(body, "skip_special_tokens", "bool", True),
        include_stop_str_in_output=_get(body, "include_stop_str_in_output", "bool", False),
        repetition_penalty=float(_get(body, "repetition_penalty", "num", 1.0)), stop_token_ids=stop_ids)


def _check_body(body: Any) -> dict:
    if not isinstance(body, dict):
        raise ProtocolError("the request body must be a JSON object", None)
    _refuse_unsupported(body)
    return body


def _parse_prompt(p) -> list:
    """OpenAI prompt forms: str, [str, ...], [int, ...], [[int, ...], ...] -> list of prompts."""
    if isinstance(p, str):
        return [_check_text(p, "prompt")]
    if isinstance(p, list) and p:
        if all(_is_int(t) for t in p):
            return [[int(t) for t in p]]
        if all(isinstance(s, str) for s in p):
            return [_check_text(s, "prompt") for s in p]
        if all(isinstance(s, list) and s and all(_is_int(t) for t in s) for s in p):
            return [[int(t) for t in s] for s in p]
    raise ProtocolError("'prompt' must be a non-empty string, a list of strings, a list of token ids or a list "
                        "of token-id lists", "prompt")


def parse_completion_request(body: Any) -> CompletionRequest:
    body = _check_body(body)
    if body.get("prompt") is None:
        raise ProtocolError("'prompt' is required", "prompt")
    prompts = _parse_prompt(body["prompt"])
    if any(isinstance(p, str) and not p for p in prompts):
        raise ProtocolError("'prompt' must not be empty", "prompt")
    max_tokens = _get(body, "max_tokens", "int", 16)
    logprobs = _get(body, "logprobs", "int", None)
    if logprobs is not None and not 0 <= logprobs <= 20:
        raise ProtocolError(f"'logprobs' must be in [0, 20], got {logprobs}", "logprobs")
    req = CompletionRequest(**_common(body, max_tokens, logprobs), prompts=prompts,
                            echo=_get(body, "echo", "bool", False))
    if req.echo:
        raise ProtocolError("'echo' is not supported", "echo")
    return req


def parse_chat_request(body: Any) -> ChatRequest:
    body = _check_body(body)
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise ProtocolError("'messages' must be a non-empty list of messages", "messages")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ProtocolError(f"'messages[{i}]' must be an object with a string 'role'", f"messages[{i}].role")
        for k, v in m.items():  # the chat template may render any of them
            if isinstance(v, str):
                _check_text(v, f"messages[{i}].{k}")
        content = m.get("content")
        if isinstance(content, list):  # content parts: keep the text ones
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise ProtocolError(f"'messages[{i}].content' parts must be text parts",
                                        f"messages[{i}].content")
                texts.append(part["text"])
            content = "".join(texts)
        if isinstance(content, str):
            _check_text(content, f"messages[{i}].content")
        elif content is not None:
            raise ProtocolError(f"'messages[{i}].content' must be a string or a list of text parts",
                                f"messages[{i}].content")
        out.append({**m, "content": content if content is not None else ""})
    mct = _get(body, "max_completion_tokens", "int", None)
    max_tokens = mct if mct is not None else _get(body, "max_tokens", "int", None)
    if mct is not None and mct < 1:
        raise ProtocolError(f"'max_completion_tokens' must be >= 1, got {mct}", "max_completion_tokens")
    want = _get(body, "logprobs", "bool", False)
    top = _get(body, "top_logprobs", "int", None)
    if top is not None:
        if not 0 <= top <= 20:
            raise ProtocolError(f"'top_logprobs' must be in [0, 20], got {top}", "top_logprobs")
        if not want:
            raise ProtocolError("'top_logprobs' needs 'logprobs': true", "top_logprobs")
    top = top or 0
    return ChatRequest(**_common(body, max_tokens, top if want else None), messages=out, top_logprobs=top,
                       want_logprobs=want)
