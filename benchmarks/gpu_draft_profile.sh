#!/usr/bin/env bash
# Issue 21's 1B-draft miss (1.15x at a = 0.7 vs >= 1.7x) and issue 17's unmeasured prefill items, in ONE GPU call:
#   1. probes/step_profile.py on the Llama-3.2-1B shape (the draft): decode-b1 / decode-b64 step time, per-kernel
#      table (where its 1.32 ms step goes against its 0.59 ms roofline)
#   2. probes/step_profile.py on the 8B shape: decode-b1, decode-b64, prefill-256, prefill-2048 (% of matmul rate)
#   3. spec_speed.py batch 1, a = 0.7, no draft (plain) / free drafts / the 1B draft (the figure of record)
# Files in $OUT: step-profile-1b.json, step-profile-8b.json, spec-speed.json, draft-profile.log.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-draft-profile-out}; mkdir -p "$OUT_DIR"; export OUT="$OUT_DIR"
LOG="$OUT_DIR/draft-profile.log"
mvres() { for f in "$OUT_DIR"/$1-2*.json "$OUT_DIR"/$1-cpu-*.json; do [[ -f $f ]] && mv "$f" "$OUT_DIR/$2"; done; }
timeout -k 5 90 python3 benchmarks/probes/step_profile.py --model llama3.2-1b --shapes decode-b1 decode-b64 \
  --max-num-seqs 64 --top 24 >>"$LOG" 2>&1; echo "1b profile rc=$?"; mvres step-profile step-profile-1b.json
timeout -k 5 150 python3 benchmarks/probes/step_profile.py >>"$LOG" 2>&1; echo "8b profile rc=$?"
mvres step-profile step-profile-8b.json
timeout -k 5 ${SPEC_S:-260} python3 benchmarks/spec_speed.py --batch 1 --accept 0.7 >>"$LOG" 2>&1; echo "spec rc=$?"
mvres spec-speed spec-speed.json
grep -E "^---|^  step|^  traced|^batch|^setup" "$LOG" | cut -c1-220
