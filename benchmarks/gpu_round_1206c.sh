#!/usr/bin/env bash
# Device calls for the questions the 12-06 b lease left open, most important first; BUDGET=<s> skips a part that
# would not finish within it (a part runs only if its own timeout still fits), PARTS picks the parts:
#   small  the 1B shape's batch-1 decode (issue 21's draft step)
#   cudnn  the engine's attention through cuDNN's GQA form vs the Pallas kernel, latency at batch 64 / 256 (8B)
#   cudnn1 the same at batch 1
#   spec   the 1B int8 draft at batch 1, accept 0.7
#   tp     offline 1000 x 512/256 with cuDNN's attention vs the Pallas kernel (issue 17's >= 10,000 tok/s)
#   auto   the defaults ('auto' attention): latency batch 64 / 256, offline
#   tests  cuDNN's GPU tests (stand-ins now at float32 'highest' precision), the staged inputs' tests, the engine's
#          GPU tests of stable addresses and startup caches (with 'auto' attention)
#   JAXINFER_COMMIT=<sha> BUDGET=540 PARTS="small cudnn spec" bash benchmarks/gpu_round_1206c.sh   # into $OUT
GPU_ROUND=gpu-round-1206c
source "$(dirname "$0")/gpu_lib.sh"
PARTS=${PARTS:-small cudnn spec tp tests}
LAT1="benchmarks/latency.py --model llama3.2-1b --batch 1 --no-peer --max-num-seqs 16"
LAT8="benchmarks/latency.py --batch 64 256 --no-peer"
SPEC="benchmarks/spec_speed.py --drafts none llama3.2-1b@int8 --batch 1 --accept 0.7"
for part in $PARTS; do case $part in
  small)
    # (jax 0.11.2's XLA has no --xla_gpu_enable_dot_strength_reduction, "Unknown flag"; --fold-norms ran at 31a378a,
    # measured slower and removed since)
    run lat1b-base 100 timeout 100 $PY $LAT1 --tag draft1b-base ;;
  cudnn1)
    for be in cudnn pallas; do
      run lat8b-b1-$be 100 timeout 100 $PY benchmarks/latency.py --batch 1 --no-peer --attention-backend $be \
        --tag b1-attn-$be
    done ;;
  cudnn)
    for be in cudnn pallas; do run lat8b-$be 110 timeout 110 $PY $LAT8 --attention-backend $be --tag attn-$be; done ;;
  spec)
    run spec-base 280 timeout 280 $PY $SPEC --tag draft-int8-base ;;  # (170 s was too short on a cold machine)
  tp)
    for be in cudnn pallas; do
      run tp-$be 170 timeout 170 $PY benchmarks/throughput.py --workload fixed --attention-backend $be
    done ;;
  auto)  # the defaults (attention_backend='auto'): latency batch 64 / 256 and offline
    run lat8b-auto 110 timeout 110 $PY $LAT8 --tag attn-auto
    run tp-auto 170 timeout 170 $PY benchmarks/throughput.py --workload fixed ;;
  tests)
    run tests 180 timeout 180 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" --tb=short \
      tests/runner/test_staged_inputs.py tests/kernels/test_cudnn_paged.py tests/test_cudnn_attention_gpu.py \
      tests/test_stable_addresses_gpu.py tests/test_startup_caches_gpu.py ;;
esac; done
pack round-1206c
