"""Stable command-buffer temporaries on the GPU (runner/xla_env.py: SKIP_TEMP, XLA's VMM allocator) must not change
a single token: the same requests in two fresh processes, one with the setting (the default) and one without
(JAXINFER_STABLE_GRAPH_ADDRESSES=0), give identical token ids and logprobs; the KV pool is sized in both (the VMM
one from the CUDA driver, runner/device_memory.py). Run on the H200 with
`python benchmarks/gpu_tests.py tests/test_stable_addresses_gpu.py`."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = r"""
import json, jaxinfer, jax
from jaxinfer import SamplingParams
llm = jaxinfer.LLM("tiny-llama", load_format="dummy", max_model_len=512, max_num_batched_tokens=256,
                   max_num_seqs=16, gpu_memory_utilization=0.3, warmup=False, progress=False)
prompts = [list(range(1 + i, 1 + i + n)) for i, n in enumerate([3, 17, 64, 5, 130, 9, 33, 200, 2, 71, 12, 48])]
params = [SamplingParams(temperature=0.0 if i % 2 else 0.8, seed=i, max_tokens=24 + i, ignore_eos=True, logprobs=1)
          for i in range(len(prompts))]
outs = llm.generate(prompts, params, use_tqdm=False)
print("RESULT", json.dumps(dict(
    tokens=[o.outputs[0].token_ids for o in outs],
    logprobs=[[sorted((k, v.logprob) for k, v in d.items()) for d in o.outputs[0].logprobs] for o in outs],
    stats=bool(jax.devices()[0].memory_stats()), pages=llm.runner.num_pages)))
"""


def _run(stable: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "XLA_PYTHON_CLIENT_ALLOCATOR")}
    env["JAXINFER_STABLE_GRAPH_ADDRESSES"] = "1" if stable else "0"
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def test_stable_command_buffer_addresses_change_no_token():
    base, stable = _run(False), _run(True)
    assert base["stats"], "without the setting jax's BFC allocator reports memory statistics"
    assert not stable["stats"], "the setting did not engage (jax still reports BFC statistics)"
    assert abs(stable["pages"] / base["pages"] - 1) < 0.05, (stable["pages"], base["pages"])  # the same budget
    assert stable["tokens"] == base["tokens"]
    assert stable["logprobs"] == base["logprobs"]
