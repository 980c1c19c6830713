"""Llama-family decoder in Flax NNX: Llama 2/3.x, Mistral, Qwen2/2.5 (qkv bias), Qwen3 (q/k norm), SmolLM2.

Layers are unrolled Python modules with one array per weight (measured on the H200: `lax.scan` over stacked
layer weights ran 2.7x slower at batch 1). Q/K/V and gate/up are single fused matmuls. The fused QKV output
is grouped per KV head — [q heads of kv 0, k0, v0, q heads of kv 1, k1, v1, ...] — so tensor parallelism
can split it along KV heads without reordering.

The module is split once at load (`nnx.split`); the jitted step merges it inside the trace, so nothing is
re-flattened per step.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxinfer.config import ModelConfig
from jaxinfer.models.attention import AttentionMetadata, AttentionOptions, paged_attention
from jaxinfer.models.layers import Linear, RMSNorm, apply_rope, rope_cos_sin, rope_inv_freq


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype):
        self.cfg = cfg
        self.qkv = Linear(cfg.hidden_size, cfg.qkv_size, bias=cfg.qkv_bias, dtype=dtype, axes=("embed", "qkv"))
        self.o = Linear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, bias=cfg.o_bias, dtype=dtype,
                        axes=("heads", "embed"))
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, axis="head_dim")
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps, dtype, axis="head_dim")
        else:
            self.q_norm = self.k_norm = None

    def __call__(self, x, cos, sin, k_pages, v_pages, md: AttentionMetadata, opts: AttentionOptions):
        cfg = self.cfg
        T = x.shape[0]
        g = cfg.q_per_kv
        qkv = self.qkv(x).reshape(T, cfg.num_kv_heads, g + 2, cfg.head_dim)
        q = qkv[:, :, :g].reshape(T, cfg.num_heads, cfg.head_dim)  # [T, H, D]
        k = qkv[:, :, g]  # [T, KVH, D]
        v = qkv[:, :, g + 1]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        out, k_pages, v_pages = paged_attention(
            q, k, v, k_pages, v_pages, md, opts, sm_scale=cfg.head_dim ** -0.5, sliding_window=cfg.sliding_window)
        return self.o(out.reshape(T, cfg.num_heads * cfg.head_dim)), k_pages, v_pages


class MLP(nnx.Module):
    """SwiGLU. gate_up columns are [gate_0 up_0 | gate_1 up_1 | ...] in `blocks` blocks (1: [gate | up]), so a
    tensor-parallel device holding block i has the gate and up columns it multiplies (jaxinfer/parallel.py)."""

    def __init__(self, cfg: ModelConfig, dtype, blocks: int = 1):
        self.blocks = blocks
        self.intermediate_size = cfg.intermediate_size  # static (gate_up may be a QuantLinear without `.w`)
        self.gate_up = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False, dtype=dtype,
                              axes=("embed", "mlp"))
        self.down = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False, dtype=dtype, axes=("mlp", "embed"))

    def __call__(self, x):
        T, two_i = x.shape[0], 2 * self.intermediate_size
        y = self.gate_up(x)
        y = y.reshape(T, self.blocks, 2, two_i // (2 * self.blocks))  # [T, blocks, 2, I/blocks]
        gate, up = y[:, :, 0].reshape(T, two_i // 2), y[:, :, 1].reshape(T, two_i // 2)
        return self.down(jax.nn.silu(gate) * up)


class DecoderLayer(nnx.Module):
    # (Folding the norms into the matmuls, the per-token rsqrt on the dots' outputs, measured slower on an H100:
    # the 1B shape's batch-1 step 1.65 vs 1.53 ms; removed, benchmarks/README.md 2026-12-06 c.)

    def __init__(self, cfg: ModelConfig, dtype, mlp_blocks: int = 1):
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.attn = Attention(cfg, dtype)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        self.mlp = MLP(cfg, dtype, mlp_blocks)

    def __call__(self, x, cos, sin, k_pages, v_pages, md, opts):
        h, k_pages, v_pages = self.attn(self.attn_norm(x), cos, sin, k_pages, v_pages, md, opts)
        x = x + h
        x = x + self.mlp(self.mlp_norm(x))
        return x, k_pages, v_pages


class LlamaForCausalLM(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype=jnp.bfloat16, mlp_blocks: int = 1):
        """mlp_blocks: gate/up interleave blocks (the tensor-parallel degree; see MLP)."""
        self.cfg = cfg
        self.dtype = dtype
        self.embed = nnx.Param(jnp.zeros((cfg.vocab_size, cfg.hidden_size), dtype),
                               logical_axes=("vocab", "embed"))  # [V, H]
        self.layers = nnx.List([DecoderLayer(cfg, dtype, mlp_blocks) for _ in range(cfg.num_layers)])
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype)
        # None: the head is the embedding (tied). Quantization on load may set a QuantLinear here even then: a
        # quantized copy of embed.T (weights/quantize.py), so `lm_head is None` does not mean "untied".
        self.lm_head = None if cfg.tie_word_embeddings else Linear(
            cfg.hidden_size, cfg.vocab_size, bias=False, dtype=dtype, axes=("embed", "vocab"))  # w: [H, V]

    def __call__(self, input_ids, kv_caches, md: AttentionMetadata, opts: AttentionOptions):
        """input_ids: i32[T]; kv_caches: list of (k_pages, v_pages) per layer.

        Returns the final hidden states before the last norm, [T, H], and the updated caches.
        """
        x = self.embed[...][input_ids]  # [T, H]
        inv_freq = jnp.asarray(np.asarray(rope_inv_freq(self.cfg), np.float32))  # constant of the config
        cos, sin = rope_cos_sin(md.positions, inv_freq, x.dtype)
        new_caches = []
        for i, layer in enumerate(self.layers):
            with jax.named_scope(f"layer{i}"):
                k_pages, v_pages = kv_caches[i]
                x, k_pages, v_pages = layer(x, cos, sin, k_pages, v_pages, md, opts)
                new_caches.append((k_pages, v_pages))
        return x, new_caches

    def logits(self, hidden):
        """hidden: [N, H] (pre-norm) -> float32 logits [N, V]. The head is `lm_head` whenever there is one (for a
        tied model, a quantized copy of embed.T), else the embedding. A head of fewer than V columns (a draft's,
        cut to the first token ids: jaxinfer/weights/head_cut.py) leaves the other ids at -inf."""
        h = self.norm(hidden)
        if self.lm_head is None:
            return jnp.dot(h, self.embed[...].T, preferred_element_type=jnp.float32)
        if not isinstance(self.lm_head, Linear):  # a QuantLinear (models/quant_linear.py; weights/quantize.py)
            y = self.lm_head(h, preferred_element_type=jnp.float32)
        else:
            y = jnp.dot(h, self.lm_head.w[...], preferred_element_type=jnp.float32)
        cut = self.cfg.vocab_size - y.shape[-1]
        return y if not cut else jnp.concatenate([y, jnp.full((*y.shape[:-1], cut), -jnp.inf, y.dtype)], axis=-1)
