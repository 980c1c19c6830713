#!/usr/bin/env bash
# Issue 17, item 2: the step's packed inputs at fixed device addresses (runner/input_slots.py, the GPU default)
# against a fresh transfer per step (JAXINFER_STABLE_INPUTS=0), same machine, one call per part:
#   PART=a  the GPU test (same tokens staged or not), probes/host_step_cost.py on the 8B at batch 1 / 64 / 256 both
#           ways, quantized_decode.py int8 batch 1 / 16 both ways (issue 20: int8 batch 1 was host-bound)
#   PART=b  latency.py --batch 1 64 256 both ways (the plain-XLA peer in both runs)
#   PART=c  spec_speed.py --batch 1 with the 1B-shaped draft, both ways (issue 21)
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu-inputs-out}; mkdir -p "$OUT"; export OUT
PART=${PART:-a}
LOG="$OUT/inputs-$PART.log"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >>"$LOG" 2>&1
both() {  # cap, tag-prefix, command...
  local cap=$1 tag=$2; shift 2
  for s in 1 0; do
    echo "=== $(date +%T) JAXINFER_STABLE_INPUTS=$s: $*" >>"$LOG"
    JAXINFER_STABLE_INPUTS=$s timeout -k 5 "$cap" "$@" --tag "$tag-inputs$s" 2>&1 | grep -v cuda_timer >>"$LOG"
    echo "rc=${PIPESTATUS[0]}" >>"$LOG"
  done
}
case $PART in
  a) timeout -k 5 120 python3 benchmarks/gpu_tests.py tests/runner/test_input_slots.py -q >>"$LOG" 2>&1
     echo "gpu test rc=$?" >>"$LOG"
     both 110 hsc python3 benchmarks/probes/host_step_cost.py --model llama3-8b --load-format dummy --no-tokenizer \
       --batch 1 64 256
     both 130 q python3 benchmarks/quantized_decode.py --methods int8 --throughput-methods --decode-batches 1 16 \
       --no-kv-capacity ;;
  b) both 280 lat python3 benchmarks/latency.py --batch 1 64 256 ;;
  c) both 270 spec python3 benchmarks/spec_speed.py --batch 1 --accept 0.7 --drafts none llama3.2-1b ;;
esac
echo "=== $(date +%T) done" >>"$LOG"
cp benchmarks/results/*-inputs[01]-*.json "$OUT"/ 2>/dev/null
grep -vE "^\s+[0-9.]+\s+[0-9.]+\s" "$LOG" | tail -60
