#!/usr/bin/env bash
# Issue 20 in ONE GPU call: the Pallas-Triton small-M kernels (kernel_nk.py: int8 [N, K], int4 [N, K/2]) — GPU tests, per-op time
# beside XLA (jax part of kernels/triton_small_m.py), and batch-1 decode in the engine with it (int8 'xla-nk')
# beside bf16 and, with JAXINFER_TRITON=0 in a second process, int8 on XLA alone. Carry .whl (jax_triton).
set -u
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" || exit 1
export PYTHONUNBUFFERED=1 JAXINFER_WARMUP=0
OUT_DIR=${OUT:-/tmp/gpu-pallas-nk-out}; mkdir -p "$OUT_DIR"
timeout 100 python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_triton_small_m_gpu.py \
  -k "pallas or engine_path" > "$OUT_DIR/gpu-tests.log" 2>&1
echo "gpu tests rc=$?"; tail -2 "$OUT_DIR/gpu-tests.log"
timeout 110 python3 benchmarks/kernels/triton_small_m.py --part jax --m 1 16 --pallas --kinds int8 \
  --best /nonexistent --out "$OUT_DIR/kernel-jax.json" > "$OUT_DIR/kernel-jax.log" 2>&1
echo "kernel jax rc=$?"; grep "^jax" "$OUT_DIR/kernel-jax.log"
timeout 300 python3 benchmarks/quantized_decode.py --methods ${METHODS:-bf16 int8 int4 int4:triton-int4} --decode-batches 1 16 --throughput-methods --no-kv-capacity \
  --min-bucket-tokens 1 --budget-s 270 > "$OUT_DIR/quant-pallas.log" 2>&1
echo "quant (pallas-nk) rc=$?"; grep -E "batch-(1|16) decode" "$OUT_DIR/quant-pallas.log" | cut -c1-12,150-
mv "$OUT_DIR"/quantized-decode-2*.json "$OUT_DIR/quantized-decode-pallas.json" 2>/dev/null
rm -f benchmarks/results/quantized-decode-2*.json
JAXINFER_TRITON=0 timeout 90 python3 benchmarks/quantized_decode.py --methods int8 --throughput-methods \
  --no-kv-capacity --min-bucket-tokens 1 --budget-s 80 > "$OUT_DIR/quant-xla.log" 2>&1
echo "quant (JAXINFER_TRITON=0) rc=$?"; grep "batch-1 decode" "$OUT_DIR/quant-xla.log" | cut -c1-12,150-
mv "$OUT_DIR"/quantized-decode-2*.json "$OUT_DIR/quantized-decode-xla.json" 2>/dev/null
