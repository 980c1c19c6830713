"""A Hugging Face fast tokenizer built from a GGUF file's metadata, without torch.

transformers can read a GGUF tokenizer too, but its GGUF reader imports torch, which a plain
`pip install jaxinfer` does not have. Byte-level BPE vocabularies (llama.cpp's `tokenizer.ggml.model == "gpt2"`:
SmolLM2, Llama 3, Qwen2/3, Mistral-Nemo) are rebuilt here with the `tokenizers` library the same way
transformers does: vocabulary + merges, byte-level pre-tokenizer (with the split regex the vocabulary was
trained with, where llama.cpp names one; for `smollm` the Digits + ByteLevel pair of SmolLM2's tokenizer.json),
byte-level decoder, control tokens as special tokens, no BOS added,
the chat template from `tokenizer.chat_template`. Other vocabularies (sentencepiece "llama") go through
transformers, which then needs torch.
"""
from __future__ import annotations

import os

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # no "PyTorch was not found" advice (tokenizer.py)

# Split regexes of the original tokenizers, keyed by llama.cpp's `tokenizer.ggml.pre`. Vocabularies not listed
# use the GPT-2 byte-level regex (the ByteLevel pre-tokenizer's own).
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_SPLITS = {"llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "smaug-bpe": _LLAMA3, "qwen2": _QWEN2,
           "deepseek-r1-qwen": _QWEN2}
# `tokenizer.ggml.pre` values whose tokenizer.json pre-tokenizer is Sequence([Digits(individual_digits=True),
# ByteLevel(use_regex=True)]): every Unicode number character (Nd / Nl / No: "7", "²", "①", "½") becomes its own
# piece *before* the GPT-2 regex runs, so " 12" is [" ", "1", "2"] (the space is not glued to the digit) and
# "a ²" is ["a", " ", "²"]. A plain ByteLevel regex would give [" 12"] and [" ²"]: different token ids.
_DIGITS_THEN_BYTE_LEVEL = {"smollm"}
_CONTROL = 3  # llama.cpp token type of special tokens like <|im_end|>


def build_gguf_tokenizer(path: str):
    """PreTrainedTokenizerFast for the GGUF at `path` (byte-level BPE), or transformers' own loader otherwise."""
    from jaxinfer.weights.gguf_reader import gguf_field, open_gguf

    reader = open_gguf(path)
    kind = gguf_field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        return _transformers_fallback(path, kind)
    from tokenizers import AddedToken, Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    tokens = list(gguf_field(reader, "tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ", 1)) for m in gguf_field(reader, "tokenizer.ggml.merges", [])]
    types = list(gguf_field(reader, "tokenizer.ggml.token_type", []) or [])
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False,
                                   byte_fallback=False))
    backend.pre_tokenizer = _pre_tokenizer(gguf_field(reader, "tokenizer.ggml.pre"))
    backend.decoder = decoders.ByteLevel()
    special = [t for t, ty in zip(tokens, types) if ty == _CONTROL]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])

    def tok(key):
        i = gguf_field(reader, f"tokenizer.ggml.{key}")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    hf = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=tok("bos_token_id"),
                                 eos_token=tok("eos_token_id"), unk_token=tok("unknown_token_id"),
                                 pad_token=tok("padding_token_id"))
    template = gguf_field(reader, "tokenizer.chat_template")
    if template:
        hf.chat_template = template
    return hf


def tokenizer_spec(hf) -> dict | None:
    """What tokenizer_from_spec needs to rebuild `hf` (a PreTrainedTokenizerFast built above) without the GGUF:
    the backend's tokenizer.json, the four special tokens and the chat template; None for other tokenizers."""
    from transformers import PreTrainedTokenizerFast

    if type(hf) is not PreTrainedTokenizerFast:
        return None
    return {"tokenizer_json": hf.backend_tokenizer.to_str(), "bos_token": hf.bos_token, "eos_token": hf.eos_token,
            "unk_token": hf.unk_token, "pad_token": hf.pad_token, "chat_template": hf.chat_template}


def tokenizer_from_spec(spec: dict):
    """The PreTrainedTokenizerFast of tokenizer_spec (the same vocabulary, merges, specials and template)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(spec["tokenizer_json"]),
                                 bos_token=spec["bos_token"], eos_token=spec["eos_token"],
                                 unk_token=spec["unk_token"], pad_token=spec["pad_token"])
    if spec.get("chat_template"):
        hf.chat_template = spec["chat_template"]
    return hf


def _pre_tokenizer(pre: str | None):
    """The `tokenizers` pre-tokenizer of llama.cpp's `tokenizer.ggml.pre` name (None: GPT-2's byte-level regex)."""
    from tokenizers import Regex, pre_tokenizers

    if pre in _DIGITS_THEN_BYTE_LEVEL:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    split = _SPLITS.get(pre)
    if split is None:
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    return pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])


def _transformers_fallback(path: str, kind):
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path))
    except Exception as e:
        raise OSError(
            f"cannot build the {kind!r} tokenizer of {path!r} without transformers' GGUF reader, which needs "
            f"torch ({type(e).__name__}: {e}); install torch, or pass tokenizer=DIR with the model's "
            "Hugging Face tokenizer files") from e
