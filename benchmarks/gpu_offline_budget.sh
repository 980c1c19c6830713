#!/usr/bin/env bash
# Issue 17's offline target (1000 x 512/256 >= 10,000 output tok/s; 8,792 at max_num_batched_tokens 2048) against
# the step's token budget and the batch, in ONE GPU call: throughput.py's fixed workload in fresh processes at
# (budget, max_num_seqs) = (2048, 256) [the suite's setting: the same-call peer], (4096, 256), (8192, 256),
# (4096, 512). One JAX compilation cache for all (each budget adds its own larger buckets). JSONs:
# $OUT/throughput-b<budget>-s<seqs>.json; log $OUT/offline-budget.log. SMOKE=1: the tiny model on CPU.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-offline-budget-out}; mkdir -p "$OUT_DIR"; export OUT="$OUT_DIR"
LOG="$OUT_DIR/offline-budget.log"
export JAXINFER_CACHE=${JAXINFER_CACHE:-$(mktemp -d /tmp/ob-cache.XXXXXX)}
M=(--model llama3-8b --load-format dummy --max-model-len 2048 --num-requests 1000 --prompt-len 512 --output-len 256)
RUNS=${RUNS:-"2048:256 4096:256 8192:256 4096:512"}
CAP=${CAP_S:-140}
if [[ ${SMOKE:-0} == 1 ]]; then
  M=(--model tiny-llama --load-format dummy --max-model-len 256 --num-requests 16 --prompt-len 32 --output-len 16)
  RUNS="64:8 128:8"
fi
for r in $RUNS; do
  b=${r%:*} s=${r#*:}
  echo "=== budget $b seqs $s" >>"$LOG"
  timeout -k 5 "$CAP" python3 benchmarks/throughput.py "${M[@]}" --workload fixed --max-num-batched-tokens "$b" \
    --max-num-seqs "$s" >>"$LOG" 2>&1
  echo "budget $b seqs $s rc=$?: $(grep -E '^fixed' "$LOG" | tail -1)"
  for f in "$OUT_DIR"/throughput-2*.json "$OUT_DIR"/throughput-cpu-*.json; do
    [[ -f $f ]] && mv "$f" "$OUT_DIR/throughput-b$b-s$s.json"
  done
done
