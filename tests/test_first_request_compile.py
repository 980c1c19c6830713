"""`jaxinfer generate`'s start-up overlap (api.LLM `_first_request`): the runner is built from the weights' shapes
(weights/loader.abstract_model) before they are read, and the first request's step program compiles on a thread
while they load. Checked: the compile starts before the weights are read, the engine then uses that program, and
the tokens equal those of an LLM built without the hint (float32)."""
import threading

import jax

from jaxinfer import LLM, SamplingParams
from jaxinfer.runner.model_runner import ModelRunner
from jaxinfer.runner.program_cache import abstract_signature
from jaxinfer.weights import loader

KW = dict(max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64, warmup=False, progress=False)
SP = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def test_abstract_model_has_the_loaded_models_signature(tiny_llama_dir):
    """Same structure, shapes, dtypes and shardings: a program lowered from the shapes is the one the weights
    run, and its program-cache key is the one a later start computes from the weights."""
    src = loader.resolve_model(tiny_llama_dir)
    shapes, real = loader.abstract_model(src, "float32"), loader.load_model(src, "float32", progress=False)
    assert abstract_signature(shapes.params) == abstract_signature(real.params)
    assert shapes.treedef == real.treedef and shapes.cfg == real.cfg
    assert all(isinstance(p, jax.ShapeDtypeStruct) for p in shapes.params)


def test_first_request_compiles_while_the_weights_load(tiny_llama_dir, tiny_tokenizer_dir, monkeypatch):
    messages = [{"role": "user", "content": "hello there, how are you today?"}]
    ref = LLM(tiny_llama_dir, tokenizer=tiny_tokenizer_dir, **KW)
    prompt = ref.tokenizer.apply_chat_template(messages)
    bucket = ref.runner.ladder.pick(len(prompt), 1)
    want = ref.generate([prompt], SP, use_tqdm=False)[0].outputs[0].token_ids

    started, calls = threading.Event(), []
    compile_step = ModelRunner.compile_step

    def recording(self, b, *a, **k):
        calls.append(b)
        started.set()
        return compile_step(self, b, *a, **k)

    load_model = loader.load_model
    seen = []

    def loading(*a, **k):  # the weights are read only once the first request's compile has started
        seen.append(started.wait(120))
        return load_model(*a, **k)

    monkeypatch.setattr(ModelRunner, "compile_step", recording)
    monkeypatch.setattr(loader, "load_model", loading)
    llm = LLM(tiny_llama_dir, tokenizer=tiny_tokenizer_dir, _first_request=(messages, SP), **KW)
    assert seen == [True], "the weights were read before the first request's program started compiling"
    assert calls[0] == bucket
    assert not any(isinstance(p, jax.ShapeDtypeStruct) for p in llm.runner.loaded.params)
    got = llm.generate([prompt], SP, use_tqdm=False)[0].outputs[0].token_ids
    assert got == want
    assert calls.count(bucket) == 1  # the step used the program compiled during the load


def test_waiting_for_a_background_program_leaves_after_first_step_ones_waiting():
    """A step that waits for an ordinary background program (the first request's) is not "the first step
    waiting for a deferred one": the deferred decode program keeps waiting for the first fetch."""
    llm = LLM("tiny-llama", load_format="dummy", **KW)
    r = llm.runner
    one, four = r.ladder.buckets[:2]
    r.compile_in_background([four], greedy_only=True)
    r.compile_in_background([one], after_first_step=True, greedy_only=True)
    r._step_program(four, greedy_only=True)
    assert not r._first_step_done.is_set()
    r._step_program(one, greedy_only=True)  # a step that needs the deferred one itself starts it
    assert r._first_step_done.is_set()


def test_no_early_runner_where_the_kv_pool_is_sized_from_free_memory(tiny_llama_dir, monkeypatch):
    """On an accelerator the KV pool takes a share of the memory free when the runner is built: built before the
    weights are on the device it would leave them no room. The early path is the CPU's alone."""
    from jaxinfer.runner import cpu_defaults

    calls = []
    compile_step = ModelRunner.compile_step
    monkeypatch.setattr(ModelRunner, "compile_step", lambda self, b, *a, **k: calls.append(b) or compile_step(
        self, b, *a, **k))
    monkeypatch.setattr(cpu_defaults, "on_cpu", lambda: False)
    llm = LLM(tiny_llama_dir, _first_request=([5, 6, 7], SP), **KW)
    assert calls == []  # nothing compiled while building
    assert not any(isinstance(p, jax.ShapeDtypeStruct) for p in llm.runner.loaded.params)
