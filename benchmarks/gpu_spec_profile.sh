#!/usr/bin/env bash
# Issue 21's draft-model miss, profiled (ONE GPU call, from the repo root): how XLA compiles decode-sized dots
# (probes/small_dot_forms.py), then spec_speed at batch 1 and 8, a = 0.7, free drafts and the 1B-shaped draft, each
# run traced once more (--profile): device time per generated token by kernel family, and the device-busy share.
# Files back: $OUT/small-dot-forms-*.json, $OUT/spec-speed-*.json, $OUT/spec-profile.log.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu-spec-profile-out}; mkdir -p "$OUT"; export OUT
LOG="$OUT/spec-profile.log"
timeout -k 5 ${DOTS_CAP_S:-120} python3 benchmarks/probes/small_dot_forms.py >>"$LOG" 2>&1; echo "dots rc=$?" >>"$LOG"
timeout -k 5 ${SPEC_CAP_S:-420} python3 benchmarks/spec_speed.py --batch ${BATCH:-1 8} --accept 0.7 \
  --drafts none llama3.2-1b --profile /tmp/spec-traces >>"$LOG" 2>&1; echo "spec rc=$?" >>"$LOG"
grep -v cuda_timer "$LOG" | tail -120
