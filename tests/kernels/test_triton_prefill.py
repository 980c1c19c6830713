"""The Triton prefill attention kernel (pallas_kernels/paged_attention/triton_prefill.py) on CPU: its body runs in
Triton's interpreter (TRITON_INTERPRET=1, set by tests/conftest.py where there is no GPU) with torch CPU tensors,
launched with the entry point's grid and constexprs (`launch_params`) on the same tiled queries (`tile_queries`)
and turned back into tokens the same way (`tiles_to_tokens`), and compared with the jnp reference
(ragged_paged_attention_reference, the spec) on the engine's packed ragged batches: prefill chunks on cached
context, decodes, lengths around a page, empty tiles; with garbage and NaN in unused page slots. The
interpreter's bf16 dot is wrong (numpy has no bf16), so the dots run with F32_DOT; the GPU form is checked by
test_triton_prefill_gpu.py."""
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from pallas_kernels.paged_attention import triton_prefill as TP
from pallas_kernels.paged_attention.kernel import tile_queries, tiles_to_tokens
from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference
from tests.kernels.paged_cases import build, cases, kernel_args, unreferenced

assert os.environ.get("TRITON_INTERPRET") == "1" or torch.cuda.is_available(), \
    "tests/conftest.py sets TRITON_INTERPRET=1 on machines without a GPU"
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU interpreter tests; the GPU runs *_gpu.py")


def _t(a):
    return torch.from_numpy(np.array(a, order="C"))                          # a writable row-major copy


def run_kernel(q, kp, vp, positions, tile_tokens, tile_seq, tile_kv_len, page_tables, *, sm_scale, block_n):
    """The kernel body in the interpreter, wrapped as the jax-triton entry point wraps it -> [T, H, D]."""
    T, H, _ = q.shape
    qt, qpos = tile_queries(q, positions, tile_tokens, kp.shape[2])
    grid, meta = TP.launch_params(qt.shape, kp.shape, page_tables.shape[1], block_n=block_n)
    o = torch.full(tuple(qt.shape), float("nan"))                             # poison: every row must be written
    TP.prefill_attention_kernel[grid](_t(qt), _t(qpos), _t(kp), _t(vp), _t(tile_seq), _t(tile_kv_len),
                                      _t(page_tables), sm_scale * TP.LOG2E, o, F32_DOT=True, **meta)
    assert not torch.isnan(o).any(), "a row of the output was left unwritten (or NaN leaked in)"
    return np.asarray(tiles_to_tokens(jnp.asarray(o.numpy()), tile_tokens, T, H))


@pytest.mark.parametrize("heads,kv_heads,head_dim,ps,query_tile,block_n", [
    (8, 2, 64, 16, 8, 16),      # GQA 4: R = 32 rows, one page a block
    (8, 2, 64, 16, 16, 32),     # R = 64, two pages a block: blocks straddle a tile's diagonal
    (4, 4, 32, 8, 16, 64),      # MHA, page 8: eight pages a block
    (8, 1, 64, 32, 8, 16),      # MQA (g = 8), a page holds two blocks
])
def test_matches_reference(heads, kv_heads, head_dim, ps, query_tile, block_n):
    rng = np.random.default_rng(heads * 100 + query_tile + block_n + ps)
    step = cases(ps) + [(3 * ps, 2 * ps + 3), (0, 5 * ps)]                   # long chunks: unmasked blocks run
    d = build(rng, step, heads, kv_heads, head_dim, ps, query_tile=query_tile, max_tokens=512)
    assert d["batch"].bucket.query_tile == query_tile
    args = kernel_args(d)
    ref = np.asarray(ragged_paged_attention_reference(*args, sm_scale=head_dim ** -0.5, kv_chunk_pages=2))
    out = run_kernel(*args, sm_scale=head_dim ** -0.5, block_n=block_n)
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)
    assert np.all(out[unreferenced(d)] == 0)


def test_garbage_in_unused_slots_never_reaches_the_output():
    """Unused pages, the padding rows and the page-table entries past a sequence hold large values, the slots past
    each sequence's end in its last page NaN: the masked loads must keep them out (scores and V rows)."""
    rng = np.random.default_rng(7)
    ps = 16
    d = build(rng, cases(ps) + [(ps + 5, 3 * ps)], 8, 2, 64, ps, query_tile=16, max_tokens=512, garbage=1e4)
    args = list(kernel_args(d))
    ref = np.asarray(ragged_paged_attention_reference(*args, sm_scale=0.125, kv_chunk_pages=2))
    kp, vp = np.array(args[1]), np.array(args[2])
    for (ctx, n), s in zip(cases(ps) + [(ps + 5, 3 * ps)], d["seqs"]):     # NaN past each sequence's end: a
        if (ctx + n) % ps:                                                   # masked score times a NaN V row is
            kp[s.page_table[-1], (ctx + n) % ps:] = np.nan                   # NaN, so those rows must not be read
            vp[s.page_table[-1], (ctx + n) % ps:] = np.nan
    kp[0], vp[0] = np.nan, np.nan                     # page 0 (padding tokens write it): where masked keys point
    args[1], args[2] = jnp.asarray(kp), jnp.asarray(vp)
    out = run_kernel(*args, sm_scale=0.125, block_n=32)
    n = d["n_tok"]
    np.testing.assert_allclose(out[:n], ref[:n], rtol=2e-5, atol=2e-5)


def test_unmasked_blocks_are_the_ones_every_row_sees():
    """A chunk of 3 blocks after 4 blocks of context: the tile rows' smallest position bounds the unmasked loop.
    Corrupting a key that only later rows may see (position > the tile's first row) must change only those rows:
    the unmasked loop must not have read it for the earlier ones."""
    rng = np.random.default_rng(11)
    ps, D = 16, 32
    d = build(rng, [(64, 48)], 4, 2, D, ps, query_tile=16, max_tokens=64)
    args = list(kernel_args(d))
    base = run_kernel(*args, sm_scale=D ** -0.5, block_n=16)
    kp = np.array(args[1])
    table = d["seqs"][0].page_table
    kp[table[70 // ps], 70 % ps] += 50.0                                      # key 70: seen by positions >= 70
    args[1] = jnp.asarray(kp)
    moved = run_kernel(*args, sm_scale=D ** -0.5, block_n=16)
    pos = np.asarray(args[3])[:48]
    changed = np.abs(moved[:48] - base[:48]).max(axis=(1, 2)) > 1e-6
    assert np.array_equal(changed, pos >= 70)


@pytest.mark.parametrize("head_dim,block_n,sm_scale,match", [
    (96, 64, 0.1, "head_dim"), (64, 48, 0.1, "block_n"), (64, 8, 0.1, "block_n"), (64, 64, float("nan"), "sm_scale"),
])
def test_bad_arguments_are_named(head_dim, block_n, sm_scale, match):
    """The entry point refuses what its block shapes cannot take before anything is compiled."""
    z = jnp.zeros((4,), jnp.int32)
    with pytest.raises(ValueError, match=match):
        TP.prefill_attention(jnp.zeros((4, 8, head_dim)), jnp.zeros((3, 16, 2, head_dim)),
                             jnp.zeros((3, 16, 2, head_dim)), z, z.reshape(1, 4), z[:1], z[:1],
                             jnp.zeros((2, 4), jnp.int32), sm_scale=sm_scale, block_n=block_n)


def test_engine_takes_the_kernel_only_in_large_prefill_buckets(monkeypatch):
    """models/attention.triton_prefill_for: opt-in, buckets above the command-buffer limit with more tokens than
    sequences, no sliding window or quantized KV, and only where the kernel can run."""
    from types import SimpleNamespace

    from jaxinfer.models import attention as A

    md = SimpleNamespace(page_tables=np.zeros((17, 8), np.int32))          # 16 sequences (+ the empty row)
    monkeypatch.setattr(TP, "usable", lambda: True)
    monkeypatch.delenv("JAXINFER_TRITON_PREFILL", raising=False)
    assert not A.triton_prefill_for(2048, md, None, {})                      # off unless asked for
    monkeypatch.setenv("JAXINFER_TRITON_PREFILL", "1")
    assert A.triton_prefill_for(2048, md, None, {})
    from jaxinfer.runner.compile_options import COMMAND_BUFFER_MAX_TOKENS
    assert A.TRITON_PREFILL_MIN_TOKENS > COMMAND_BUFFER_MAX_TOKENS
    assert not A.triton_prefill_for(COMMAND_BUFFER_MAX_TOKENS, md, None, {})  # a command-buffered bucket
    assert not A.triton_prefill_for(2048, SimpleNamespace(page_tables=np.zeros((2049, 8))), None, {})  # decodes
    assert not A.triton_prefill_for(2048, md, 128, {})
    assert not A.triton_prefill_for(2048, md, None, {"k_scales": 1})
    monkeypatch.setattr(TP, "usable", lambda: False)
    assert not A.triton_prefill_for(2048, md, None, {})


_HOPPER_COMPILE = r"""
import sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from pallas_kernels.paged_attention import triton_prefill as TP

R, BLOCK_N, warps, stages = (int(x) for x in sys.argv[1:5])
sig = {"q_ptr": "*bf16", "qpos_ptr": "*i32", "k_ptr": "*bf16", "v_ptr": "*bf16", "tile_seq_ptr": "*i32",
       "tile_kv_len_ptr": "*i32", "pt_ptr": "*i32", "qk_scale": "fp32", "o_ptr": "*bf16"}
consts = dict(W=128, KVH=8, R=R, D=128, PS=16, BLOCK_N=BLOCK_N, F32_DOT=False)
sig.update({k: "constexpr" for k in consts})
attrs = {(i,): [["tt.divisibility", 16]] for i, t in enumerate(sig.values()) if t.startswith("*")}  # as jax-triton
k = triton.compile(ASTSource(fn=TP.prefill_attention_kernel, signature=sig, constexprs=consts, attrs=attrs),
                   target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
print("ASYNC" if "async_copy" in k.asm["ttgir"] else "SYNC", "WGMMA" if "wgmma" in k.asm["ptx"] else "MMA")
"""


@pytest.mark.parametrize("rows,block_n,warps,stages", [(64, 64, 4, 2), (128, 64, 8, 3)])
def test_kernel_compiles_for_hopper_with_pipelined_loads(rows, block_n, warps, stages):
    """The real compiler (not the interpreter), for sm_90 without a GPU: the kernel must compile (the interpreter
    accepts what Triton's code generator refuses, e.g. a non-constexpr global), its K / V loads must become
    asynchronous copies (software-pipelined: 16-byte vector gathers from 16-byte aligned pages, as jax-triton
    declares its arrays), and its dots Hopper's wgmma."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root
    r = subprocess.run([sys.executable, "-c", _HOPPER_COMPILE, str(rows), str(block_n), str(warps), str(stages)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["ASYNC", "WGMMA"]
