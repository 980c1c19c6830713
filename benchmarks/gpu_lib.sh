# Sourced by the benchmarks/gpu_round_*.sh scripts (bash): the shared set-up of a device call and its helpers.
#   OUT_DIR   where logs and JSONs go ($OUT on the device machine; else /tmp/<name>)
#   BUDGET    seconds this call may use; `run` skips a part whose own timeout no longer fits
#   run NAME TIMEOUT [ENV=..] CMD...   one process, its log in $OUT_DIR/NAME.log, a few result lines echoed
#   pack NAME                          everything in $OUT_DIR into one archive (the device tool returns ~8 files)
#   clocks.csv (in OUT_DIR)            the GPU's clocks, temperature, power and throttle reasons before and after each
#                                      part: 12-06 j found a freshly started machine's first minutes 4% slower in
#                                      device time (same process order), so a call's first part may need discounting
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/${GPU_ROUND:-gpu-round}}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-540}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT_DIR/gpu.txt"

clocks() {  # clocks LABEL: one line of clocks.csv
  nvidia-smi --query-gpu=clocks.sm,clocks.mem,clocks.max.sm,temperature.gpu,power.draw,clocks_throttle_reasons.active \
    --format=csv,noheader 2>/dev/null | sed "s/^/$1, t=${SECONDS}s, /" >> "$OUT_DIR/clocks.csv"
}

run() {
  local name=$1 limit=$2 rc; shift 2
  if [ $((BUDGET - SECONDS)) -lt "$limit" ]; then echo "== $name skipped (budget)"; return; fi
  clocks "$name before"
  env "$@" > "$OUT_DIR/$name.log" 2>&1
  rc=$?
  clocks "$name after"
  echo "== $name rc=$rc t=${SECONDS}s"
  grep -hE "tok/s|device-only|roofline|TB/s|passed|failed|Error" "$OUT_DIR/$name.log" | grep -v Warning | tail -8 \
    | cut -c1-220
}

pack() {
  (cd "$OUT_DIR" && tar czf "../$1.tgz" . && rm -rf ./* && mv "../$1.tgz" .)
}
