"""A/B of `jaxinfer generate --chat` start-up: seconds to the first stdout byte, cold and warm, of source trees.

Each round and tree gets a fresh JAXINFER_CACHE (its models/ linked to the cached default model): one cold run
(every other cache empty), then --warm runs (program and prepared-weights caches hot). Trees alternate within a
round, the order flipping each round, so a shared box's load falls on each alike. A tree is a directory on
PYTHONPATH (e.g. `git archive <commit> | tar -x -C /tmp/base`), optionally `@VAR=value,...` for its environment.
Also printed: the seconds to the process's exit (a background compile still running keeps it alive).

  python benchmarks/probes/cli_first_byte_ab.py --rounds 4 --warm 2 /tmp/base .
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROMPT = "Write a short story about a robot who learns to paint."


def first_byte(spec: str, root: str) -> tuple[float, float]:
    tree, _, kv = spec.partition("@")
    env = dict(os.environ, JAXINFER_CACHE=root, PYTHONPATH=os.path.abspath(tree),
               **dict(x.split("=", 1) for x in kv.split(",") if x))
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "jaxinfer.cli", "generate", PROMPT, "--chat", "--quiet",
                          "--max-tokens", "8"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd="/")
    p.stdout.read(1)
    t = time.perf_counter() - t0
    _, err = p.communicate()
    if p.returncode:
        raise RuntimeError(f"{spec}: jaxinfer generate failed: {err.decode()[-2000:]}")
    return t, time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trees", nargs="+")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warm", type=int, default=2)
    a = ap.parse_args()
    from jaxinfer.weights.default_model import default_model_path

    model_dir = os.path.dirname(default_model_path())
    res = {t: dict(cold=[], warm=[], cold_exit=[], warm_exit=[]) for t in a.trees}
    for r in range(a.rounds):
        for tree in a.trees if r % 2 == 0 else a.trees[::-1]:
            root = tempfile.mkdtemp(prefix="jaxinfer-ab-")
            os.symlink(model_dir, os.path.join(root, "models"))
            try:
                load = os.getloadavg()[0]
                c, ce = first_byte(tree, root)
                ws = [first_byte(tree, root) for _ in range(a.warm)]
            finally:
                shutil.rmtree(root, ignore_errors=True)
            d = res[tree]
            d["cold"].append(c), d["cold_exit"].append(ce)
            d["warm"] += [w for w, _ in ws]
            d["warm_exit"] += [e for _, e in ws]
            print(f"round {r} {tree}: load {load:.2f} cold {c:.2f} (exit {ce:.2f}) warm "
                  + " ".join(f"{w:.2f}" for w, _ in ws), flush=True)
    for tree, d in res.items():
        m = {k: statistics.median(v) for k, v in d.items()}
        print(f"{tree}: median cold {m['cold']:.2f} s (exit {m['cold_exit']:.2f}), warm {m['warm']:.2f} s "
              f"(exit {m['warm_exit']:.2f})")


if __name__ == "__main__":
    main()
