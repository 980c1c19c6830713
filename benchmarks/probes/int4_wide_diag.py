"""Why the int4 engine test of a 300-token prefill failed on the GPU (2026-12-05 d): the many-token int4 kernel
(mosaic_int4_wide.py) per op at the tiny g128 model's shapes (K 128 / 256: one or two groups, N 128..512) against
the float32 reference of the same weights, then the engine's prompt log-probs and greedy tokens for the int4
default ('mosaic-int4'), XLA's dequantize + dot ('xla-int4') and the jnp reference on that model: if the kernel is
right per op and the XLA path differs from the reference as much as the kernel path does, the test's bound (not
the kernel) is wrong. GPU only.

  python benchmarks/probes/int4_wide_diag.py [--engines-only]   # --engines-only: float32 at 100 tokens, bfloat16
"""
from __future__ import annotations

import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402


def per_op():
    import jax.numpy as jnp
    from jax import lax

    from pallas_kernels.quantized_matmul import mosaic_int4_wide as MW
    from tests.kernels.quant_cases import rel_err
    from tests.kernels.test_mosaic_int4 import native_nk_case
    from tests.kernels.test_mosaic_int4_wide import dequant_bf16

    for M in (129, 300):
        for K, N in ((128, 256), (128, 128), (128, 512), (256, 128)):
            for offset in (False, True):
                x, q, scale, off, want = native_nk_case(M, K, N, seed=M + K + N, offset=offset)
                cfg = MW.default_config(M, K, N)
                got = MW.int4_matmul_mosaic_wide(x, q, scale, off, out_dtype=jnp.float32, cfg=cfg)
                exact = jnp.dot(x.astype(jnp.float32), dequant_bf16(q, scale, off).T, precision=lax.Precision.HIGHEST)
                print(f"per op M={M} K={K} N={N} offset={offset} cfg={cfg}: rel err vs f32 reference "
                      f"{rel_err(got, want):.2e}, vs bf16-rounded weights {rel_err(got, exact):.2e}, "
                      f"finite {bool(np.isfinite(np.asarray(got)).all())}", flush=True)


def engines(dtype: str = "float32", prompt_len: int = 300):
    import torch
    import transformers as tf

    import jaxinfer
    from jaxinfer import SamplingParams

    torch.manual_seed(1)
    cfg = tf.LlamaConfig(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         initializer_range=0.3, bos_token_id=1, eos_token_id=2)
    path = tempfile.mkdtemp()
    tf.LlamaForCausalLM(cfg).float().eval().save_pretrained(path)
    kw = dict(dtype=dtype, max_model_len=512, num_pages=64, max_num_batched_tokens=512, warmup=False,
              progress=False)
    prompt = [(37 * i + 11) % 500 + 3 for i in range(prompt_len)]
    sp = SamplingParams(max_tokens=8, temperature=0.0, prompt_logprobs=0, ignore_eos=True)
    res = {}
    for name in ("reference", "xla-int4", "mosaic-int4"):
        llm = jaxinfer.LLM(path, quantization="int4", quantized_matmul=name, **kw)
        o = llm.generate([prompt], sp, use_tqdm=False)[0]
        lps = np.array([next(iter(d.values())).logprob for d in o.prompt_logprobs[1:]])
        res[name] = (o.outputs[0].token_ids, lps)
        print(f"engine {name}: greedy {o.outputs[0].token_ids}", flush=True)
        del llm
    ref_toks, ref_lp = res["reference"]
    for name in ("xla-int4", "mosaic-int4"):
        toks, lp = res[name]
        d = np.abs(lp - ref_lp)
        print(f"[{dtype}, prompt {prompt_len}] {name} vs reference: prompt log-prob |diff| max {d.max():.4f} "
              f"mean {d.mean():.5f} "
              f"(argmax position {int(d.argmax())}); greedy equal {toks == ref_toks}", flush=True)


if __name__ == "__main__":
    if "--engines-only" not in sys.argv:
        per_op()
        engines()
    else:  # is it the kernel or bf16 activations? a prompt within the small kernel (100), and a bf16 model
        for dtype, n in (("float32", 100), ("bfloat16", 300), ("bfloat16", 100)):
            engines(dtype, n)
