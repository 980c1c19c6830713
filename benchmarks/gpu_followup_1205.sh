#!/usr/bin/env bash
# The GPU runs the 2026-12-05 session left open, in four device calls of < 10 min each (H200):
#   PART=a  the GPU tests of the new int4 default (tests/kernels/test_mosaic_int4_gpu.py, incl. the engine test
#           written on 12-05 and not yet run), then int8's batch-1 / 16 decode alone in a fresh process and again
#           after an int4 LLM in the same process (12-05 call 1 read 5.12 ms a step for int8 when it ran fourth in
#           its process, against 3.2-3.6 ms on 12-04 and 4.23 ms on an H100 in a fresh one: is it real?)
#   PART=b  spec_speed.py for the 1B-shaped draft at batch 1 / 2 / 4 / 8 (engine/spec_policy.py uses the batch-8
#           row for batches 2-8: the cells between are unmeasured), then latency.py at batch 1 / 64 / 256 with the
#           plain-XLA peer (issue 17's table after the 12-05 changes)
#   PART=c  the int8 Mosaic kernel of 12-05 (mosaic_int8.py: GPU tests, then per op at M = 1 / 16 / 64 beside the
#           engine's int8 small-M kernel 'pallas-nk', XLA's convert-nk and bf16, then int8 vs int8:mosaic-int8 decode
#           in the engine): the other design for int8's 1.6x; if it wins, GPU_DEFAULT['int8'] can name it
#   PART=d  the Mosaic int4 kernel at M = 32 / 64 / 128 (it takes up to 128 tokens since 12-05; the engine runs it
#           at M <= 16 only) beside XLA's dequantize + dot on the same layout (the engine's path there) and the bf16
#           dot: if it wins, models/quant_paths.PATHS[('int4', 'mosaic-int4')] can run it up to that M
#   PART=e  after PART=d moved every int4 bucket up to 128 tokens onto the Mosaic kernel: its GPU tests at M > 16 and
#           the engine's int4 against bf16 at batch 1 / 16 / 64 and offline, in one process
#   PART=f  the int4 Mosaic kernel's K-split target at M = 32 / 64 / 128 (each split writes [N, Mp] f32 partials: at
#           M = 128 as many bytes as the int4 weight for gate_up): targets 1024 (default) / 512 / 256 / 128
#   PART=g  the engine-thread host time at batch 256 on the 8B after Scheduler.schedule's inlined common case, and
#           int4 (K split for ~256 CTAs from 64 tokens on) against bf16 at batch 64 and offline
#   JAXINFER_COMMIT=<sha> PART=a bash benchmarks/gpu_followup_1205.sh      # logs + JSONs into $OUT
set -u
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
OUT_DIR=${OUT:-/tmp/gpu-followup-out}; mkdir -p "$OUT_DIR"
PY=${PYTHON:-python3}
if [ "${PART:-a}" = a ]; then
  timeout 200 $PY benchmarks/gpu_tests.py tests/kernels/test_mosaic_int4_gpu.py -q > "$OUT_DIR/tests.log" 2>&1
  echo "tests rc=$?" >> "$OUT_DIR/run.log"
  timeout 170 $PY benchmarks/quantized_decode.py --methods int8 --decode-batches 1 16 --throughput-methods \
    --no-kv-capacity --budget-s 150 --tag int8-fresh > "$OUT_DIR/int8-fresh.log" 2>&1
  echo "int8 fresh rc=$?" >> "$OUT_DIR/run.log"
  timeout 220 $PY benchmarks/quantized_decode.py --methods int4 int8 --decode-batches 1 16 --throughput-methods \
    --no-kv-capacity --budget-s 200 --tag int8-after-int4 > "$OUT_DIR/int8-after.log" 2>&1
  echo "int8 after int4 rc=$?" >> "$OUT_DIR/run.log"
  cp benchmarks/results/gpu-tests-2*.json benchmarks/results/quantized-decode-int8-*.json "$OUT_DIR"/ 2>/dev/null
elif [ "${PART}" = c ]; then
  timeout 60 $PY benchmarks/gpu_tests.py tests/kernels/test_mosaic_int8_gpu.py -x -q > "$OUT_DIR/tests8.log" 2>&1
  echo "int8 kernel tests rc=$?" >> "$OUT_DIR/run.log"
  timeout 230 $PY benchmarks/kernels/quantized_matmul.py --variants bf16 int8_pallas_nk int8_mosaic_nk \
    int8_convert_nk --m 1 16 64 --check-m 1 64 --reps 3 --budget-s 210 --gpus 1 > "$OUT_DIR/kernel8.log" 2>&1
  echo "int8 kernel rc=$?" >> "$OUT_DIR/run.log"
  timeout 250 $PY benchmarks/quantized_decode.py --methods int8 int8:mosaic-int8 --decode-batches 1 16 \
    --throughput-methods --no-kv-capacity --budget-s 230 --tag mosaic-int8 > "$OUT_DIR/decode8.log" 2>&1
  echo "int8 engine A/B rc=$?" >> "$OUT_DIR/run.log"
  cp benchmarks/results/kernel-quantized-matmul-2*.json benchmarks/results/quantized-decode-mosaic-int8-*.json \
    "$OUT_DIR"/ 2>/dev/null
elif [ "${PART}" = e ]; then
  timeout 130 $PY benchmarks/gpu_tests.py tests/kernels/test_mosaic_int4_gpu.py -q -k \
    "32 or 77 or 128 or default" > "$OUT_DIR/tests4.log" 2>&1
  echo "int4 kernel tests rc=$?" >> "$OUT_DIR/run.log"
  timeout 400 $PY benchmarks/quantized_decode.py --methods int4 bf16 --decode-batches 1 16 64 --throughput-methods \
    int4 bf16 --no-kv-capacity --budget-s 380 --tag int4-m128 > "$OUT_DIR/decode4.log" 2>&1
  echo "int4 engine rc=$?" >> "$OUT_DIR/run.log"
  cp benchmarks/results/gpu-tests-2*.json benchmarks/results/quantized-decode-int4-m128-*.json "$OUT_DIR"/ 2>/dev/null
elif [ "${PART}" = f ]; then
  timeout 300 $PY benchmarks/kernels/quantized_matmul.py --variants bf16 int4_mosaic int4_mosaic_t512 \
    int4_mosaic_t256 int4_mosaic_t128 --m 32 64 128 --check-m 128 --reps 3 --budget-s 280 --gpus 1 \
    > "$OUT_DIR/kernel-split.log" 2>&1
  echo "kernel rc=$?" >> "$OUT_DIR/run.log"
  cp benchmarks/results/kernel-quantized-matmul-2*.json "$OUT_DIR"/ 2>/dev/null
elif [ "${PART}" = g ]; then
  timeout 200 $PY benchmarks/probes/host_step_cost.py --model llama3-8b --no-tokenizer --batch 256 --steps 40 \
    --tag 8b-inlined-schedule > "$OUT_DIR/host.log" 2>&1
  echo "host rc=$?" >> "$OUT_DIR/run.log"
  timeout 300 $PY benchmarks/quantized_decode.py --methods int4 bf16 --decode-batches 64 --throughput-methods \
    int4 bf16 --no-kv-capacity --budget-s 280 --tag int4-split256 > "$OUT_DIR/decode4.log" 2>&1
  echo "int4 engine rc=$?" >> "$OUT_DIR/run.log"
  cp benchmarks/results/host-step-cost-*8b-inlined*.json benchmarks/results/quantized-decode-int4-split256-*.json \
    "$OUT_DIR"/ 2>/dev/null
elif [ "${PART}" = d ]; then
  timeout 400 $PY benchmarks/kernels/quantized_matmul.py --variants bf16 int4_mosaic int4_mosaic_t512 \
    int4_mosaic_xla --m 32 64 128 --check-m 64 --reps 3 --budget-s 370 --gpus 1 > "$OUT_DIR/kernel.log" 2>&1
  echo "kernel rc=$?" >> "$OUT_DIR/run.log"
  cp benchmarks/results/kernel-quantized-matmul-2*.json "$OUT_DIR"/ 2>/dev/null
else
  timeout 330 $PY benchmarks/spec_speed.py --drafts none llama3.2-1b --batch 1 2 4 8 --accept 0.7 \
    --tag policy-cells > "$OUT_DIR/spec.log" 2>&1
  echo "spec rc=$?" >> "$OUT_DIR/run.log"
  timeout 240 $PY benchmarks/latency.py --batch 1 64 256 --tag followup > "$OUT_DIR/latency.log" 2>&1
  echo "latency rc=$?" >> "$OUT_DIR/run.log"
  cp benchmarks/results/spec-speed-policy-cells-*.json benchmarks/results/latency-followup-*.json "$OUT_DIR"/ 2>/dev/null
fi
grep -hE "passed|failed|decode|speed-up|tok/s|rc=" "$OUT_DIR"/*.log | tail -30
