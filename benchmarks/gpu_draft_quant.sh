#!/usr/bin/env bash
# One device call (< 8 min) for issue 21's 1B-shaped draft model (target: >= 1.7x plain decoding at batch 1, k = 4,
# a = 0.7; 1.20-1.33x measured, its step ~1.15 ms against a ~0.5 ms floor): the draft as it is, with its weights int8
# and int4 (speculative_config.draft_quantization; the target stays bf16, so output is the target's), free drafts
# beside them, at batch 1 and 4, plain decoding of the same engine in the same process (spec_speed.py).
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_draft_quant.sh        # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-draft-quant}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT_DIR/gpu.txt" 2>&1
timeout 420 $PY benchmarks/spec_speed.py --drafts none llama3.2-1b llama3.2-1b@int8 llama3.2-1b@int4 \
  --batch 1 4 --accept 0.7 --tag draft-quant > "$OUT_DIR/spec.log" 2>&1
echo "spec rc=$?" >> "$OUT_DIR/run.log"
grep -hE "plain|draft|rc=" "$OUT_DIR"/*.log | cut -c1-300 | tail -20
