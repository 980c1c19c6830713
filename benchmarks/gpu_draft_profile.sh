#!/usr/bin/env bash
# One short device call (< 4 min) for issue 21: where the 1B-shaped draft's step time goes, per kernel (a
# jax.profiler trace of the engine's own step program, probes/step_profile.py), in the 1-token bucket (batch-1
# decode of the 1B) and in the 16-token bucket the draft runs in (speculation has no 1-token bucket), bf16 and
# int8 weights (the folded-norms variant measured slower, 12-06 c, and was removed). The 1B step is
# ~1.8x its weight-streaming floor with ~15-17 kernels a layer (the optimized HLO, 12-06): this says which kernels
# hold the excess before a fused one is written.
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_draft_profile.sh        # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-draft-profile}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT_DIR/gpu.txt" 2>&1
SP="benchmarks/probes/step_profile.py --model llama3.2-1b --shapes decode-b1 --top 40 --max-num-seqs 16"
timeout 100 $PY $SP --tag draft1b-t1 > "$OUT_DIR/prof-t1.log" 2>&1
echo "profile 1-token rc=$?" >> "$OUT_DIR/run.log"
timeout 100 $PY $SP --min-bucket-tokens 16 --tag draft1b-t16 > "$OUT_DIR/prof-t16.log" 2>&1
echo "profile 16-token rc=$?" >> "$OUT_DIR/run.log"
timeout 100 $PY $SP --min-bucket-tokens 16 --quantization int8 --tag draft1b-t16-int8 \
  > "$OUT_DIR/prof-t16-int8.log" 2>&1
echo "profile 16-token int8 rc=$?" >> "$OUT_DIR/run.log"
cat "$OUT_DIR/run.log"
for f in prof-t1 prof-t16 prof-t16-int8; do
  echo "== $f"; grep -vE "^\s*$|Warning|warn" "$OUT_DIR/$f.log" | tail -40 | cut -c1-200
done
