#!/usr/bin/env bash
# The many-token Mosaic int4 kernel of 2026-12-05 c (pallas_kernels/quantized_matmul/mosaic_int4_wide.py), one
# device call (< 10 min): its GPU tests, then per op at M = 256 / 2048 / 128 / 16 / 512 / 1 on the five 8B shapes
# beside the bf16 dot, the engine's paths today (the Mosaic kernel up to 128 tokens, XLA's dequantize + dot
# above) and its variants, then the engine's offline throughput (384 x 512/128) with the opt-in backend
# 'mosaic-int4-wide' against 'mosaic-int4' (the int4 default) and bf16 in one process.
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_int4_wide.sh          # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-int4-wide-out}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT_DIR/gpu.txt" 2>&1
if [ "${PART:-all}" != engine ]; then
  timeout 120 $PY benchmarks/gpu_tests.py tests/kernels/test_mosaic_int4_wide_gpu.py -q -x > "$OUT_DIR/tests.log" 2>&1
  echo "wide kernel tests rc=$?" >> "$OUT_DIR/run.log"
  timeout 230 $PY benchmarks/kernels/quantized_matmul.py --variants bf16 int4_mosaic int4_mosaic_xla int4_wide \
    int4_wide_tm256 int4_wide_rb1 int4_wide_st2 --m 256 2048 128 16 512 1 --check-m 256 2048 --reps 3 \
    --budget-s 210 --gpus 1 > "$OUT_DIR/kernel.log" 2>&1
  echo "kernel rc=$?" >> "$OUT_DIR/run.log"
fi
timeout 240 $PY benchmarks/quantized_decode.py --methods int4:mosaic-int4-wide int4 bf16 --decode-batches 1 \
  --throughput-methods int4:mosaic-int4-wide int4 bf16 --no-kv-capacity --budget-s 220 --tag int4-wide \
  > "$OUT_DIR/decode.log" 2>&1
echo "engine rc=$?" >> "$OUT_DIR/run.log"
cp benchmarks/results/gpu-tests-2*.json benchmarks/results/kernel-quantized-matmul-2*.json \
  benchmarks/results/quantized-decode-int4-wide-*.json "$OUT_DIR"/ 2>/dev/null
grep -hE "passed|failed|error|Error|speed-up|offline|tok/s|rc=" "$OUT_DIR"/*.log | tail -40
