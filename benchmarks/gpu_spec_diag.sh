#!/usr/bin/env bash
# Why the suite's spec part overran at dd2a473 (ONE GPU call, from the repo root): spec_speed batch 1 at a = 0.7 with
# the GPU ladder's 1-token bucket (thread stacks dumped from 170 s on), then with --min-bucket-tokens 16.
# Results: benchmarks/results/gpu-spec-diag-354aeb7-2026-12-03.log, spec-speed-mb16-354aeb7-2026-12-03.json.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" JAXINFER_LOG_LEVEL=INFO
timeout 250 python3 benchmarks/probes/run_with_stacks.py 170 benchmarks/spec_speed.py --batch 1 --accept 0.7 > $OUT/spec-new.log 2>&1
echo "new rc=$?" >> $OUT/summary.log
timeout 200 python3 benchmarks/spec_speed.py --batch 1 --accept 0.7 --min-bucket-tokens 16 > $OUT/spec-mb16.log 2>&1
echo "mb16 rc=$?" >> $OUT/summary.log
grep -h "^batch\|^setup" $OUT/spec-new.log $OUT/spec-mb16.log >> $OUT/summary.log
