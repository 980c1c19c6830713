"""Peer: a plain XLA greedy decode loop (no engine) with a contiguous KV cache, on the same weights.

One jitted step per token, layers unrolled, KV cache donated — the "plain XLA" row of ANCHORS.md. It bounds
what the engine can reach with XLA alone; the engine adds paging, ragged batching, sampling and a scheduler.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np


def plain_decode_tokens_per_s(loaded, batch: int, context: int = 512, steps: int = 64) -> float:
    cfg = loaded.cfg
    m = loaded.module()
    w = {
        "embed": m.embed[...], "norm": m.norm.weight[...],
        "head": m.embed[...].T if m.lm_head is None else m.lm_head.w[...],
        "layers": [dict(an=l.attn_norm.weight[...], qkv=l.attn.qkv.w[...], o=l.attn.o.w[...],
                        mn=l.mlp_norm.weight[...], gu=l.mlp.gate_up.w[...], d=l.mlp.down.w[...])
                   for l in m.layers],
    }
    H, KVH, D, g = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.q_per_kv
    inv = jnp.asarray(1.0 / (cfg.rope_theta ** (np.arange(0, D, 2) / D)), jnp.float32)

    def rms(x, wt):
        x32 = x.astype(jnp.float32)
        return wt * (x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + cfg.rms_norm_eps)).astype(x.dtype)

    def rope(x, pos):
        f = pos.astype(jnp.float32)[:, None] * inv[None]
        cos, sin = jnp.cos(jnp.concatenate([f, f], -1)), jnp.sin(jnp.concatenate([f, f], -1))
        h = D // 2
        rot = jnp.concatenate([-x[..., h:], x[..., :h]], -1)
        return x * cos[:, None].astype(x.dtype) + rot * sin[:, None].astype(x.dtype)

    def step(w, caches, tok, pos):  # tok [B], pos [B]
        x = w["embed"][tok]
        new = []
        for lw, (kc, vc) in zip(w["layers"], caches):
            h = rms(x, lw["an"])
            qkv = (h @ lw["qkv"]).reshape(-1, KVH, g + 2, D)
            q = rope(qkv[:, :, :g].reshape(-1, H, D), pos)
            k = rope(qkv[:, :, g], pos)
            v = qkv[:, :, g + 1]
            b = jnp.arange(k.shape[0])
            kc = kc.at[b, pos].set(k)
            vc = vc.at[b, pos].set(v)
            s = jnp.einsum("bkgd,bckd->bkgc", q.reshape(-1, KVH, g, D), kc,
                           preferred_element_type=jnp.float32) * D ** -0.5
            mask = jnp.arange(kc.shape[1])[None, :] <= pos[:, None]
            s = jnp.where(mask[:, None, None], s, -1e30)
            p = jax.nn.softmax(s, -1).astype(vc.dtype)
            a = jnp.einsum("bkgc,bckd->bkgd", p, vc).reshape(-1, H * D)
            x = x + a @ lw["o"]
            gu = rms(x, lw["mn"]) @ lw["gu"]
            gt, up = jnp.split(gu, 2, -1)
            x = x + (jax.nn.silu(gt) * up) @ lw["d"]
            new.append((kc, vc))
        logits = jnp.dot(rms(x, w["norm"]), w["head"], preferred_element_type=jnp.float32)
        return new, jnp.argmax(logits, -1).astype(jnp.int32), pos + 1

    f = jax.jit(step, donate_argnums=(1,))
    shape = (batch, context, KVH, D)
    caches = [(jnp.zeros(shape, loaded.dtype), jnp.zeros(shape, loaded.dtype)) for _ in range(cfg.num_layers)]
    tok = jnp.zeros((batch,), jnp.int32)
    pos = jnp.full((batch,), context // 4, jnp.int32)
    caches, tok, pos = f(w, caches, tok, pos)
    tok.block_until_ready()
    t0 = time.perf_counter()
    for _ in range(steps):
        caches, tok, pos = f(w, caches, tok, pos)
    tok.block_until_ready()
    dt = time.perf_counter() - t0
    del caches
    return batch * steps / dt


def main():
    """Run the peer in a process of its own, before the engine takes the device memory:
        python -m benchmarks.peers.plain_xla --model llama3-8b --batch 1 16 64 256 --context 640 640 640 640
    Prints one JSON line {"batch": [...], "context": [...], "tok_s": [...]} (the last line of stdout)."""
    import argparse
    import json

    from jaxinfer.weights.loader import load_model, resolve_model

    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama3-8b")
    ap.add_argument("--load-format", default="dummy")
    ap.add_argument("--batch", type=int, nargs="+", required=True)
    ap.add_argument("--context", type=int, nargs="+", required=True, help="one per batch, or one for all")
    ap.add_argument("--steps", type=int, default=64)
    a = ap.parse_args()
    ctx = a.context * len(a.batch) if len(a.context) == 1 else a.context
    if len(ctx) != len(a.batch):
        raise SystemExit(f"--context has {len(ctx)} values for {len(a.batch)} batch sizes; give one or one each")
    loaded = load_model(resolve_model(a.model, a.load_format), progress=False)
    out = []
    for b, c in zip(a.batch, ctx):
        out.append(plain_decode_tokens_per_s(loaded, b, context=c, steps=a.steps))
        print(f"plain XLA decode: batch {b} context {c}: {out[-1]:.1f} tok/s", flush=True)
    print(json.dumps(dict(batch=a.batch, context=ctx, tok_s=out)), flush=True)


if __name__ == "__main__":
    main()
