"""Tokenizer: a thin wrapper over a Hugging Face tokenizer with the few calls the engine needs.

Why a wrapper: the engine wants plain `list[int]` in and `str` out, one set of EOS ids (the tokenizer's plus
the model's generation_config.json, which for e.g. Llama 3 lists several), chat templates that always come back
as token ids (transformers 5 returns a BatchEncoding by default), and a fast decode path — the incremental
detokenizer decodes a small window every step, so we call the Rust `tokenizers` backend directly when there is one.

Decoding never applies `clean_up_tokenization_spaces` (a WordPiece-era heuristic that deletes spaces before
punctuation): it corrupts LLM output and makes decode(a + b) differ from the incremental deltas.
"""
from __future__ import annotations

import functools
import json
import os
from typing import Any, Callable, Iterable, Sequence

# transformers' import-time advice "PyTorch was not found. Models won't be available ..." is noise here: jaxinfer
# only uses its tokenizers, which need no torch (set before any transformers import of the package).
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

NO_CHAT_TEMPLATE_MSG = "this tokenizer has no chat template; pass a raw prompt or a model with a chat template"


class Tokenizer:
    """Wraps a transformers tokenizer (`.hf`). Build with `Tokenizer.from_pretrained(...)`.

    The wrapped object (`_impl`) may also be a LiteTokenizer (weights/lite_tokenizer.py: a GGUF model's tokenizer
    from the prepared cache, without importing transformers); `.hf` is then built from it on first access, so it is
    always a transformers tokenizer."""

    def __init__(self, hf_tokenizer: Any, generation_config: dict | None = None):
        self._impl = hf_tokenizer
        # The Rust tokenizer behind a fast/"TokenizersBackend" tokenizer, or None for a pure-Python one.
        self._backend = getattr(hf_tokenizer, "backend_tokenizer", None)
        self.generation_config = dict(generation_config or {})
        self.eos_token_ids: set[int] = self._collect_eos_ids()

    @property
    def hf(self):
        """The transformers tokenizer (built from the lite one on first access)."""
        impl = self._impl
        return impl.to_transformers() if hasattr(impl, "to_transformers") else impl

    # ---- construction -------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, gguf_file: str | None = None,
                        generation_config: dict | None = None, **hf_kwargs: Any) -> "Tokenizer":
        """Load from a model directory / hub id, or from a GGUF file.

        `path` may itself be a `.gguf` file (then `gguf_file` is its basename); `gguf_file` may be a basename
        inside `path` or an absolute path. `generation_config` (a dict like generation_config.json) defaults to
        the `generation_config.json` next to the tokenizer when there is one; its `eos_token_id` (int or list)
        is added to `eos_token_ids`.
        """
        path = os.fspath(path)
        if gguf_file is None and path.endswith(".gguf") and os.path.isfile(path):
            path, gguf_file = os.path.split(os.path.abspath(path))
        elif gguf_file is not None and os.path.isabs(gguf_file):
            path, gguf_file = os.path.split(gguf_file)
        try:
            spec = _cached_gguf_spec(os.path.join(path, gguf_file)) if gguf_file is not None else None
            if spec is not None:  # the prepared cache's tokenizer.json: no transformers import (lite_tokenizer.py)
                from jaxinfer.weights.lite_tokenizer import LiteTokenizer

                hf = LiteTokenizer(spec)
            elif gguf_file is not None:  # built from the GGUF metadata without torch (see weights/gguf_tokenizer.py)
                from jaxinfer.weights.gguf import load_gguf_tokenizer

                hf = load_gguf_tokenizer(os.path.join(path, gguf_file))
            else:  # (AutoTokenizer imports torch where installed: 2.5 s, so the GGUF path never imports it)
                from transformers import AutoTokenizer

                hf = AutoTokenizer.from_pretrained(path, **hf_kwargs)
        except Exception as e:  # re-raise with the path: transformers' messages often omit it
            what = f"{path!r}" + (f" (gguf_file={gguf_file!r})" if gguf_file else "")
            raise OSError(f"could not load a tokenizer from {what}: {e}") from e

        if generation_config is None and os.path.isdir(path):
            gc_path = os.path.join(path, "generation_config.json")
            if os.path.isfile(gc_path):
                with open(gc_path, encoding="utf-8") as f:
                    generation_config = json.load(f)
        return cls(hf, generation_config)

    def _collect_eos_ids(self) -> set[int]:
        ids: set[int] = set()
        if self._impl.eos_token_id is not None:
            ids.add(int(self._impl.eos_token_id))
        gen_eos = self.generation_config.get("eos_token_id")
        if isinstance(gen_eos, int):
            ids.add(gen_eos)
        elif isinstance(gen_eos, (list, tuple)):
            ids.update(int(i) for i in gen_eos)
        return ids

    # ---- properties ---------------------------------------------------------------------------------
    @property
    def bos_token_id(self) -> int | None:
        return self._impl.bos_token_id

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's own EOS id (see `eos_token_ids` for every id that ends generation)."""
        return self._impl.eos_token_id

    @property
    def vocab_size(self) -> int:
        """Number of token ids the tokenizer knows, added tokens included (the model's embedding may be larger)."""
        return len(self._impl)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self._impl, "chat_template", None))

    # ---- encode / decode ----------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        return list(self._impl.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Token ids -> text. Ids unknown to the tokenizer (padded embedding rows) decode to nothing."""
        if type(ids) is not list:
            ids = [int(i) for i in ids]
        if self._backend is not None:
            try:
                return self._backend.decode(ids, skip_special_tokens=skip_special_tokens)
            except TypeError:  # e.g. numpy ints inside a list
                return self._backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)
        return self._impl.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)

    def decoder(self, skip_special_tokens: bool = True) -> Callable[[list[int]], str]:
        """decode() as one callable for lists of Python ints (the incremental detokenizer's per-token call): the
        Rust tokenizer's own decode where there is one, without decode()'s argument checks."""
        if self._backend is not None:
            return functools.partial(self._backend.decode, skip_special_tokens=skip_special_tokens)
        return functools.partial(self.decode, skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: int | Iterable[int]) -> str | list[str]:
        """Raw vocabulary pieces (e.g. 'Ġworld', '<0xE4>'), not text; one str for one id."""
        if isinstance(ids, int):
            return self._impl.convert_ids_to_tokens(ids)
        return list(self._impl.convert_ids_to_tokens([int(i) for i in ids]))

    # ---- chat templates -----------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **kwargs: Any) -> list[int]:
        """Render `messages` ([{"role": ..., "content": ...}, ...]) with the chat template -> prompt token ids.

        Special tokens come from the template itself (no extra BOS is added). Extra kwargs (e.g. `tools`,
        `enable_thinking`) go to the template.
        """
        self._require_chat_template()
        out = self._impl.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=True,
                                          return_dict=False, **kwargs)
        # transformers 5 may still hand back a BatchEncoding / dict (e.g. if a caller's kwargs ask for one).
        if isinstance(out, dict) or hasattr(out, "input_ids"):
            out = out["input_ids"]
        if out and isinstance(out[0], (list, tuple)):  # batched form for a single conversation
            if len(out) != 1:
                raise ValueError(f"expected one conversation, the chat template returned {len(out)}")
            out = out[0]
        return [int(i) for i in out]

    def render_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                             **kwargs: Any) -> str:
        """The chat template's text for `messages` (what `apply_chat_template` tokenizes)."""
        self._require_chat_template()
        return self._impl.apply_chat_template(messages, add_generation_prompt=add_generation_prompt, tokenize=False,
                                           **kwargs)

    def _require_chat_template(self) -> None:
        if not self.has_chat_template:
            raise ValueError(NO_CHAT_TEMPLATE_MSG)

    def __repr__(self) -> str:
        return (f"Tokenizer({type(self._impl).__name__}, vocab_size={self.vocab_size}, "
                f"eos_token_ids={sorted(self.eos_token_ids)}, bos_token_id={self.bos_token_id})")


def _cached_gguf_spec(path: str) -> dict | None:
    """The tokenizer spec the prepared cache holds for this GGUF (weights/prepared.py), or None."""
    if not os.path.isfile(path):
        return None
    from jaxinfer.weights import prepared

    return prepared.load_metadata(path).get("tokenizer")
