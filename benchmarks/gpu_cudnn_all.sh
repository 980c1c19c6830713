#!/usr/bin/env bash
# One device call (< 9 min) when the lease is short: cuDNN's paged attention per op (the probe, three decode configs
# and two prefill chunks), its GPU tests, then offline 1000 x 512/256 with attention_backend='cudnn' and with the
# Pallas kernel (the default) in two processes, 8B shape, random bf16 weights.
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_cudnn_all.sh        # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-cudnn-all}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT_DIR/gpu.txt" 2>&1
timeout 110 $PY benchmarks/probes/cudnn_paged_attention.py --tag probe --configs 256x512 64x4096 \
  --prefill 2x512x512 > "$OUT_DIR/probe.log" 2>&1
echo "probe rc=$?" >> "$OUT_DIR/run.log"
cp benchmarks/results/cudnn-paged-attention-probe-2026-12-0*.json "$OUT_DIR"/ 2>/dev/null
timeout 50 $PY -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_cudnn_paged.py > "$OUT_DIR/tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT_DIR/run.log"
for be in cudnn pallas; do
  timeout 150 $PY benchmarks/throughput.py --workload fixed --attention-backend $be > "$OUT_DIR/tp-$be.log" 2>&1
  echo "throughput $be rc=$?" >> "$OUT_DIR/run.log"
done
grep -hE "^\{|passed|failed|output tok/s|rc=" "$OUT_DIR"/probe.log "$OUT_DIR"/tests.log "$OUT_DIR"/tp-*.log \
  "$OUT_DIR"/run.log | cut -c1-400 | tail -40
