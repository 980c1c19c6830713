#!/usr/bin/env bash
# One device call (< 9 min): the engine with its attention through cuDNN's paged fused attention
# (attention_backend='cudnn', pallas_kernels/paged_attention/cudnn_paged.py) against the Pallas kernel (the GPU
# default), same process order alternating, 8B shape, random bf16 weights: offline 1000 x 512/256 (issue 17's
# >= 10,000 output tok/s; 8,857-9,421 on the H200 before) and latency at batch 64 / 256 (the steady decode step).
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_cudnn_engine.sh        # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-cudnn-engine}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT_DIR/gpu.txt" 2>&1
for be in cudnn pallas; do
  timeout 165 $PY benchmarks/throughput.py --workload fixed --attention-backend $be > "$OUT_DIR/tp-$be.log" 2>&1
  echo "throughput $be rc=$?" >> "$OUT_DIR/run.log"
done
for be in cudnn pallas; do
  timeout 105 $PY benchmarks/latency.py --batch 64 256 --no-peer --attention-backend $be --tag attn-$be \
    > "$OUT_DIR/lat-$be.log" 2>&1
  echo "latency $be rc=$?" >> "$OUT_DIR/run.log"
done
grep -hE "output tok/s|tok/s|rc=" "$OUT_DIR"/*.log | tail -24
