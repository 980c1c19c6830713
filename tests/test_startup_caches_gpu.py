"""Whole compiled programs on disk (runner/program_cache.py) on the GPU, where they are on by default since
60b8838 (benchmarks/results/gpu-program-cache-803e7a6-2026-12-03.log: warm start-up of the 8B shape 13.5 s ->
8.8 s). The programs there hold command buffers and Pallas/Triton kernels; a program loaded from disk must give
exactly what a fresh compile gives. Run on the H200 with `python benchmarks/gpu_tests.py tests/test_startup_caches_gpu.py`."""
import pytest

import jaxinfer
from tests.startup_cases import TINY
from tests.startup_cases import run_two_prompts as _run
from tests.startup_cases import stored_programs as _programs

pytestmark = pytest.mark.gpu


def test_program_cache_hit_is_bitwise_identical_on_gpu(tmp_path, monkeypatch):
    monkeypatch.setenv("JAXINFER_CACHE", str(tmp_path))
    monkeypatch.delenv("JAXINFER_PROGRAM_CACHE", raising=False)  # the default must be on for the GPU
    fresh = jaxinfer.LLM("tiny-llama", **TINY)
    assert fresh.runner.program_cache is not None, "the program cache is off on the GPU"
    want = _run(fresh)
    pc = fresh.runner.program_cache
    assert pc.misses > 0 and pc.hits == 0 and pc.failures == 0
    assert len(_programs(tmp_path)) == pc.misses  # every program stored (none marked unserializable)

    warm = jaxinfer.LLM("tiny-llama", **TINY)
    assert _run(warm) == want  # token ids and logprobs, exactly
    assert warm.runner.program_cache.hits == pc.misses and warm.runner.program_cache.misses == 0
