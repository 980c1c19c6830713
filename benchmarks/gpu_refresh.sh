#!/usr/bin/env bash
# Re-measure on the GPU what the host work since 981b94b / c9284bb changed (issues 17 and 21), in TWO calls:
#   PART=host   probes/call_trace.py (where the compiled step's 2-3.5 ms call goes, 8B, batch 1 / 64 / 256) and
#               probes/host_step_cost.py --model llama3-8b (engine-thread host time per step; target <= 1.0 ms at 256)
#   PART=spec   spec_speed.py at batch 1 / 8 / 32, a = 0.7, plain vs the 1B-shaped draft (since the greedy-only
#               draft programs; issue 21's >= 1.7x at batch 1 and no slowdown at 8)
# Files back in $OUT: the JSONs (write_result copies them) and refresh-<part>.log.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu-refresh-out}; mkdir -p "$OUT"; export OUT
export JAXINFER_CACHE=${JAXINFER_CACHE:-$(mktemp -d /tmp/refresh-cache.XXXXXX)}
PART=${PART:-host}
LOG="$OUT/refresh-$PART.log"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >>"$LOG" 2>&1
if [[ $PART == host ]]; then
  timeout -k 5 ${CAP_TRACE_S:-290} python3 benchmarks/probes/call_trace.py --batch 1 64 256 >>"$LOG" 2>&1
  echo "call_trace rc=$?" >>"$LOG"
  timeout -k 5 ${CAP_HOST_S:-250} python3 benchmarks/probes/host_step_cost.py --model llama3-8b --load-format dummy \
    --no-tokenizer --batch 1 64 256 >>"$LOG" 2>&1
  echo "host_step_cost rc=$?" >>"$LOG"
else
  timeout -k 5 ${CAP_SPEC_S:-540} python3 benchmarks/spec_speed.py --batch 1 8 32 --accept 0.7 \
    --drafts none llama3.2-1b >>"$LOG" 2>&1
  echo "spec_speed rc=$?" >>"$LOG"
fi
grep -vE "cuda_timer|^\s+[0-9.]+\s+[0-9.]+\s" "$LOG" | tail -60
