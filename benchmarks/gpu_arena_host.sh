#!/usr/bin/env bash
# One device call (< 8 min) for the norm-scale arena of 2026-12-05 e (runner/param_arena.py, issue 17 item 2),
# written and measured on the CPU only: the step call's host thread time with the arena and with the flat weights
# list, one process, alternating rounds (param_arena_cost.py, 8B shape); then the engine-thread host time a step at
# batch 1 / 64 / 256 of the default engine (host_step_cost.py; 12-05 e on an H100 before the arena: 2,019-2,025 µs at
# batch 256, target <= 1.0 ms); the call's host events (call_trace.py); the arena's tests on the GPU backend.
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_arena_host.sh        # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-arena-host}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT_DIR/gpu.txt" 2>&1
timeout 150 $PY benchmarks/probes/param_arena_cost.py --model llama3-8b --rounds 8 --calls 60 --tag gpu \
  > "$OUT_DIR/arena.log" 2>&1
echo "arena probe rc=$?" >> "$OUT_DIR/run.log"
timeout 150 $PY benchmarks/probes/host_step_cost.py --model llama3-8b --no-tokenizer --batch 1 64 256 --steps 40 \
  --tag arena > "$OUT_DIR/hsc-arena.log" 2>&1
echo "hsc arena rc=$?" >> "$OUT_DIR/run.log"
# where the call's host time goes now (12-04 d, before the early copy and the arena: graph update 0.5-1.4 ms,
# cuGraphLaunch 1.2-2.3 ms a call)
timeout 110 $PY benchmarks/probes/call_trace.py --model llama3-8b --batch 1 64 256 --iters 20 --tag arena \
  > "$OUT_DIR/call-trace.log" 2>&1
echo "call trace rc=$?" >> "$OUT_DIR/run.log"
timeout 60 $PY -m pytest -q -p no:cacheprovider tests/runner/test_param_arena.py > "$OUT_DIR/tests.log" 2>&1
echo "arena tests on the GPU rc=$?" >> "$OUT_DIR/run.log"
grep -hE "^(offline|scenario)|call thread|arena saves|buffers|passed|failed|rc=" "$OUT_DIR"/*.log | tail -30
