#!/usr/bin/env bash
# One device call (< 9.5 min) after gpu_int4_wide_final.sh's run of 2026-12-05 d (H100, 3370ce3): there the
# in-kernel transpose failed to trace on jax 0.11.2 (transpose_ref of a plain scratch ref; now `.at[:, :]`), the
# opt-in overlap config gave NaN, and the engine test of a 300-token int4 prefill disagreed with the reference.
# (1) benchmarks/probes/int4_wide_diag.py: the kernel per op at the tiny test model's shapes, and the engine's
#     prompt log-probs for 'mosaic-int4' / 'xla-int4' against the reference on that model;
# (2) the kernel's GPU tests (the overlap config excluded) incl. transpose_out and the int8 form;
# (3) the engine: int4 with the in-kernel transpose ("int4@tout") / int4 / bf16 at batch 1 / 256 and offline.
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_int4_wide_fix.sh        # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-int4-wide-fix}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT_DIR/gpu.txt" 2>&1
timeout 110 $PY benchmarks/probes/int4_wide_diag.py > "$OUT_DIR/diag.log" 2>&1
echo "diag rc=$?" >> "$OUT_DIR/run.log"
timeout 110 $PY benchmarks/gpu_tests.py tests/kernels/test_mosaic_int4_wide_gpu.py -q -k "not kw4 and not long_prefills" \
  > "$OUT_DIR/tests.log" 2>&1
echo "tests rc=$?" >> "$OUT_DIR/run.log"; cp benchmarks/results/gpu-tests-2*.json "$OUT_DIR"/ 2>/dev/null
timeout 290 $PY benchmarks/quantized_decode.py --methods "int4@tout" int4 bf16 --decode-batches 1 256 \
  --throughput-methods "int4@tout" int4 bf16 --no-kv-capacity --budget-s 270 --tag int4-wide-tout \
  > "$OUT_DIR/decode.log" 2>&1
echo "engine rc=$?" >> "$OUT_DIR/run.log"; cp benchmarks/results/quantized-decode-int4-wide-tout-*.json "$OUT_DIR"/ 2>/dev/null
grep -hE "per op|engine |vs reference|passed|failed|speed-up|offline|tok/s|rc=" "$OUT_DIR"/*.log | tail -40
