#!/usr/bin/env bash
# int8 batch-1 decode, an old commit and this tree back to back in ONE GPU call (the 316 vs 239-247 tok/s question of
# benchmarks/README.md, 2026-12-03 evening). Before the call, on this machine:
#   rm -rf _ab_old && mkdir _ab_old && git archive e29a522 jaxinfer pallas_kernels benchmarks | tar -x -C _ab_old
# (an untracked, not ignored folder: it travels with the working tree). Each side runs twice, interleaved, with bf16
# as the peer of each (ROUNDS=1: once each); carry .whl (jax_triton) as for gpu_pallas_nk.sh.
set -u
cd "$(dirname "$0")/.."
[ -d _ab_old/jaxinfer ] || { echo "no _ab_old/ (see the header)"; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONUNBUFFERED=1 JAXINFER_WARMUP=0
A="benchmarks/quantized_decode.py --methods bf16 int8 --decode-batches 1 16 --throughput-methods --no-kv-capacity --min-bucket-tokens 1"
for round in $(seq 1 "${ROUNDS:-2}"); do
  for side in _ab_old .; do
    (cd "$side" && PYTHONPATH="$PWD:/tmp/site" timeout -k 5 80 python3 $A 2>&1 | grep -E "decode" | cut -c1-12,150-240)
    echo "round $round side $side rc=$?"
  done
done
