#!/usr/bin/env bash
# One device call (< 6 min): the engine's int4 default after fa242cf moved the buckets of 17..128 tokens onto the
# many-token kernel (per layer on the H100 it beat mosaic_int4.py at M = 32 / 64 / 128: 86 / 114 / 154 us against
# 98 / 117 / 202) and after 2f9142a made its in-kernel transpose the default. int4 with the 17-token boundary
# ("int4") against bf16 in one process: batch 1 / 16 / 64 decode and offline 384 x 512/128 (H200 at 2b5cd52 with
# the 129-token boundary: batch 256 0.89x, offline 0.87x; H100 on 12-05 b: batch 64 1.16x).
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_int4_from17.sh        # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-int4-from17}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT_DIR/gpu.txt" 2>&1
timeout 330 $PY benchmarks/quantized_decode.py --methods int4 bf16 --decode-batches 1 16 64 --throughput-methods \
  int4 bf16 --no-kv-capacity --budget-s 310 --tag int4-from17 > "$OUT_DIR/decode.log" 2>&1
echo "engine rc=$?" >> "$OUT_DIR/run.log"; cp benchmarks/results/quantized-decode-int4-from17-*.json "$OUT_DIR"/ 2>/dev/null
grep -hE "speed-up|offline|tok/s|rc=" "$OUT_DIR"/*.log | tail -12
