#!/usr/bin/env bash
# Issue 20 in ONE GPU call, after int4's GPU default became 'triton-int4': per-op int4 (kernel_nk beside XLA's
# dequantize + dot, with int8 and bf16), then batch-1 / batch-16 decode and offline throughput (384 x 512/128)
# for bf16, fp8, int8 and int4 in one process (the bf16 peer first). Carry .whl (jax_triton). JAXINFER_COMMIT=<sha>.
set -u
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" || exit 1
export PYTHONUNBUFFERED=1 JAXINFER_WARMUP=0
OUT_DIR=${OUT:-/tmp/gpu-quant-offline-out}; mkdir -p "$OUT_DIR"
timeout 100 python3 benchmarks/kernels/triton_small_m.py --part jax --m 1 16 --pallas --kinds none \
  --best /nonexistent --out "$OUT_DIR/kernel-jax.json" > "$OUT_DIR/kernel-jax.log" 2>&1
echo "kernel jax rc=$?"; grep "^jax" "$OUT_DIR/kernel-jax.log" | sed 's/int8 xla-nk.*int4 pallas/int4 pallas/'
timeout 420 python3 benchmarks/quantized_decode.py --methods bf16 fp8 int8 int4 --decode-batches 1 16 \
  --throughput-methods bf16 fp8 int8 int4 --no-kv-capacity --min-bucket-tokens 1 --budget-s 400 \
  > "$OUT_DIR/quant.log" 2>&1
echo "quant rc=$?"; grep -E "decode|offline|speed-up" "$OUT_DIR/quant.log" | tail -14 | cut -c1-200
cp benchmarks/results/quantized-decode-2*.json "$OUT_DIR/" 2>/dev/null
