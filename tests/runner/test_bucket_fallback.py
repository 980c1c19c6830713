"""A step whose bucket's program is still compiling in the background runs in the first larger bucket whose
program is ready (runner/model_runner.py _packed_step): the GPU's 1-token bucket compiles after warm-up, and
until then the batch-1 decode runs in the 16-token bucket as it did before that bucket existed. Same tokens
either way (float32), and the small bucket is used as soon as its program is ready."""
import threading
from concurrent.futures import Future

from jaxinfer import LLM, SamplingParams
from jaxinfer.outputs import SeqInput


def test_step_runs_in_a_larger_ready_bucket_while_its_own_compiles():
    llm = LLM("tiny-llama", load_format="dummy", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64,
              warmup=False, progress=False)
    r = llm.runner
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    prompt = [5, 6, 7, 8, 9]
    want = llm.generate([prompt], sp, use_tqdm=False)[0].outputs[0].token_ids  # decodes in the 1-token bucket
    one, four = r.ladder.buckets[:2]  # CPU ladder: 1, 4, 16, 64
    assert (one.num_tokens, four.num_tokens) == (1, 4)
    assert r.greedy_programs  # compiled lazily (warmup=False): the greedy-only programs, on the CPU too
    one_exe = r._compiled.pop((one, True))
    r._step_program(four, greedy_only=True)  # the larger bucket's program is ready
    pending = Future()  # "still compiling in the background"
    r._pending[one, True] = pending
    # a dispatch that waited for it would hang: fail it instead after a minute
    guard = threading.Timer(60, lambda: pending.done() or pending.set_exception(TimeoutError("a step waited")))
    guard.daemon = True
    guard.start()
    seqs = [SeqInput(token_ids=[5], start_pos=3, page_table=[1])]
    batch, step = r._packed_step(seqs, one)
    assert batch.bucket == four and step is r._compiled[four, True]

    used = []
    packed_step = r._packed_step
    r._packed_step = lambda s, b: (lambda res: used.append(res[0].bucket) or res)(packed_step(s, b))
    try:
        got = llm.generate([prompt], sp, use_tqdm=False)[0].outputs[0].token_ids
        assert got == want
        assert four in used and one not in used  # every decode ran in the 4-token bucket
        pending.set_result(one_exe)  # the background compile finished
        used.clear()
        assert llm.generate([prompt], sp, use_tqdm=False)[0].outputs[0].token_ids == want
        assert one in used and (one, True) in r._compiled and (one, True) not in r._pending
    finally:
        r._packed_step = packed_step
        guard.cancel()


def test_small_buckets_only_without_speculation(monkeypatch, tiny_llama_dir):
    """The GPU's 1-token bucket (GPU_LADDER small_buckets) is left out of a speculative engine, which gets a bucket of
    one verification instead (k + 1 tokens, one sequence, one verify row), and out of a draft model's runner (its
    fused k-step programs would compile for it too), whose pipelined cycle alone can pick it (decode_ladder).
    Simulated here by giving the CPU the GPU's ladder; an explicit min_bucket_tokens turns both extras off."""
    from jaxinfer.runner import cpu_defaults

    monkeypatch.setattr(cpu_defaults, "CPU_LADDER", dict(cpu_defaults.GPU_LADDER))
    kw = dict(load_format="dummy", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64, warmup=False,
              progress=False)
    plain = LLM("tiny-llama", **kw)
    assert [b.num_tokens for b in plain.runner.ladder.buckets] == [1, 16, 32, 64]
    spec = LLM(tiny_llama_dir, speculative_config=dict(method="draft", draft_model=tiny_llama_dir,
                                                       num_speculative_tokens=2, batch_policy=False), **kw)
    verify, *rest = spec.runner.ladder.buckets
    assert (verify.num_tokens, verify.num_seqs, verify.spec_rows, verify.spec_len) == (3, 1, 1, 2)
    assert [b.num_tokens for b in rest] == [16, 32, 64]
    draft_runner = spec.engine.spec.proposer.runner
    assert [b.num_tokens for b in draft_runner.ladder.buckets] == [16, 32, 64]
    assert [b.num_tokens for b in draft_runner.decode_ladder.buckets] == [1, 2, 16, 32, 64]
    # the cycle takes that pair only under its A/B switch (DraftCycle.small_pair, off: measured slower)
    pairs = {(b1.num_tokens, b2.num_tokens) for b1, b2 in spec.engine.spec.proposer.cycle.buckets()}
    assert pairs == {(16, 16)}
    spec16 = LLM(tiny_llama_dir, speculative_config=dict(method="draft", draft_model=tiny_llama_dir,
                                                         num_speculative_tokens=2, batch_policy=False),
                 **kw, min_bucket_tokens=16)
    assert [b.num_tokens for b in spec16.runner.ladder.buckets] == [16, 32, 64]
    assert spec16.engine.spec.proposer.runner.decode_ladder is spec16.engine.spec.proposer.runner.ladder


def _tiny():
    return LLM("tiny-llama", load_format="dummy", max_model_len=128, max_num_seqs=4, max_num_batched_tokens=64,
               warmup=False, progress=False)


def test_deferred_background_compile_starts_after_the_first_step():
    """compile_in_background(after_first_step=True) (`jaxinfer generate`'s decode bucket) compiles nothing before
    the first step's results are fetched; the decodes before it is ready run in a larger bucket, same tokens. A
    first step that needs the deferred program itself starts it (no wait for a fetch that cannot come)."""
    sp = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    ref = _tiny()
    want = ref.generate([[5, 6, 7, 8, 9]], sp, use_tqdm=False)[0].outputs[0].token_ids
    want_one = ref.generate([[5]], sp, use_tqdm=False)[0].outputs[0].token_ids

    llm = _tiny()
    r = llm.runner
    one = r.ladder.pick(1, 1)
    calls = []
    compile_step = r.compile_step
    r.compile_step = lambda b, *a, **k: calls.append((b, r._first_fetch_done)) or compile_step(b, *a, **k)
    r.compile_in_background([one], after_first_step=True, greedy_only=True)
    assert not r._pending[one, True].done()
    threading.Event().wait(0.6)  # (the waiting thread polls every 0.25 s)
    assert not [b for b, _ in calls if b == one]  # not started: no step has run yet
    assert llm.generate([[5, 6, 7, 8, 9]], sp, use_tqdm=False)[0].outputs[0].token_ids == want
    r.finish_background_compiles()
    assert [(b, fetched) for b, fetched in calls if b == one] == [(one, True)]  # started after the first fetch
    assert (one, True) in r._compiled

    first_one = _tiny()  # a 1-token prompt: the first step is the deferred bucket's
    first_one.runner.compile_in_background([one], after_first_step=True, greedy_only=True)
    got = []
    t = threading.Thread(target=lambda: got.append(
        first_one.generate([[5]], sp, use_tqdm=False)[0].outputs[0].token_ids), daemon=True)
    t.start()
    t.join(300)
    assert got == [want_one], "the first step waited for a program deferred until after it"
