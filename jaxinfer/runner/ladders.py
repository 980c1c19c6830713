"""Which buckets a ModelRunner compiles its programs for (runner/buckets.py builds each ladder):

  ladder              the runner's steps: the backend's ladder (runner/cpu_defaults.ladder_args: the CPU's 1, 4,
                      16, ...; the GPU's 16, 32, ... plus a 1-token bucket), speculation's verify rows, and on a GPU
                      a speculating runner's verify bucket (k + 1 tokens, one sequence, one verify row)
  decode_ladder       the draft cycle's batch-1 buckets under DraftCycle.small_pair (an A/B switch, off): a draft
                      runner's ladder plus 2- and 1-token buckets on a GPU, for that one program; the ladder elsewhere
  background          the ladder's buckets compiled in the background after warm-up (until their programs are
                      ready such a step runs in the next bucket up that holds it: ModelRunner._packed_step): the
                      small buckets, the verify bucket and the prefill twins (until then the buckets above them
                      run those steps, as before the twins)
  prefill twins       (runner/buckets.py) KernelConfig.prefill_buckets, by default on the CPU in a runner without
                      speculation (a speculating target's verify buckets stay as measured for issue 21); never in a
                      draft runner's ladders (its cycle programs compile per bucket pair)

Speculation drops the GPU's 1-token bucket from a runner's own ladder: a verification step has k + 1 tokens, so the
1-token bucket serves no decode there, and a draft runner (small_buckets=False) would compile its fused k-step
programs for it too (H200, spec engine + 1B draft: 225 s of setup with it vs 39 s without, and slower cycles while
those compiled in the background: results/gpu-spec-diag-354aeb7-2026-12-03.log). The two buckets of this module
that serve one sequence replace it where it paid:
  * verify bucket: a verification of one sequence ran in the 16-token bucket with min(16, max_num_seqs) sampled and
    verify rows (8 x 5 rows of 128k-vocabulary logits at batch 1 with k = 4 and max_num_seqs 8), 20 attention tiles
    and 16-row norms, RoPE and scatters: the padding work the 8B's plain batch-1 step lost with its 1-token bucket
    (4.75 -> 4.37 ms device, 2026-12-03). Compiled in the background like that bucket.
  * decode_ladder: the draft cycle at batch 1 (step 1 = the catch-up + first draft, 2 tokens; steps 2..k one token
    each) runs 2- and 1-row norms, RoPE, scatters, attention tiles and sampler instead of the 16-token bucket's. One
    cycle program more at warm-up (n = 1's pair), not the small buckets' step programs of every kind.
One GPU measurement of each (H100, 8B target, int8 1B draft, k = 4, a = 0.7, spec_speed.py at afe74e6, both on against
--min-bucket-tokens 16, one timed run a row in two processes: results/spec-speed-draft-int8-onetok{,-off}-afe74e6-
2026-12-06.json): free drafts 479.6 vs 462.1 tok/s (+3.8%: the verify bucket, on by default); the draft model,
both on, 236.8 vs 272.1 (-13%). The verify bucket alone made the free drafts faster, so the cycle's pair is the
suspect and is off (DraftCycle.small_pair). The in-process A/B (spec_speed.py --ab-min16, 12-06 g, after the int8
kernel stopped padding x) kept it off: 286.0 vs 290.8 tok/s, the int8 1B step taking the same 1.04-1.05 ms in
its 1- and 16-token buckets. An explicit min_bucket_tokens turns both off, as it does the 1-token bucket.
"""
from __future__ import annotations

from jaxinfer.config import EngineConfig
from jaxinfer.runner.buckets import BucketLadder
from jaxinfer.runner.cpu_defaults import ladder_args, on_cpu


def spec_ladder_args(config: EngineConfig) -> dict:
    """Verify rows per bucket: up to the speculation batch limit, k drafts each; none without speculation."""
    spec = config.speculative
    if spec is None:
        return {}
    return dict(max_spec_seqs=min(spec.max_batch_size, config.scheduler.max_num_seqs),
                num_spec_tokens=spec.num_speculative_tokens)


def prefill_buckets_wanted(config: EngineConfig, small_buckets: bool = True) -> bool:
    """Whether a runner's ladder gets the prefill twins: never a draft model's (small_buckets=False: its cycle
    programs are compiled per bucket pair), else KernelConfig.prefill_buckets, when None (auto) on the CPU without
    speculation: measured there (benchmarks/probes/cpu_prefill_blocks.py --twins, 2026-12-07: a 100 / 230 / 300-token
    prompt's prefill 2.04 / 1.61 / 1.83x faster), not yet on a GPU, whose A/B is gpu_round_1207.sh's part 'p256'."""
    setting = config.kernels.prefill_buckets
    return small_buckets and (setting if setting is not None else config.speculative is None and on_cpu())


def runner_ladders(config: EngineConfig, max_model_len: int, page_size: int, kv_chunk_pages: int,
                   small_buckets: bool = True) -> tuple[BucketLadder, BucketLadder, frozenset]:
    """(ladder, decode_ladder, background) of a runner (module docstring); small_buckets=False: a draft model's
    runner."""
    sched = config.scheduler
    backend_ladder = ladder_args(config.kernels.min_bucket_tokens,
                                 small_buckets=small_buckets and config.speculative is None)
    # the backend's small buckets where it has them (the GPU's 1-token bucket; none on CPU, whose ladder starts at
    # 1, or with an explicit min_bucket_tokens): the condition of both one-sequence buckets
    program_small = ladder_args(config.kernels.min_bucket_tokens).get("small_buckets", ())
    verify = bool(program_small) and config.speculative is not None
    kw = dict(max_num_batched_tokens=sched.max_num_batched_tokens, max_num_seqs=sched.max_num_seqs,
              max_model_len=max_model_len, page_size=page_size, query_tile=config.kernels.query_tile,
              kv_chunk_pages=kv_chunk_pages, **spec_ladder_args(config))
    twins = prefill_buckets_wanted(config, small_buckets)
    ladder = BucketLadder.build(**kw, **backend_ladder, verify_bucket=verify, prefill_buckets=twins)
    cycle_small = tuple(sorted({*program_small, 2})) if program_small else ()
    decode_ladder = (BucketLadder.build(**kw, **{**backend_ladder, "small_buckets": cycle_small})
                     if cycle_small and not small_buckets else ladder)
    small = frozenset(backend_ladder.get("small_buckets", ()))
    background = frozenset(b for b in ladder.buckets
                           if b.num_tokens in small or (verify and b.num_seqs == 1 and b.spec_rows)) | ladder.twins
    return ladder, decode_ladder, background
