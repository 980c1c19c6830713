#!/usr/bin/env bash
# Issue 17 item 5 in ONE GPU call (H200, Llama-3-8B shape, dummy bf16 weights), from the repo root:
#
#   JAXINFER_COMMIT=<short sha> bash benchmarks/gpu_suite.sh
#
# Parts, most important first, each under its own `timeout` (cap = the most it may take; it also never runs past
# the suite's deadline, SUITE_BUDGET_S, default 530 s, and is skipped when less than its minimum is left):
#   latency     latency.py batch 1/16/64/256, prompt 512, 128 new, plain-XLA peer (subprocess) + roofline  ~110 s
#   throughput  throughput.py fixed 1000 x 512/256 + ShareGPT-like 1000, compute bound beside            ~95 s
#   serving     serving_sweep.py 4/16/32/64 req/s, 80/1000/1000/1000 prompts, ShareGPT-like mix          ~210 s
#   startup     startup.py warm (the cache the parts above filled), then cold (a fresh cache dir)     ~25 + ~70 s
#   host        probes/host_step_cost.py on the 8B shape, batch 1/64/256, no tokenizer (host ms per step)   ~60 s
#   spec        spec_speed.py: batch 1/8/32, free drafts and the 1B-shaped draft, a 0.5/0.7/0.9             ~150 s
#   profile     probes/step_profile.py: device time of decode b1/b64, prefill 256/2048, per-op trace        ~90 s
# PARTS (env) picks which parts run, in this order (default: latency throughput serving startup).
# All engine runs use the same settings (max_model_len 2048, max_num_seqs 256, max_num_batched_tokens 2048,
# gpu_memory_utilization 0.9), so they share one persistent compilation cache: only latency compiles cold, and
# its LLM() time (compilation_cache_entries_before = 0 in its JSON) is a second cold start-up figure.
#
# Files back in $OUT (the device tool returns at most 8): suite.log (timings + a summary of every figure),
# latency.log, throughput.log, serving.log, startup.log, results.tar.gz (every benchmarks/results file this run
# wrote: JSONs + the serving PNG, and the server's log). The tar is rebuilt after every part, so a run cut short
# still returns what finished.
set -u
cd "$(dirname "$0")/.."

BUDGET=${SUITE_BUDGET_S:-530}
PY=${PYTHON:-python3}
OUT_DIR=${OUT:-/tmp/gpu-suite-out}
mkdir -p "$OUT_DIR"
WORK=$(mktemp -d /tmp/gpu-suite.XXXXXX)
touch "$WORK/stamp"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export OUT="$WORK/out"                 # write_result's copies go here, not into the 8-file $OUT_DIR
mkdir -p "$OUT"
export JAXINFER_CACHE="$WORK/cache"    # one compilation cache for latency, throughput, serving, startup warm
COLD_CACHE="$WORK/cache-cold"          # empty: startup cold
SUITE_LOG="$OUT_DIR/suite.log"
T0=$(date +%s)
ENGINE=(--max-model-len 2048 --max-num-seqs 256 --max-num-batched-tokens 2048)
LAT=(--model llama3-8b --batch 1 16 64 256 --prompt-len 512 --new-tokens 128 --device-only-context 704)
THR=(--model llama3-8b --num-requests 1000 --prompt-len 512 --output-len 256)
SRV=(--model llama3-8b --rates 4 16 32 64 --num-prompts 80 1000 1000 1000)
ST=(--model llama3-8b)
HOST=(--model llama3-8b --batch 1 64 256 --steps 40)
SPEC=(--batch 1 8 32)  # the default 1/4/8/16/32 does not fit the part's 240 s
PROF=()
if [[ ${SUITE_SMOKE:-0} == 1 ]]; then  # CPU check of this script: the tiny model, a few requests
  ENGINE=(--max-model-len 256 --max-num-seqs 8 --max-num-batched-tokens 64)
  LAT=(--model tiny-llama --batch 1 4 --prompt-len 32 --new-tokens 16 --device-only-context 100)
  THR=(--model tiny-llama --num-requests 16 --prompt-len 32 --output-len 16)
  SRV=(--model tiny-llama --rates 4 16 --num-prompts 8 16)
  ST=(--model tiny-llama)
  HOST=(--model tiny-llama --batch 1 4 --steps 5)
  SPEC=(--model tiny-llama --drafts none tiny-llama --batch 1 2 --accept 0.7 --new-tokens 12 --prompt-len 16)
  PROF=(--model tiny-llama --iters 2 --max-num-seqs 64 --max-model-len 1024 --shapes decode-b1)
fi

log() { echo "[suite $(( $(date +%s) - T0 ))s] $*" | tee -a "$SUITE_LOG"; }

pack() {  # every results file written since the suite started, plus the server log
  local args=()
  mapfile -t args < <(find benchmarks/results -maxdepth 1 -type f -newer "$WORK/stamp" | sort)
  [[ -f "$WORK/jaxinfer-serve.log" ]] && args+=(-C "$WORK" jaxinfer-serve.log)
  (( ${#args[@]} )) || return 0
  tar czf "$OUT_DIR/results.tar.gz" "${args[@]}" 2>>"$SUITE_LOG" || log "tar failed"
}

# part NAME LOG CAP_S MIN_S GRACE_S cmd...: run cmd under timeout, output appended to $OUT_DIR/LOG.log
part() {
  local name=$1 logf="$OUT_DIR/$2.log" cap=$3 min=$4 grace=$5
  shift 5
  local left=$(( BUDGET - ($(date +%s) - T0) - grace - 5 ))
  if (( left < min )); then
    log "$name: SKIPPED ($left s left before the deadline, needs >= $min s)"
    return
  fi
  local lim=$(( cap < left ? cap : left )) t1=$(date +%s)
  log "$name: start (limit $lim s + $grace s grace): $*"
  echo "=== $name: $* (limit $lim s)" >>"$logf"
  timeout -k "$grace" "$lim" "$@" 2>&1 | tee -a "$logf"
  local rc=${PIPESTATUS[0]}
  log "$name: exit $rc after $(( $(date +%s) - t1 )) s$( (( rc == 124 || rc == 137 )) && echo ' (TIMED OUT)')"
  pack
}

log "start: commit ${JAXINFER_COMMIT:-unset (set JAXINFER_COMMIT)}; budget $BUDGET s; python $PY; $(date -u +%FT%TZ)"
nvidia-smi -L 2>&1 | tee -a "$SUITE_LOG"

PARTS=" ${PARTS:-latency throughput serving startup} "
want() { [[ $PARTS == *" $1 "* ]]; }

want latency && part latency latency 170 90 10 "$PY" benchmarks/latency.py "${LAT[@]}" --load-format dummy "${ENGINE[@]}" \
  --gpu-memory-utilization 0.9

want throughput && part throughput throughput 140 60 10 "$PY" benchmarks/throughput.py "${THR[@]}" --load-format dummy \
  --workload fixed sharegpt "${ENGINE[@]}" --gpu-memory-utilization 0.9

# grace 45 s: on SIGTERM the sweep stops the server (<= 15 s), then writes what it measured
want serving && part serving serving 260 100 45 "$PY" benchmarks/serving_sweep.py "${SRV[@]}" "${ENGINE[@]}" \
  --gpu-memory-utilization 0.9 --log-dir "$WORK"

want startup && part startup-warm startup 45 20 5 "$PY" benchmarks/startup.py "${ST[@]}" --load-format dummy "${ENGINE[@]}" \
  --label warm

want startup && part startup-cold startup 100 55 5 env JAXINFER_CACHE="$COLD_CACHE" "$PY" benchmarks/startup.py "${ST[@]}" \
  --load-format dummy "${ENGINE[@]}" --label cold

want host && part host host 120 40 5 "$PY" benchmarks/probes/host_step_cost.py "${HOST[@]}" --load-format dummy \
  --no-tokenizer
want spec && part spec spec 240 90 10 "$PY" benchmarks/spec_speed.py "${SPEC[@]}"
want profile && part profile profile 150 60 5 "$PY" benchmarks/probes/step_profile.py "${PROF[@]}"

log "summary:"
grep -h -E "^(device|batch +[0-9]+:|plain-XLA peer|fixed +:|sharegpt +:|rate +[0-9.]+ \(|rate [0-9.]+: completed|targets:|jaxinfer serve ready|startup \(|wrote)" \
  "$OUT_DIR"/latency.log "$OUT_DIR"/throughput.log "$OUT_DIR"/host.log "$OUT_DIR"/spec.log "$OUT_DIR"/serving.log "$OUT_DIR"/startup.log 2>/dev/null \
  | tee -a "$SUITE_LOG"
pack
log "done; results.tar.gz: $(tar tzf "$OUT_DIR/results.tar.gz" 2>/dev/null | tr '\n' ' ')"
