"""Quality gain of AWQ-style activation-aware scaling over round-to-nearest int4 (CPU; quality only).

Perplexity on the shipped quality text (jaxinfer/data/quality_text.txt) of: the float model, int4 RTN, and int4
after AWQ scales searched on the shipped calibration text (jaxinfer/data/calibration_text.txt, a different text).
Weights are fake-quantized (the exact QuantizedTensor.dequantize() values put back into the float model) and the
model runs as a dense float forward (jaxinfer/weights/awq.py), so this measures the weights' quality independent of
the device-side int4 kernels. SmolLM2-135M's hidden size 576 is not a multiple of 128: group 64 is its largest
power-of-two group.

  python benchmarks/awq_gain.py [--model PATH] [--dtype float32] [--group-size 64] [--num-tokens N]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.common import write_result  # noqa: E402
from jaxinfer.weights import awq  # noqa: E402
from jaxinfer.weights.loader import load_model, resolve_model  # noqa: E402
from jaxinfer.quality import quality_text  # noqa: E402
from jaxinfer.tokenizer import Tokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--group-size", type=int, nargs="+", default=[64])
    ap.add_argument("--num-tokens", type=int, default=None)
    a = ap.parse_args()
    if a.model is None:
        from jaxinfer.weights.default_model import default_model_path
        a.model = default_model_path()
    if a.model.endswith(".gguf"):
        tok = Tokenizer.from_pretrained(os.path.dirname(a.model) or ".", gguf_file=os.path.basename(a.model))
    else:
        tok = Tokenizer.from_pretrained(a.model)
    ids = tok.encode(quality_text())[: a.num_tokens]
    calib = tok.encode(awq.calibration_text())
    loaded = load_model(resolve_model(a.model), a.dtype, progress=False)

    def ppl(module):
        nll, _ = awq.dense_forward(module, ids)
        return float(np.exp(nll.mean()))

    base = ppl(loaded.module())
    print(f"float {a.dtype}: perplexity {base:.4f}", flush=True)
    rows = [dict(method="float", perplexity=base)]
    for g in a.group_size:
        m = loaded.module()
        awq.load_dequantized(m, awq.quantize_module(m, g))
        rtn = ppl(m)
        t0 = time.perf_counter()
        m = loaded.module()
        res = awq.apply_awq(m, calib, group_size=g)
        search_s = time.perf_counter() - t0
        awq.load_dequantized(m, awq.quantize_module(m, g))
        got = ppl(m)
        alphas = list(res.alphas.values())
        rows += [dict(method=f"int4 RTN g{g}", perplexity=rtn, increase=rtn / base - 1),
                 dict(method=f"int4 AWQ g{g}", perplexity=got, increase=got / base - 1, search_seconds=search_s,
                      calibration_tokens=len(calib), mean_alpha=float(np.mean(alphas)),
                      groups_scaled=int(sum(x > 0 for x in alphas)), groups=len(alphas))]
        print(f"int4 g{g}: RTN {rtn:.4f} ({100 * (rtn / base - 1):+.2f}%), AWQ {got:.4f} "
              f"({100 * (got / base - 1):+.2f}%), search {search_s:.0f} s", flush=True)
    path = write_result("awq-gain", dict(model=os.path.basename(a.model), dtype=a.dtype, num_tokens=len(ids),
                                         text="jaxinfer/data/quality_text.txt",
                                         calibration="jaxinfer/data/calibration_text.txt", rows=rows,
                                         target="issue 7: int4-g128 RTN <= +8%, AWQ better than RTN"))
    print("wrote", path)


if __name__ == "__main__":
    main()
