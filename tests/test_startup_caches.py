"""The start-up caches: compiled programs on disk (runner/program_cache.py), prepared GGUF weights and metadata
(weights/prepared.py), and the tokenizer without transformers (weights/lite_tokenizer.py).

Every test points JAXINFER_CACHE at its own tmp dir: nothing is written into the user's cache. References are
independent: a fresh compile, a fresh dequantization of the file, transformers' tokenizer."""
import os

import gguf
import jax
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import jaxinfer
from jaxinfer.weights import prepared
from tests.startup_cases import TINY
from tests.startup_cases import run_two_prompts as _run
from tests.startup_cases import stored_programs as _programs


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXINFER_CACHE", str(tmp_path))
    monkeypatch.delenv("JAXINFER_PROGRAM_CACHE", raising=False)
    monkeypatch.delenv("JAXINFER_PREPARED_CACHE", raising=False)
    return tmp_path


# ---- compiled programs --------------------------------------------------------------------------------------
def test_program_cache_hit_is_bitwise_identical_and_corruption_recompiles(cache):
    fresh = jaxinfer.LLM("tiny-llama", **TINY)
    want = _run(fresh)
    pc = fresh.runner.program_cache
    assert pc.misses > 0 and pc.hits == 0 and pc.failures == 0
    stored = _programs(cache)
    assert len(stored) == pc.misses

    warm = jaxinfer.LLM("tiny-llama", **TINY)
    assert _run(warm) == want  # token ids and logprobs, exactly
    assert warm.runner.program_cache.hits == len(stored) and warm.runner.program_cache.misses == 0

    for i, path in enumerate(stored):  # truncated / garbage entries: deleted, compiled again, stored again
        with open(path, "r+b") as f:
            if i % 2:
                f.truncate(100)
            else:
                f.write(b"not a program" * 10)
    broken = jaxinfer.LLM("tiny-llama", **TINY)
    assert _run(broken) == want
    bpc = broken.runner.program_cache
    assert bpc.failures == len(stored) and bpc.misses == len(stored) and bpc.hits == 0
    assert _programs(cache) == stored  # rewritten under the same keys, valid again
    again = jaxinfer.LLM("tiny-llama", **TINY)
    assert _run(again) == want and again.runner.program_cache.hits == len(stored)


def test_program_cache_misses_on_a_changed_config_and_can_be_disabled(cache, monkeypatch):
    base = jaxinfer.LLM("tiny-llama", **TINY).runner
    base.compile_step(base.ladder.buckets[0])
    assert base.program_cache.misses == 1
    other = jaxinfer.LLM("tiny-llama", **{**TINY, "kv_chunk_pages": 2})
    other.runner.compile_step(other.runner.ladder.buckets[0])
    assert other.runner.program_cache.hits == 0 and other.runner.program_cache.misses == 1
    monkeypatch.setenv("JAXINFER_PROGRAM_CACHE", "0")
    assert jaxinfer.LLM("tiny-llama", **TINY).runner.program_cache is None


def test_program_key_covers_name_and_parts():
    from jaxinfer.runner.program_cache import abstract_signature, program_key

    a = jax.ShapeDtypeStruct((4, 8), np.float32)
    assert program_key("step", 1, abstract_signature([a])) == program_key("step", 1, abstract_signature([a]))
    assert program_key("step", 1, abstract_signature([a])) != program_key("step", 2, abstract_signature([a]))
    b = jax.ShapeDtypeStruct((4, 9), np.float32)
    assert program_key("step", 1, abstract_signature([a])) != program_key("step", 1, abstract_signature([b]))


@pytest.mark.parametrize("name,registry,other,same", [
    ("JAXINFER_TRITON", "TRACE_ENV", "0", "1"),              # on unless "0"
    ("JAXINFER_SPLIT_CAUSAL", "TRACE_ENV_OFF", "1", "0"),    # off unless set on
    ("JAXINFER_TRITON_PREFILL", "TRACE_ENV_OFF", "1", "0"),
])
def test_program_key_covers_the_trace_time_switches(monkeypatch, name, registry, other, same):
    """Switches read while the step is traced (JAXINFER_TRITON: the small-M kernels or XLA's forms; the attention
    kernel's forms) change the program: a program compiled under one setting must not be loaded under the other,
    and the default's own spelling is the same setting as leaving it unset."""
    from jaxinfer.runner import program_cache

    assert name in getattr(program_cache, registry)
    monkeypatch.delenv(name, raising=False)
    default = program_cache.program_key("step", 1)
    monkeypatch.setenv(name, other)
    changed = program_cache.program_key("step", 1)
    monkeypatch.setenv(name, same)
    assert changed != default and program_cache.program_key("step", 1) == default


def test_prefetch_loads_the_first_program_of_the_last_start_and_a_stale_hint_is_harmless(cache, monkeypatch):
    """prefetch() (jaxinfer generate): the next start under the same hint gets the first program the last one
    used from the prefetch thread, bitwise the same results as the programs read from disk; missing or damaged
    hinted programs change nothing (the damaged one is still dropped and recompiled by the ordinary load)."""
    from jaxinfer.runner import program_cache as pc

    monkeypatch.setattr(pc, "_hint", None)
    monkeypatch.setattr(pc, "_prefetched", {})
    hint = pc.hint_name("test", 1)
    assert pc.prefetch(hint) == []  # no hint yet: nothing to load; this process's keys are recorded from now
    first = jaxinfer.LLM("tiny-llama", **TINY)
    want = _run(first)
    stored = _programs(cache)
    with open(os.path.join(cache, "programs", hint + ".hint")) as f:
        keys = f.read().split()
    assert sorted(keys) == sorted(os.path.basename(p)[:-4] for p in stored) and len(keys) == len(stored) >= 2

    assert pc.prefetch(hint) == keys[:1]  # "the next start"
    warm = jaxinfer.LLM("tiny-llama", **TINY)
    assert _run(warm) == want
    wpc = warm.runner.program_cache
    assert wpc.prefetched == 1 and wpc.hits == len(stored) and wpc.misses == 0

    with open(stored[0], "r+b") as f:  # a damaged program and a missing one under the hint
        f.truncate(100)
    damaged = os.path.basename(stored[0])[:-4]
    with open(os.path.join(cache, "programs", hint + ".hint"), "w") as f:
        f.write(damaged + "\n" + "0" * 64 + "\n")
    assert pc.prefetch(hint, count=2) == [damaged, "0" * 64]
    again = jaxinfer.LLM("tiny-llama", **TINY)
    assert _run(again) == want
    apc = again.runner.program_cache
    assert apc.prefetched == 0 and apc.failures == 1 and apc.misses == 1 and apc.hits == len(stored) - 1
    assert _programs(cache) == stored  # the damaged one stored again


# ---- prepared GGUF weights ----------------------------------------------------------------------------------
def _write_gguf(path, seed: int):
    """A 2-layer llama GGUF (Q8_0 / Q4_1 / F16 / F32 tensors; no tokenizer)."""
    rng = np.random.default_rng(seed)
    hidden, inter, vocab, heads, kv = 64, 96, 128, 4, 2
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny llama")
    for add, v in ((w.add_block_count, 2), (w.add_context_length, 256), (w.add_embedding_length, hidden),
                   (w.add_feed_forward_length, inter), (w.add_head_count, heads), (w.add_head_count_kv, kv),
                   (w.add_layer_norm_rms_eps, 1e-6), (w.add_rope_freq_base, 10000.0), (w.add_vocab_size, vocab),
                   (w.add_rope_dimension_count, hidden // heads)):
        add(v)

    def tensor(name, shape, qtype=QT.F32):
        x = rng.standard_normal(shape).astype(np.float32)
        if qtype == QT.F32:
            w.add_tensor(name, x)
        else:
            raw = gguf.quants.quantize(x, qtype)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=qtype)

    tensor("token_embd.weight", (vocab, hidden), QT.F16)
    for i in range(2):
        p = f"blk.{i}."
        tensor(p + "attn_norm.weight", (hidden,))
        tensor(p + "ffn_norm.weight", (hidden,))
        tensor(p + "attn_q.weight", (hidden, hidden), QT.Q8_0)
        tensor(p + "attn_k.weight", (kv * hidden // heads, hidden), QT.Q8_0)
        tensor(p + "attn_v.weight", (kv * hidden // heads, hidden), QT.Q4_1)
        tensor(p + "attn_output.weight", (hidden, hidden), QT.Q8_0)
        tensor(p + "ffn_gate.weight", (inter, hidden), QT.Q4_1)
        tensor(p + "ffn_up.weight", (inter, hidden), QT.Q8_0)
        tensor(p + "ffn_down.weight", (hidden, inter), QT.Q8_0)
    tensor("output_norm.weight", (hidden,))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _load(path, dtype="float32"):
    from jaxinfer.weights.loader import load_model, resolve_model

    m = load_model(resolve_model(str(path)), dtype, progress=False)
    prepared.wait_for_writes()
    return [np.asarray(p) for p in m.params]


def _fresh(path, monkeypatch, dtype="float32"):
    with monkeypatch.context() as m:
        m.setenv("JAXINFER_PREPARED_CACHE", "0")
        return _load(path, dtype)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_prepared_weights_hit_equals_fresh_dequantization(cache, tmp_path, monkeypatch, dtype):
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, seed=0)
    want = _fresh(path, monkeypatch, dtype)
    assert not os.path.exists(prepared.root())  # disabled: nothing written
    first = _load(path, dtype)  # miss: dequantized, then stored
    assert [os.path.isfile(os.path.join(r, "manifest.json")) for r, _, _ in os.walk(prepared.root())].count(True) == 1

    import jaxinfer.weights.loader as loader

    monkeypatch.setattr(loader, "_iter_gguf", lambda p: pytest.fail("a hit read the GGUF tensors"))
    monkeypatch.setattr("jaxinfer.weights.gguf.gguf_to_hf_config", lambda p: pytest.fail("a hit parsed the GGUF"))
    hit = _load(path, dtype)
    for a, b, c in zip(want, first, hit):
        assert a.dtype == c.dtype == np.dtype(jax.numpy.dtype(dtype)) and a.shape == c.shape
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_prepared_cache_is_invalidated_when_the_file_changes(cache, tmp_path, monkeypatch):
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, seed=0)
    old = _load(path)
    old_entries = os.listdir(prepared.root())
    _write_gguf(path, seed=1)  # same path and size, other weights
    want = _fresh(path, monkeypatch)
    got = _load(path)
    assert any(not np.array_equal(a, b) for a, b in zip(old, got))
    for a, b in zip(want, got):
        np.testing.assert_array_equal(a, b)
    assert not set(old_entries) & set(os.listdir(prepared.root()))  # the old version's entry is gone


def test_prepared_cache_damaged_entry_and_size_cap(cache, tmp_path, monkeypatch):
    path = tmp_path / "tiny.gguf"
    _write_gguf(path, seed=0)
    want = _fresh(path, monkeypatch)
    _load(path)
    manifests = [os.path.join(r, "manifest.json") for r, _, fs in os.walk(prepared.root()) if "manifest.json" in fs]
    npys = sorted(f for f in os.listdir(os.path.dirname(manifests[0])) if f.endswith(".npy"))
    os.truncate(os.path.join(os.path.dirname(manifests[0]), npys[3]), 10)
    for a, b in zip(want, _load(path)):  # the damaged entry is dropped and written again
        np.testing.assert_array_equal(a, b)
    prepared.trim(limit=0)
    assert not [r for r, _, fs in os.walk(prepared.root()) if "manifest.json" in fs]
    monkeypatch.setenv("JAXINFER_PREPARED_CACHE_MAX_GB", "0.000001")  # an entry above the cap is never written
    for a, b in zip(want, _load(path)):
        np.testing.assert_array_equal(a, b)
    assert not [r for r, _, fs in os.walk(prepared.root()) if "manifest.json" in fs]


# ---- tokenizer ----------------------------------------------------------------------------------------------
CHATS = [[{"role": "user", "content": "What is the capital of France?"}],
         [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi 12 ²½ 😀"},
          {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Again\n\n  spaced"}]]


def test_lite_tokenizer_equals_transformers(smollm2_gguf, cache):
    from jaxinfer.weights.lite_tokenizer import LiteTokenizer
    from jaxinfer.tokenizer import Tokenizer
    from jaxinfer.weights.gguf import load_gguf_tokenizer

    hf = load_gguf_tokenizer(smollm2_gguf)  # the transformers tokenizer; stores its spec in the cache
    spec = prepared.load_metadata(smollm2_gguf)["tokenizer"]
    lite = LiteTokenizer(spec)
    wrapped = Tokenizer.from_pretrained(smollm2_gguf)
    assert isinstance(wrapped._impl, LiteTokenizer)
    for text in ["The quick brown fox", " 12 ²", "naïve café — 中文 ✓ 😀", "<|im_start|>user\nhi<|im_end|>"]:
        assert lite.encode(text, add_special_tokens=False) == hf.encode(text, add_special_tokens=False)
        assert wrapped.encode(text) == hf.encode(text)
        ids = hf.encode(text)
        for skip in (True, False):
            assert lite.decode(ids, skip_special_tokens=skip) == hf.decode(ids, skip_special_tokens=skip)
    for chat in CHATS:
        for gen in (True, False):
            assert lite.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False) == \
                hf.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False)
            assert wrapped.apply_chat_template(chat, add_generation_prompt=gen) == \
                list(hf.apply_chat_template(chat, add_generation_prompt=gen, tokenize=True, return_dict=False))
    assert (lite.bos_token_id, lite.eos_token_id, len(lite)) == (hf.bos_token_id, hf.eos_token_id, len(hf))
    assert wrapped.eos_token_ids == Tokenizer(hf).eos_token_ids
    assert type(wrapped.hf).__name__ == type(hf).__name__  # .hf is still a transformers tokenizer


def test_unserializable_program_is_marked_and_compiled_plainly(cache, monkeypatch):
    import jax.experimental.serialize_executable as se

    def refuse(compiled):
        raise ValueError("Compilation does not support serialization")

    one_bucket = {**TINY, "min_bucket_tokens": 32}  # one step program runs _run (its prefill and decodes)
    with monkeypatch.context() as m:
        m.setattr(se, "serialize", refuse)
        first = jaxinfer.LLM("tiny-llama", **one_bucket)
        want = _run(first)
    d = os.path.join(cache, "programs")
    marks = [f for f in os.listdir(d) if f.endswith(".plain")]
    assert marks and not _programs(cache) and len(marks) == first.runner.program_cache.misses
    second = jaxinfer.LLM("tiny-llama", **one_bucket)
    assert _run(second) == want
    pc = second.runner.program_cache
    assert pc.hits == 0 and pc.failures == 0 and not _programs(cache)  # the marked programs are not stored


def test_program_cache_default_is_per_backend(monkeypatch):
    """Unset, the program cache is on for the backends it is verified on (CPU, GPU) and off elsewhere (TPU); the
    variable forces it either way."""
    from jaxinfer.runner import program_cache as pc

    monkeypatch.delenv("JAXINFER_PROGRAM_CACHE", raising=False)
    assert pc.program_cache_enabled("cpu") and pc.program_cache_enabled("gpu") and not pc.program_cache_enabled("tpu")
    monkeypatch.setenv("JAXINFER_PROGRAM_CACHE", "1")
    assert pc.program_cache_enabled("tpu")
    monkeypatch.setenv("JAXINFER_PROGRAM_CACHE", "off")
    assert not pc.program_cache_enabled("cpu")
