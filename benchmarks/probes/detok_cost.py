"""Host cost of incremental detokenization per generated token (issue 17: host time per step at batch 256).

A plain decode step sends every running sequence's one new token through its IncrementalDetokenizer
(engine/detokenizer.py); at batch 256 that is 256 appends a step on the engine thread, for every request that has
a tokenizer (the server's, `LLM.generate`'s). This probe feeds --seqs sequences of real text's token ids (the
default model's tokenizer, SmolLM2's byte-level BPE) one token a step and prints µs per token, with and without stop
strings, beside two floors measured in the same process:
  decode-2    one Rust decode of two tokens a token (the least an exact incremental decode does: context + new)
  whole       one decode of each whole output at the end (no streaming: what a FINAL_ONLY request could do)

  python benchmarks/probes/detok_cost.py [--seqs 256] [--tokens 64]

Measured (2-core CPU box, 12-07, the tree before the one-token length cache and the single-token path (113a027)
and after, in turn, twice): 4.14 -> 2.83 and 2.68 -> 1.84 µs a token without stop strings, 5.67 -> 4.23 and
3.77 -> 2.76 with two; decode-2 0.82-1.33, whole 0.12-0.19 (benchmarks/README.md, 2026-12-07 a).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.common import write_result  # noqa: E402
from jaxinfer.engine.detokenizer import IncrementalDetokenizer  # noqa: E402
from jaxinfer.tokenizer import Tokenizer  # noqa: E402
from jaxinfer.weights.default_model import default_model_path  # noqa: E402

TEXT = ("The quick brown fox jumps over the lazy dog; naïve café owners sell crème brûlée for 5 € (≈ $5.40). "
        "Numbers: 3.14159, 2.71828. 你好，世界！ Emoji 🦊👍🏽 and code: def f(x): return x ** 2\n")


def per_token_us(tok, streams, prompt, stop) -> float:
    """µs per token of appending every stream's tokens one at a time, round-robin (as engine steps do)."""
    ds = [IncrementalDetokenizer(tok, prompt, True, stop) for _ in streams]
    t = time.perf_counter()
    for j in range(len(streams[0])):
        for d, s in zip(ds, streams):
            d.append((s[j],))
    for d in ds:
        d.flush()
    dt = time.perf_counter() - t
    want = tok.decode(prompt + streams[0])[len(tok.decode(prompt)):]
    assert stop or ds[0].text == want, "incremental text differs from decode()"
    return 1e6 * dt / (len(streams) * len(streams[0]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seqs", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--tag", default="")
    a = ap.parse_args()
    tok = Tokenizer.from_pretrained(default_model_path())
    ids = tok.encode(TEXT * 20, add_special_tokens=False)
    streams = [ids[i % 50: i % 50 + a.tokens] for i in range(a.seqs)]
    prompt = tok.encode("Write something:", add_special_tokens=False)
    decode2 = tok.decoder(True)
    rows = {}
    for name, fn in (
            ("no stop strings", lambda: per_token_us(tok, streams, prompt, None)),
            ("two stop strings", lambda: per_token_us(tok, streams, prompt, ["</s>", "\n\n"])),
            ("floor: decode-2", lambda: _timed_per_token(lambda: [decode2(s[j:j + 2]) for s in streams
                                                                   for j in range(a.tokens)], streams)),
            ("floor: whole", lambda: _timed_per_token(lambda: [tok.decode(s) for s in streams], streams))):
        rows[name] = statistics.median(fn() for _ in range(a.repeat))
        print(f"{name:18s} {rows[name]:6.2f} µs a token", flush=True)
    path = write_result("detok-cost", dict(seqs=a.seqs, tokens=a.tokens, us_per_token=rows), tag=a.tag)
    print("wrote", path)


def _timed_per_token(fn, streams) -> float:
    t = time.perf_counter()
    fn()
    return 1e6 * (time.perf_counter() - t) / (len(streams) * len(streams[0]))


if __name__ == "__main__":
    main()
