"""Shared inputs and error measure of the quantized-matmul tests (CPU and GPU-marked)."""
import numpy as np


def rel_err(a, b) -> float:
    """||a - b|| / ||b|| in float64."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def assert_engine_path_like_xla(path_dir, quantization: str, prompt, **kw) -> None:
    """The int4 default on Hopper ('mosaic-int4' kernels) against two independent forms of the same int4 weights in
    a bfloat16 model: XLA's dequantize + dot ('xla-int4') and the jnp reference. The kernels round activations and
    dequantized weights to bf16, as XLA's form does, and bf16 logits of this peaked tiny model are coarse (one bf16
    step at |logit| 32 is 0.25), so each path differs from the reference by up to ~0.6 in a prompt token's log-prob
    (float32 models are not a fair reference: there the kernels' bf16 activations alone moved log-probs by 0.05-0.10
    on average; int4_wide_diag.py, H200, 2026-12-05 d). Required: the kernel path no farther from the reference than
    XLA's form (mean |d log-prob| <= 1.25x XLA's + 0.02), and its 8 greedy tokens equal to those of one of the two."""
    import numpy as np

    from jaxinfer import LLM, SamplingParams

    sp = SamplingParams(max_tokens=8, temperature=0.0, prompt_logprobs=0, ignore_eos=True)
    res = {}
    for backend in ("auto", "xla-int4", "reference"):
        llm = LLM(path_dir, quantization=quantization, quantized_matmul=backend, dtype="bfloat16", **kw)
        if backend == "auto":
            assert llm.model.module().layers[0].mlp.down.backend == "mosaic-int4"
        o = llm.generate([prompt], sp, use_tqdm=False)[0]
        res[backend] = (o.outputs[0].token_ids, np.array([next(iter(d.values())).logprob
                                                          for d in o.prompt_logprobs[1:]]))
        del llm
    ref_lp = res["reference"][1]
    kernel_d, xla_d = (float(np.abs(res[b][1] - ref_lp).mean()) for b in ("auto", "xla-int4"))
    assert kernel_d <= 1.25 * xla_d + 0.02, (kernel_d, xla_d)
    assert res["auto"][0] in (res["xla-int4"][0], res["reference"][0]), res


def outlier_weights(K, N, seed=0) -> np.ndarray:
    """f32[K, N] Gaussian weights with a few outlier columns (the case per-channel scales exist for)."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(K, N)) * 0.05 * np.where(rng.random(N) < 0.1, 8.0, 1.0)[None, :]
    return w.astype(np.float32)
