"""A tokenizer without transformers: the `tokenizers` backend plus a jinja2 chat template, for start-up.

Importing transformers costs ~1.8 s on a 2-core CPU (python -X importtime), more than everything else a warm
`jaxinfer generate --chat` does before its first token. A GGUF model's tokenizer is a tokenizer.json (kept by the
prepared cache, weights/prepared.py) plus four special tokens and a chat template, so this class serves the calls
the engine makes (encode, decode, ids -> pieces, plain-text chats) from those alone. `to_transformers()` builds
the PreTrainedTokenizerFast of the same spec (what `Tokenizer.hf` hands out, and what renders any chat this
class does not: tools, documents, template kwargs, non-string content).

Invariant: for the chats it accepts (`renders(messages, kwargs)`), `apply_chat_template` returns exactly what
transformers' does for the same spec (tests/test_startup_caches.py compares them); the template runs in
jinja2's immutable sandbox with transformers' options (trim_blocks, lstrip_blocks, loopcontrols, the tojson /
raise_exception / strftime_now helpers).
"""
from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, Sequence


@functools.lru_cache(maxsize=4)
def _compile(template: str):
    import jinja2
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


class LiteTokenizer:
    """The subset of a transformers fast tokenizer the engine uses, from a tokenizer spec (gguf_tokenizer.py)."""

    def __init__(self, spec: dict):
        from tokenizers import Tokenizer

        self.spec = spec
        self.backend_tokenizer = Tokenizer.from_str(spec["tokenizer_json"])
        self.chat_template = spec.get("chat_template")
        for name in ("bos_token", "eos_token", "unk_token", "pad_token"):
            setattr(self, name, spec.get(name))
        self._hf = None

    def _id(self, token):
        return None if token is None else self.backend_tokenizer.token_to_id(token)

    @property
    def bos_token_id(self):
        return self._id(self.bos_token)

    @property
    def eos_token_id(self):
        return self._id(self.eos_token)

    def __len__(self) -> int:
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend_tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True, **_: Any) -> str:
        return self.backend_tokenizer.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids]

    @staticmethod
    def renders(messages, kwargs: dict) -> bool:
        """True for chats this class renders exactly as transformers: dict messages of a string role and string
        content only, and no template kwargs."""
        return not kwargs and all(type(m) is dict and set(m) == {"role", "content"} and isinstance(m["role"], str)
                                  and isinstance(m["content"], str) for m in messages)

    def apply_chat_template(self, messages, add_generation_prompt: bool = False, tokenize: bool = True,
                            return_dict: bool = False, **kwargs: Any):
        if not self.renders(messages, kwargs) or return_dict:
            return self.to_transformers().apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                                              tokenize=tokenize, return_dict=return_dict, **kwargs)
        specials = {k: getattr(self, k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                    if getattr(self, k) is not None}
        text = _compile(self.chat_template).render(messages=[dict(m) for m in messages], tools=None, documents=None,
                                                   add_generation_prompt=add_generation_prompt, **specials)
        return self.encode(text, add_special_tokens=False) if tokenize else text

    def to_transformers(self):
        """The transformers PreTrainedTokenizerFast of the same spec (built once, on first use)."""
        if self._hf is None:
            from jaxinfer.weights.gguf_tokenizer import tokenizer_from_spec

            self._hf = tokenizer_from_spec(self.spec)
        return self._hf
