"""A Hugging Face fast tokenizer built from a GGUF file's metadata, without torch.

transformers can read a GGUF tokenizer too, but its GGUF reader imports torch, which a plain
`pip install jaxinfer` does not have. Byte-level BPE vocabularies (llama.cpp's `tokenizer.ggml.model == "gpt2"`:
SmolLM2, Llama 3, Qwen2/3, Mistral-Nemo) are rebuilt here with the `tokenizers` library the same way
transformers does: vocabulary + merges, byte-level pre-tokenizer (with the split regex the vocabulary was
trained with, where llama.cpp names one), byte-level decoder, control tokens as special tokens, no BOS added,
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
_CONTROL = 3  # llama.cpp token type of special tokens like <|im_end|>


def build_gguf_tokenizer(path: str):
    """PreTrainedTokenizerFast for the GGUF at `path` (byte-level BPE), or transformers' own loader otherwise."""
    from jaxinfer.models.gguf_loader import _field, _open

    reader = _open(path)
    kind = _field(reader, "tokenizer.ggml.model")
    if kind != "gpt2":
        return _transformers_fallback(path, kind)
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", [])]
    types = list(_field(reader, "tokenizer.ggml.token_type", []) or [])
    backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False,
                                   byte_fallback=False))
    split = _SPLITS.get(_field(reader, "tokenizer.ggml.pre"))
    if split is None:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()
    special = [t for t, ty in zip(tokens, types) if ty == _CONTROL]
    backend.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])

    def tok(key):
        i = _field(reader, f"tokenizer.ggml.{key}")
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    hf = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=tok("bos_token_id"),
                                 eos_token=tok("eos_token_id"), unk_token=tok("unknown_token_id"),
                                 pad_token=tok("padding_token_id"))
    template = _field(reader, "tokenizer.chat_template")
    if template:
        hf.chat_template = template
    return hf


def _transformers_fallback(path: str, kind):
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(os.path.dirname(os.path.abspath(path)), gguf_file=os.path.basename(path))
    except Exception as e:
        raise OSError(
            f"cannot build the {kind!r} tokenizer of {path!r} without transformers' GGUF reader, which needs "
            f"torch ({type(e).__name__}: {e}); install torch, or pass tokenizer=DIR with the model's "
            "Hugging Face tokenizer files") from e
