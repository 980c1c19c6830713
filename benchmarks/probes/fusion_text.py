"""What an op of a device profile computes: the optimized HLO of named fusions, from an XLA dump.

A step profile (probes/step_profile.py) names kernels as the trace does, e.g. `fusion_1373` or `loop_add_fusion_1`:
the HLO instruction `%fusion.1373` / `%loop_add_fusion.1` of the compiled module. This prints, for each name, that
instruction (its shape, kind and operands) and the body of the computation it calls, from the
`*after_optimizations.txt` files XLA writes under --xla_dump_to. Host-only: reads text, needs no device.

  XLA_FLAGS="--xla_dump_to=/tmp/hlo --xla_dump_hlo_as_text" python benchmarks/probes/step_profile.py ...
  python benchmarks/probes/fusion_text.py --dump /tmp/hlo --names fusion_1373 fusion_2305
  python benchmarks/probes/fusion_text.py --dump /tmp/hlo --profile results/step-profile-X.json --shape prefill-2048 \
      --module-contains 2048,28672
(--profile: the shape's top ops that are neither GEMMs nor custom kernels, --top of them; --module-contains: the
bucket's own program, since each program numbers its fusions on its own.)
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re

_GEMM = re.compile(r"nvjet|gemm|cutlass|cudnn|sm90|ragged_paged|_nk_|Memcpy|Memset")


def hlo_name(trace_name: str) -> str:
    """The trace's `fusion_1373` is the HLO's `fusion.1373` (XLA joins a name's numeric suffix with a dot)."""
    m = re.fullmatch(r"(.*)_(\d+)", trace_name)
    return f"{m.group(1)}.{m.group(2)}" if m else trace_name


def computations(text: str) -> dict[str, str]:
    """{computation name: its text} of one HLO module's text."""
    out, name, lines = {}, None, []
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if name is None and head:
            name, lines = head.group(1), [line]
        elif name is not None:
            lines.append(line)
            if line.startswith("}"):
                out[name] = "\n".join(lines)
                name = None
    return out


def describe(text: str, name: str) -> str | None:
    """The instruction `%name = ...` of the module text and the computation it calls, or None if absent."""
    inst = re.search(rf"^\s*(?:ROOT )?%{re.escape(name)} = .*$", text, re.M)
    if inst is None:
        return None
    called = re.search(r"calls=%?([\w.\-]+)", inst.group(0))
    body = computations(text).get(called.group(1), "") if called else ""
    return inst.group(0).strip() + ("\n" + body if body else "")


def profile_names(path: str, shape: str, top: int) -> list[str]:
    """The --top largest ops of `shape` in a step_profile JSON that are neither GEMMs nor custom kernels."""
    rows = [r for r in json.load(open(path))["rows"] if r["shape"] == shape]
    if not rows:
        raise SystemExit(f"{path} has no row for shape {shape!r}")
    ops = sorted(rows[0]["top_ops_us"].items(), key=lambda kv: -kv[1])
    return [n for n, _ in ops if not _GEMM.search(n)][:top]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dump", required=True, help="the --xla_dump_to directory")
    ap.add_argument("--names", nargs="*", default=[], help="op names as the trace writes them")
    ap.add_argument("--profile", help="a step_profile JSON: take names from its --shape row")
    ap.add_argument("--shape", default="prefill-2048")
    ap.add_argument("--top", type=int, default=6)
    ap.add_argument("--module-contains", default="",
                    help="only modules whose text holds this (e.g. '2048,28672': the 2,048-token bucket's program; "
                         "every bucket's program numbers its fusions on its own)")
    a = ap.parse_args()
    names = list(a.names) + (profile_names(a.profile, a.shape, a.top) if a.profile else [])
    files = sorted(glob.glob(os.path.join(a.dump, "*after_optimizations.txt")), key=os.path.getsize, reverse=True)
    if not files:
        raise SystemExit(f"no *after_optimizations.txt under {a.dump}: run with XLA_FLAGS=--xla_dump_to={a.dump} "
                         "--xla_dump_hlo_as_text")
    texts = [(f, t) for f in files if a.module_contains in (t := open(f).read())]
    for name in names:
        found = [(f, d) for f, t in texts if (d := describe(t, hlo_name(name))) is not None]
        print(f"=== {name} ({hlo_name(name)}): " + (f"{len(found)} module(s)" if found else "not found"))
        for f, d in found[:1]:   # the largest module holding it (the step's), not every warm-up program
            print(f"--- {os.path.basename(f)}\n{d}")


if __name__ == "__main__":
    main()
