#!/usr/bin/env bash
# Issue 20 in ONE GPU call: the Triton small-M kernels' GPU tests, then batch-1 decode in the engine with them
# (int8 'xla-nk' = the kernel on the large weights; int4 'triton-int4') beside bf16, the old int4 path and, in a
# second process with JAXINFER_TRITON=0, int8 on XLA alone (the previous default). Carry .whl (jax_triton).
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_triton_engine.sh
set -u
cd "$(dirname "$0")/.."
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH="$PWD:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" || exit 1
export PYTHONUNBUFFERED=1 JAXINFER_WARMUP=0
OUT_DIR=${OUT:-/tmp/gpu-triton-out}; mkdir -p "$OUT_DIR"
timeout ${TEST_S:-180} python3 -m pytest -q -p no:cacheprovider -m gpu tests/kernels/test_triton_small_m_gpu.py \
  > "$OUT_DIR/gpu-tests.log" 2>&1
echo "gpu tests rc=$?"; tail -3 "$OUT_DIR/gpu-tests.log"
timeout ${QUANT_S:-330} python3 benchmarks/quantized_decode.py --methods ${METHODS:-bf16 int8 int4:triton-int4 int4} \
  --throughput-methods --no-kv-capacity --min-bucket-tokens 1 --budget-s ${QUANT_BUDGET_S:-280} \
  > "$OUT_DIR/quant-triton.log" 2>&1
echo "quant (triton) rc=$?"; grep "batch-1 decode\|tok/s" "$OUT_DIR/quant-triton.log" | tail -8
cp benchmarks/results/quantized-decode-2*.json "$OUT_DIR/quantized-decode-triton.json" 2>/dev/null
rm -f benchmarks/results/quantized-decode-2*.json
JAXINFER_TRITON=0 timeout ${XLA_S:-100} python3 benchmarks/quantized_decode.py --methods int8 --throughput-methods \
  --no-kv-capacity --min-bucket-tokens 1 --budget-s 80 > "$OUT_DIR/quant-xla.log" 2>&1
echo "quant (JAXINFER_TRITON=0) rc=$?"; grep "batch-1 decode\|tok/s" "$OUT_DIR/quant-xla.log" | tail -4
cp benchmarks/results/quantized-decode-2*.json "$OUT_DIR/quantized-decode-xla.json" 2>/dev/null
