#!/usr/bin/env bash
# One device call: the Triton small-M kernels swept with torch launches, then through jax-triton beside XLA.
# Carry .whl (jax_triton wheel: the image has triton but not jax-triton). Results land in $OUT.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv,noheader
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
timeout ${SWEEP_S:-300} python3 benchmarks/kernels/triton_small_m.py --part sweep --best "$OUT/best.json" \
  --out "$OUT/sweep.json" --budget-s ${SWEEP_BUDGET_S:-200} 2>&1 | tee "$OUT/sweep.log" | grep -v "^\s*$"
timeout ${JAX_S:-200} python3 benchmarks/kernels/triton_small_m.py --part jax --best "$OUT/best.json" \
  --out "$OUT/jax.json" 2>&1 | tee "$OUT/jax.log" | grep -v Warning
