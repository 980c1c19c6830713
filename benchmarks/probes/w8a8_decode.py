"""Probe (issue 20): int8 W8A8 at EVERY step size in the engine's decode — XLA's int8 x int8 dot on the [N, K]
weights with activations quantized per token, the form that measured 1.46-2.01x the bf16 dot per op at M = 1 on the
large 8B weights (H200, results/kernel-quantized-matmul-nk-2026-12-02.json) but 0.82x in the engine on 12-02 (W8A8 on
the large weights only, before stable command-buffer addresses; not diagnosed). Runs benchmarks/quantized_decode.py
with the 'xla-nk-w8a8' row of models/quant_paths.PATHS replaced by W8A8 at every M, so its `int8:xla-nk-w8a8`
method is W8A8 everywhere here (decode included: W8A8 numerics, for SmoothQuant-smoothed checkpoints). The program
cache is off: its key cannot see the patched table.

  python benchmarks/probes/w8a8_decode.py --methods bf16 int8:xla-nk-w8a8 --decode-batches 1 16 \\
      --throughput-methods --no-kv-capacity --tag w8a8-all-m
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ["JAXINFER_PROGRAM_CACHE"] = "0"

from jaxinfer.models import quant_paths  # noqa: E402

quant_paths.PATHS[("int8", "xla-nk-w8a8")] = ((quant_paths.ANY_M, "w8a8-nk"),)

from benchmarks import quantized_decode  # noqa: E402

if __name__ == "__main__":
    quantized_decode.main()
