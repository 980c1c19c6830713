#!/usr/bin/env bash
# Issue 20, the Mosaic GPU int4 decode kernel in ONE GPU call (H200): its GPU tests, then the per-op sweep at
# M = 1 / 4 / 16 on the 8B shapes beside the bf16 dot and the engine's previous int4 kernel (same process).
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_mosaic_int4.sh     # ~6 min; logs + JSONs into $OUT
# PART=engine instead: batch-1 / 16 decode in the engine, bf16 vs int4 ('triton-int4', the previous default) vs
# int4 'mosaic-int4' (one process), and offline throughput of 'mosaic-int4' and bf16.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-mosaic-int4-out}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
if [ "${PART:-kernel}" = engine ]; then
  timeout ${ENGINE_S:-540} $PY benchmarks/quantized_decode.py --methods bf16 int4 int4:mosaic-int4 \
    --decode-batches 1 16 --throughput-methods ${THR:-int4:mosaic-int4 bf16} --no-kv-capacity \
    --budget-s $(( ${ENGINE_S:-540} - 60 )) --tag mosaic-int4 > "$OUT_DIR/decode.log" 2>&1
  echo "decode rc=$?" >> "$OUT_DIR/run.log"
  cp benchmarks/results/quantized-decode-*mosaic-int4*.json "$OUT_DIR"/ 2>/dev/null
  exit 0
fi
timeout ${TEST_S:-200} $PY benchmarks/gpu_tests.py tests/kernels/test_mosaic_int4_gpu.py -x -q > "$OUT_DIR/tests.log" 2>&1
echo "tests rc=$?" >> "$OUT_DIR/run.log"
VARIANTS=${MOSAIC_VARIANTS:-"bf16 int4_mosaic int4_mosaic_t512 int4_mosaic_t2048 int4_mosaic_st2 int4_mosaic_st8 int4_pallas_nk"}
timeout ${KERNEL_S:-300} $PY benchmarks/kernels/quantized_matmul.py --variants $VARIANTS --m ${MOSAIC_M:-1 16 4} \
  --check-m 1 16 --reps 3 --budget-s $(( ${KERNEL_S:-300} - 30 )) --gpus 1 > "$OUT_DIR/kernel.log" 2>&1
echo "kernel rc=$?" >> "$OUT_DIR/run.log"
cp benchmarks/results/kernel-quantized-matmul-2*.json benchmarks/results/gpu-tests-2*.json "$OUT_DIR"/ 2>/dev/null
ls -la "$OUT_DIR" >> "$OUT_DIR/run.log"
