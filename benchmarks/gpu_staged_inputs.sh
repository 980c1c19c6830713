#!/usr/bin/env bash
# One device call (< 6 min) for issue 17's host time: the step with its inputs staged into donated fixed-address
# buffers (ModelRunner.stage_inputs, runner/step.stage_inputs) against the step reading the transferred inputs,
# host_step_cost.py at batch 64 / 256 on the 8B shape, two processes a side, alternating; and the staged step's
# tests on the GPU (its HLO structure there, tokens identical to the unstaged step).
#   JAXINFER_COMMIT=<sha> [ROUNDS=2] bash benchmarks/gpu_staged_inputs.sh        # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-staged-inputs}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT_DIR/gpu.txt" 2>&1
timeout 60 $PY -m pytest -q -p no:cacheprovider tests/runner/test_staged_inputs.py 2>&1 | tail -6 > "$OUT_DIR/tests.log"
HSC="benchmarks/probes/host_step_cost.py --model llama3-8b --batch 64 256 --no-tokenizer"
for i in $(seq 1 "${ROUNDS:-2}"); do
  for side in stage-inputs no-stage-inputs; do
    timeout 100 $PY $HSC --$side --tag $side$i > "$OUT_DIR/hsc-$side$i.log" 2>&1
    echo "host_step_cost $side $i rc=$?" >> "$OUT_DIR/run.log"
  done
done
cat "$OUT_DIR/tests.log" "$OUT_DIR/run.log"
for f in "$OUT_DIR"/hsc-*.log; do echo "== $f"; grep -E "scenario|^offline|^stream" "$f" | cut -c1-220; done
