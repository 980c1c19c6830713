"""The GGUF `smollm` pre-tokenizer equals SmolLM2's own tokenizer.json (issue 16 item 6).

SmolLM2's tokenizer.json pre-tokenizes with Sequence([Digits(individual_digits=True), ByteLevel(use_regex=True)]):
every Unicode number character (general category Nd / Nl / No: "7", "٣", "²", "①", "½", "Ⅻ") is split off on its
own *before* the GPT-2 byte-level regex runs, so a space in front of a digit is not glued to it (" 12" ->
" ", "1", "2") and a whitespace run before a digit stays one piece ("  1" -> "  ", "1", where the plain regex
gives " ", " 1"). llama.cpp records this as `tokenizer.ggml.pre = "smollm"`; transformers' GGUF reader does not
know that name and falls back to the plain ByteLevel regex, so it is *not* the reference here.

References, each independent of jaxinfer's code:
  * `tokenizers` pre-tokenizer built in this file from the tokenizer.json spec (the brief's reference);
  * a pure-Python statement of the same spec with the `regex` module (isolated \\p{N}, then the GPT-2 pattern,
    then GPT-2's bytes_to_unicode), so a bug shared by our code and the `tokenizers` objects would still show;
  * token ids of a tokenizer deserialised from a tokenizer.json document carrying SmolLM2's pre_tokenizer
    section, with the same vocabulary and merges: on a tiny synthetic GGUF (fast, merges chosen so the wrong
    pre-tokenizer gives different ids) and on the real SmolLM2-135M GGUF (the default model).
Strings are drawn by hypothesis from the character classes where the two pre-tokenizers differ: whitespace runs,
ASCII digits, Unicode Nd / No / Nl characters, letters, punctuation and contractions.
"""
from __future__ import annotations

import json
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import gguf  # noqa: E402
import pytest  # noqa: E402
import regex  # noqa: E402
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from tokenizers import Tokenizer as RustTokenizer  # noqa: E402
from tokenizers import models, pre_tokenizers  # noqa: E402

from jaxinfer.tokenizer import Tokenizer  # noqa: E402

# The pre_tokenizer section of HuggingFaceTB/SmolLM2-*'s tokenizer.json, as JSON.
SMOLLM2_PRE_TOKENIZER = {
    "type": "Sequence",
    "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ],
}
# GPT-2's pre-tokenization pattern (the one ByteLevel(use_regex=True) applies).
_GPT2 = regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
_NUMBER = regex.compile(r"(\p{N})")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table (encoder.py of openai/gpt-2)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_B2U = _bytes_to_unicode()


def spec_pretokenize(text: str) -> list[str]:
    """The tokenizer.json spec written out: isolate each number character, GPT-2 regex the rest, map bytes."""
    pieces: list[str] = []
    for part in _NUMBER.split(text):
        if not part:
            continue
        pieces.extend([part] if _NUMBER.fullmatch(part) else _GPT2.findall(part))
    return ["".join(_B2U[b] for b in p.encode("utf-8")) for p in pieces]


def reference_pre_tokenizer():
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])


def reference_tokenizer(vocab: dict[str, int], merges: list[tuple[str, str]], special: list[str]) -> RustTokenizer:
    """A tokenizer deserialised from a tokenizer.json document with SmolLM2's pre_tokenizer section."""
    doc = json.loads(RustTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False)).to_str())
    doc["pre_tokenizer"] = SMOLLM2_PRE_TOKENIZER
    doc["decoder"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
    tok = RustTokenizer.from_str(json.dumps(doc))
    tok.add_special_tokens(special)
    return tok


# ---- strings from the classes where Digits-first and plain ByteLevel disagree --------------------------------
_UNICODE_NUMBERS = "²³¹⁰⁴⁹₀₃①②⑳⓪❶½¼¾⅓⅞٣۵१๓０９ⅫⅣ〇"
_PUNCT = "'.,;:!?-+=()[]{}\"/\\_#$%&*@^~`|<>"
_pieces = st.one_of(
    st.text(alphabet=" \t\n\r\u00a0\u2009\u3000", min_size=1, max_size=4),  # whitespace runs
    st.text(alphabet="0123456789", min_size=1, max_size=5),  # ASCII digits
    st.sampled_from(_UNICODE_NUMBERS),  # superscripts, circled digits, fractions, other scripts' digits
    st.characters(categories=("Nd", "No", "Nl"), max_codepoint=0xFFFF),
    st.text(alphabet="abcxyzABCéßж中", min_size=1, max_size=4),  # letters
    st.characters(categories=("Lu", "Ll", "Lo"), max_codepoint=0xFFFF),
    st.text(alphabet=_PUNCT, min_size=1, max_size=3),  # punctuation
    st.sampled_from(["'s", "'ll", "'re", "'d"]),  # the GPT-2 regex's contractions
)
texts = st.lists(_pieces, max_size=12).map("".join)
_EXAMPLES = ["x = 12345 + 67", "  12\n 3", "a ² b ①½", "in 2024,  ³⁄₄ of ⑳", "\t\t9", "Ⅻ 1/2"]

# ---- a tiny synthetic GGUF: byte alphabet plus merges that only the wrong split can use ----------------------
_ALPHABET = sorted(set(_B2U.values()))
_MERGES = [("Ġ", "1"), ("Ġ", "Ġ"), ("Â", "²"), ("Ġ", "Â²"), ("1", "2"), ("Ċ", "Ġ"), ("a", "b"), ("Ġ", "ab")]
_SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def tiny_smollm_gguf(tmp_path_factory) -> tuple[str, dict[str, int]]:
    tokens = _SPECIAL + _ALPHABET + ["".join(m) for m in _MERGES]
    path = str(tmp_path_factory.mktemp("smollm_tok") / "tok.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_merges([" ".join(m) for m in _MERGES])
    w.add_token_types([3] * len(_SPECIAL) + [1] * (len(tokens) - len(_SPECIAL)))
    w.add_bos_token_id(0)
    w.add_eos_token_id(2)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path, {t: i for i, t in enumerate(tokens)}


@pytest.fixture(scope="module")
def tiny_tokenizer(tiny_smollm_gguf):
    return Tokenizer.from_pretrained(tiny_smollm_gguf[0]).hf


@pytest.fixture(scope="module")
def tiny_reference(tiny_smollm_gguf):
    return reference_tokenizer(tiny_smollm_gguf[1], _MERGES, _SPECIAL)


def test_spec_statement_agrees_with_tokenizers_on_examples():
    """The pure-Python statement of the spec is the same function as the tokenizers reference (sanity)."""
    ref = reference_pre_tokenizer()
    for text in _EXAMPLES:
        assert spec_pretokenize(text) == [p for p, _ in ref.pre_tokenize_str(text)], text


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts)
@example(text="  12\n 3")
@example(text="a ² b ①½")
def test_smollm_pre_tokenizer_equals_tokenizer_json(tiny_tokenizer, text):
    ours = [p for p, _ in tiny_tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str(text)]
    assert ours == [p for p, _ in reference_pre_tokenizer().pre_tokenize_str(text)]
    assert ours == spec_pretokenize(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts)
@example(text="  12\n 3")  # plain ByteLevel: "Ġ", "Ġ1"+"2", ...; tokenizer.json: "ĠĠ", "1"+"2", "ĊĠ", "3"
@example(text="ab ²")  # plain ByteLevel: "ab", "ĠÂ²"; tokenizer.json: "ab", "Ġ", "Â²"
def test_smollm_token_ids_equal_tokenizer_json_tiny(tiny_tokenizer, tiny_reference, text):
    ids = tiny_tokenizer.encode(text, add_special_tokens=False)
    assert ids == tiny_reference.encode(text, add_special_tokens=False).ids
    assert tiny_tokenizer.decode(ids) == text


def test_wrong_split_would_be_caught(tiny_smollm_gguf, tiny_reference):
    """The merges above make the plain ByteLevel split give other ids, so the id test can fail."""
    plain = reference_tokenizer(tiny_smollm_gguf[1], _MERGES, _SPECIAL)
    plain.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    for text in ("  12\n 3", "ab ²"):
        assert plain.encode(text).ids != tiny_reference.encode(text).ids, text


# ---- the real SmolLM2-135M GGUF (the default model) ------------------------------------------------------------


@pytest.fixture(scope="module")
def smol_tokenizer(smollm2_gguf):
    return Tokenizer.from_pretrained(smollm2_gguf).hf


@pytest.fixture(scope="module")
def smol_reference(smollm2_gguf):
    reader = gguf.GGUFReader(smollm2_gguf)

    def field(name):
        return reader.get_field(name).contents()

    assert field("tokenizer.ggml.pre") == "smollm"
    tokens = list(field("tokenizer.ggml.tokens"))
    merges = [tuple(m.split(" ", 1)) for m in field("tokenizer.ggml.merges")]
    special = [t for t, ty in zip(tokens, field("tokenizer.ggml.token_type")) if ty == 3]
    return reference_tokenizer({t: i for i, t in enumerate(tokens)}, merges, special)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=texts | st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
@example(text="<|im_start|>user\nWhat is 2+2?  ²³ ①½<|im_end|>\n")
@example(text="  12\n 3")
def test_smollm2_token_ids_equal_tokenizer_json(smol_tokenizer, smol_reference, text):
    ids = smol_tokenizer.encode(text, add_special_tokens=False)
    assert ids == smol_reference.encode(text, add_special_tokens=False).ids
    # Not `== text`: the vocabulary lacks a few byte tokens (e.g. of U+40000), which both sides drop alike.
    assert smol_tokenizer.decode(ids) == smol_reference.decode(ids, skip_special_tokens=False)
