#!/usr/bin/env bash
# One device call (< 9 min) for the many-token int4 kernel's opt-in transpose_out (it writes y [M, N] itself,
# 2026-12-05 c; not yet run on a GPU): its GPU tests on that path, the engine test of a long prefill on the int4
# default and the tests of the kernel's int8 form; per op at M = 256 / 2048 with and without the in-kernel
# transpose, and the int8 form beside int8's engine path there (XLA's convert + dot), beside the bf16 dot; then the
# engine in one process: int4 with transpose_out ("@tout"), int4 as today, bf16 (batch 1 / 256 decode, offline
# 384 x 512/128; 78cc294 on an H100: 0.83x at batch 256 and offline). If the tests pass and "@tout" wins, make
# mosaic_int4_wide.TRANSPOSE_OUT True.
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_int4_wide_final.sh        # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-int4-wide-final}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT_DIR/gpu.txt" 2>&1
timeout 90 $PY benchmarks/gpu_tests.py tests/kernels/test_mosaic_int4_wide_gpu.py -q -k \
  "transposed or swept or bf16 or long_prefills or int8_form" > "$OUT_DIR/tests.log" 2>&1
echo "tests rc=$?" >> "$OUT_DIR/run.log"; cp benchmarks/results/gpu-tests-2*.json "$OUT_DIR"/ 2>/dev/null
timeout 130 $PY benchmarks/kernels/quantized_matmul.py --variants bf16 int4_wide int4_wide_t int8_wide_nk \
  int8_convert_nk --shapes gate_up down qkv o --m 256 2048 --check-m 256 --reps 3 --budget-s 120 --gpus 1 \
  > "$OUT_DIR/kernel.log" 2>&1
echo "kernel rc=$?" >> "$OUT_DIR/run.log"; cp benchmarks/results/kernel-quantized-matmul-2*.json "$OUT_DIR"/ 2>/dev/null
timeout 280 $PY benchmarks/quantized_decode.py --methods "int4@tout" int4 bf16 --decode-batches 1 256 \
  --throughput-methods "int4@tout" int4 bf16 --no-kv-capacity --budget-s 260 --tag int4-wide-tout \
  > "$OUT_DIR/decode.log" 2>&1
echo "engine rc=$?" >> "$OUT_DIR/run.log"; cp benchmarks/results/quantized-decode-int4-wide-tout-*.json "$OUT_DIR"/ 2>/dev/null
grep -hE "passed|failed|speed-up|offline|tok/s|rc=" "$OUT_DIR"/*.log | tail -20
