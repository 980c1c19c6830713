"""The compiled step's optimized HLO: projections are fused matmuls, elementwise work is fused, the KV cache is
updated in place (no copy of a cache-sized buffer)."""
import re

import jaxinfer


def test_step_hlo_fusions_and_in_place_cache():
    llm = jaxinfer.LLM("tiny-llama", load_format="dummy", max_model_len=256, max_num_batched_tokens=32,
                       max_num_seqs=4, num_pages=64, warmup=False, progress=False)
    cfg, runner = llm.model_config, llm.runner
    bucket = runner.ladder.buckets[0]
    step, _ = runner._programs(bucket)
    text = step.as_text()
    T, L = bucket.num_tokens, cfg.num_layers
    # 2-D matmuls over the step's T tokens: exactly 4 per layer (fused QKV, O, fused gate/up, down).
    outs = [tuple(map(int, m.split(","))) for m in re.findall(r"\w+\[([\d,]+)\]\{[\d,]*\} dot\(", text)]
    token_dots = [o for o in outs if len(o) == 2 and o[0] == T]
    assert token_dots.count((T, cfg.qkv_size)) == L, "Q/K/V are not one fused matmul per layer"
    assert token_dots.count((T, 2 * cfg.intermediate_size)) == L, "gate/up are not one fused matmul per layer"
    assert token_dots.count((T, cfg.hidden_size)) == 2 * L  # o_proj and down_proj
    assert len(token_dots) == 4 * L
    # Norms, RoPE, activations and residual adds live inside fusions, not as top-level instructions.
    entry = text[text.index("ENTRY"):]
    top_ops = set(re.findall(r"=\s*\S+\s+([\w-]+)\(", entry))
    assert not top_ops & {"multiply", "add", "rsqrt", "exponential", "logistic", "divide", "cosine", "sine"}, top_ops
    # The donated KV cache is updated in place: no top-level copy of a page-pool-sized buffer.
    pool = [runner.num_pages, runner.page_size, cfg.num_kv_heads, cfg.head_dim]
    pool_re = r"\[" + ",".join(map(str, pool)) + r"\]"
    assert not re.search(pool_re + r"\{[\d,]*\} copy\(", entry), "the KV cache is copied every step"
    # Nor is the donated penalty count table [max_num_seqs, V] (runner/penalties.py).
    table_re = r"s32\[" + f"{runner.num_penalty_slots},{cfg.vocab_size}" + r"\]"
    assert re.search(table_re, entry), "the penalty table is not a step argument"
    assert not re.search(table_re + r"\{[\d,]*\} copy\(", entry), "the penalty table is copied every step"
