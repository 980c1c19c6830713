"""runner/step.stage_inputs: the step copies its packed inputs into donated stage buffers and reads them there, so
on the GPU only that copy's command moves between calls (the CUDA graph's other commands keep their addresses).

Structure (XLA:CPU's optimized HLO of a real step program; the GPU compiler shares these passes): the transferred
inputs have the in-place update as their only user, the update's result feeds the step, and the stage parameters
are aliased to outputs (donated, so the next call gets the same buffers); the same for a draft model's cycle
program (runner/draft_cycle.py). Exactness: an engine with the stage
and one without produce the same tokens, across buckets of different input lengths, a stage per length."""
import re

import jax
import numpy as np
import pytest

import jaxinfer
from jaxinfer import SamplingParams
from jaxinfer.runner.model_runner import ModelRunner
from jaxinfer.runner.step import stage_inputs


def _entry(txt: str) -> str:
    return txt[txt.index("ENTRY"):]


def test_step_reads_its_inputs_from_the_donated_stage():
    llm = jaxinfer.LLM(model="tiny-llama", load_format="dummy", warmup=False, progress=False, max_model_len=256)
    r = llm.runner
    assert r.staged
    _assert_reads_inputs_from_stage(r.compile_step(r.ladder.buckets[0]).as_text(), many_readers=True)


def test_draft_cycle_reads_its_inputs_from_the_donated_stage(tiny_llama_dir):
    """runner/draft_cycle.py: a draft model's k steps as one program, its two packed inputs staged the same way."""
    llm = jaxinfer.LLM(tiny_llama_dir, num_pages=32, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=4,
                       warmup=False, progress=False, speculative_config=dict(
                           method="draft", draft_model=tiny_llama_dir, num_speculative_tokens=2, batch_policy=False))
    prop = llm.engine.spec.proposer
    assert prop.cycle is not None and prop.cycle.staged
    b1, b2 = prop.cycle.buckets()[0]
    _assert_reads_inputs_from_stage(prop.cycle._program(b1, b2, prop.carry_shape).as_text(), many_readers=False)


def test_fused_draft_steps_read_their_inputs_from_the_donated_stage(tiny_llama_dir):
    """runner/draft_steps.py (the unpipelined proposal: k draft steps in one program): staged the same way."""
    llm = jaxinfer.LLM(tiny_llama_dir, num_pages=32, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=4,
                       warmup=False, progress=False, speculative_config=dict(
                           method="draft", draft_model=tiny_llama_dir, num_speculative_tokens=2, batch_policy=False))
    fused = llm.engine.spec.proposer.fused
    assert fused is not None and fused.staged
    _assert_reads_inputs_from_stage(fused._program(fused.buckets()[0]).as_text(), many_readers=False)


def _assert_reads_inputs_from_stage(txt: str, many_readers: bool):
    """The optimized HLO's transferred ints / floats parameters: their only reader is the copy into their stage
    parameter, whose result the program reads; the stage parameters are aliased to outputs (donated)."""
    entry = _entry(txt)
    params = dict(re.findall(r"%(\S+) = \S+ parameter\((\d+)\)", entry))
    ints, floats = next(n for n in params if n.startswith("ints")), next(n for n in params if n.startswith("floats"))
    stage = sorted((n for n in params if n.startswith("stage")), key=lambda n: int(params[n]))
    assert len(stage) == 2
    for name in (ints, floats):
        users = [line for line in entry.splitlines() if re.search(rf"%{re.escape(name)}\b", line)
                 and "parameter(" not in line]
        # its only reader: the copy into the stage (a dynamic-update-slice; on the GPU an async fusion-start of it,
        # H100 12-06), whose operands are the stage and this input
        own_stage = stage[0] if name == ints else stage[1]
        assert len(users) == 1 and re.search(rf"%{re.escape(own_stage)}\b", users[0]), users
        assert re.search(r"dynamic.update.slice", users[0]) or "fusion-start(" in users[0], users
        copy = re.match(r"\s*(?:ROOT )?%(\S+) =", users[0]).group(1)
        readers = [line for line in entry.splitlines() if re.search(rf"%{re.escape(copy)}\b", line)
                   and not line.strip().startswith(f"%{copy} =")]
        assert readers  # the step reads the stage (ints: the batch's slices; floats: the sampling parameters)
        if many_readers and name == ints and "fusion-start(" not in users[0]:
            assert len(readers) > 3, readers
    aliased = {int(p) for p in re.findall(r"\{\d+\}: \((\d+), \{\}", txt[txt.index("input_output_alias"):
                                                                        txt.index("entry_computation_layout")])}
    assert {int(params[s]) for s in stage} <= aliased


def test_stage_inputs_returns_the_inputs():
    ints = np.arange(7, dtype=np.int32)
    floats = np.linspace(0, 1, 3).astype(np.float32)
    stage = (np.full(8, -1, np.int32), np.full(4, -1, np.float32))
    i, f, (si, sf) = jax.jit(stage_inputs)(ints, floats, stage)
    np.testing.assert_array_equal(i, ints)
    np.testing.assert_array_equal(f, floats)
    np.testing.assert_array_equal(si[:7], ints)
    assert si[7] == -1 and sf[3] == -1  # the extra element is left alone


@pytest.mark.parametrize("greedy", [True, False])
def test_engine_tokens_are_those_of_the_unstaged_step(tiny_llama_dir, monkeypatch, greedy):
    prompts = [[5, 6, 7], list(range(10, 40)), list(range(3, 70)), [9]]
    sp = SamplingParams(temperature=0.0 if greedy else 0.8, seed=3, max_tokens=14, ignore_eos=True)
    opts = dict(num_pages=64, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=4, warmup=False,
                progress=False)
    llm = jaxinfer.LLM(tiny_llama_dir, **opts)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
    assert llm.runner.staged and len(llm.runner._stages) >= 2  # prefill and decode lengths: a stage each
    monkeypatch.setattr(ModelRunner, "stage_inputs", False)
    plain = jaxinfer.LLM(tiny_llama_dir, **opts)
    assert not plain.runner.staged
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, sp, use_tqdm=False)]
    assert got == want
