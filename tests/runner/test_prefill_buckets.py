"""The prefill twins of the decode-shaped buckets (runner/buckets.py prefill_buckets, KernelConfig.prefill_buckets):
their shapes and place in the ladder, which runners get them, that a step of few sequences runs in one, and that
the tokens are those of the ladder without them."""
import pytest

from jaxinfer import LLM, SamplingParams
from jaxinfer.runner.buckets import BucketLadder

KW = dict(max_num_batched_tokens=256, max_num_seqs=64, max_model_len=512, page_size=16, query_tile=16,
          kv_chunk_pages=4, min_tokens=16, growth=2, small_buckets=(1,))


def _shapes(ladder):
    return [(b.num_tokens, b.num_seqs, b.query_tile, b.num_tiles) for b in ladder.buckets]


def test_twins_sit_before_their_decode_shaped_siblings():
    plain = BucketLadder.build(**KW)
    ladder = BucketLadder.build(**KW, prefill_buckets=True)
    assert _shapes(plain) == [(1, 1, 4, 2), (16, 16, 4, 20), (32, 32, 4, 40), (64, 64, 4, 80), (128, 64, 16, 72),
                              (256, 64, 16, 80)]
    # T <= max_num_seqs (4-token tiles, S = T): a twin of S' = T / 16 sequences and 16-token tiles just before
    assert _shapes(ladder) == [(1, 1, 4, 2), (16, 1, 16, 2), (16, 16, 4, 20), (32, 2, 16, 4), (32, 32, 4, 40),
                               (64, 4, 16, 8), (64, 64, 4, 80), (128, 64, 16, 72), (256, 64, 16, 80)]
    pick = lambda n, m: (lambda b: (b.num_tokens, b.num_seqs))(ladder.pick(n, m))  # noqa: E731
    assert pick(1, 1) == (1, 1)
    assert pick(10, 1) == (16, 1)      # a short prompt alone
    assert pick(10, 2) == (16, 16)     # two sequences: the sibling
    assert pick(16, 16) == (16, 16)    # a decode step
    assert pick(40, 4) == (64, 4)      # a chunk beside three decodes
    assert pick(40, 5) == (64, 64)
    assert pick(100, 1) == (128, 64)   # above max_num_seqs: 16-token tiles already, no twin
    # no twins where the small buckets' tile is the query tile already, or with the switch off
    assert _shapes(BucketLadder.build(**{**KW, "query_tile": 4}, prefill_buckets=True)) == _shapes(
        BucketLadder.build(**{**KW, "query_tile": 4}))
    # a ladder growing x4 (the CPU's): twins of their own at the doublings in between, not below min_tokens
    cpu = BucketLadder.build(**{**KW, "min_tokens": 1, "growth": 4, "small_buckets": (), "max_num_batched_tokens": 1024,
                                "max_num_seqs": 256}, prefill_buckets=True)
    assert [(b.num_tokens, b.num_seqs, b.query_tile) for b in cpu.buckets] == [
        (1, 1, 4), (4, 4, 4), (16, 1, 16), (16, 16, 4), (32, 2, 16), (64, 4, 16), (64, 64, 4), (128, 8, 16),
        (256, 16, 16), (256, 256, 4), (512, 32, 16), (1024, 256, 16)]
    assert (cpu.pick(100, 1).num_tokens, cpu.pick(100, 9).num_tokens, cpu.pick(300, 1).num_tokens) == (128, 256, 512)
    # the ladder names its twins: what it has beyond the ladder without them
    for kw in (KW, {**KW, "min_tokens": 1, "growth": 4, "small_buckets": (), "max_num_batched_tokens": 1024,
                    "max_num_seqs": 256}):
        with_twins, without = BucketLadder.build(**kw, prefill_buckets=True), BucketLadder.build(**kw)
        assert with_twins.twins == set(with_twins.buckets) - set(without.buckets) and not without.twins
    # speculation: a twin's verify rows follow its sequences
    spec = BucketLadder.build(**KW, prefill_buckets=True, max_spec_seqs=8, num_spec_tokens=3)
    assert [(b.num_seqs, b.spec_rows) for b in spec.buckets[1:5]] == [(1, 1), (16, 8), (2, 2), (32, 8)]


def _llm(**kw):
    return LLM("tiny-llama", load_format="dummy", dtype="float32", max_model_len=256, max_num_seqs=64,
               max_num_batched_tokens=128, warmup=False, progress=False, **kw)


def test_which_runners_get_twins(tiny_llama_dir):
    """On by default without speculation, compiled in the background after warm-up; off with prefill_buckets=False;
    a speculating engine keeps its measured ladder unless asked; a draft model's runner never gets them."""
    on, off = _llm(), _llm(prefill_buckets=False)
    twins = [b for b in on.runner.ladder.buckets if b not in off.runner.ladder.buckets]
    # CPU ladder 1, 4, 16, 64, 128: twins of the 16- and 64-token buckets and one of its own at 32 (x4 growth)
    assert [(b.num_tokens, b.num_seqs) for b in twins] == [(16, 1), (32, 2), (64, 4)]
    assert on.runner._background == set(twins) and not off.runner._background  # (the CPU has no small buckets)
    spec_kw = dict(speculative_config=dict(method="draft", draft_model=tiny_llama_dir, num_speculative_tokens=2,
                                           batch_policy=False), max_model_len=256, max_num_seqs=64,
                   max_num_batched_tokens=128, warmup=False, progress=False)
    spec = LLM(tiny_llama_dir, **spec_kw)
    assert all(b.query_tile == 4 or b.num_tokens > 64 for b in spec.runner.ladder.buckets)
    forced = LLM(tiny_llama_dir, prefill_buckets=True, **spec_kw)
    assert (16, 1) in [(b.num_tokens, b.num_seqs) for b in forced.runner.ladder.buckets]
    draft = forced.engine.spec.proposer.runner
    assert all(b.query_tile == 4 or b.num_tokens > 64 for b in draft.ladder.buckets + draft.decode_ladder.buckets)


@pytest.mark.parametrize("greedy", [True, False])
def test_same_tokens_with_and_without_twins(greedy):
    """Prompts alone and together, short and long (1 / 4 / 16 / 64 / 128-token steps), with a prompt arriving while
    others decode: the same tokens as the ladder without twins (float32), and the twins did run steps."""
    sp = SamplingParams(max_tokens=12, ignore_eos=True, **(dict(temperature=0.0) if greedy else
                                                           dict(temperature=0.8, top_k=20, seed=3)))
    prompts = [[(5 * i + 3 * j) % 200 + 2 for j in range(n)] for i, n in enumerate((9, 14, 40, 61, 3, 100, 25))]

    def run(llm):
        used = []
        packed_step = llm.runner._packed_step
        llm.runner._packed_step = lambda s, b: (lambda res: used.append(res[0].bucket) or res)(packed_step(s, b))
        alone = [llm.generate([p], sp, use_tqdm=False)[0].outputs[0].token_ids for p in prompts]
        together = [o.outputs[0].token_ids for o in llm.generate(prompts[:4], sp, use_tqdm=False)]
        eng = llm.engine  # a prompt arriving beside three decoding sequences
        for i, p in enumerate(prompts[:3]):
            eng.add_request(f"r{i}", p, sp)
        for _ in range(3):
            eng.step()
        eng.add_request("late", prompts[3], sp)
        late = {}
        while eng.has_unfinished():
            for out in eng.step():
                if out.finished:
                    late[out.request_id] = out.outputs[0].token_ids
        return alone, together, late, used

    on, off = _llm(), _llm(prefill_buckets=False)
    *got, used = run(on)
    *want, _ = run(off)
    assert got == want
    twins = set(on.runner.ladder.buckets) - set(off.runner.ladder.buckets)
    assert {(b.num_tokens, b.num_seqs) for b in twins & set(used)} == {(16, 1), (32, 2), (64, 4)}


def test_fallback_while_a_bucket_compiles():
    """While a twin's program compiles in the background its step runs in the sibling (ModelRunner._packed_step);
    while a decode-shaped bucket's compiles, its step skips the next twin, which holds fewer sequences."""
    from concurrent.futures import Future

    from jaxinfer.outputs import SeqInput

    r = _llm().runner
    by = {(b.num_tokens, b.num_seqs): b for b in r.ladder.buckets}
    twin16, sib16, twin64, sib64 = by[16, 1], by[16, 16], by[64, 4], by[64, 64]
    for b in (sib16, sib64, twin64):
        r._step_program(b, greedy_only=True)
    r._pending[twin16, True] = Future()  # "still compiling"
    prompt = [SeqInput(token_ids=list(range(2, 12)), start_pos=0, page_table=[1])]
    batch, step = r._packed_step(prompt, twin16)
    assert batch.bucket == sib16 and step is r._compiled[sib16, True]
    r._compiled.pop((sib16, True))
    r._pending[sib16, True] = Future()
    decodes = [SeqInput(token_ids=[5], start_pos=3, page_table=[i + 1]) for i in range(6)]
    batch, step = r._packed_step(decodes, sib16)
    assert batch.bucket == sib64 and step is r._compiled[sib64, True]
    for key in ((twin16, True), (sib16, True)):
        r._pending.pop(key).cancel()
