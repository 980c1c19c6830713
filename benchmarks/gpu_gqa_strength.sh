#!/usr/bin/env bash
# One short device call (< 4 min): (1) cuDNN paged attention in the engine's GQA form (cudnn_paged.py since 12-06:
# q [T, 1, H, D] on the KV heads) beside the Pallas kernel per op (the probe), and its GPU tests (the kernel against
# the reference; the engine against the bf16 reference beside the Pallas kernel); (2) the 1B shape's batch-1 decode
# with and without XLA's dot strength reduction (the 1-token bucket's optimized HLO on an H100, 12-06: the o
# projection [1, 2048] x [2048, 2048] becomes a multiply that writes a [2048, 2048] bf16 product and a reduce that
# reads it back, 3x the weight's bytes; QKV a reduce fusion; --xla_gpu_enable_dot_strength_reduction=false keeps
# them dots).
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_gqa_strength.sh        # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-gqa-strength}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT_DIR/gpu.txt" 2>&1
timeout 60 $PY benchmarks/probes/cudnn_paged_attention.py --tag gqa --configs 256x512 64x4096 --prefill 2x512x512 \
  > "$OUT_DIR/probe.log" 2>&1
echo "probe rc=$?" >> "$OUT_DIR/run.log"
timeout 70 $PY -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_cudnn_paged.py \
  tests/test_cudnn_attention_gpu.py 2>&1 | tail -15 > "$OUT_DIR/tests.log"
echo "gpu tests done" >> "$OUT_DIR/run.log"
LAT="benchmarks/latency.py --model llama3.2-1b --batch 1 --no-peer --max-num-seqs 16"
timeout 60 $PY $LAT --tag sr-on > "$OUT_DIR/lat-sr-on.log" 2>&1
echo "1B strength reduction on rc=$?" >> "$OUT_DIR/run.log"
XLA_FLAGS="--xla_gpu_enable_dot_strength_reduction=false" timeout 60 $PY $LAT --tag sr-off > "$OUT_DIR/lat-sr-off.log" 2>&1
echo "1B strength reduction off rc=$?" >> "$OUT_DIR/run.log"
grep -hE "cudnn_engine|kernel_engine|cudnn_gqa|passed|failed|Error|tok/s|rc=" "$OUT_DIR"/*.log | cut -c1-330 | tail -24
