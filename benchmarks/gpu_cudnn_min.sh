#!/usr/bin/env bash
# One short device call (< 6 min): cuDNN's paged attention per op against the Pallas kernel (the probe: decode at
# 256 x 512 and 64 x 4k, one prefill chunk after cached context), its GPU tests, then batch-256 steady decode with
# attention_backend='cudnn' and with the Pallas kernel (two processes, 8B shape, random bf16 weights).
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_cudnn_min.sh        # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-cudnn-min}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT_DIR/gpu.txt" 2>&1
timeout 100 $PY benchmarks/probes/cudnn_paged_attention.py --tag probe --configs 256x512 64x4096 \
  --prefill 2x512x512 > "$OUT_DIR/probe.log" 2>&1
echo "probe rc=$?" >> "$OUT_DIR/run.log"
cp benchmarks/results/cudnn-paged-attention-probe-2026-12-0*.json "$OUT_DIR"/ 2>/dev/null
timeout 75 $PY -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_cudnn_paged.py \
  tests/test_cudnn_attention_gpu.py > "$OUT_DIR/tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT_DIR/run.log"
for be in cudnn pallas; do
  timeout 110 $PY benchmarks/latency.py --batch 256 --no-peer --attention-backend $be --tag attn-$be \
    > "$OUT_DIR/lat-$be.log" 2>&1
  echo "latency $be rc=$?" >> "$OUT_DIR/run.log"
done
grep -hE "^\{|passed|failed|tok/s|rc=" "$OUT_DIR"/probe.log "$OUT_DIR"/tests.log "$OUT_DIR"/lat-*.log \
  "$OUT_DIR"/run.log | cut -c1-400 | tail -40
