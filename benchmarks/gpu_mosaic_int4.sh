#!/usr/bin/env bash
# Issue 20, the Mosaic GPU int4 decode kernel in ONE GPU call (H200): its GPU tests, then the per-op sweep at
# M = 1 / 4 / 16 on the 8B shapes beside the bf16 dot and the engine's previous int4 kernel (same process).
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_mosaic_int4.sh     # ~6 min; logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-mosaic-int4-out}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
timeout ${TEST_S:-200} $PY benchmarks/gpu_tests.py tests/kernels/test_mosaic_int4_gpu.py -x -q > "$OUT_DIR/tests.log" 2>&1
echo "tests rc=$?" >> "$OUT_DIR/run.log"
VARIANTS=${MOSAIC_VARIANTS:-"bf16 int4_mosaic int4_mosaic_t512 int4_mosaic_t2048 int4_mosaic_st2 int4_mosaic_st8 int4_pallas_nk"}
timeout ${KERNEL_S:-300} $PY benchmarks/kernels/quantized_matmul.py --variants $VARIANTS --m ${MOSAIC_M:-1 16 4} \
  --check-m 1 16 --reps 3 --budget-s $(( ${KERNEL_S:-300} - 30 )) --gpus 1 > "$OUT_DIR/kernel.log" 2>&1
echo "kernel rc=$?" >> "$OUT_DIR/run.log"
cp benchmarks/results/kernel-quantized-matmul-2*.json benchmarks/results/gpu-tests-2*.json "$OUT_DIR"/ 2>/dev/null
ls -la "$OUT_DIR" >> "$OUT_DIR/run.log"
