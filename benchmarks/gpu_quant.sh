#!/usr/bin/env bash
# Issue 20 in ONE GPU call (H200): the int8 / int4 kernel sweep at every M on the 8B shapes (bf16 peer in the
# same process), then quantized decode / offline throughput in the engine (bf16 peer in the same process).
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_quant.sh        # ~8 min; results JSONs + logs into $OUT
# QUANT_VARIANTS / QUANT_METHODS / QUANT_THR override what runs.
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-quant-out}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
VARIANTS=${QUANT_VARIANTS:-"bf16 int8_convert_kn int8_w8a8_nk int8_mixed_nk int8_convert_nk int4_pallas int4n_dequant_nk"}
METHODS=${QUANT_METHODS:-"bf16 int8 int8:xla-nk int4"}
THR=${QUANT_THR:-"bf16 int8 int8:xla-nk"}
timeout 260 $PY benchmarks/kernels/quantized_matmul.py --variants $VARIANTS --m 1 4 16 64 256 2048 --reps 3 \
  --budget-s 230 --gpus 1 > "$OUT_DIR/kernel.log" 2>&1
echo "kernel rc=$?" >> "$OUT_DIR/quant.log"
timeout 330 $PY benchmarks/quantized_decode.py --methods $METHODS --throughput-methods $THR --no-kv-capacity \
  --budget-s 300 > "$OUT_DIR/decode.log" 2>&1
echo "decode rc=$?" >> "$OUT_DIR/quant.log"
cp benchmarks/results/kernel-quantized-matmul-2*.json benchmarks/results/quantized-decode-2*.json "$OUT_DIR"/ 2>/dev/null
ls -la "$OUT_DIR" >> "$OUT_DIR/quant.log"
