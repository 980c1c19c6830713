#!/usr/bin/env bash
# Issue 17, item 2: the product with stable command-buffer temporaries (runner/xla_env.py, the default on a CUDA
# jaxlib >= 0.11) against the same code with JAXINFER_STABLE_GRAPH_ADDRESSES=0, same machine, one call per part:
#   PART=a  the GPU test (identical tokens, KV pool sized) + probes/host_step_cost.py on the 8B, batch 1 / 64 / 256,
#           both ways (engine-thread host time per step; target <= 1.0 ms at 256)
#   PART=b  latency.py --batch 1 64 256 both ways (the plain-XLA peer in the first run only)
#   PART=c  spec_speed.py --batch 1 with the 1B-shaped draft, both ways (its draft steps were host-bound)
#   PART=inputs  with stable temporaries, what is left of the call: call_trace.py at batch 1 / 64 / 256 as the
#           engine calls it, with the same input buffers every call, and with the same previous tokens too (run at
#           d03d2a6: results/gpu-stable-addresses-inputs-d03d2a6-2026-12-04.log; the moved inputs cost ~0.6 ms of
#           update, the previous tokens nothing; staging them through a second program did not pay, see
#           benchmarks/README.md "2026-12-04 d")
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu-stable-out}; mkdir -p "$OUT"; export OUT
PART=${PART:-a}
LOG="$OUT/stable-$PART.log"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >>"$LOG" 2>&1
both() {  # cap, tag-prefix, command...
  local cap=$1 tag=$2; shift 2
  for s in 1 0; do
    echo "=== JAXINFER_STABLE_GRAPH_ADDRESSES=$s: $*" >>"$LOG"
    JAXINFER_STABLE_GRAPH_ADDRESSES=$s timeout -k 5 "$cap" "$@" --tag "$tag-stable$s" 2>&1 | grep -v cuda_timer >>"$LOG"
    echo "rc=${PIPESTATUS[0]}" >>"$LOG"
  done
}
case $PART in
  a) timeout -k 5 200 python3 benchmarks/gpu_tests.py tests/test_stable_addresses_gpu.py -q >>"$LOG" 2>&1
     echo "gpu test rc=$?" >>"$LOG"
     both 150 hsc python3 benchmarks/probes/host_step_cost.py --model llama3-8b --load-format dummy --no-tokenizer \
       --batch 1 64 256 ;;
  b) both 245 lat python3 benchmarks/latency.py --batch 1 64 256 ;;
  inputs) for v in "" "--same-inputs" "--same-inputs --fixed-prev"; do
       echo "=== call_trace $v" >>"$LOG"
       timeout -k 5 120 python3 benchmarks/probes/call_trace.py --batch 1 64 256 --iters 20 $v \
         --tag "inputs$(echo $v | tr -d ' -')" 2>&1 | grep -v cuda_timer \
         | grep -E "^batch|command_buffer::|cuGraphLaunch|wrote|rror" >>"$LOG"
     done ;;
  c) both 270 spec python3 benchmarks/spec_speed.py --batch 1 --accept 0.7 --drafts none llama3.2-1b ;;
esac
grep -vE "^\s+[0-9.]+\s+[0-9.]+\s" "$LOG" | tail -70
