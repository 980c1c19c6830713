#!/usr/bin/env bash
# Issue 17's warm start-up (<= 10 s to the first token, 8B shape) with whole compiled programs on disk
# (runner/program_cache.py; first measured on a GPU here, on by default there since 60b8838) beside JAX's persistent
# compilation cache alone, in ONE GPU call. Four fresh processes, same engine settings as gpu_suite.sh:
#   1. xla-cold   JAXINFER_PROGRAM_CACHE=0, empty cache dir       (fills JAX's persistent cache)
#   2. xla-warm   JAXINFER_PROGRAM_CACHE=0, same dir              (the peer: today's warm start)
#   3. pc-cold    JAXINFER_PROGRAM_CACHE=1, same dir              (programs miss: compile fresh and store)
#   4. pc-warm    JAXINFER_PROGRAM_CACHE=1, same dir              (programs load without tracing)
# JSONs (startup-<label>-*.json) land in benchmarks/results; the log in $OUT/program-cache.log.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-program-cache-out}; mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/program-cache.log"
export JAXINFER_CACHE=$(mktemp -d /tmp/pc-cache.XXXXXX)
ENGINE=(--model llama3-8b --load-format dummy --max-model-len 2048 --max-num-seqs 256 --max-num-batched-tokens 2048)
[[ ${SMOKE:-0} == 1 ]] && ENGINE=(--model tiny-llama --load-format dummy --max-model-len 256 --max-num-seqs 8 --max-num-batched-tokens 64)
for step in "xla-cold 0 110" "xla-warm 0 45" "pc-cold 1 110" "pc-warm 1 45"; do
  set -- $step
  t0=$(date +%s.%N)
  JAXINFER_PROGRAM_CACHE=$2 timeout -k 5 "$3" python3 benchmarks/startup.py "${ENGINE[@]}" --label "$1" >>"$LOG" 2>&1
  rc=$?
  echo "$1 rc=$rc wall $(python3 -c "import time;print(round(time.time()-$t0,1))") s, programs on disk: $(ls "$JAXINFER_CACHE"/programs 2>/dev/null | grep -c jxp)" | tee -a "$LOG"
  grep -E "^startup" "$LOG" | tail -2
done
du -sh "$JAXINFER_CACHE"/* 2>/dev/null
