"""Run the GPU-marked tests (`pytest -m gpu`) on the GPU and record every test's outcome and duration in
benchmarks/results/gpu-tests-<commit>-<date>.json (with the device, jax version and commit), so that "the GPU tests
passed" is a recorded fact, not a claim.

  python benchmarks/gpu_tests.py                       # all GPU tests
  python benchmarks/gpu_tests.py tests/kernels -x      # extra arguments go to pytest
  GPU_TESTS_TAG=part2 python benchmarks/gpu_tests.py ... # results/gpu-tests-part2-<commit>-<date>.json (one file a run)
"""
from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import pytest  # noqa: E402

from benchmarks.common import write_result  # noqa: E402


class Recorder:
    """pytest plugin: one row per test (node id, outcome, seconds, message), the JSON rewritten after every test so
    that a run cut by the device's time limit keeps what it ran."""

    def __init__(self, args: list[str]):
        self.args, self.rows, self.t0, self.path = args, [], time.perf_counter(), None

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":  # setup/teardown only when they fail or skip
            msg = None if report.passed else str(report.longrepr)[-300:]
            self.rows.append(dict(test=report.nodeid, phase=report.when, outcome=report.outcome,
                                  seconds=round(report.duration, 2), message=msg))
            self.save(exit_code=None)

    def save(self, exit_code):
        counts = {k: sum(r["outcome"] == k for r in self.rows) for k in ("passed", "failed", "skipped")}
        payload = dict(pytest_args=self.args, exit_code=exit_code, counts=counts,
                       wall_s=round(time.perf_counter() - self.t0, 1), tests=self.rows)
        self.path = write_result("gpu-tests", payload, tag=os.environ.get("GPU_TESTS_TAG", ""))
        return counts


def main(argv: list[str]) -> int:
    args = ["-m", "gpu", "-q", "-p", "no:cacheprovider"] + (argv or ["tests"])
    rec = Recorder(args)
    rc = int(pytest.main(args, plugins=[rec]))
    counts = rec.save(exit_code=rc)
    print(f"GPU tests: {counts} in {time.perf_counter() - rec.t0:.0f} s; wrote {rec.path}", flush=True)
    return rc

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
