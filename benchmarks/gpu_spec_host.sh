#!/usr/bin/env bash
# Issue 21: where the 1B-shaped draft's cycle loses its time on the host (ONE GPU call, from the repo root).
# spec_speed batch 1, a = 0.7, plain and the 1B draft, each run once more under cProfile (--host-profile) and once
# traced (--profile: device time per token); without the program cache (JAXINFER_PROGRAM_CACHE=0) first, then with it
# (the order of 2e4ce03's run reversed):
# is the cache's cost (2e4ce03: 1B draft 236.9 vs 291.3 tok/s) device time or host time?
# Files back: $OUT/spec-host.log, $OUT/spec-speed-*.json (the second run's JSON is renamed -nopc).
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu-spec-host-out}; mkdir -p "$OUT"; export OUT
LOG="$OUT/spec-host.log"
S=(benchmarks/spec_speed.py --batch 1 --accept 0.7 --drafts llama3.2-1b)
JAXINFER_PROGRAM_CACHE=0 timeout -k 5 ${CAP_B_S:-230} python3 "${S[@]}" --host-profile --profile /tmp/traces-nopc >>"$LOG" 2>&1; echo "B (no program cache) rc=$?" >>"$LOG"
for f in "$OUT"/spec-speed-2026-??-??.json; do [[ -f $f ]] && mv "$f" "${f%.json}-nopc.json"; done
timeout -k 5 ${CAP_A_S:-270} python3 "${S[@]}" --host-profile --profile /tmp/traces-pc >>"$LOG" 2>&1; echo "A (program cache) rc=$?" >>"$LOG"
for f in "$OUT"/spec-speed-2026-??-??.json; do [[ -f $f ]] && mv "$f" "${f%.json}-pc.json"; done
grep -v cuda_timer "$LOG" | grep -E "tok/s|setup|rc=|profile|__call__|_value|draft_cycle.py|propose_device|matmul|sort" | head -80
