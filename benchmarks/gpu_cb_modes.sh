#!/usr/bin/env bash
# Issue 17, item 2: call_trace.py (79bf89b, results/call-trace-79bf89b-2026-12-04.json) put the compiled step's
# 2-5 ms call on XLA re-recording its command buffer (CUDA graph) on EVERY call: `command_buffer::update` 1.4 ms at
# batch 64 and 4.2 ms at batch 256 (where cuBLAS gemms are re-captured by stream tracing, 128 per call), then
# cuGraphLaunch 1.2-1.7 ms. XLA updates a command buffer whenever an allocation its commands use moved; the step's
# temporaries (one executable-owned allocation) move between back-to-back calls. jaxlib 0.11.2 knows
# --xla_gpu_command_buffer_update_mode={ALWAYS_UPDATE,SKIP_TEMP} and --xla_gpu_enable_command_buffer_va_remapping
# (strings of libjax_common.so; first call of this script, results/gpu-cb-modes-0021616-2026-12-04.log: SKIP_TEMP
# alone took batch 256's call from 5.6 to 3.3 ms). Stable temporaries need the VMM allocator to reserve one
# virtual range per executable. Each variant is one process: call_trace.py's timings at batch 64 / 256 and its
# --exactness digest (the same in every variant that computes right). Found by the second call
# (results/gpu-cb-modes-0a4f929-2026-12-04.log): SKIP_TEMP itself switches the client to the VMM allocator ("requires
# the VMM allocator. Overriding allocator kind to kVmm"; memory_stats() empty), the digests are identical in all
# variants, and --xla_gpu_enable_command_buffer_va_remapping is not an XLA_FLAGS flag here (that variant aborts).
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu-cb-out}; mkdir -p "$OUT"; export OUT
LOG="$OUT/cb-modes.log"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >>"$LOG" 2>&1
run() {  # tag, allocator, XLA_FLAGS
  echo "=== variant $1: XLA_PYTHON_CLIENT_ALLOCATOR=$2 XLA_FLAGS='$3'" >>"$LOG"
  XLA_PYTHON_CLIENT_ALLOCATOR="$2" XLA_FLAGS="$3" timeout -k 5 ${CAP_S:-110} python3 benchmarks/probes/call_trace.py \
    --batch 64 256 --iters 20 --exactness 40 --tag "$1" 2>&1 | grep -vE "cuda_timer" \
    | grep -E "^batch|^ {4,}[0-9.]+ .*(command_buffer::|cuGraphLaunch|Execute \(|stages.py)|exactness|memory_stats|wrote|rror|nknown|Abort|F[0-9]{4}" >>"$LOG"
  echo "variant $1 rc=${PIPESTATUS[0]}" >>"$LOG"
}
ST=--xla_gpu_command_buffer_update_mode=SKIP_TEMP
run default default ""
run vmm vmm ""
run vmm-skiptemp-remap vmm "$ST --xla_gpu_enable_command_buffer_va_remapping=true"
run bfc-skiptemp default "$ST"
grep -E "===|exactness|call median|rc=" "$LOG"
