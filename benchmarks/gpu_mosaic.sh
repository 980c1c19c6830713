#!/usr/bin/env bash
# Issue 20, item 2: int8 at large M on JAX's Mosaic GPU mixed-type matmul (mosaic_large_m.py), one call per part:
#   PART=kernel  the GPU tests of the kernel, then quantized_matmul.py at M = 2048 / 256 / 64 on the 8B shapes:
#                bf16, XLA's convert-nk (the previous large-M path) and the kernel in each tile configuration
#   PART=engine  quantized_decode.py: bf16 and int8 decode batch 1 + offline throughput (384 x 512/128), then
#                int8 again with JAXINFER_MOSAIC=0 (convert-nk at every large M) in a second process
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT=${OUT:-/tmp/gpu-mosaic-out}; mkdir -p "$OUT"
PART=${PART:-kernel}
LOG="$OUT/mosaic-$PART.log"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv >>"$LOG" 2>&1
case $PART in
  kernel)
    echo "=== $(date +%T) gpu tests" >>"$LOG"
    timeout -k 5 150 python3 benchmarks/gpu_tests.py tests/kernels/test_mosaic_large_m_gpu.py -q -x 2>&1 \
      | grep -v cuda_timer | tail -40 >>"$LOG"
    echo "=== $(date +%T) kernel sweep" >>"$LOG"
    timeout -k 5 260 python3 benchmarks/kernels/quantized_matmul.py --variants bf16 int8_convert_nk \
      int8_mosaic_nk_a int8_mosaic_nk_b int8_mosaic_nk_c int8_mosaic_nk_d --m 2048 256 64 --reps 3 \
      --budget-s 230 --gpus 1 2>&1 | grep -v cuda_timer >>"$LOG"
    cp benchmarks/results/kernel-quantized-matmul-2*.json benchmarks/results/gpu-tests-2*.json "$OUT"/ ;;
  engine)
    echo "=== $(date +%T) bf16 + int8 (mosaic at large M)" >>"$LOG"
    timeout -k 5 240 python3 benchmarks/quantized_decode.py --methods bf16 int8 --throughput-methods bf16 int8 \
      --no-kv-capacity --tag mosaic1 2>&1 | grep -v cuda_timer >>"$LOG"
    echo "=== $(date +%T) int8, JAXINFER_MOSAIC=0" >>"$LOG"
    JAXINFER_MOSAIC=0 timeout -k 5 170 python3 benchmarks/quantized_decode.py --methods int8 \
      --throughput-methods int8 --no-kv-capacity --tag mosaic0 2>&1 | grep -v cuda_timer >>"$LOG"
    cp benchmarks/results/quantized-decode-mosaic*.json "$OUT"/ ;;
esac
echo "=== $(date +%T) done" >>"$LOG"
tail -80 "$LOG"
