"""The fused draft steps (runner/draft_steps.py: k draft steps in one compiled program) against the per-step path
they replace (k dispatches of the runner's step): identical drafts and equal (float32) draft KV caches over several
propose / accept / rollback rounds, with sequences across page boundaries, mixed numbers of drafts per sequence
(rows that stop early) and a catch-up after fully accepted rounds."""
import numpy as np
import pytest

from jaxinfer.config import EngineConfig, SpeculativeConfig
from jaxinfer.weights.loader import load_model, resolve_model
from jaxinfer.draft_model import model_proposer

K = 3


@pytest.fixture(scope="module")
def proposers(tiny_llama_dir):
    draft = load_model(resolve_model(tiny_llama_dir), progress=False)
    cfg = EngineConfig.from_options(max_model_len=128, max_num_batched_tokens=32, max_num_seqs=8,
                                    speculative_config=SpeculativeConfig(method="draft", draft_model=tiny_llama_dir,
                                                                         num_speculative_tokens=K, batch_policy=False))
    fused = model_proposer(draft, cfg, 128, 64)
    plain = model_proposer(draft, cfg, 128, 64, fused_steps=False)
    assert fused.fused is not None and plain.fused is None
    # No warmup(): both paths compile the programs they use on first use (conftest JAXINFER_WARMUP=0); a warm-up
    # would build every bucket of both runners (~25 s of the suite's CPU time for buckets no test runs).
    return fused, plain


def test_fused_draft_steps_match_per_step_path(proposers):
    fused, plain = proposers
    calls = []
    dispatch = fused.fused.dispatch
    fused.fused.dispatch = lambda seqs, ks: calls.append(list(ks)) or dispatch(seqs, ks)
    rng = np.random.default_rng(0)
    # prompt lengths around the page size (16): the drafts' positions cross page boundaries
    seqs = {f"s{i}": rng.integers(3, 512, n).tolist() for i, n in enumerate([1, 14, 15, 16, 17, 40])}
    try:
        for rnd in range(6):
            ks = {rid: K if rnd % 2 == 0 or i % 3 == 0 else 1 + (i + rnd) % K for i, rid in enumerate(seqs)}
            batch = [(rid, list(toks), ks[rid]) for rid, toks in seqs.items()]
            got, want = fused.propose(batch), plain.propose(batch)
            assert got == want, f"round {rnd}"
            assert all(len(got[rid]) == ks[rid] for rid in seqs)
            for (ka, va), (kb, vb) in zip(fused.runner.kv_caches, plain.runner.kv_caches):
                # every page but the reserved page 0 (padding and rows past their own drafts write there). Equal to
                # float32 rounding, not bit for bit: the per-step path runs the steps where fewer rows still draft
                # in smaller buckets (CPU ladder 1, 4, 16, ...: runner/cpu_defaults.py), whose matmuls of fewer
                # rows round differently from the fused program's full bucket (measured: <= 4e-6 absolute).
                np.testing.assert_allclose(np.asarray(ka)[1:], np.asarray(kb)[1:], rtol=1e-5, atol=1e-5)
                np.testing.assert_allclose(np.asarray(va)[1:], np.asarray(vb)[1:], rtol=1e-5, atol=1e-5)
            for i, (rid, toks) in enumerate(seqs.items()):
                # accept m drafts (all of them in some rounds: the next round catches up one token) + a bonus token
                m = ks[rid] if (i + rnd) % 2 == 0 else int(rng.integers(0, ks[rid]))
                seqs[rid] = toks + got[rid][:m] + [int(rng.integers(3, 512))]
                for p in (fused, plain):
                    p.rollback(rid, len(toks) + m)
    finally:
        fused.fused.dispatch = dispatch
        for rid in seqs:
            fused.free(rid)
            plain.free(rid)
    assert len(calls) == 6 and any(min(c) < K for c in calls)  # every round fused, some with mixed k
    fused.kv.check_invariants()
    assert fused.kv.num_used_pages == 0


def test_fused_draft_steps_reject_bad_input(proposers):
    from jaxinfer.outputs import SeqInput

    fused, _ = proposers
    with pytest.raises(ValueError, match="drafts"):
        fused.fused.dispatch([SeqInput([5], 0, [1])], [K + 1])
    with pytest.raises(ValueError, match="one token"):
        fused.fused.dispatch([SeqInput([5, 6], 0, [1])], [1])


def test_fused_draft_steps_update_the_cache_in_place(proposers):
    """The k unrolled steps chain the donated KV cache through one program: no copy of a page pool (a copy per
    step would cost a cache-sized read and write per draft step)."""
    import re

    fused, _ = proposers
    r = fused.runner
    # the bucket of the 6-sequence proposals above (compiled once for both tests)
    text = fused.fused._program(r.ladder.pick(6, 6)).as_text()
    entry = text[text.index("ENTRY"):]
    cfg = r.loaded.cfg
    pool = r"\[" + ",".join(map(str, [r.num_pages, r.page_size, cfg.num_kv_heads, cfg.head_dim])) + r"\]"
    assert re.search(pool, entry), "the KV cache is not an argument of the fused program"
    assert not re.search(pool + r"\{[\d,]*\} copy\(", entry), "the fused draft steps copy the KV cache"


def test_draft_programs_sample_greedily(proposers):
    """Every draft is the draft model's argmax, so its programs carry the greedy-only sampler: on the GPU the
    general one computes every branch (selects), a sort over the vocabulary included, which cost the 1B-shaped
    draft 490 us per generated token on the H200 (benchmarks/README.md, 2026-12-04 b). The general step program of
    the same bucket has the sort (the check can fail)."""
    fused, _ = proposers
    r = fused.runner
    b = r.ladder.pick(2, 2)
    general = r.compile_step(b).as_text()
    assert " sort(" in general, "the general sampler lost its sort: this check no longer tells the two apart"
    assert " sort(" not in fused.fused._program(b).as_text(), "the fused draft steps run the general sampler"
    b1, b2 = fused.cycle._buckets(2)
    assert " sort(" not in fused.cycle._program(b1, b2, fused.carry_shape).as_text(), \
        "the draft cycle runs the general sampler"
