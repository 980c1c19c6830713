#!/usr/bin/env bash
# One device call (< 9 min) with this session's open questions, most important first (a lease that runs short
# still returns the first ones):
#   1. the staged step inputs' GPU tests (tests/runner/test_staged_inputs.py) and cuDNN's (kernel + engine, GQA form)
#   2. host_step_cost.py at batch 64 / 256 on the 8B shape, staged inputs vs not (one process each)
#   3. the 1B draft's step per kernel in its 16-token bucket (step_profile.py; the folded-norms variant: removed)
# BUDGET=<s>: skip what would not finish within it (each later part runs only with >= 110 s left).
#   JAXINFER_COMMIT=<sha> [BUDGET=540] bash benchmarks/gpu_round_1206.sh        # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-round-1206}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 $PY -m pytest -q -p no:cacheprovider -m "gpu or not gpu" tests/runner/test_staged_inputs.py \
  tests/kernels/test_cudnn_paged.py tests/test_cudnn_attention_gpu.py 2>&1 | tail -8
HSC="benchmarks/probes/host_step_cost.py --model llama3-8b --batch 64 256 --no-tokenizer"
BUDGET=${BUDGET:-540}
for side in stage-inputs no-stage-inputs; do
  [ $((BUDGET - SECONDS)) -ge 110 ] || { echo "skipped host_step_cost $side (budget)"; continue; }
  timeout 110 $PY $HSC --$side --tag $side > "$OUT_DIR/hsc-$side.log" 2>&1
  echo "== host_step_cost $side rc=$?"; grep -E "scenario|^offline|^stream" "$OUT_DIR/hsc-$side.log" | cut -c1-200
done
SP="benchmarks/probes/step_profile.py --model llama3.2-1b --shapes decode-b1 --top 12 --max-num-seqs 16"
SP="$SP --min-bucket-tokens 16"
for v in ""; do  # (--fold-norms: removed, 12-06 c)
  [ $((BUDGET - SECONDS)) -ge 110 ] || { echo "skipped step_profile $v (budget)"; continue; }
  timeout 100 $PY $SP $v --tag draft1b-t16${v:+-fold} > "$OUT_DIR/prof$v.log" 2>&1
  echo "== step_profile 1B t16 $v rc=$?"; grep -vE "^\s*$|Warning|warn" "$OUT_DIR/prof$v.log" | tail -34 | cut -c1-170
done
