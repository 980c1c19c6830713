#!/usr/bin/env bash
# Issue 17 (batch 1 >= the plain-XLA loop) and issue 20 (quantized batch 1) in ONE GPU call: does the smallest
# step shape (KernelConfig.min_bucket_tokens, 16 on GPU so far) cost batch-1 decode time? A one-token decode
# padded to 16 rows pays 16-row norms / RoPE / KV scatters / attention tiles; the matmuls cost the same
# (weight-streaming bound), so the difference is the non-matmul ~1 ms of results/step-profile-b1-bf16-*.json.
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_min_bucket.sh      # ~8 min; logs + results.tar.gz into $OUT
# Lazy compiles (JAXINFER_WARMUP=0): only the buckets batch 1 uses are built; batch 1 runs twice (--batch 1 1)
# and the second row is the clean one (the first includes the decode program's compile).
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" JAXINFER_WARMUP=0
OUT_DIR=${OUT:-/tmp/gpu-min-bucket-out}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
MBS=${MIN_BUCKETS:-"16 1"}
peer=""
for mb in $MBS; do
  timeout 140 $PY benchmarks/latency.py --batch 1 1 --min-bucket-tokens "$mb" --tag "b1-mb$mb" $peer \
    > "$OUT_DIR/latency-mb$mb.log" 2>&1
  echo "latency mb$mb rc=$?" >> "$OUT_DIR/summary.log"
  grep "^batch\|plain-XLA" "$OUT_DIR/latency-mb$mb.log" >> "$OUT_DIR/summary.log"
  peer="--no-peer"  # the plain-XLA loop once (the first run)
done
QMB=${QUANT_MIN_BUCKET:-1}
timeout 250 $PY benchmarks/quantized_decode.py --methods bf16 int8 int8:xla-nk int4 --throughput-methods \
  --no-kv-capacity --min-bucket-tokens "$QMB" --budget-s 210 > "$OUT_DIR/quant-mb$QMB.log" 2>&1
echo "quantized mb$QMB rc=$?" >> "$OUT_DIR/summary.log"
grep "batch-1 decode" "$OUT_DIR/quant-mb$QMB.log" >> "$OUT_DIR/summary.log"
tar czf "$OUT_DIR/results.tar.gz" benchmarks/results/latency-b1-mb*.json benchmarks/results/quantized-decode-2*.json \
  2>/dev/null
ls -la "$OUT_DIR" >> "$OUT_DIR/summary.log"
