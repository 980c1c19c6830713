"""One process of the two-process (multi-host) test: `python -m tests.parallel.multihost_worker CKPT OUT_JSON`.

Configured like a real host through the environment: JAXINFER_COORDINATOR_ADDRESS, JAXINFER_NUM_PROCESSES,
JAXINFER_PROCESS_ID, and XLA_FLAGS giving each process 2 CPU devices. Runs tensor parallelism 4 across both
processes (every process runs the same program on the same prompts) and writes what it generated.
"""
import json
import sys


def main(ckpt: str, out_path: str):
    from jaxinfer.parallel import initialize_distributed

    assert initialize_distributed()  # before any device is touched
    import jax

    from jaxinfer import LLM, SamplingParams
    from tests.parallel.tp_cases import ENGINE_OPTIONS, PROMPTS

    llm = LLM(ckpt, tensor_parallel_size=4, **ENGINE_OPTIONS)
    outs = llm.generate(PROMPTS, SamplingParams(max_tokens=6, temperature=0.0, prompt_logprobs=0, logprobs=0),
                        use_tqdm=False)
    devices = llm.runner.plan.devices
    result = {
        "process_index": jax.process_index(), "process_count": jax.process_count(),
        "local_devices": jax.local_device_count(), "global_devices": jax.device_count(),
        "mesh_processes": sorted({d.process_index for d in devices}),
        "tokens": [o.outputs[0].token_ids for o in outs],
        "prompt_logprobs": [[next(iter(d.values())).logprob for d in o.prompt_logprobs[1:]] for o in outs],
    }
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
