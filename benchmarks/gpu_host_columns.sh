#!/usr/bin/env bash
# One device call (< 8 min) for the host work of 2026-12-05 d (issue 17 item 2), written and measured on the CPU
# only: steady decodes as columns (engine/decode_run.py) and the step's inputs handed to the compiled call as numpy
# (no jax.device_put first). On the 8B shape, the engine-thread host time per step at batch 1 / 64 / 256
# (host_step_cost.py, target <= 1.0 ms at 256; 12-04 c on an H200: 5.3 ms, 2.5 of it the call) with both changes,
# then without them (--general-loop --device-put-inputs: the code paths of before, in the same tree), then with the
# results' device->host copy started at dispatch instead of in fetch (--early-host-copy: ModelRunner.early_host_copy,
# 12-05 d, off until this measures it), twice alternating; then the engine's columns-vs-general-loop equality test
# on the GPU backend. Ran at 3370ce3 (before the early-copy switch existed) on an H100.
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_host_columns.sh        # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-host-columns}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT_DIR/gpu.txt" 2>&1
HSC="benchmarks/probes/host_step_cost.py --model llama3-8b --no-tokenizer --batch 1 64 256 --steps 40"
for r in 1 2; do  # (the first process compiles; the later ones read the compilation cache)
  timeout $([ $r = 1 ] && echo 170 || echo 110) $PY $HSC --no-early-host-copy --tag columns$r \
    > "$OUT_DIR/hsc-columns$r.log" 2>&1
  echo "hsc columns $r rc=$?" >> "$OUT_DIR/run.log"
  timeout 110 $PY $HSC --general-loop --device-put-inputs --no-early-host-copy --tag before$r \
    > "$OUT_DIR/hsc-before$r.log" 2>&1
  echo "hsc before $r rc=$?" >> "$OUT_DIR/run.log"
  timeout 110 $PY $HSC --early-host-copy --tag earlycopy$r > "$OUT_DIR/hsc-earlycopy$r.log" 2>&1
  echo "hsc early copy $r rc=$?" >> "$OUT_DIR/run.log"
  cp benchmarks/results/host-step-cost-{columns,before,earlycopy}[12]-*.json "$OUT_DIR"/ 2>/dev/null
done
# (not GPU-marked: the CPU suite runs it too; here the same equality on the GPU backend, tiny model)
timeout 90 $PY -m pytest -q -p no:cacheprovider tests/test_decode_run_e2e.py > "$OUT_DIR/tests.log" 2>&1
echo "e2e columns test on the GPU rc=$?" >> "$OUT_DIR/run.log"
grep -hE "^(offline|scenario)|passed|failed|rc=" "$OUT_DIR"/*.log | tail -30
