# One call, whichever GPU comes: an H200 measures issue 21's 1B draft (whole and cut head); an H100 repeats the int8
# exact-rows A/B with int8 first in a fresh process both times.
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1); echo "$GPU"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
if echo "$GPU" | grep -q H200; then
  timeout 230 python3 benchmarks/spec_speed.py --drafts none llama3.2-1b@int8 llama3.2-1b@int8+vocab32768 --batch 1 \
    --accept 0.7 --max-num-batched-tokens 16 --tag h200-vocab > $OUT/h200-vocab.log 2>&1; echo rc=$?
  grep "tok/s" $OUT/h200-vocab.log; cp benchmarks/results/spec-speed-h200-vocab-*.json $OUT/
else
  QDX="benchmarks/quantized_decode.py --decode-batches 1 --throughput-methods --no-kv-capacity --methods int8"
  timeout 110 python3 $QDX --budget-s 100 --tag exact-first > $OUT/qd-on.log 2>&1; echo rc=$?
  JAXINFER_NK_EXACT_ROWS=0 timeout 110 python3 $QDX --budget-s 100 --tag exact-first-off > $OUT/qd-off.log 2>&1
  echo rc=$?; grep -h "tok/s" $OUT/qd-on.log $OUT/qd-off.log
  cp benchmarks/results/quantized-decode-exact-first*.json $OUT/
fi
