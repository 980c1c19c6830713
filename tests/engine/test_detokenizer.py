"""Tokenizer wrapper and IncrementalDetokenizer.

No model download: two tiny tokenizers are trained here with the `tokenizers` library on a few sentences that
include Chinese, emoji and runs of spaces, wrapped as PreTrainedTokenizerFast, saved and loaded back through
`Tokenizer.from_pretrained`:
  * "byte": GPT-2 style byte-level BPE (SmolLM2, Llama 3, Qwen): rare characters split over byte tokens.
  * "sp":   Llama-2 style Metaspace BPE with <0xNN> byte-fallback tokens and a decoder that strips the
            leading space of a decode — the case that needs prompt context.
"""
import json
import os
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxinfer.engine import detokenizer as detok_mod
from jaxinfer.engine.detokenizer import MAX_PENDING_TOKENS, REPLACEMENT_CHAR, IncrementalDetokenizer
from jaxinfer.tokenizer import NO_CHAT_TEMPLATE_MSG, Tokenizer

CORPUS = [
    "Hello world! The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x  +  1\n\n\t# tabs and   runs of   spaces",
    "你好，世界！中文文本测试。我们喜欢机器学习。",
    "Emoji time 🤖🚀✨ café naïve résumé — “quotes” …",
    "Stop here. STOP! The end.</s> Observation: done",
] * 3
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Text alphabet for generated strings: ASCII, spaces/newlines, accents, CJK in and out of the corpus, emoji
# (in and out of the corpus), so both whole-character tokens and byte-split characters occur.
ALPHABET = list("abcdeHlo .!:\n\t") + list("éï—") + list("你好中文新词猫") + ["🤖", "🚀", "🦊", "👍🏽", "𝕏"]


def _texts(min_size=0, max_size=None):
    """Strings made of ALPHABET pieces (some are several code points, like the skin-toned thumb)."""
    return st.lists(st.sampled_from(ALPHABET), min_size=min_size, max_size=max_size).map("".join)


def _train_byte_level():
    from tokenizers import Tokenizer as RustTokenizer, decoders, models, pre_tokenizers, trainers
    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    return tok


def _train_metaspace_byte_fallback():
    from tokenizers import Tokenizer as RustTokenizer, models, pre_tokenizers, trainers
    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS,
                                                        show_progress=False))
    spec = json.loads(tok.to_str())
    vocab = spec["model"]["vocab"]
    next_id = max(vocab.values()) + 1
    for b in range(256):  # <0x00>..<0xFF> byte-fallback pieces, as in Llama 2's vocabulary
        vocab[f"<0x{b:02X}>"] = next_id + b
    spec["model"]["byte_fallback"] = True
    spec["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    return RustTokenizer.from_str(json.dumps(spec))


def _save(rust_tok, directory, chat_template=CHATML, generation_config=None):
    from transformers import PreTrainedTokenizerFast
    hf = PreTrainedTokenizerFast(tokenizer_object=rust_tok, bos_token="<|im_start|>", eos_token="<|im_end|>",
                                 pad_token="<|endoftext|>", chat_template=chat_template,
                                 clean_up_tokenization_spaces=False)
    hf.save_pretrained(directory)
    if generation_config is not None:
        with open(os.path.join(directory, "generation_config.json"), "w") as f:
            json.dump(generation_config, f)
    return str(directory)


@pytest.fixture(scope="module")
def tok_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("toks")
    byte = _train_byte_level()
    eos = byte.token_to_id("<|im_end|>")
    eot = byte.token_to_id("<|endoftext|>")
    return {
        "byte": _save(byte, root / "byte", generation_config={"eos_token_id": [eos, eot], "bos_token_id": 1}),
        "byte_int_gc": _save(byte, root / "byte_int_gc", generation_config={"eos_token_id": eot}),
        "byte_no_template": _save(byte, root / "byte_no_template", chat_template=None),
        "sp": _save(_train_metaspace_byte_fallback(), root / "sp"),
    }


@pytest.fixture(scope="module")
def byte_tok(tok_dirs):
    return Tokenizer.from_pretrained(tok_dirs["byte"])


@pytest.fixture(scope="module")
def sp_tok(tok_dirs):
    return Tokenizer.from_pretrained(tok_dirs["sp"])


def _stream(tok, prompt, ids, chunks=None, stop_terminated=False, **kw):
    """Feed `ids` in chunks of the given sizes (cycled; default 1). Returns (deltas, stop, flushed, detok)."""
    d = IncrementalDetokenizer(tok, prompt, kw.pop("skip_special_tokens", True), kw.pop("stop", []),
                               kw.pop("include_stop_str_in_output", False), **kw)
    sizes = chunks or [1]
    deltas, stop, i, k = [], None, 0, 0
    while i < len(ids) and stop is None:
        n = sizes[k % len(sizes)]
        k += 1
        last = i + n >= len(ids)
        delta, stop = d.append(ids[i:i + n], stop_terminated=stop_terminated and last)
        deltas.append(delta)
        i += n
    flushed = d.flush() if stop is None else ""
    assert d.text == "".join(deltas) + flushed
    return deltas, stop, flushed, d


class _CountingTokenizer:
    """Records the length of every decode call."""

    def __init__(self, tok):
        self.tok, self.lengths = tok, []

    def decode(self, ids, skip_special_tokens=True):
        self.lengths.append(len(ids))
        return self.tok.decode(ids, skip_special_tokens=skip_special_tokens)


# ================================ Tokenizer ================================================================

UNICODE_TEXTS = ["你好，世界！", "emoji 🤖🚀✨ and 🦊 (not in corpus) 👍🏽", "runs   of    spaces\n\n\t\ttabs  ",
                 "  leading and trailing  ", "naïve café — “quotes” …", "mixed中文and English🚀end", "𝕏 ÿ ĀĂ",
                 "", " ", "\n"]


@pytest.mark.parametrize("text", UNICODE_TEXTS)
def test_tokenizer_unicode_round_trip(byte_tok, text):
    ids = byte_tok.encode(text, add_special_tokens=False)
    assert all(isinstance(i, int) for i in ids)
    assert byte_tok.decode(ids) == text


def test_tokenizer_basics(byte_tok, tok_dirs):
    hf = byte_tok.hf
    assert byte_tok.vocab_size == len(hf) == 420
    assert byte_tok.bos_token_id == hf.convert_tokens_to_ids("<|im_start|>")
    eos, eot = hf.convert_tokens_to_ids("<|im_end|>"), hf.convert_tokens_to_ids("<|endoftext|>")
    assert byte_tok.eos_token_id == eos
    assert byte_tok.eos_token_ids == {eos, eot}  # tokenizer's eos + generation_config.json's list
    assert Tokenizer.from_pretrained(tok_dirs["byte_int_gc"]).eos_token_ids == {eos, eot}  # int form
    assert Tokenizer.from_pretrained(tok_dirs["byte_no_template"]).eos_token_ids == {eos}  # no generation config
    assert Tokenizer(hf, generation_config={"eos_token_id": [7, 9]}).eos_token_ids == {eos, 7, 9}
    ids = byte_tok.encode("Hello 中")
    assert byte_tok.convert_ids_to_tokens(ids) == hf.convert_ids_to_tokens(ids)
    assert isinstance(byte_tok.convert_ids_to_tokens(ids[0]), str)
    assert "Tokenizer(" in repr(byte_tok)


def test_tokenizer_special_tokens_and_odd_ids(byte_tok):
    start, end = byte_tok.bos_token_id, byte_tok.eos_token_id
    ids = [start] + byte_tok.encode("hi 你", add_special_tokens=False) + [end]
    assert byte_tok.decode(ids) == "hi 你"
    assert byte_tok.decode(ids, skip_special_tokens=False) == "<|im_start|>hi 你<|im_end|>"
    assert byte_tok.decode(tuple(ids)) == "hi 你"
    import numpy as np
    assert byte_tok.decode(np.array(ids)) == "hi 你"
    assert byte_tok.decode([ids[1], 10**6]) == byte_tok.decode([ids[1]])  # ids past the vocab decode to nothing
    with pytest.raises(TypeError):
        byte_tok.encode(["not", "a", "str"])


def test_chat_template(byte_tok):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "你好 🤖"}]
    ids = byte_tok.apply_chat_template(msgs)
    assert isinstance(ids, list) and all(type(i) is int for i in ids)
    text = byte_tok.render_chat_template(msgs)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n你好 🤖<|im_end|>\n<|im_start|>assistant\n"
    assert ids == byte_tok.encode(text, add_special_tokens=False)
    assert ids.count(byte_tok.bos_token_id) == 3  # special tokens come from the template, no extra BOS
    no_gen = byte_tok.apply_chat_template(msgs, add_generation_prompt=False)
    assert byte_tok.decode(no_gen, skip_special_tokens=False).endswith("🤖<|im_end|>\n")


def test_no_chat_template_error(tok_dirs):
    tok = Tokenizer.from_pretrained(tok_dirs["byte_no_template"])
    assert not tok.has_chat_template
    with pytest.raises(ValueError) as e:
        tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert str(e.value) == NO_CHAT_TEMPLATE_MSG


def test_from_pretrained_missing_path(tmp_path):
    missing = tmp_path / "no_such_model"
    with pytest.raises(OSError, match="no_such_model"):
        Tokenizer.from_pretrained(missing)


def test_from_pretrained_gguf_default_model(smollm2_gguf):
    """The real SmolLM2 vocabulary (the default model's GGUF, fetched on first use)."""
    path = smollm2_gguf
    tok = Tokenizer.from_pretrained(path)  # a .gguf file path is split into directory + gguf_file
    assert tok.vocab_size == 49152
    assert tok.eos_token_id in tok.eos_token_ids
    for text in UNICODE_TEXTS:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text
    ids = tok.apply_chat_template([{"role": "user", "content": "hi"}])
    assert tok.decode(ids, skip_special_tokens=False).endswith("<|im_start|>assistant\n")
    # the real vocabulary through the detokenizer: continuation of a chat prompt, one token at a time
    out_ids = tok.encode(" ".join(UNICODE_TEXTS), add_special_tokens=False)
    deltas, _, flushed, _ = _stream(tok, ids, out_ids, stop=["\n\n\n"])
    assert "".join(deltas) + flushed == tok.decode(out_ids)
    assert not any(REPLACEMENT_CHAR in x for x in deltas)


# ================================ IncrementalDetokenizer: decoding ========================================

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_deltas_concatenate_to_decode_of_random_ids(byte_tok, data):
    """Any id sequence (specials, partial UTF-8, invalid UTF-8), any chunking: deltas + flush == decode(ids)."""
    V = byte_tok.vocab_size
    ids = data.draw(st.lists(st.integers(0, V - 1), max_size=60), label="ids")
    prompt = data.draw(st.lists(st.integers(0, V - 1), max_size=8), label="prompt")
    chunks = data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=4), label="chunks")
    skip = data.draw(st.booleans(), label="skip_special_tokens")
    # Without the garbage-stream cut-off the equality is exact for every stream (see the module docstring).
    with mock.patch.object(detok_mod, "MAX_PENDING_TOKENS", 10**9):
        deltas, stop, flushed, _ = _stream(byte_tok, prompt, ids, chunks, skip_special_tokens=skip)
    assert stop is None
    assert "".join(deltas) + flushed == byte_tok.decode(ids, skip_special_tokens=skip)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), kind=st.sampled_from(["byte", "sp"]))
def test_valid_text_never_emits_replacement_char(byte_tok, sp_tok, data, kind):
    """Text split over byte tokens: no delta ever contains U+FFFD, and the result is exact (also with a prompt)."""
    tok = byte_tok if kind == "byte" else sp_tok
    text = data.draw(_texts(max_size=40), label="text")
    prompt_text = data.draw(_texts(max_size=10), label="prompt")
    chunks = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3), label="chunks")
    prompt = tok.encode(prompt_text, add_special_tokens=False)
    ids = tok.encode(text, add_special_tokens=False)
    deltas, _, flushed, _ = _stream(tok, prompt, ids, chunks)
    assert not any(REPLACEMENT_CHAR in d for d in deltas + [flushed])
    # The output continues the prompt: decode(prompt + ids) minus decode(prompt) (this keeps the leading space
    # a SentencePiece decoder strips from the first token of a decode).
    expected = tok.decode(prompt + ids)[len(tok.decode(prompt)):]
    assert "".join(deltas) + flushed == expected
    if not prompt:
        assert expected == tok.decode(ids)


class _PlainDecode:
    """A tokenizer seen only through decode() (no Tokenizer.decoder, its own one-token cache): the reference path."""

    def __init__(self, tok):
        self.decode = tok.decode


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), kind=st.sampled_from(["byte", "sp"]))
def test_fast_decoder_and_shared_length_cache_match_plain_decode(byte_tok, sp_tok, data, kind):
    """Tokenizer.decoder (the Rust decode) and the one-token lengths cached on the tokenizer, shared by all its
    detokenizers and both skip_special_tokens values (interleaved here, specials included), give the deltas of a
    detokenizer that only calls decode()."""
    tok = byte_tok if kind == "byte" else sp_tok
    V = tok.vocab_size
    streams = data.draw(st.lists(st.lists(st.integers(0, V - 1), max_size=30), min_size=2, max_size=4), label="ids")
    skips = data.draw(st.lists(st.booleans(), min_size=len(streams), max_size=len(streams)), label="skips")
    for ids, skip in zip(streams, skips):
        fast = _stream(tok, [], ids, skip_special_tokens=skip)
        plain = _stream(_PlainDecode(tok), [], ids, skip_special_tokens=skip)
        assert fast[0] == plain[0] and fast[2] == plain[2]
    for skip, lengths in tok.__dict__.get("_detok_one_token_len", {}).items():
        for t, n in list(lengths.items())[:50]:
            assert n == len(tok.decode([t], skip_special_tokens=skip))


@pytest.mark.parametrize("kind", ["byte", "sp"])
def test_split_characters_are_emitted_whole(byte_tok, sp_tok, kind):
    tok = byte_tok if kind == "byte" else sp_tok
    text = "猫🦊 x 👍🏽"  # not in the training corpus -> byte tokens
    ids = tok.encode(text, add_special_tokens=False)
    assert any(REPLACEMENT_CHAR in tok.decode([i]) for i in ids), "test needs characters split over tokens"
    deltas, _, flushed, d = _stream(tok, [], ids)
    assert "".join(deltas) == text and flushed == ""
    assert not any(REPLACEMENT_CHAR in x for x in deltas)
    assert "" in deltas  # some appends had to wait for the rest of a character


@pytest.mark.parametrize("kind", ["byte", "sp"])
def test_chunks_that_keep_ending_mid_character(byte_tok, sp_tok, kind):
    """Appends of 1, 3, 3 tokens over 8-byte emoji: most appends end mid-character, for the whole stream."""
    tok = byte_tok if kind == "byte" else sp_tok
    text = "👍🏽👍🏽a👍🏽" * 40
    ids = tok.encode(text, add_special_tokens=False)
    counting = _CountingTokenizer(tok)
    deltas, _, flushed, _ = _stream(counting, [], ids, [1, 3, 3])
    assert "".join(deltas) + flushed == tok.decode(ids)
    assert not any(REPLACEMENT_CHAR in x for x in deltas + [flushed])
    assert max(counting.lengths) <= 16  # the window stays a few characters' tokens


def test_prompt_context_keeps_leading_space(sp_tok):
    prompt = sp_tok.encode("Hello", add_special_tokens=False)
    ids = sp_tok.encode("Hello world", add_special_tokens=False)[1:]  # "▁world": a continuation with a space
    deltas, *_ = _stream(sp_tok, prompt, ids)
    assert "".join(deltas) == " world"
    deltas, *_ = _stream(sp_tok, [], ids)  # no prompt: a decode of the output alone strips it, like decode()
    assert "".join(deltas) == sp_tok.decode(ids) == "world"


def test_prompt_ending_mid_character(byte_tok):
    """A prompt cut inside a character: the output is decoded on its own, consistently."""
    ids = byte_tok.encode("🦊 ok", add_special_tokens=False)
    assert REPLACEMENT_CHAR in byte_tok.decode(ids[:1])
    deltas, _, flushed, _ = _stream(byte_tok, ids[:1], ids[1:])
    assert "".join(deltas) + flushed == byte_tok.decode(ids[1:])


def test_stop_terminated_token_text_is_left_out(byte_tok):
    eos = byte_tok.eos_token_id
    ids = byte_tok.encode("done", add_special_tokens=False) + [eos]
    deltas, *_ = _stream(byte_tok, [], ids, [1], stop_terminated=True, skip_special_tokens=False)
    assert "".join(deltas) == "done"
    deltas, *_ = _stream(byte_tok, [], ids, [1], stop_terminated=True, skip_special_tokens=False,
                         include_stop_str_in_output=True)
    assert "".join(deltas) == "done<|im_end|>"
    deltas, *_ = _stream(byte_tok, [], ids, [1], stop_terminated=False, skip_special_tokens=False)
    assert "".join(deltas) == "done<|im_end|>"


def test_work_per_append_is_bounded(byte_tok):
    """Each append decodes a window of O(new tokens), never the whole output (5000+ tokens here)."""
    counting = _CountingTokenizer(byte_tok)
    text = "The quick brown fox 你好 🦊 jumps;  " * 330
    ids = byte_tok.encode(text, add_special_tokens=False)
    assert len(ids) > 5000
    prompt = byte_tok.encode("prompt: ", add_special_tokens=False)
    d = IncrementalDetokenizer(counting, prompt, True, ["@@@"], False)
    out = []
    for i in ids:
        out.append(d.append([i])[0])
    out.append(d.flush())
    assert "".join(out) == text
    assert max(counting.lengths) <= 8  # context (<= previous append's tokens) + a split character's tokens


def test_garbage_stream_is_bounded(byte_tok):
    """Bytes that never form a character: pending tokens are capped and the U+FFFD text is emitted."""
    lead = next(i for i in range(byte_tok.vocab_size) if byte_tok.convert_ids_to_tokens(i) == "ä")  # byte 0xE4
    d = IncrementalDetokenizer(byte_tok, [], True, [], False)
    out = []
    for _ in range(100):
        out.append(d.append([lead])[0])
        assert d.num_pending_tokens < MAX_PENDING_TOKENS
    out.append(d.flush())
    assert "".join(out) and set("".join(out)) == {REPLACEMENT_CHAR}


# ================================ IncrementalDetokenizer: stop strings ====================================

def _expected_stop_cut(text, stops, include):
    """Reference: the match that completes first (smallest end, then earliest start) ends the text."""
    best = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or (i + len(s), i) < best[:2]):
            best = (i + len(s), i, s)
    if best is None:
        return text, None
    end, start, s = best
    return text[:end] if include else text[:start], s


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), kind=st.sampled_from(["byte", "sp"]))
def test_stop_strings_property(byte_tok, sp_tok, data, kind):
    tok = byte_tok if kind == "byte" else sp_tok
    text = data.draw(_texts(min_size=1, max_size=40), label="text")
    ids = tok.encode(text, add_special_tokens=False)
    full = tok.decode(ids)
    # stops: substrings of the text (so they match, possibly across tokens) and random strings (may not match)
    substr = st.tuples(st.integers(0, len(full)), st.integers(1, 6)).map(lambda t: full[t[0]:t[0] + t[1]])
    stops = data.draw(st.lists(st.one_of(substr, _texts(min_size=1, max_size=4)),
                               min_size=1, max_size=3).map(lambda ss: [s for s in ss if s]), label="stops")
    include = data.draw(st.booleans(), label="include")
    chunks = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3), label="chunks")

    deltas, stop, flushed, d = _stream(tok, [], ids, chunks, stop=stops, include_stop_str_in_output=include)
    out = "".join(deltas) + flushed
    expected, expected_stop = _expected_stop_cut(full, stops, include)
    assert out == expected
    assert stop == expected_stop == d.stop_reason
    assert d.finished
    if stops and not include:
        assert not any(s in out for s in stops)  # a stop string never appears in the output
    if stop is not None:
        assert flushed == "" and (out.endswith(stop) if include else full[len(out):].startswith(stop))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_texts(min_size=1, max_size=30), stop_len=st.integers(2, 6))
def test_no_prefix_of_a_stop_string_leaks_early(byte_tok, text, stop_len):
    """At every step the emitted text is a prefix of the final text, and no delta could be part of a match."""
    stop = "Ω" * stop_len  # never matches: everything must come out eventually, but always hold back len-1
    ids = byte_tok.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(byte_tok, [], True, [stop], False)
    for k in range(len(ids)):
        d.append(ids[k:k + 1])
        known = byte_tok.decode(ids[:k + 1]).rstrip(REPLACEMENT_CHAR)  # text before an incomplete character
        assert d.text == known[:max(0, len(known) - (stop_len - 1))]
    assert d.text + d.flush() == text


def test_stop_string_spanning_several_tokens(byte_tok):
    text = "Hello world! Observation: done"
    ids = byte_tok.encode(text, add_special_tokens=False)
    stop = "Observation:"
    start = text.index(stop)
    # the stop string covers more than one token
    tok_ends = [len(byte_tok.decode(ids[:k + 1])) for k in range(len(ids))]
    assert sum(start < e < start + len(stop) for e in tok_ends) >= 1
    for include in (False, True):
        deltas, stop_hit, flushed, d = _stream(byte_tok, [], ids, stop=[stop], include_stop_str_in_output=include)
        assert stop_hit == stop and flushed == ""
        assert "".join(deltas) == (text[: start + len(stop)] if include else text[:start])
        assert stop not in "".join(deltas[:-1])  # never leaked before the match
        assert d.append(ids[:2]) == ("", None)  # finished: later appends are ignored


def test_stop_string_in_the_first_token(byte_tok):
    ids = byte_tok.encode("Hello world", add_special_tokens=False)
    first = byte_tok.decode(ids[:1])
    deltas, stop, flushed, d = _stream(byte_tok, [], ids, stop=[first])
    assert deltas == [""] and stop == first and d.text == ""
    assert len(first) >= 2
    deltas, stop, _, _ = _stream(byte_tok, [], ids, stop=[first[1:]])  # stop string starts inside the token
    assert deltas == [first[:1]] and stop == first[1:]
    deltas, stop, _, _ = _stream(byte_tok, [], ids, stop=[first], include_stop_str_in_output=True)
    assert deltas == [first] and stop == first


def test_stop_string_across_a_split_character(byte_tok):
    text = "a 🦊 b 🦊!"
    ids = byte_tok.encode(text, add_special_tokens=False)
    deltas, stop, _, _ = _stream(byte_tok, [], ids, stop=["🦊!"])
    assert stop == "🦊!" and "".join(deltas) == "a 🦊 b "
    deltas, stop, _, _ = _stream(byte_tok, [], ids, stop=["🦊!"], include_stop_str_in_output=True)
    assert "".join(deltas) == text


def test_held_back_text_is_released_by_flush(byte_tok):
    ids = byte_tok.encode("The end STO", add_special_tokens=False)
    deltas, stop, flushed, d = _stream(byte_tok, [], ids, stop=["STOP"])
    assert stop is None
    assert "STO" not in "".join(deltas) and flushed.endswith("STO")
    assert d.text == "The end STO"
    assert d.flush() == "" and d.append(ids) == ("", None)


def test_earliest_completing_match_wins(byte_tok):
    ids = byte_tok.encode("xx abcd yy", add_special_tokens=False)
    for chunks in ([1], [2], [len(ids)]):
        deltas, stop, *_ = _stream(byte_tok, [], ids, chunks, stop=["abcd", "c"])
        assert stop == "c" and "".join(deltas) == "xx ab"
        deltas, stop, *_ = _stream(byte_tok, [], ids, chunks, stop=["bcd", "abcd"])
        assert stop == "abcd" and "".join(deltas) == "xx "  # same end: earliest start


def test_min_tokens_defers_stop_strings(byte_tok):
    text = "a. b. c."
    ids = byte_tok.encode(text, add_special_tokens=False)
    deltas, stop, *_ = _stream(byte_tok, [], ids, stop=["."])
    assert "".join(deltas) == "a" and stop == "."
    # min_tokens = the tokens up to the first ".": that match is ignored, the next one stops
    m = next(k for k in range(1, len(ids) + 1) if "." in byte_tok.decode(ids[:k]))
    second = text.index(".", len(byte_tok.decode(ids[:m])))
    deltas, stop, *_ = _stream(byte_tok, [], ids, stop=["."], min_tokens=m)
    assert "".join(deltas) == text[:second] and stop == "."


def test_bad_stop_strings_rejected(byte_tok):
    with pytest.raises(ValueError):
        IncrementalDetokenizer(byte_tok, [], True, [""], False)
