"""Random ragged paged-attention problems shared by the reference and kernel tests: sequences with cached context
on shuffled pages, this step's K/V written through write_kv_pages, metadata packed by the engine's own packer."""
import numpy as np
import jax.numpy as jnp

from jaxinfer.outputs import SeqInput
from jaxinfer.runner.batch import pack
from jaxinfer.runner.buckets import BucketLadder
from pallas_kernels.paged_attention.reference import write_kv_pages


def cases(ps):
    """(context already in the cache, new tokens this step): decodes, prefill chunks on top of cached context,
    and lengths 1, page-1, page, page+1 and long."""
    return [(0, 1), (ps - 2, 1), (0, ps - 1), (0, ps), (0, ps + 1), (ps + 3, 1), (2 * ps, ps + 5), (0, 3 * ps + 7),
            (5 * ps - 1, 1)]


def build(rng, cases, heads, kv_heads, head_dim, ps, *, num_pages=None, max_tokens=256, max_seqs=16,
           query_tile=8, max_model_len=None, garbage=None):
    """Pages with each sequence's context written, this step's K/V written through write_kv_pages, packed metadata.

    garbage: None (unused pages random normal, as a pool with stale data) or a float: unused pages, the slots of a
    sequence's last page past its length, the padding rows of q / positions and the unused page-table entries are
    filled with values of that magnitude (and the packed page-table entries past a sequence with random page ids).
    """
    need = sum(-(-(c + n) // ps) for c, n in cases)
    num_pages = num_pages or need + 8
    perm = rng.permutation(np.arange(1, num_pages))  # shuffled page tables, page 0 reserved
    shape = (num_pages, ps, kv_heads, head_dim)
    if garbage is None:
        k_pages = rng.standard_normal(shape).astype(np.float32)
        v_pages = rng.standard_normal(shape).astype(np.float32)
    else:
        k_pages = (garbage * rng.uniform(-1, 1, shape)).astype(np.float32)
        v_pages = (garbage * rng.uniform(-1, 1, shape)).astype(np.float32)
    seqs, full_k, full_v, cursor = [], [], [], 0
    for ctx, n in cases:
        total = ctx + n
        npages = -(-total // ps)
        table = perm[cursor:cursor + npages].tolist()
        cursor += npages
        kk = rng.standard_normal((total, kv_heads, head_dim)).astype(np.float32)
        vv = rng.standard_normal((total, kv_heads, head_dim)).astype(np.float32)
        for p in range(ctx):
            k_pages[table[p // ps], p % ps] = kk[p]
            v_pages[table[p // ps], p % ps] = vv[p]
        seqs.append(SeqInput(token_ids=[0] * n, start_pos=ctx, page_table=table))
        full_k.append(kk)
        full_v.append(vv)
    n_tok = sum(n for _, n in cases)
    ladder = BucketLadder.build(max_num_batched_tokens=max_tokens, max_num_seqs=max_seqs,
                                max_model_len=max_model_len or 16 * ps, page_size=ps, query_tile=query_tile,
                                kv_chunk_pages=2)
    batch = pack(seqs, ladder.pick(max(n_tok, 1), max(len(seqs), 1)), ps)
    a = dict(batch.arrays)
    T = batch.bucket.num_tokens
    q = rng.standard_normal((T, heads, head_dim)).astype(np.float32)
    k_new = np.zeros((T, kv_heads, head_dim), np.float32)
    v_new = np.zeros((T, kv_heads, head_dim), np.float32)
    for i, (ctx, n) in enumerate(cases):
        s0 = batch.token_offsets[i]
        k_new[s0:s0 + n] = full_k[i][ctx:]
        v_new[s0:s0 + n] = full_v[i][ctx:]
    if garbage is not None:
        q[n_tok:] = garbage * rng.uniform(-1, 1, q[n_tok:].shape)
        a["positions"] = a["positions"].copy()
        a["positions"][n_tok:] = rng.integers(0, 8 * ps, T - n_tok)
        pt = a["page_tables"].copy()
        for i, s in enumerate(seqs):  # entries past each sequence's pages: other sequences' pages
            pt[i, len(s.page_table):] = rng.integers(0, num_pages, pt.shape[1] - len(s.page_table))
        a["page_tables"] = pt
    kp, vp = write_kv_pages(jnp.asarray(k_pages), jnp.asarray(v_pages), k_new, v_new, a["slot_mapping"])
    if garbage is not None:
        # Padding tokens wrote page 0; re-poison it and the slots past each sequence's end in its last page.
        kp, vp = np.array(kp), np.array(vp)
        kp[0] = garbage * rng.uniform(-1, 1, kp[0].shape)
        vp[0] = garbage * rng.uniform(-1, 1, vp[0].shape)
        for (ctx, n), s in zip(cases, seqs):
            end = ctx + n
            if end % ps:
                kp[s.page_table[-1], end % ps:] = garbage
                vp[s.page_table[-1], end % ps:] = -garbage
        kp, vp = jnp.asarray(kp), jnp.asarray(vp)
    return dict(q=jnp.asarray(q), kp=kp, vp=vp, a=a, batch=batch, n_tok=n_tok, seqs=seqs, full_k=full_k,
                full_v=full_v, k_before=k_pages)


def kernel_args(d, dtype=jnp.float32):
    """The positional arguments of ragged_paged_attention(_reference) for a `build` result, in `dtype`."""
    a = d["a"]
    return (d["q"].astype(dtype), d["kp"].astype(dtype), d["vp"].astype(dtype), jnp.asarray(a["positions"]),
            jnp.asarray(a["tile_tokens"]), jnp.asarray(a["tile_seq"]), jnp.asarray(a["tile_kv_len"]),
            jnp.asarray(a["page_tables"]))


def unreferenced(d):
    """bool[T]: the step's token rows no query tile references (padding: their output must be zero)."""
    T = d["batch"].bucket.num_tokens
    ref = np.zeros(T + 1, bool)
    ref[d["a"]["tile_tokens"].reshape(-1)] = True
    return ~ref[:T]


def rel_err(x, y):
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    return float(np.linalg.norm(x - y) / np.linalg.norm(y))
