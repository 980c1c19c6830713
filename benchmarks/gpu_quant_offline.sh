#!/usr/bin/env bash
# Issue 20 in ONE GPU call, after int4's GPU default became 'triton-int4': (1) per-op int4 at prefill sizes (XLA's
# [N, K]-native dequantize + dot beside bf16), (2) batch-1 / batch-16 decode of bf16, int8, int4, fp8 in one process
# (lazy compiles, as gpu_pallas_nk.sh), (3) offline throughput 384 x 512/128 of the same four in a second process
# with the normal warm-up (so no compile falls inside the measurement; the b1 runs of (3) come after other
# methods' offline runs and are not the figures of record). Carry .whl (jax_triton). JAXINFER_COMMIT=<sha>.
set -u
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" || exit 1
export PYTHONUNBUFFERED=1
OUT_DIR=${OUT:-/tmp/gpu-quant-offline-out}; mkdir -p "$OUT_DIR"
JAXINFER_WARMUP=0 timeout -k 5 70 python3 benchmarks/kernels/triton_small_m.py --part jax --m 16 256 2048 --pallas \
  --kinds none --shapes gate_up down --best /nonexistent --out "$OUT_DIR/kernel-jax.json" > "$OUT_DIR/kernel-jax.log" 2>&1
echo "kernel jax rc=$?"; grep "^jax" "$OUT_DIR/kernel-jax.log" | sed 's/int8 xla-nk.*int4 pallas/int4 pallas/'
JAXINFER_WARMUP=0 timeout -k 5 120 python3 benchmarks/quantized_decode.py --methods bf16 int8 int4 fp8 --decode-batches 1 16 \
  --throughput-methods --no-kv-capacity --min-bucket-tokens 1 --budget-s 110 > "$OUT_DIR/decode.log" 2>&1
echo "decode rc=$?"; grep -E "decode|speed-up" "$OUT_DIR/decode.log" | tail -9 | cut -c1-12,150-230
mv "$OUT_DIR"/quantized-decode-2*.json "$OUT_DIR/quantized-decode-decode.json" 2>/dev/null
timeout -k 5 330 python3 benchmarks/quantized_decode.py --methods bf16 int8 int4 fp8 \
  --throughput-methods bf16 int8 int4 fp8 --no-kv-capacity --budget-s 300 > "$OUT_DIR/offline.log" 2>&1
echo "offline rc=$?"; grep -E "offline|startup|speed-up" "$OUT_DIR/offline.log" | tail -9 | cut -c1-12,150-240
mv "$OUT_DIR"/quantized-decode-2*.json "$OUT_DIR/quantized-decode-offline.json" 2>/dev/null
