"""Multi-host: two processes on localhost, 2 CPU devices each, joined by jax.distributed (coordinator address,
process count and id from the environment, as on two real hosts), run tensor parallelism 4 ACROSS the two
processes (cross-process collectives over gloo) and must generate what one device generates."""
import json
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from jaxinfer.config import ConfigError
from jaxinfer.parallel import initialize_distributed
from tests.parallel.tp_cases import PROMPTS

_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_tensor_parallel_across_hosts(build_llm, gqa_few_kv_dir, tmp_path):
    from jaxinfer import SamplingParams

    port = _free_port()
    procs = []
    for pid in range(2):
        env = dict(os.environ, JAXINFER_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAXINFER_NUM_PROCESSES="2",
                   JAXINFER_PROCESS_ID=str(pid), XLA_FLAGS="--xla_force_host_platform_device_count=2",
                   JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([_REPO, os.environ.get("PYTHONPATH", "")]))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.parallel.multihost_worker", gqa_few_kv_dir, str(tmp_path / f"{pid}.json")],
            cwd=_REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=300)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    want = build_llm(gqa_few_kv_dir).generate(
        PROMPTS, SamplingParams(max_tokens=6, temperature=0.0, prompt_logprobs=0, logprobs=0), use_tqdm=False)
    for pid in range(2):
        got = json.loads((tmp_path / f"{pid}.json").read_text())
        assert (got["process_index"], got["process_count"]) == (pid, 2)
        assert (got["local_devices"], got["global_devices"]) == (2, 4)
        assert got["mesh_processes"] == [0, 1]  # the TP=4 mesh spans both processes
        assert got["tokens"] == [o.outputs[0].token_ids for o in want]
        for g, o in zip(got["prompt_logprobs"], want):
            np.testing.assert_allclose(g, [next(iter(d.values())).logprob for d in o.prompt_logprobs[1:]],
                                       atol=1e-4, rtol=0)


def test_partial_multihost_settings_are_refused(monkeypatch):
    for k in ("JAXINFER_COORDINATOR_ADDRESS", "JAXINFER_NUM_PROCESSES", "JAXINFER_PROCESS_ID"):
        monkeypatch.delenv(k, raising=False)
    assert initialize_distributed() is False  # nothing set: single process, nothing initialised
    with pytest.raises(ConfigError, match="needs all three.*process_id=None"):
        initialize_distributed("10.0.0.1:1234", num_processes=2)
    with pytest.raises(ConfigError, match=r"process_id=2 must be in \[0, num_processes=2\)"):
        initialize_distributed("10.0.0.1:1234", num_processes=2, process_id=2)
