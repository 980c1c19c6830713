"""Shared settings of the tensor/data-parallel tests (also used by the multi-host worker process)."""

# One bucket (16 tokens, 4 sequences) serves every step of the prompts below: one step program per engine (plus
# the bucket's prompt-logprob program). min_bucket_tokens=16: without it the CPU ladder (runner/cpu_defaults.py) adds
# 1- and 4-token buckets, and the decode steps of these two prompts compiled a second step program per engine.
ENGINE_OPTIONS = dict(max_num_seqs=4, max_num_batched_tokens=16, min_bucket_tokens=16, num_pages=64,
                      max_model_len=128, warmup=False, progress=False)
PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12]]


def save_tiny(path, seed, **shape):
    import torch
    import transformers as tf

    torch.manual_seed(seed)
    # initializer_range=0.3: peaked logits, so greedy decoding has no near-ties that rounding could flip.
    cfg = tf.LlamaConfig(**{**dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   max_position_embeddings=1024, initializer_range=0.3, bos_token_id=1,
                                   eos_token_id=2), **shape})
    tf.LlamaForCausalLM(cfg).float().eval().save_pretrained(path)
    return str(path)
