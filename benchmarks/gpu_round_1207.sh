#!/usr/bin/env bash
# Device calls for what 12-06 c left open (BUDGET / PARTS as in gpu_lib.sh); parts in the default order (~2,800 s in
# all on a warm machine: more than one session's lease, so pick):
#   tests  the cuDNN GPU tests
#   attn   the attention probe per op: cuDNN's GQA form vs the Pallas kernel at 256 x 512 and 64 x 4k (issue 17's
#          decode attention >= 3.2 TB/s is an H200 figure)
#   auto   the defaults against the Pallas kernel: latency batch 64 / 256 and offline 1000 x 512/256 (the H200's
#          figures for issue 17's targets; 'auto' = cuDNN in decode buckets of >= 64 tokens)
#   serve  online serving, ShareGPT-like mix at 16 / 32 req/s, 'auto' vs the Pallas kernel: mixed steps of <= 256
#          tokens (decodes beside a prompt chunk) run through cuDNN under 'auto', one cuDNN row per prompt token
#          reading its whole context (the Pallas kernel reads it once per 16-token tile); is that a loss?
#   (split / splitab: JAXINFER_CUDNN_SPLIT=1, run 12-06 d as splitab, no offline gain, removed with the switch)
#   tp512  offline with 512 sequences, 'auto' vs the Pallas kernel (9,421 with the kernel on the H200, 12-04: cuDNN's
#          attention, 1.23x at batch 256, may carry it past 10,000)
#   spec   the 1B int8 draft at batch 1, accept 0.7, with and without staged inputs (the target's step stages its
#          inputs since a8ea137, the draft programs since 4be183a): 1.23x at 9fafb1c against 1.54x at 8ea7637 on
#          another H100, not cuDNN's doing (its buckets had more tokens than sequences), not yet explained
#   specab the same, 'auto' against --attention-backend pallas (the draft runner's 'auto' resolves to 'cudnn' too)
#   speccudnn the same with an explicit 'cudnn' (the draft's one-token steps on cuDNN)
#   specprof the int8 draft's run under jax.profiler and cProfile (per-kernel device and per-function host time)
#   head   the tied int8 LM head: the int8 1B draft with a float / int8 head, the 1B's own int8 / int4 decode
#   w8a8   int8 with W8A8 above 16 tokens vs weight-only int8 vs bf16: decode batch 1 / 16 and offline (issue 20)
#   dprof  the 1B draft's step per kernel in its 16-token bucket, bf16 and int8 (step_profile.py): which of its ~14
#          kernels a layer hold the excess over its weight-streaming floor (issue 21), before a fused kernel is written
#   dprof1 the int8 1B step per kernel in its 1-token bucket vs the 16-token one (the cycle pair's suspect)
#   mid    latency batch 16 / 32, cuDNN vs the Pallas kernel (is 64 the right AUTO_CUDNN_MIN_TOKENS?)
#   onetokab the same A/B in one process (--ab-min16), median of 3 runs a row, < 300 s on a cold machine (estimate)
#   nktest the small-M int8 / int4 kernels' GPU tests (no x padding below 16 rows since d1c89d6)
#   ctiles prefill attention through cuDNN, one row a query tile: GPU tests and per op (~350 s; 12-06 h: 3.0-3.3x
#          cuDNN dense, slower than the Pallas kernel, so its engine switch and the offline parts were removed)
#   exact  the small-M kernels' partials of x's rows only vs 16 a split: per op, the cut-head 1B draft (~450 s)
#   exactqd the same on the 8B int8 model's decode, batch 1 / 16 (~400 s)
#   (fmlp: the int8 decode MLP as one kernel, mlp_nk.py; run 12-06 k: 0.57-0.85x the unfused kernels per op, the
#          1B draft 1.42x vs 1.65x; removed with the kernel)
#   (normpro / normprospec: the norms inside the int8 kernel, JAXINFER_NORM_PROLOGUE; run 12-06 j as normpro: 13%
#          slower, removed with the switch)
#   order  int8 / bf16 first and again in one process (12-06 i's unexplained 0.26 ms a step, ~550 s)
#   gso    fresh vs stable (aliased, donated) outputs of a toy step of the 8B graph's size: the call's host time
#   spec1b / kern / qd  issue 21's 1B-draft row, issue 20's small-M kernels per op and its decode rows (for an H200)
#   fresh2 the 1B draft in a process that compiles its programs, then in one that loads them (12-06 k: 1.21x vs 1.65x)
#   (pinned: the packed inputs in pinned host memory, JAXINFER_PINNED_INPUTS; run 12-07 a: segfaults under the VMM
#          allocator, no change in the engine's dispatch under BFC; removed with the switch)
#   hcut   the 1B int8 draft's head alone, whole vs cut (probes/draft_head_cut.py, ~90 s)
#   vocab  the 1B int8 draft with its head cut to 32k ids vs the whole head (issue 21; ~330 s on a cold machine)
#   cseq   the sequence form (one cuDNN row a chunk or a part of it) per op, then its GPU tests (~70 s; 12-06 h)
#   onetok the verify bucket and the draft cycle's 1-token bucket at batch 1 (12-06 e), on and off (two calls)
#   Cold machine (12-06 e): an 8B model's first start ~100 s of compiles, spec_speed > 240 s: give parts room.
#   12-06 g ran nktest onetokab dprof1 tp512 attn w8a8 mid head (H100; benchmarks/README.md "2026-12-06 g").
#   12-06 h ran ctiles attn, then cseq (H100). 12-06 i ran hcut vocab, nktest exact exactqd (H100).
#   12-06 j ran gso normpro (then order's question and vocab by hand, gpu-round-1207j-0c602fe-2026-12-06.log; H100).
#   12-06 k ran fmlp (then dprof1 spec1b, a reversed fmlp A/B and gso by hand; gpu-round-1207k-db813a7-2026-12-06.log).
#   12-07 a ran gso, pinned and fresh2 (then gso / pinned under faulthandler; gpu-round-1207a-8fc9e1b-2026-12-07.log).
#   12-07 b ran callthr callthrlat gil, servab gputests (cut), callthr again (gpu-round-1207b-2c4a8c9-2026-12-07.log).
#   12-07 c ran spec1b kern, qd tests attn, callthr tp512, gputests (a cut at 300 s), gputests-b by hand (H200).
#   12-07 d ran tpgrid on an H100 (its budget cut after two offline rows), then page 16 / 64 offline again by hand
#   (gpu-round-1207d-7874606-2026-12-07.log): page size and head-major pools do not lift cuDNN at 256 x 512; page 64
#   +1.8% offline. Left of tpgrid: 512:8192 and the fp8-KV row (PARTS=tpgrid with BUDGET >= 560 on a warm machine).
#   12-07 e ran servct latct callthr gputests gputestsk, then tpgrid2 and the defaults by hand (H100;
#   gpu-round-1207e-96b048e-19256dc-2026-12-07.log): the serving gain is the switch interval (29.0 -> 32.6 req/s),
#   the call thread is now on with a GPU; offline 512:8192 = 512:2048 (8,011 / 8,018), 512:4096 7,726, fp8 KV 8,633.
#   12-07 f ran mixprof (crashed: page ids past the H100's pool; fixed), hsc256 attnps, then mixprof again (H100;
#   gpu-round-1207f-2026-12-07.log): the Pallas kernel holds 22.3 of the mixed step's 67.8 ms, cuDNN 14.5 ms for the
#   same decodes; the split (JAXINFER_CUDNN_SPLIT) is back for prefill-shaped buckets, off, not yet measured.
#   12-07 g ran split2 and splitstep (H100; gpu-round-1207g-2026-12-07.log): the mixed step 66.2 -> 63.2-64.2 ms
#   split, offline 8,094 -> 8,171 (+0.9%); probes/offline_step_mix.py: the H200 run's mixed steps carry ~370 decodes,
#   half its steps are decode-only.
#   12-07 h ran splitshapes (H100; gpu-round-1207h-2026-12-07.log): the split slower where steps have few or no
#   decodes (prefill 50.9 -> 55.0 ms); the split and its parts (split2 splitstep splitserve splitshapes) removed.
#   Then fp8out fp8off (fp8's bf16 dot output: 1.72x the bf16 dot per layer at M = 2,048, offline 1.27x bf16; fp8
#   batch 1 0.75x bf16, not explained) and step profiles by hand.
#   12-07 i: no machine came (eleven tries). The host step's chain / continuation / packing reuse (13e0980..51684ac)
#   are counted on the CPU only: "hsc256" first on any GPU (issue 17's host <= 1.0 ms; CPU estimate ~630 µs).
#   12-07 j: no machine came again (four failed starts, then loans paused). New parts: "p256" (the 256-token prefill
#   under 'auto' / the Pallas kernel / the prefill twin of cf1f679: issue 17's 52% -> 60% of the matmul rate and
#   whether the twins should be on by default on a GPU, ~300 s cold), "attn2" (decode attention at 15 reps: issue
#   17's 3.2 TB/s sits inside 12-07 c's rep spread), "spec1bv" (the 1B draft whole vs 32k head on an H200).
#   First call, any GPU: PARTS="hsc256 p256 nktest" (H100) / PARTS_H200="attn2 spec1bv hsc256" (BUDGET 585).
#   Late in 12-07 j three H100 calls ran hsc256 p256 nktest (a warm-up crash, fixed in 10dde75), hsc256 nktest, fp8hlo
#   w4a8k (gpu-round-1207j-2026-12-07.log). Next: "fp8bar" (the fp8 quantization barrier A/B), "w4a8i4" (now from
#   2,048 tokens), then the H200 parts above.
#   12-07 k: no machine came (twelve failed starts). Next, first on any GPU: "tprefill" (the Triton prefill kernel's GPU
#   tests, then per op beside the Pallas kernel, its split_causal form and cuDNN dense: issue 17's <= 1.5x), then
#   "splitc" (the engine's steps with JAXINFER_SPLIT_CAUSAL / JAXINFER_TRITON_PREFILL); for a short lease "tpquick",
#   "tpmini" or "tpone". Then "fp8bar", "w4a8i4" and the H200 parts below.
#   Next: "nktest fp8b1 fp8hlo" (the fp8 small-M path's and W4A8's GPU tests; fp8 batch 1 as the first model), "w4a8i4"
#   (issue 20's offline int4 through the opt-in W4A8 backend), "tpgrid fp8off qd hsc256" on an H200 (hsc256: issue 17's
#   host <= 1.0 ms after 50f2c6c's scheduler change); then "specct", "w8a8"
#   on an H200 (issue 20's offline int8 >= 1.0x, met on an H100 only), "specgrid", "kern" (with the Hopper int4 default),
#   "gputestsb" (b passed on 12-07 c; a and k at 96b048e on 12-07 e). Pass JAXINFER_COMMIT always (the device's tree
#   may hold a stale .git: 12-07 e's hand-run JSONs named 96b048e for 19256dc).
#   Before 12-07 c: "gputests" on any Hopper (the fixed GPU tests, e6c1ab6, not yet re-run); on an H200 "spec1b kern qd"
#   (issues 21 / 20's figures), "tests attn auto", then "serve tp512 mid" (AUTO_CUDNN_MIN_TOKENS is 16 since 12-06 g):
#   JAXINFER_COMMIT=<sha> BUDGET=560 PARTS="tests attn" bash benchmarks/gpu_round_1207.sh   # one archive in $OUT
GPU_ROUND=gpu-round-1207
source "$(dirname "$0")/gpu_lib.sh"
PARTS=${PARTS:-tests attn auto serve tp512 spec dprof mid}
# PARTS_H200, when set, replaces PARTS on an H200 (the issues' figures are H200 figures; H100s come more often)
if grep -q H200 "$OUT_DIR/gpu.txt" && [ -n "${PARTS_H200:-}" ]; then PARTS=$PARTS_H200; fi
LAT8="benchmarks/latency.py --no-peer"
SPEC="benchmarks/spec_speed.py --drafts none llama3.2-1b@int8 --batch 1 --accept 0.7"
for part in $PARTS; do case $part in
  spec)
    run spec-auto 280 timeout 280 $PY $SPEC --tag draft-int8-auto
    run spec-no-stage 200 timeout 200 $PY $SPEC --no-stage-inputs --tag draft-int8-no-stage ;;
  specab)  # the 1.23x of 9fafb1c against 1.54x at 8ea7637: 'auto' (cuDNN for the plain engine) vs the Pallas kernel
    run spec-auto 280 timeout 280 $PY $SPEC --tag draft-int8-auto
    run spec-pallas 200 timeout 200 $PY $SPEC --attention-backend pallas --tag draft-int8-pallas ;;
  speccudnn)  # the draft's steps 2..k (n tokens for n sequences) through cuDNN (an explicit 'cudnn' takes decode-shaped
              # buckets of any size; the target's verification buckets are not decode-shaped: the Pallas kernel)
    run spec-cudnn 220 timeout 220 $PY $SPEC --attention-backend cudnn --tag draft-int8-cudnn ;;
  specprof)  # where the draft's cycle goes: device time by kernel (jax.profiler) and host time (cProfile)
    run spec-prof 300 timeout 300 $PY $SPEC --drafts llama3.2-1b@int8 --profile /tmp/spec-trace --host-profile \
      --tag draft-int8-prof ;;
  auto)
    for be in auto pallas; do
      run lat-$be 130 timeout 130 $PY $LAT8 --batch 64 256 --attention-backend $be --tag $be
    done
    for be in auto pallas; do
      run tp-$be 170 timeout 170 $PY benchmarks/throughput.py --workload fixed --attention-backend $be --tag $be
    done ;;
  tp512)
    for be in auto pallas; do
      run tp512-$be 180 timeout 180 $PY benchmarks/throughput.py --workload fixed --max-num-seqs 512 \
        --attention-backend $be --tag s512-$be
    done ;;
  tpgrid)  # issue 17's offline 10k and decode attention 3.2 TB/s in one call (~500 s; BUDGET >= 560): cuDNN's decode
           # attention per op at page 16 and 64 (the probe's --page-size), then offline under 'auto' at sequences:budget
           # 512:2048 (12-07 c: 9,461) and 512:8192, each at page 16 and 64, and 512:2048 with an fp8 KV cache
    for ps in 64 16; do
      run attn-ps$ps 60 timeout 60 $PY benchmarks/probes/cudnn_paged_attention.py --tag gqa-ps$ps --page-size $ps \
        --configs 256x512 64x4096 --prefill 2x512x512
    done
    # (fp8: half the KV bytes of the ~1/3 of the run that is decode attention, through the Pallas kernel)
    # (12-07 d: the first process on a fresh machine compiled for > 110 s; later ones loaded its programs in ~42 s)
    t=200
    for sbp in 512:2048:16 512:2048:64 512:8192:16 512:2048:16:fp8 512:8192:64; do
      IFS=: read -r s b p kv <<< "$sbp"
      run tp-$s-$b-ps$p${kv:+-$kv} $t timeout $t $PY benchmarks/throughput.py --workload fixed --max-num-seqs $s \
        --max-num-batched-tokens $b --page-size $p --kv-cache-dtype ${kv:-auto} --tag s$s-b$b-ps$p${kv:+-${kv}kv}
      t=130
    done ;;
  tpgrid2)  # tpgrid's offline rows not reached on 12-07 d, beside its baseline (no attention probe; ~520 s on a fresh
            # machine): 512:2048 page 16 (the default form), 512:8192 (more steps pure decode: cuDNN's buckets),
            # 512:2048 with an fp8 KV cache, 512:4096
    t=200
    for sbp in 512:2048:16 512:8192:16 512:2048:16:fp8 512:4096:16; do
      IFS=: read -r s b p kv <<< "$sbp"
      run tp-$s-$b-ps$p${kv:+-$kv} $t timeout $t $PY benchmarks/throughput.py --workload fixed --max-num-seqs $s \
        --max-num-batched-tokens $b --page-size $p --kv-cache-dtype ${kv:-auto} --tag s$s-b$b-ps$p${kv:+-${kv}kv}
      t=170
    done ;;
  attnps)  # tpgrid's attention probe alone: cuDNN's decode attention at page 64 / 16, 256 x 512 and 64 x 4k (~120 s)
    for ps in 64 16; do
      run attn-ps$ps 60 timeout 60 $PY benchmarks/probes/cudnn_paged_attention.py --tag gqa-ps$ps --page-size $ps \
        --configs 256x512 64x4096 --prefill 2x512x512
    done ;;
  hsc256)  # the engine thread's host time a step at batch 256 with the defaults (issue 17's <= 1.0 ms; ~100 s)
    # (--scenarios: 12-07 i's first scenario, offline, had twice the sections of the second on a fresh machine)
    run hsc-256 140 timeout 140 $PY benchmarks/probes/host_step_cost.py --model llama3-8b --no-tokenizer --batch 256 \
      --scenarios offline stream offline stream --tag defaults ;;
  mixprof)  # where the offline run's device time goes (issue 17's 10k; 12-07 e: ~15 ms of an ~85 ms H100 step not
            # explained by its linears and KV reads): the usual mixed step (509 decodes + 3 prompts) and a pure-decode
            # step of 512 under jax.profiler, per kernel (~250 s on a fresh machine)
    run mixprof 280 timeout 280 $PY benchmarks/probes/step_profile.py --shapes mixed-2048 decode-b512 \
      --max-num-seqs 512 --max-model-len 2048 --top 30 --iters 10 --tag mixed ;;
  mixprofq)  # the same mixed step quantized: fp8 W8A8 (offline 1.20x bf16 against issue 20's >= 1.4x) and int4-g128
             # (0.87x against >= 1.0x): which kernels hold their time (~300 s on a warm machine)
    # (bf16 first: the same call's peer; fp8 / int4 on a warm machine ~100 s each)
    for q in bf16 fp8 int4; do
      run mixprof-$q 170 timeout 170 $PY benchmarks/probes/step_profile.py --shapes mixed-2048 \
        $([ $q != bf16 ] && echo --quantization $q) \
        --max-num-seqs 512 --max-model-len 2048 --top 30 --iters 10 --tag mixed-$q
    done ;;
  fp8out)  # fp8 W8A8's dot output bf16 (the default since 12-07 h) vs f32 (before), per op at M = 2048 / 1 beside
           # XLA's bf16 dot (issue 20's fp8 offline 1.20x against >= 1.4x; the scaling reads the output back; ~120 s)
    run kern-fp8out 300 timeout 300 $PY benchmarks/kernels/quantized_matmul.py --m 2048 1 --reps 3 \
      --variants fp8_w8a8 fp8_w8a8_f32out ;;
  fp8off)  # issue 20's fp8 offline >= 1.4x bf16 (1.20x before the bf16 dot output) and batch-1 decode, one process
           # (~180 s on a warm machine; > 330 s on a fresh one)
    run fp8off 540 timeout 540 $PY benchmarks/quantized_decode.py --methods bf16 fp8 --decode-batches 1 \
      --throughput-methods bf16 fp8 --no-kv-capacity --budget-s 520 --tag fp8off ;;
  fp8b1)  # fp8 batch 1 as the process's first model, then bf16 (12-07 h: fp8 after bf16 in one process 7.85 ms median
          # step, device-only 6.16 ms, where step_profile in a fresh process took 4.84 / 4.68 ms; ~400 s cold: fp8's
          # quantize-on-load and compiles took > 170 s on a fresh machine)
    run fp8b1 420 timeout 420 $PY benchmarks/quantized_decode.py --methods fp8 bf16 --decode-batches 1 \
      --throughput-methods --no-kv-capacity --budget-s 400 --tag fp8b1 ;;
  w4a8i4)  # issue 20's offline int4 >= 1.0x (0.87x): 'mosaic-int4-w4a8' (W4A8 through XLA's fp8 dot from 512 tokens a
           # step) per op at M = 512 / 2048 beside the many-token Mosaic kernel and the bf16 dot, then in the engine:
           # offline 384 x 512/128 and batch 1 against 'mosaic-int4' and bf16, one process (~500 s cold)
    run kern-w4a8 200 timeout 200 $PY benchmarks/kernels/quantized_matmul.py --m 2048 512 --reps 3 \
      --variants int4_w4a8_nk int4_wide fp8_w8a8
    run qd-w4a8 420 timeout 420 $PY benchmarks/quantized_decode.py --methods bf16 int4 int4:mosaic-int4-w4a8 \
      --decode-batches 1 --throughput-methods bf16 int4 int4:mosaic-int4-w4a8 --no-kv-capacity --budget-s 400 \
      --tag w4a8i4 ;;
  w4a8k)  # w4a8i4's per-op half alone (~150 s warm): W4A8 at M = 512 / 2048 beside the Mosaic int4 kernel and fp8
    run kern-w4a8 200 timeout 200 $PY benchmarks/kernels/quantized_matmul.py --m 2048 512 --reps 3 \
      --variants int4_w4a8_nk int4_wide fp8_w8a8 ;;
  fp8bar)  # fp8's 2,048-token step with its activations behind an optimization barrier before their e4m3 quantization
           # (JAXINFER_FP8_FUSED_QUANT=0) vs fused (12-07 j's fp8hlo: the down input's silu(gate) * up computed twice,
           # 5.8 ms of 34.25) (issue 20's fp8 offline >= 1.4x; ~120 s warm, > 350 s on a fresh machine)
    for v in 1 0; do
      run fp8bar-$v 200 JAXINFER_FP8_FUSED_QUANT=$v timeout 200 $PY benchmarks/probes/step_profile.py \
        --shapes prefill-2048 --quantization fp8 --top 12 --iters 5 --tag fp8-fused-quant-$v
    done ;;
  fp8hlo)  # what fp8's 2,048-token step spends ~10 ms of elementwise work on (12-07 h: fusion_1373 3.1 ms, fusion_2305
           # 2.7 ms, 68 fusions 7.1 ms of its 34.8): the step profiled with an XLA dump, then the top fusions' HLO
           # (probes/fusion_text.py); the dump itself stays on the device (~150 s on a warm machine)
    run fp8hlo 200 XLA_FLAGS="--xla_dump_to=/tmp/fp8hlo --xla_dump_hlo_as_text" \
      timeout 200 $PY benchmarks/probes/step_profile.py --shapes prefill-2048 --quantization fp8 --top 20 --iters 5 \
      --tag fp8hlo
    $PY benchmarks/probes/fusion_text.py --dump /tmp/fp8hlo --top 8 --shape prefill-2048 --module-contains 2048,28672 \
      --profile "$(ls -t benchmarks/results/step-profile-fp8hlo-*.json | head -1)" > "$OUT_DIR/fp8-fusions.txt" 2>&1
    cp benchmarks/results/step-profile-fp8hlo-*.json "$OUT_DIR/" 2>/dev/null ;;
  # (pages / tp512b, page 64 vs 16 and sequences:budget offline: removed 12-07 d, tpgrid runs their offline rows;
  #  pages' latency at page 64 and tp512b's 256:2048 row were dropped with them)
  serve)
    for be in auto pallas; do
      run serve-$be 270 timeout 270 $PY benchmarks/serving_sweep.py --rates 16 32 --num-prompts 500 \
        --attention-backend $be --tag $be
    done ;;
  exact)  # the small-M kernels' split partials of x's M rows only (kernel_nk._store, 12-06 i) against 16 rows a split
          # (JAXINFER_NK_EXACT_ROWS=0, the form before): per op on the 1B and 8B shapes, then the cut-head 1B draft
    run exact-kernel 150 timeout 150 $PY benchmarks/kernels/quantized_matmul.py --shapes 2048x3072 2048x2048 \
      2048x16384 8192x2048 qkv o gate_up down --m 1 4 --variants int8_pallas_nk int8_pallas_nk_blocked --check-m 1 \
      --budget-s 120
    SPX="benchmarks/spec_speed.py --drafts none llama3.2-1b@int8+vocab32768 --batch 1 --accept 0.7 \
      --max-num-batched-tokens 16"
    run exact-spec 200 timeout 200 $PY $SPX --tag exact-rows
    run exact-spec-off 200 JAXINFER_NK_EXACT_ROWS=0 timeout 200 $PY $SPX --tag exact-rows-off ;;
  exactqd)  # the same A/B on the 8B int8 model's own decode (issue 20's int8 b1 >= 1.6x), two processes
    QDX="benchmarks/quantized_decode.py --decode-batches 1 16 --throughput-methods --no-kv-capacity"
    run exact-qd 240 timeout 240 $PY $QDX --methods bf16 int8 --budget-s 210 --tag exact-rows
    run exact-qd-off 180 JAXINFER_NK_EXACT_ROWS=0 timeout 180 $PY $QDX --methods int8 --budget-s 150 \
      --tag exact-rows-off ;;
  order)  # 12-06 i: int8 after a bf16 LLM in one process ran 3.83 ms a step, int8 as a process's first model 4.09-4.12
          # (either partial form). The same model twice in one process, a bf16 between, says whether the first model
          # of a process is slow (users run one) or the second fast; bf16 twice too
    QDO="benchmarks/quantized_decode.py --decode-batches 1 --throughput-methods --no-kv-capacity"
    run order-int8 330 timeout 330 $PY $QDO --methods int8 bf16 int8 --budget-s 300 --tag order-int8
    run order-bf16 250 timeout 250 $PY $QDO --methods bf16 int8 bf16 --budget-s 220 --tag order-bf16 ;;
  gso)  # does a step whose outputs alias donated inputs (every address fixed) dispatch cheaper? A toy of the 8B
        # step's graph size, fresh vs stable outputs (probes/graph_stable_outputs.py, ~60 s): issue 17's host target
    # 12-06 j (VMM, the default): no output effect; a device_put input made the call last a whole device step.
    # Does the BFC allocator (no stable temporaries) block too? numpy inputs (the engine's form) on both
    # 12-06 k: numpy inputs block as device_put ones did, under both allocators; now also pinned-host inputs
    run gso 100 timeout 100 $PY benchmarks/probes/graph_stable_outputs.py --batch 64 256 --tag vmm
    run gso-bfc 100 JAXINFER_STABLE_GRAPH_ADDRESSES=0 timeout 100 $PY benchmarks/probes/graph_stable_outputs.py \
      --batch 64 256 --tag bfc ;;
  spec1b)  # issue 21's figure on the GPU it names (an H200): the int8 1B draft with its whole head, batch 1, a = 0.7
    run spec1b 300 timeout 300 $PY benchmarks/spec_speed.py --drafts none llama3.2-1b@int8 --batch 1 --accept 0.7 \
      --max-num-batched-tokens 16 --tag draft-int8-whole ;;
  spec1bv)  # spec1b with the opt-in 32k head cut beside the whole head, one process (12-06 j on an H100: 1.65x -> 1.70x)
    run spec1bv 330 timeout 330 $PY benchmarks/spec_speed.py --drafts none llama3.2-1b@int8 \
      llama3.2-1b@int8+vocab32768 --batch 1 --accept 0.7 --max-num-batched-tokens 16 --tag draft-int8-vocab ;;
  specgrid)  # the int8 1B draft's speed-up grid (batch 1 / 8, a = 0.5 / 0.7 / 0.9; 12-07 c: 1.55x at batch 1, a = 0.7):
             # spec_policy.SPEEDUP's "model" rows are the bf16 draft's (12-02 / 12-04); a draft_quantization="int8"
             # row would let the policy speculate from a lower a at batch 1 and say where batch 8 stands
    run specgrid 420 timeout 420 $PY benchmarks/spec_speed.py --drafts none llama3.2-1b@int8 --batch 1 8 \
      --accept 0.5 0.7 0.9 --max-num-batched-tokens 64 --tag draft-int8-grid ;;  # (batch 8 verifies 40 tokens)
  specct)  # speculation with the call thread (12-07 e: speculative engines keep inline calls by default, unmeasured
           # threaded): free drafts and the int8 1B draft at batch 1 / 8, a = 0.7, inline then JAXINFER_CALL_THREAD=1
           # (batch 8 verifies 40 tokens in the 64-token bucket: threaded; batch 1 stays inline either way) (~500 s)
    for v in 0 1; do
      run specct-$v 250 JAXINFER_CALL_THREAD=$v timeout 250 $PY benchmarks/spec_speed.py --drafts none \
        llama3.2-1b@int8 --batch 1 8 --accept 0.7 --max-num-batched-tokens 64 --tag callthr-$v
    done ;;
  kern)  # issue 20's kernel figure (>= 2.8 TB/s at M <= 16, an H200 figure): the engine's small-M int8 kernel, the
         # Hopper int4 default (int4_mosaic; 12-07 c measured only the Pallas int4 kernel, not the default) and it
    run kern 250 timeout 250 $PY benchmarks/kernels/quantized_matmul.py --shapes qkv o gate_up down lm_head \
      --m 1 4 16 --variants int8_pallas_nk int4_mosaic int4_pallas_nk --check-m 1 --budget-s 220 ;;
  qd)  # issue 20's decode figures: bf16 / int8 / int4-g128 at batch 1 and 16, one process
    run qd 330 timeout 330 $PY benchmarks/quantized_decode.py --methods bf16 int8 int4 --decode-batches 1 16 \
      --throughput-methods --no-kv-capacity --budget-s 300 --tag h200 ;;
  fresh2)  # 12-06 k: the 1B int8 draft ran 213.0 tok/s (1.21x) in a process that compiled its programs on a freshly
           # started machine, 290-291 (1.65x) in later processes that loaded them from the program cache. The same
           # command twice on a fresh machine: compiled, then loaded (is a compiling process's draft slower?)
    for i in 1 2; do
      t=$((i == 1 ? 170 : 100))
      run fresh-$i $t timeout $t $PY benchmarks/spec_speed.py --drafts none llama3.2-1b@int8 --batch 1 \
        --accept 0.7 --max-num-batched-tokens 16 --tag draft-int8-fresh$i
    done ;;
  hcut)  # the draft's head alone, whole vs cut to 32k / 64k ids (probes/draft_head_cut.py, ~90 s): the time a draft
         # step saves, before part vocab's end-to-end run
    run hcut 150 timeout 150 $PY benchmarks/probes/draft_head_cut.py --vocab 32768 65536 ;;
  vocab)  # the 1B int8 draft with its head cut to the first 32k ids (draft_head_vocab, 12-06 h: its int8 head is
          # 101 of the step's 1,083 us; the 1.7x target needs ~70 us less a pass) against the whole head, one process
    run vocab-draft 330 timeout 330 $PY benchmarks/spec_speed.py --drafts none llama3.2-1b@int8 \
      llama3.2-1b@int8+vocab32768 --batch 1 --accept 0.7 --max-num-batched-tokens 16 --tag draft-vocab ;;
  head)  # the tied int8 LM head (f0a6962): the 1B int8 draft with a float head (+floathead, the old default for tied
         # models) and the int8 head in one process, then the 1B model's own int8 / int4 decode with either head
    run head-draft 330 timeout 330 $PY benchmarks/spec_speed.py --drafts none llama3.2-1b@int8+floathead \
      llama3.2-1b@int8 --batch 1 --accept 0.7 --tag head-ab
    run head-1b 260 timeout 260 $PY benchmarks/quantized_decode.py --model llama3.2-1b --methods bf16 \
      int8+floathead int8 int4+floathead int4 --throughput-methods --no-kv-capacity --budget-s 230 \
      --tag tied-head-1b ;;
  onetok)  # batch 1 under speculation (2026-12-06 e): the target verifies one sequence in a (k + 1)-token bucket
           # (buckets.py verify_bucket) and the draft cycle's steps 2..k run in a 1-token bucket (decode_ladder).
           # --min-bucket-tokens 16 turns both off (and the plain engine's 1-token bucket: compare tok/s of the
           # speculative rows, not their ratios); 12-06 d: free drafts 2.58x, int8 1B draft 1.57x
    run onetok 330 timeout 330 $PY $SPEC --tag draft-int8-onetok
    run onetok-off 260 timeout 260 $PY $SPEC --min-bucket-tokens 16 --tag draft-int8-onetok-off ;;
  onetokab)  # the verify bucket and the draft cycle's (2, 1) pair A/B'd in one process (spec_speed --ab-min16: rows
             # as built, /min16, /cycle-pair; median of 3 runs a row); 16-token steps only: fewer programs to compile
    run onetokab 300 timeout 300 $PY $SPEC --ab-min16 --max-num-batched-tokens 16 --tag draft-int8-onetok-ab ;;
  w8a8)  # issue 20's offline int8 >= 1.0x: weight-only int8 ('xla-nk', the default) vs W8A8 above 16 tokens
    QD="benchmarks/quantized_decode.py --methods bf16 int8 int8:xla-nk-w8a8 --decode-batches 1 16 --no-kv-capacity"
    run w8a8 420 timeout 420 $PY $QD --throughput-methods bf16 int8 int8:xla-nk-w8a8 --budget-s 330 --tag w8a8 ;;
  nktest)  # the small-M kernels on the GPU (d1c89d6: below 16 rows x's last row is read again instead of padded);
           # the Pallas port and the engine path only: the jax-triton tests need jax-triton, which the device lacks
           # (12-06 g: 37 of them failed there on the import, the 19 others passed)
    run nktest 120 timeout 120 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" --tb=short \
      -k "pallas or engine_path or w4a8" tests/kernels/test_triton_small_m_gpu.py ;;
  ctiles)  # the cuDNN tile form of prefill attention (cudnn_prefill_forms.py): its GPU tests (real cuDNN
           # log-sum-exp), then per op beside the Pallas kernel and cuDNN's dense attention (issue 17: <= 1.5x)
    run ctiles-tests 150 timeout 150 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" --tb=short \
      tests/kernels/test_cudnn_paged.py
    run ctiles-kernel 200 timeout 200 $PY benchmarks/kernels/prefill_attention.py --chunk 512 2048 4096 \
      --variants 16:4:4 --cudnn-tiles 16 64 --budget-s 150 ;;
  cseq)  # the sequence form (cudnn_sequence_attention: cuDNN rows of a chunk, 12-06 h): per op (its rel_err against
         # the f32 reference checks the real cuDNN's numbers too), then the GPU tests
    run cseq-kernel 120 timeout 120 $PY benchmarks/kernels/prefill_attention.py --chunk 512 2048 4096 \
      --variants 16:4:4 --cudnn-tiles --cudnn-seq 0 256 512 --budget-s 90
    run cseq-tests 150 timeout 150 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" --tb=short \
      -k "sequence or gpu_cudnn" tests/kernels/test_cudnn_paged.py ;;
  servab)  # issue 17 item 2 on a GPU host: the 8B shape served at 64 req/s before (113a027, in .ab_old, carried)
           # and after the host changes of 12-07 a (the event loop woken once a step, FINAL_ONLY outputs not built
           # every step); dummy models have no tokenizer, so the detokenizer change is not in this A/B
    SW="benchmarks/serving_sweep.py --rates 64 --num-prompts 1000"
    run servab-old 200 JAXINFER_COMMIT=113a027 timeout 240 bash -c "cd .ab_old && PYTHONPATH=\$PWD $PY $SW --tag ab-old"
    run servab-new 150 timeout 150 $PY $SW --tag ab-new ;;
  callthr)  # the compiled call on a worker thread (runner/call_thread.py, JAXINFER_CALL_THREAD; switch interval
            # 0.2 ms, the default then): the engine thread's host time a step and the call thread's CPU beside it,
            # off then on
    HSC="benchmarks/probes/host_step_cost.py --model llama3-8b --no-tokenizer --batch 64 256"
    run hsc-thread-off 140 timeout 140 $PY $HSC --no-call-thread --tag callthr-off
    run hsc-thread-on 100 timeout 100 $PY $HSC --call-thread --tag callthr-on ;;
  callthrlat)  # the same switch end to end: latency.py batch 1 / 64 / 256 (no peer: the A/B is the engine off / on)
    for v in 0 1; do
      run lat-thread-$v 150 JAXINFER_CALL_THREAD=$v timeout 150 $PY $LAT8 --batch 1 64 256 \
        --tag callthr-$v
    done ;;
  servct)  # served traffic, one call: the 8B server at 64 req/s as shipped, with the call thread (call_thread.py;
           # steps of >= 64 bucket tokens since 12-07 c), and with only the switch interval at 0.1 ms (serve
           # --switch-interval; what the call thread also sets): can the call thread become the default? Is the
           # server's engine call slowed by the 5 ms interval (call_gil.py, 12-07 b: 250-280 ms a call beside a
           # spinning thread, as alone at 0.1 ms)? (Replaces part servsi, which had no call-thread run.)
    SW="benchmarks/serving_sweep.py --rates 64 --num-prompts 1000"
    run servct-off 190 timeout 190 $PY $SW --tag ct-off
    run servct-on 170 JAXINFER_CALL_THREAD=1 timeout 170 $PY $SW --tag ct-on
    run servct-si100 170 timeout 170 $PY $SW --switch-interval 0.0001 --tag si-0.0001 ;;
  latct)  # latency batch 1 / 64 / 256 with the call thread on (batch 1 calls inline since 12-07 c) and off
    for v in 1 0; do
      run lat-ct-$v 150 JAXINFER_CALL_THREAD=$v timeout 150 $PY $LAT8 --batch 1 64 256 --tag callthr-gated-$v
    done ;;
  gil)  # a dispatch thread, again (12-05: beside a spinning thread the call took 240-380 ms, its GIL re-takes each
        # waiting out Python's 5 ms switch interval): the same probe under shorter intervals (CPU box, tiny model,
        # batch 1: 42 ms -> 0.6 ms at 0.2 ms); if the call then takes its time alone, the engine's call can move
        # off the engine thread (issue 17's host <= 1.0 ms at batch 256 counts the call)
    run gil 200 timeout 200 $PY benchmarks/probes/call_gil.py --batch 1 64 256 --switch-interval 0.005 0.0005 0.0001 ;;
  gputests)  # the recorded GPU test run (benchmarks/gpu_tests.py; jax-triton and gguf from the carried .whl/, installed
             # into the interpreter that runs the tests), in parts of < 600 s with a result file each (12-07 c: the
             # 88 kernel / fused-int8 tests of test_quantized_matmul_gpu.py ~3.3 s each, all passed; part b 478 s)
    $PY -m pip install -q --no-deps .whl/*.whl > "$OUT_DIR/pip.log" 2>&1
    run gputests-a 300 GPU_TESTS_TAG=a timeout 300 $PY benchmarks/gpu_tests.py \
      tests/kernels/test_quantized_matmul_gpu.py tests/kernels/test_triton_small_m_gpu.py \
      -k "not test_kernel_matches_reference and not test_xla_fused_int8_paths" ;;
  gputestsb)  # the Mosaic GPU kernels, attention, KV quantization, stable addresses, start-up caches (~480 s)
    $PY -m pip install -q --no-deps .whl/*.whl > "$OUT_DIR/pip.log" 2>&1
    run gputests-b 540 GPU_TESTS_TAG=b timeout 540 $PY benchmarks/gpu_tests.py \
      tests/kernels/test_paged_attention_kernel.py tests/kernels/test_cudnn_paged.py tests/test_cudnn_attention_gpu.py \
      tests/test_stable_addresses_gpu.py tests/kernels/test_kv_quant.py tests/kernels/test_mosaic_int8_gpu.py \
      tests/kernels/test_mosaic_int4_gpu.py tests/kernels/test_mosaic_int4_wide_gpu.py \
      tests/test_startup_caches_gpu.py ;;
  gputestsk)  # the 88 tests part a leaves out (~300 s)
    $PY -m pip install -q --no-deps .whl/*.whl > "$OUT_DIR/pip.log" 2>&1
    run gputests-k 330 GPU_TESTS_TAG=k timeout 330 $PY benchmarks/gpu_tests.py \
      tests/kernels/test_quantized_matmul_gpu.py -k "test_kernel_matches_reference or test_xla_fused_int8_paths" ;;
  tests)
    run tests 150 timeout 150 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" --tb=short \
      tests/kernels/test_cudnn_paged.py tests/test_cudnn_attention_gpu.py ;;
  dprof)
    SP="benchmarks/probes/step_profile.py --model llama3.2-1b --shapes decode-b1 --top 40 --max-num-seqs 16"
    run prof-t16 100 timeout 100 $PY $SP --min-bucket-tokens 16 --tag draft1b-t16
    run prof-t16-int8 100 timeout 100 $PY $SP --min-bucket-tokens 16 --quantization int8 --tag draft1b-t16-int8 ;;
  dprof1)  # the int8 1B step in its 1-token bucket against the 16-token one, per kernel: does the int8 small-M
            # kernel's row padding below 16 rows (kernel_nk._pad_rows) add ops (the draft cycle's (2, 1) pair,
            # DraftCycle.small_pair, measured slower once)? Look for pad fusions in the t1 profile's top ops
    SP="benchmarks/probes/step_profile.py --model llama3.2-1b --shapes decode-b1 --top 40 --max-num-seqs 16"
    run prof-t1-int8 100 timeout 100 $PY $SP --quantization int8 --tag draft1b-t1-int8
    run prof-t16-int8 100 timeout 100 $PY $SP --min-bucket-tokens 16 --quantization int8 --tag draft1b-t16-int8 ;;
  mid)
    for be in cudnn pallas; do
      run mid-$be 120 timeout 120 $PY $LAT8 --batch 16 32 --attention-backend $be --tag mid-$be
    done ;;
  p256)  # issue 17's 256-token prefill after 256 (12-04: 9.25 ms, 52% of the matmul rate, attention 1,633 us with 4-token
          # tiles): under 'auto' (cuDNN since 12-06 in every bucket of no more tokens than sequences: one row a token,
          # the chunk's context read 256 times), the Pallas kernel (read once a 4-token tile), and the prefill twin
          # (cf1f679, --prefill-buckets: the same 256 tokens with 16 sampled rows instead of 256 and 16-token tiles
          # through the Pallas kernel; on by default on the CPU only: 1.61x a 230-token prefill there) (~300 s cold)
    for v in auto pallas twin; do
      run p256-$v 130 timeout 130 $PY benchmarks/probes/step_profile.py --shapes prefill-256 --iters 10 \
        $([ $v = twin ] && echo --prefill-buckets || echo --attention-backend $v) --tag p256-$v
    done ;;
  tprefill)  # issue 17's prefill attention <= 1.5x cuDNN, a fourth design: the plain Triton kernel (triton_prefill.py,
             # jax-triton: unmasked blocks below the diagonal, exp2, 64 / 128 keys a step) beside the Pallas kernel and
             # cuDNN dense, per op at 512 / 2048 / 4096 tokens (12-06 h: 1.67x / 2.14x / 2.91x), and the Pallas
             # kernel with the same split causal loop (split_causal, ":split" variants); the Triton GPU tests
             # first (~200 s cold)
    run tprefill-tests 150 timeout 150 $PY -m pytest -q -m gpu tests/kernels/test_triton_prefill_gpu.py
    run tprefill 300 timeout 300 $PY benchmarks/kernels/prefill_attention.py --chunk 512 2048 4096 \
      --variants 16:4:4 16:4:4:split 16:8:4:split 32:4:8:split --cudnn-tiles --cudnn-seq --reps 7 --budget-s 260 ;;
  tpbench)  # tprefill's per-op half alone (its rel_err column checks each output against float32 dense attention)
    run tprefill 300 timeout 300 $PY benchmarks/kernels/prefill_attention.py --chunk 512 2048 4096 \
      --variants 16:4:4 16:4:4:split 16:8:4:split 32:4:8:split --cudnn-tiles --cudnn-seq --reps 7 --budget-s 200 ;;
  tpquick)  # tpbench in ~2 minutes: the Pallas kernel as the engine runs it, two Triton variants, cuDNN dense
    run tpquick 200 timeout 200 $PY benchmarks/kernels/prefill_attention.py --chunk 512 2048 4096 \
      --variants 16:4:4 --triton 16:64:4:2 32:64:8:3 --cudnn-tiles --cudnn-seq --reps 5 --budget-s 150 ;;
  tpmini)  # tpquick at 2048 / 4096 tokens only (~90 s)
    run tpmini 150 timeout 150 $PY benchmarks/kernels/prefill_attention.py --chunk 4096 2048 \
      --variants 16:4:4 --triton 16:64:4:2 32:64:8:3 --cudnn-tiles --cudnn-seq --reps 5 --budget-s 100 ;;
  tpone)  # the smallest form: 4,096 tokens, the engine's Pallas kernel, one Triton variant, cuDNN dense (~60 s)
    run tpone 90 timeout 90 $PY benchmarks/kernels/prefill_attention.py --chunk 4096 --variants 16:4:4 \
      --triton 16:64:4:2 --cudnn-tiles --cudnn-seq --reps 5 --budget-s 60 ;;
  tpengine)  # the 2,048-token prefill step (8 x 256 after 256) with and without the Triton prefill kernel (~100 s a side)
    for v in 0 1; do
      run tpengine-$v 110 JAXINFER_TRITON_PREFILL=$v timeout 110 $PY benchmarks/probes/step_profile.py \
        --shapes prefill-2048 --attention-backend pallas --iters 10 --no-trace --tag triton-prefill-$v
    done ;;
  splitc)  # the engine's steps with the Pallas kernel's split causal loop (JAXINFER_SPLIT_CAUSAL=1) vs without: the
           # 256-token prefill (its tiles read the chunk's context whole), the mixed offline step (where the kernel held
           # 22.3 of 67.8 ms, 12-07 f) under the Pallas backend (~150 s a side on a fresh machine, estimated)
           # then "triton": JAXINFER_TRITON_PREFILL=1, the Triton prefill kernel in the buckets above 256 tokens
    for v in 0 triton 1; do
      run splitc-$v 170 JAXINFER_SPLIT_CAUSAL=$([ $v = 1 ] && echo 1 || echo 0) \
        JAXINFER_TRITON_PREFILL=$([ $v = triton ] && echo 1 || echo 0) \
        timeout 170 $PY benchmarks/probes/step_profile.py --shapes prefill-2048 mixed-2048 prefill-256 \
        --max-num-seqs 512 --attention-backend pallas --iters 10 --no-trace --tag split-causal-$v
    done ;;
  attn2)  # the decode-attention probe with 3x the reps (12-07 c's H200 median 3.10 TB/s at 64 x 4k, fastest rep 3.49:
          # issue 17's >= 3.2 sits inside that spread; ~70 s)
    run attn2 120 timeout 120 $PY benchmarks/probes/cudnn_paged_attention.py --tag gqa-reps15 --configs 64x4096 \
      256x512 --prefill --inner 20 --reps 15 ;;
  attn)
    run attn 90 timeout 90 $PY benchmarks/probes/cudnn_paged_attention.py --tag gqa --configs 256x512 64x4096 \
      --prefill 2x512x512 ;;
esac; done
pack round-1207
