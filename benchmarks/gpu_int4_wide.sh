#!/usr/bin/env bash
# The many-token Mosaic int4 kernel of 2026-12-05 c (pallas_kernels/quantized_matmul/mosaic_int4_wide.py):
#   PART=kernel  its GPU tests, then per op at M = 2048 / 256 / 512 on the four 8B layer shapes beside the bf16 dot,
#                XLA's dequantize + dot (the engine's path there before 78cc294) and its tile / stage variants (the overlap ones removed on 12-05 d)
#   PART=engine  int4 (since 78cc294 the kernel above 128 tokens) against bf16 in one process: batch 1 and 256
#                decode, offline throughput (384 x 512/128); the 12-05 b figures (XLA above 128 tokens) were
#                offline 0.79x, batch 64 1.16x
#   PART=small  per op at M = 16 / 32 / 64 / 128: the many-token kernel (one row block, and its default) against
#                mosaic_int4.py, which the engine runs up to 128 tokens (at M = 16 the many-token kernel with one
#                row block was 7% faster per layer on 12-05 c, at M = 1 slower)
#   (no PART: kernel + engine; more than one device call's 10 minutes)
#   JAXINFER_COMMIT=<sha> PART=kernel bash benchmarks/gpu_int4_wide.sh          # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-int4-wide-out}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader > "$OUT_DIR/gpu.txt" 2>&1
if [ "${PART:-all}" = small ]; then
  timeout 300 $PY benchmarks/kernels/quantized_matmul.py --variants bf16 int4_mosaic int4_wide int4_wide_rb1 \
    --shapes gate_up down qkv o --m 16 32 64 128 --check-m 64 --reps 3 --budget-s 280 --gpus 1 \
    > "$OUT_DIR/kernel-small.log" 2>&1
  echo "kernel small rc=$?" >> "$OUT_DIR/run.log"
  cp benchmarks/results/kernel-quantized-matmul-2*.json "$OUT_DIR"/ 2>/dev/null
  exit 0
fi
if [ "${PART:-all}" != engine ]; then
  timeout 100 $PY benchmarks/gpu_tests.py tests/kernels/test_mosaic_int4_wide_gpu.py -q -k \
    "300 or 2048 or swept or bf16" > "$OUT_DIR/tests.log" 2>&1
  echo "wide kernel tests rc=$?" >> "$OUT_DIR/run.log"
  timeout 340 $PY benchmarks/kernels/quantized_matmul.py --variants bf16 int4_mosaic_xla int4_wide int4_wide_rb1 \
    int4_wide_tm64 --shapes gate_up down qkv o \
    --m 2048 256 512 --check-m 256 --reps 3 --budget-s 320 --gpus 1 > "$OUT_DIR/kernel.log" 2>&1
  echo "kernel rc=$?" >> "$OUT_DIR/run.log"
fi
[ "${PART:-all}" = kernel ] || \
{ timeout 400 $PY benchmarks/quantized_decode.py --methods int4 bf16 --decode-batches 1 256 \
  --throughput-methods int4 bf16 --no-kv-capacity --budget-s 330 --tag int4-wide \
  > "$OUT_DIR/decode.log" 2>&1; echo "engine rc=$?" >> "$OUT_DIR/run.log"; }
cp benchmarks/results/gpu-tests-2*.json benchmarks/results/kernel-quantized-matmul-2*.json \
  benchmarks/results/quantized-decode-int4-wide-*.json "$OUT_DIR"/ 2>/dev/null
grep -hE "passed|failed|error|Error|speed-up|offline|tok/s|rc=" "$OUT_DIR"/*.log | tail -40
