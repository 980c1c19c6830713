"""Shared inputs and error measure of the quantized-matmul tests (CPU and GPU-marked)."""
import numpy as np


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def assert_greedy_and_prompt_logprobs_match(llm, ref, prompt, tol: float = 0.05) -> None:
    """Two engines on the same weights (a kernel path and the jnp reference): 8 greedy tokens equal, and each
    prompt token's log-prob within tol."""
    from jaxinfer import SamplingParams

    sp = SamplingParams(max_tokens=8, temperature=0.0, prompt_logprobs=0, ignore_eos=True)
    got, want = (x.generate([prompt], sp, use_tqdm=False)[0] for x in (llm, ref))
    assert got.outputs[0].token_ids == want.outputs[0].token_ids
    for a, b in zip(got.prompt_logprobs[1:], want.prompt_logprobs[1:]):
        (ta, la), = a.items()
        (tb, lb), = b.items()
        assert ta == tb and abs(la.logprob - lb.logprob) < tol


def outlier_weights(K, N, seed=0) -> np.ndarray:
    """f32[K, N] Gaussian weights with a few outlier columns (the case per-channel scales exist for)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(K, N)) * 0.05 * np.where(rng.random(N) < 0.1, 8.0, 1.0)[None, :]
    return w.astype(np.float32)
