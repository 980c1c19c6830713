#!/usr/bin/env bash
# Issue 17, item 2: call_trace.py (79bf89b, results/call-trace-79bf89b-2026-12-04.json) put the compiled step's
# 2-5 ms call on XLA re-recording its command buffer (CUDA graph) on EVERY call: `command_buffer::update` 1.4 ms at
# batch 64 and 4.2 ms at batch 256 (where cuBLAS gemms are re-captured by stream tracing, 128 per call), then
# cuGraphLaunch 1.2-1.7 ms. XLA updates a command buffer whenever an allocation its commands use moved; the step's
# temporaries (one executable-owned allocation) move between back-to-back calls. This call measures the command-
# buffer address modes this jaxlib knows (found in its binaries' strings), one process each (the mode is process-wide
# through XLA_FLAGS: the VMM modes need the client's allocator), on the same probe, batch 64 and 256.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu-cb-out}; mkdir -p "$OUT"; export OUT
LOG="$OUT/cb-modes.log"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >>"$LOG" 2>&1
SOS=$(python3 - <<'PY'
import glob, os, jaxlib
roots = [os.path.dirname(jaxlib.__file__)] + glob.glob(os.path.join(os.path.dirname(os.path.dirname(jaxlib.__file__)), "jax_cuda*_p*"))
print(" ".join(p for r in roots for p in glob.glob(os.path.join(r, "**", "*.so*"), recursive=True) if os.path.getsize(p) > 20e6))
PY
)
echo "binaries: $SOS" >>"$LOG"
STRS=$(for f in $SOS; do strings "$f" | grep -oE "xla_gpu_command_buffer_[a-z_]+|xla_gpu_enable_command_buffer[a-z_]*|(ALWAYS_UPDATE|SKIP_TEMP|VMM_PERSISTENT_TEMP|DYNAMIC_ALLOCATE|NEVER_UPDATE|CAPTURE_CMD_NEVER_UPDATE|VMM_[A-Z_]+)"; done | sort | uniq -c)
echo "$STRS" >>"$LOG"
has() { grep -q -- "$1" <<<"$STRS"; }
run() {  # tag, XLA_FLAGS
  echo "=== variant $1: XLA_FLAGS='$2'" >>"$LOG"
  XLA_FLAGS="$2" timeout -k 5 ${CAP_S:-130} python3 benchmarks/probes/call_trace.py --batch 64 256 --iters 20 --tag "$1" \
    2>&1 | grep -vE "cuda_timer" | grep -E "^batch|^ {4,}[0-9.]+ .*(command_buffer|cuGraph|nvjet|Execute \(|stages.py)|wrote|rror|nknown|Abort|F[0-9]{4}" >>"$LOG"
  echo "variant $1 rc=${PIPESTATUS[0]}" >>"$LOG"
}
run default ""
for m in VMM_PERSISTENT_TEMP SKIP_TEMP; do has "$m" && run "mode-$m" "--xla_gpu_command_buffer_update_mode=$m"; done
has xla_gpu_command_buffer_cache_size && run cache4 "--xla_gpu_command_buffer_cache_size=4"
cat "$LOG"
