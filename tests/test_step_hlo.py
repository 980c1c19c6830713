"""The compiled step's optimized HLO: projections are fused matmuls, elementwise work is fused, the KV cache is
updated in place (no copy of a cache-sized buffer). Checked on every bucket size class the CPU ladder has: the
one-token decode bucket (runner/cpu_defaults.py), the 4-token one and a 16-token (GPU-sized) one."""
import math
import re
import shutil

import pytest

import jaxinfer
from tests.conftest import PRODUCT_XLA_OPTIONS


@pytest.fixture(scope="module")
def llm():
    return jaxinfer.LLM("tiny-llama", load_format="dummy", max_model_len=256, max_num_batched_tokens=32,
                        max_num_seqs=4, num_pages=64, warmup=False, progress=False)


def _step_text(llm, num_tokens):
    runner = llm.runner
    bucket = runner.ladder.pick(num_tokens, 1)
    assert bucket.num_tokens == num_tokens, [b.num_tokens for b in runner.ladder.buckets]
    # The product's program: the suite compiles at -O0 without the fusion emitters (tests/conftest.py), and those
    # programs leave elementwise ops unfused.
    step = runner.compile_step(bucket, None if shutil.which("nvidia-smi") else PRODUCT_XLA_OPTIONS)
    return bucket, step.as_text()


@pytest.mark.parametrize("num_tokens", [1, 4, 16])
def test_step_hlo_fusions_and_in_place_cache(llm, num_tokens):
    cfg, runner = llm.model_config, llm.runner
    bucket, text = _step_text(llm, num_tokens)
    T, L = bucket.num_tokens, cfg.num_layers
    # 2-D matmuls over the step's T tokens: exactly 4 per layer (fused QKV, O, fused gate/up, down), besides the
    # LM head over the S sampled rows ([S, V]; S == T in the small buckets).
    outs = [tuple(map(int, m.split(","))) for m in re.findall(r"\w+\[([\d,]+)\]\{[\d,]*\} dot\(", text)]
    token_dots = [o for o in outs if len(o) == 2 and o[0] == T and o != (bucket.num_seqs, cfg.vocab_size)]
    assert token_dots.count((T, cfg.qkv_size)) == L, "Q/K/V are not one fused matmul per layer"
    assert token_dots.count((T, 2 * cfg.intermediate_size)) == L, "gate/up are not one fused matmul per layer"
    assert token_dots.count((T, cfg.hidden_size)) == 2 * L  # o_proj and down_proj
    assert len(token_dots) == 4 * L, token_dots
    # Norms, RoPE, activations and residual adds live inside fusions, not as top-level instructions.
    entry = text[text.index("ENTRY"):]
    top_ops = set(re.findall(r"=\s*\S+\s+([\w-]+)\(", entry))
    assert not top_ops & {"multiply", "add", "rsqrt", "exponential", "logistic", "divide", "cosine", "sine"}, top_ops
    # The donated KV cache is updated in place: no top-level copy of a page-pool-sized buffer, in the pool's own
    # shape nor flattened to slots (a one-row scatter became a dynamic-update-slice of the flattened pool plus a
    # select, and XLA:CPU copied the pool twice per layer; pallas_kernels/paged_attention/reference.py).
    slots = runner.num_pages * runner.page_size
    for shape in ([runner.num_pages, runner.page_size, cfg.num_kv_heads, cfg.head_dim],
                  [slots, cfg.num_kv_heads, cfg.head_dim]):
        shape_re = r"\[" + ",".join(map(str, shape)) + r"\]"
        assert not re.search(shape_re + r"\{[\d,]*\} copy\(", entry), f"the KV cache {shape} is copied every step"
    # No copy of any buffer as large as one layer's K or V pool, whatever its shape.
    pool_elems = slots * cfg.num_kv_heads * cfg.head_dim
    big = [m for m in re.findall(r"\w+\[([\d,]+)\]\{[\d,]*\} copy\(", entry)
           if math.prod(map(int, m.split(","))) >= pool_elems]
    assert not big, f"pool-sized copies every step: {big}"
    # Nor is the donated penalty count table [max_num_seqs, V] (runner/penalties.py).
    table_re = r"s32\[" + f"{runner.num_penalty_slots},{cfg.vocab_size}" + r"\]"
    assert re.search(table_re, entry), "the penalty table is not a step argument"
    assert not re.search(table_re + r"\{[\d,]*\} copy\(", entry), "the penalty table is copied every step"
