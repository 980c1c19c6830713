#!/usr/bin/env bash
# One device call (< 5 min) for issue 21's draft step (1B shape, batch 1: 1.49 ms traced on 12-04 against a
# 0.47-0.59 ms weight-streaming floor, 865 µs of it small per-layer XLA fusions): the optimized HLO of the 1B step
# programs as XLA compiled them for this GPU (to read which fusions a layer has, on the CPU box), the batch-1 decode
# of the 1B shape as it is, and with XLA's Triton gemm allowed to fuse any elementwise producer into its operands
# (--xla_gpu_triton_gemm_any=true: the norm scales and the SwiGLU product could ride in the matmuls).
#   JAXINFER_COMMIT=<sha> bash benchmarks/gpu_draft_fusions.sh        # logs + JSONs + hlo.tar.gz into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-draft-fusions}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name --format=csv,noheader > "$OUT_DIR/gpu.txt" 2>&1
LAT="benchmarks/latency.py --model llama3.2-1b --batch 1 16 --no-peer --max-num-seqs 16"
DUMP=/tmp/hlo-dump
XLA_FLAGS="--xla_dump_to=$DUMP --xla_dump_hlo_as_text --xla_dump_hlo_module_re=.*step.*" \
  timeout 120 $PY $LAT --tag draft1b-base > "$OUT_DIR/lat-base.log" 2>&1
echo "latency 1B base (with dump) rc=$?" >> "$OUT_DIR/run.log"
(cd $DUMP && ls | grep -E "after_optimizations.txt$" | head -24 | tar czf "$OUT_DIR/hlo.tar.gz" -T -)
ls $DUMP | head -60 > "$OUT_DIR/dump-files.txt"
XLA_FLAGS="--xla_gpu_triton_gemm_any=true" timeout 100 $PY $LAT --tag draft1b-gemmany > "$OUT_DIR/lat-gemmany.log" 2>&1
echo "latency 1B triton_gemm_any rc=$?" >> "$OUT_DIR/run.log"
timeout 100 $PY $LAT --tag draft1b-base2 > "$OUT_DIR/lat-base2.log" 2>&1
echo "latency 1B base again rc=$?" >> "$OUT_DIR/run.log"
grep -hE "tok/s|rc=" "$OUT_DIR"/*.log | cut -c1-300 | tail -20
