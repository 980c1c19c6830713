"""Tensor and data parallelism on 8 simulated CPU devices give the single-device results.

Reference: the same checkpoint on ONE device through the unsharded path (plan None), itself tested against
transformers in tests/numerics. Greedy tokens must match exactly; prompt and sampled log-probs within 1e-4
(float32; the sharded matmuls sum in a different order, observed differences ~2e-6).
"""
import jax
import numpy as np
import pytest

from jaxinfer import SamplingParams
from jaxinfer.parallel import collective_bytes
from tests.parallel.tp_cases import PROMPTS

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, prompt_logprobs=0, logprobs=0)


def _results(llm):
    outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    tokens = [o.outputs[0].token_ids for o in outs]
    prompt_lp = [[next(iter(d.values())).logprob for d in o.prompt_logprobs[1:]] for o in outs]
    sampled_lp = [[next(iter(d.values())).logprob for d in o.outputs[0].logprobs] for o in outs]
    return tokens, prompt_lp, sampled_lp


def _assert_same(got, want, atol=1e-4):
    assert got[0] == want[0]
    for g, w in zip(got[1] + got[2], want[1] + want[2]):
        np.testing.assert_allclose(g, w, atol=atol, rtol=0)


@pytest.mark.parametrize("tp,dp", [(2, 1), (4, 1), (8, 1), (2, 2)])
def test_fewer_kv_heads_than_tp(build_llm, gqa_few_kv_dir, tp, dp):
    """2 KV heads: TP=2 splits them, TP=4/8 replicate each on 2/4 devices; DP=2 x TP=2 uses two replicas."""
    want = _results(build_llm(gqa_few_kv_dir))
    llm = build_llm(gqa_few_kv_dir, tp, dp)
    _assert_same(_results(llm), want)
    assert llm.model.cfg.num_kv_heads == max(2, tp)
    if dp > 1:
        # Two prompts, least-loaded routing: one per replica; each replica ran steps on its own devices.
        assert all(r._compiled for r in llm.runners)
        devs = [set(d.id for d in r.plan.devices) for r in llm.runners]
        assert not devs[0] & devs[1] and all(len(d) == tp for d in devs)
        assert llm.engine.replica_loads() == [0, 0]


@pytest.mark.parametrize("tp,backend", [(2, "pallas")])
def test_more_kv_heads_than_tp_with_pallas_per_shard(build_llm, gqa_many_kv_dir, tp, backend):
    """4 KV heads over TP=2: two whole KV heads per device; the Pallas kernel (interpret mode on CPU) runs per
    shard under shard_map."""
    want = _results(build_llm(gqa_many_kv_dir))
    _assert_same(_results(build_llm(gqa_many_kv_dir, tp, backend=backend)), want)


def test_each_device_holds_only_its_shard(build_llm, gqa_few_kv_dir):
    llm = build_llm(gqa_few_kv_dir, 8)
    cfg = llm.model.cfg  # as run: 8 KV heads (2 heads x 4 copies), 1 query head per KV head
    state = llm.model.module().layers[0]
    qkv, down = state.attn.qkv.w[...], state.mlp.down.w[...]
    assert qkv.shape == (64, cfg.qkv_size) == (64, (8 + 2 * 8) * 8)
    assert {s.data.shape for s in qkv.addressable_shards} == {(64, cfg.qkv_size // 8)}
    assert {s.data.shape for s in down.addressable_shards} == {(128 // 8, 64)}
    embed = llm.model.module().embed[...]
    assert {s.data.shape for s in embed.addressable_shards} == {(512 // 8, 64)}
    k_pages = llm.runner.kv_caches[0][0]
    assert {s.data.shape for s in k_pages.addressable_shards} == {(64, 16, 1, 8)}
    assert len({s.device for s in k_pages.addressable_shards}) == 8


def test_collectives_are_the_megatron_ones(build_llm, gqa_few_kv_dir):
    """Read from the compiled step: one all-reduce of [T, hidden] for the vocab-parallel embedding and two per
    layer (attention output, MLP down), one all-gather of the [S, vocab] logits; nothing else (no weight or KV
    gathered, attention communication-free)."""
    llm = build_llm(gqa_few_kv_dir, 2)
    cfg = llm.model.cfg
    bucket = llm.runner.ladder.buckets[0]
    step, _ = llm.runner._programs(bucket)
    hlo = step.as_text()
    got = collective_bytes(hlo)
    f32 = 4
    assert got == {"all-reduce": (1 + 2 * cfg.num_layers) * bucket.num_tokens * cfg.hidden_size * f32,
                   "all-gather": bucket.num_seqs * cfg.vocab_size * f32}
    # The per-device KV cache is updated in place: never copied (a copy per layer made steps O(num_pages)).
    shard = llm.runner.kv_caches[0][0].addressable_shards[0].data.shape
    cache_type = "f32[" + ",".join(map(str, shard)) + "]"
    assert [ln for ln in hlo.splitlines() if "copy" in ln and f"= {cache_type}" in ln] == []
    assert "input_output_alias" in hlo


def test_save_at_tp_reloads_at_one_device(build_llm, gqa_few_kv_dir, tmp_path):
    """LLM.save gathers the shards and undoes the TP layout: the orbax checkpoint equals the single-device one."""
    from jaxinfer.weights.checkpoint import restore_checkpoint

    one, tp4 = build_llm(gqa_few_kv_dir), build_llm(gqa_few_kv_dir, 4)
    one.save(str(tmp_path / "one"))
    tp4.save(str(tmp_path / "tp4"))
    a = jax.tree.leaves(restore_checkpoint(str(tmp_path / "one")))
    b = jax.tree.leaves(restore_checkpoint(str(tmp_path / "tp4")))
    assert len(a) == len(b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_server_engine_thread_drives_the_replicas(build_llm, gqa_few_kv_dir):
    """The server's AsyncEngine over the data-parallel router: requests spread over both replicas, same tokens."""
    import asyncio

    from serving.async_engine import AsyncEngine, collect

    llm = build_llm(gqa_few_kv_dir, 2, 2)
    want = _results(build_llm(gqa_few_kv_dir))[0]

    async def run():
        aeng = AsyncEngine(llm.engine)
        try:
            streams = [await aeng.add_request(p, SamplingParams(max_tokens=6, temperature=0.0)) for p in PROMPTS]
            loads = llm.engine.replica_loads()
            outs = await asyncio.gather(*(collect(s) for s in streams))
        finally:
            await aeng.shutdown(5)
        return outs, loads, aeng.stats

    outs, loads, stats = asyncio.run(run())
    assert [o.outputs[0].token_ids for o in outs] == want
    assert loads == [1, 1]
    assert stats.kv_pages_total == sum(e.kv.num_usable_pages for e in llm.engine.engines)
