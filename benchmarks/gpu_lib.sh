# Sourced by the benchmarks/gpu_round_*.sh scripts (bash): the shared set-up of a device call and its helpers.
#   OUT_DIR   where logs and JSONs go ($OUT on the device machine; else /tmp/<name>)
#   BUDGET    seconds this call may use; `run` skips a part whose own timeout no longer fits
#   run NAME TIMEOUT [ENV=..] CMD...   one process, its log in $OUT_DIR/NAME.log, a few result lines echoed
#   pack NAME                          everything in $OUT_DIR into one archive (the device tool returns ~8 files)
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/${GPU_ROUND:-gpu-round}}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
BUDGET=${BUDGET:-540}
nvidia-smi --query-gpu=name --format=csv,noheader | tee "$OUT_DIR/gpu.txt"

run() {
  local name=$1 limit=$2; shift 2
  if [ $((BUDGET - SECONDS)) -lt "$limit" ]; then echo "== $name skipped (budget)"; return; fi
  env "$@" > "$OUT_DIR/$name.log" 2>&1
  echo "== $name rc=$? t=${SECONDS}s"
  grep -hE "tok/s|device-only|roofline|TB/s|passed|failed|Error" "$OUT_DIR/$name.log" | grep -v Warning | tail -8 \
    | cut -c1-220
}

pack() {
  (cd "$OUT_DIR" && tar czf "../$1.tgz" . && rm -rf ./* && mv "../$1.tgz" .)
}
