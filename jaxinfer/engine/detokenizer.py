"""IncrementalDetokenizer: turn a stream of generated token ids into text deltas, and watch for stop strings.

Host only (never imports jax). One instance per generated sequence; `append()` once per engine step.

Decoding (the prefix_offset / read_offset technique of vLLM and TGI)
--------------------------------------------------------------------
Decoding each new token on its own is wrong: byte-level BPE splits one character over several tokens
('中' = E4 B8 AD may be 2-3 tokens, each decoding to U+FFFD alone) and SentencePiece-style decoders drop the
leading space of the first token of a decode. Re-decoding the whole output every step is right but O(total).
So we keep all ids and two offsets into them:

    ids:  ... | context (prefix_offset:read_offset) | pending (read_offset:) |
    tail = decode(ids[prefix_offset:]) minus its prefix decode(ids[prefix_offset:read_offset])

`tail` is exactly the text of the pending tokens: the context decodes identically in both calls (same start,
so the same leading-space handling), and read_offset always sits on a character boundary. The context is usually
one token, whose decoded length comes from a per-tokenizer cache of one-token lengths: a token then costs one
decode of two tokens, not two decodes (a decode costs ~0.4 µs a call and ~0.25 µs a token on the CPU box; 12-07,
`benchmarks/probes/detok_cost.py`: 2.7-4.1 -> 1.8-2.8 µs a token of real text). Tokens are taken one at a
time: if `tail` ends with U+FFFD the last character is (probably) still incomplete, so the token stays pending
and we accept only the text before the trailing U+FFFD run (characters decoded before it can no longer change);
otherwise the token ends on a character boundary, the pending tokens become the new context and
read_offset moves past it. The window is therefore the tokens since the last character boundary plus the run
before it — a handful of tokens — never the whole output.

A stream with no character boundary for MAX_PENDING_TOKENS tokens (a model emitting bytes that are not valid
UTF-8; valid text would need that many consecutive tokens each ending mid-character) is cut there: its U+FFFD
text is emitted as is and decoding restarts after it, so the cost stays bounded. For every stream that does not
hit the cut-off, the concatenated output of a byte-level BPE tokenizer equals `tokenizer.decode(output ids)`
exactly, invalid bytes included; for byte-fallback (SentencePiece) tokenizers it does for valid UTF-8.

Stop strings
------------
Stop strings are searched only where a new match can be: the newly accepted text plus the last
len(longest stop) - 1 characters before it. The match that *completes first* wins (smallest end, then earliest
start) — the match a character-by-character stream would see, so the result does not depend on how tokens
are grouped into appends. The text is cut right before the match (or right after it with
include_stop_str_in_output). So that no prefix of a stop string leaks out before we know it is not one, the
last len(longest stop) - 1 characters are held back from every delta (unless include_stop_str_in_output,
where they would be emitted either way); `flush()` releases them when the sequence ends without a stop match.
"""
from __future__ import annotations

from typing import Iterable, Protocol, Sequence

REPLACEMENT_CHAR = "\ufffd"
# Prompt tokens decoded as context for the first output tokens (leading spaces, characters split at the seam).
INITIAL_CONTEXT_TOKENS = 5
# Tokens kept pending while the tail ends in U+FFFD before we give up and emit it (see module docstring).
MAX_PENDING_TOKENS = 64


def _one_token_lengths(tokenizer, skip_special_tokens: bool) -> dict[int, int]:
    """{token id: len(tokenizer.decode([id]))} for this tokenizer and skip flag, kept on the tokenizer object (one
    cache for all of its sequences; at most its vocabulary's size)."""
    attrs = getattr(tokenizer, "__dict__", None)
    if attrs is None:   # (an object without attributes: a cache of this detokenizer's own)
        return {}
    return attrs.setdefault("_detok_one_token_len", {}).setdefault(bool(skip_special_tokens), {})


class _Decoder(Protocol):  # what we need from jaxinfer.tokenizer.Tokenizer
    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str: ...


class IncrementalDetokenizer:
    """Incremental text of one generated sequence.

    append(ids) -> (delta, stop): `delta` is new text safe to show now; `stop` is the stop string that just
    matched (the sequence is then finished: the caller ends the request with finish_reason "stop" and
    stop_reason=stop; later appends return ("", None)). flush() -> the held-back text, at the end.
    """

    def __init__(self, tokenizer: _Decoder, prompt_token_ids: Sequence[int], skip_special_tokens: bool = True,
                 stop: Iterable[str] | None = None, include_stop_str_in_output: bool = False,
                 min_tokens: int = 0):
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._stop = list(stop or ())
        for s in self._stop:
            if not isinstance(s, str) or not s:
                raise ValueError(f"stop strings must be non-empty str, got {s!r}")
        self._include_stop = include_stop_str_in_output
        self._min_tokens = min_tokens  # stop strings are not checked until more tokens than this were generated

        # Characters of look-back for matches straddling the previous text, and characters held back.
        self._lookback = max((len(s) for s in self._stop), default=1) - 1
        self._hold = 0 if include_stop_str_in_output else self._lookback

        # The decoder: the tokenizer's list-of-int decoder where it has one (jaxinfer.tokenizer.Tokenizer.decoder:
        # the Rust tokenizer's own decode, without decode()'s argument checks), else its decode (any _Decoder);
        # and the lengths of one-token decodes, shared by the tokenizer's detokenizers (see module docstring).
        decoder = getattr(tokenizer, "decoder", None)
        self._decode = decoder(skip_special_tokens) if decoder is not None else self._decode_any
        self._one_token_len = _one_token_lengths(tokenizer, skip_special_tokens)
        # Token window: ids[prefix_offset:read_offset] is context, ids[read_offset:] pending. It starts with a few
        # prompt tokens as context, so the first output token decodes as a continuation (leading space kept).
        self._ids: list[int] = self._initial_context(prompt_token_ids)
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._prefix_len: int | None = None  # len(decode(ids[prefix_offset:read_offset])), cached
        self._pending_chars = 0  # chars of the pending tokens' text already accepted (text before a U+FFFD run)

        # Text state: emitted chunks, accepted-but-held text, and the look-back tail for stop matching.
        self._chunks: list[str] = []
        self._text_cache: str | None = ""
        self._held = ""
        self._tail = ""
        self._num_output_tokens = 0
        self.stop_reason: str | None = None  # the matched stop string, once one matched
        self.finished = False                # a stop string matched, or flush() was called

    # ---- public -------------------------------------------------------------------------------------
    def append(self, new_token_ids: Sequence[int], stop_terminated: bool = False) -> tuple[str, str | None]:
        """Feed newly generated token ids; return (text delta safe to emit now, matched stop string or None).

        stop_terminated: the last id ended the sequence as an EOS / stop token id; its text is then left out
        (vLLM's behaviour) unless include_stop_str_in_output.
        """
        if self.finished:
            return "", None
        if len(new_token_ids) == 1 and not stop_terminated:   # a plain step's one token
            self._num_output_tokens += 1
            return self._accept(self._step(int(new_token_ids[0])))
        ids = [int(t) for t in new_token_ids]
        self._num_output_tokens += len(ids)
        if stop_terminated and ids and not self._include_stop:
            ids.pop()
        new_text = self._decode_new(ids, final=False) if ids else ""
        return self._accept(new_text)

    def flush(self) -> str:
        """The sequence ended without a stop-string match: return everything still held back.

        Also decodes tokens still pending on an incomplete character (their U+FFFD text is final now).
        """
        if self.finished:
            return ""
        delta, stop = self._accept(self._decode_new([], final=True))
        if stop is None:
            delta += self._held
            self._emit(self._held)
            self._held = ""
        self.finished = True
        return delta

    @property
    def text(self) -> str:
        """All text emitted so far (the concatenation of the returned deltas)."""
        if self._text_cache is None:
            self._text_cache = "".join(self._chunks)
            self._chunks = [self._text_cache] if self._text_cache else []
        return self._text_cache

    @property
    def num_pending_tokens(self) -> int:
        """Tokens whose text is not fully known yet (mid-character)."""
        return len(self._ids) - self._read_offset

    # ---- decoding -----------------------------------------------------------------------------------
    def _decode_any(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special)

    def _initial_context(self, prompt_token_ids: Sequence[int]) -> list[int]:
        """The last few prompt tokens, as many (<= INITIAL_CONTEXT_TOKENS) as end on a character boundary.

        A window starting mid-character may decode to U+FFFD junk at its start (harmless: both decodes of a
        step share it) or, with byte-fallback decoders, turn a whole byte run into U+FFFD (then try fewer
        tokens). If the prompt itself ends mid-character, use no context and decode the output on its own.
        """
        tail = [int(t) for t in prompt_token_ids[max(0, len(prompt_token_ids) - INITIAL_CONTEXT_TOKENS):]]
        for k in range(len(tail), 0, -1):
            if not self._decode(tail[-k:]).endswith(REPLACEMENT_CHAR):
                return tail[-k:]
        return []

    def _decode_new(self, ids: list[int], final: bool) -> str:
        """Append `ids` to the window one at a time; return the newly accepted text (see module docstring).

        Token by token, so that every token boundary that falls between two characters becomes the new
        read_offset: the window then never holds more than the tokens of one unfinished character (plus the
        previous token run as context), whatever the chunking of the appends.
        """
        out = [self._step(t) for t in ids]
        if final and self._read_offset < len(self._ids):
            out.append(self._step(None))
        return "".join(out)

    def _step(self, token: int | None) -> str:
        """Add one token (None: finalise the pending ones); return the newly accepted text."""
        if token is not None:
            self._ids.append(token)
        p, r, n = self._prefix_offset, self._read_offset, len(self._ids)
        if self._prefix_len is None:
            if r - p == 1:
                t = self._ids[p]
                n1 = self._one_token_len.get(t)
                if n1 is None:
                    n1 = self._one_token_len[t] = len(self._decode([t]))
                self._prefix_len = n1
            else:
                self._prefix_len = len(self._decode(self._ids[p:r])) if r > p else 0
        tail = self._decode(self._ids[p:])[self._prefix_len:]

        if token is not None and tail.endswith(REPLACEMENT_CHAR) and n - r < MAX_PENDING_TOKENS:
            # Last character probably incomplete: keep the tokens pending, accept what precedes the U+FFFD run.
            stable = tail.rstrip(REPLACEMENT_CHAR)
            new = stable[self._pending_chars:]
            self._pending_chars = max(self._pending_chars, len(stable))
            return new
        # `n` is a character boundary: the pending tokens become the context of the next ones.
        new = tail[self._pending_chars:]
        self._prefix_offset, self._read_offset, self._pending_chars, self._prefix_len = r, n, 0, None
        if self._prefix_offset > 4096:  # drop ids that are never decoded again (amortised O(1))
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        return new

    # ---- stop strings and hold-back -----------------------------------------------------------------
    def _accept(self, new: str) -> tuple[str, str | None]:
        """Take newly decoded text through stop matching and hold-back; return (delta, matched stop)."""
        if not self._stop:
            self._emit(new)
            return new, None
        window = self._tail + new
        # `held` is a suffix of `tail` (both are the last chars of the accepted text; held has hold <= lookback
        # of them), so `unemitted` is a suffix of `window`.
        unemitted = self._held + new
        if new and self._num_output_tokens > self._min_tokens:
            best: tuple[int, int, str] | None = None
            t = len(self._tail)
            for s in self._stop:
                # only matches ending inside `new` are new (earlier ones would have stopped us before)
                i = window.find(s, max(0, t - len(s) + 1))
                if i >= 0 and (best is None or (i + len(s), i) < best[:2]):
                    best = (i + len(s), i, s)
            if best is not None:
                end, start, s = best
                cut = end if self._include_stop else start
                # cut >= start of `unemitted`: everything emitted lies >= len(longest stop)-1 chars before `new`
                delta = window[len(window) - len(unemitted): cut]
                self._emit(delta)
                self._held = self._tail = ""
                self.stop_reason = s
                self.finished = True
                return delta, s
        k = len(unemitted) - self._hold
        if k > 0:
            delta, self._held = unemitted[:k], unemitted[k:]
        else:
            delta, self._held = "", unemitted
        self._tail = window[-self._lookback:] if self._lookback else ""
        self._emit(delta)
        return delta, None

    def _emit(self, s: str) -> None:
        if s:
            self._chunks.append(s)
            self._text_cache = None
