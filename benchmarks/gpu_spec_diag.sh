set -u
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD" JAXINFER_LOG_LEVEL=INFO
timeout 250 python3 benchmarks/probes/run_with_stacks.py 170 benchmarks/spec_speed.py --batch 1 --accept 0.7 > $OUT/spec-new.log 2>&1
echo "new rc=$?" >> $OUT/summary.log
timeout 200 python3 benchmarks/spec_speed.py --batch 1 --accept 0.7 --min-bucket-tokens 16 > $OUT/spec-mb16.log 2>&1
echo "mb16 rc=$?" >> $OUT/summary.log
grep -h "^batch\|^setup" $OUT/spec-new.log $OUT/spec-mb16.log >> $OUT/summary.log
