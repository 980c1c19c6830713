"""Shared by the start-up cache tests on CPU (test_startup_caches.py) and GPU (test_startup_caches_gpu.py);
imports nothing the GPU machine lacks (no gguf)."""
import os

from jaxinfer import SamplingParams

TINY = dict(load_format="dummy", max_model_len=256, max_num_batched_tokens=32, max_num_seqs=4, num_pages=64,
            warmup=False, progress=False)


def run_two_prompts(llm):
    """Greedy and seeded-sampled tokens with their logprobs (and top logprobs) of two prompts."""
    params = [SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=2),
              SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=6, ignore_eos=True, logprobs=2)]
    outs = llm.generate([[1, 2, 3, 4, 5], list(range(7, 30))], params, use_tqdm=False)
    return [(o.outputs[0].token_ids, [sorted(d.items()) for d in o.outputs[0].logprobs]) for o in outs]


def stored_programs(root):
    """The program cache's entries under a JAXINFER_CACHE root."""
    d = os.path.join(root, "programs")
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".jxp"))
