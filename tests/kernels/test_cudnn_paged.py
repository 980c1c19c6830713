"""cuDNN paged attention (pallas_kernels/paged_attention/cudnn_paged.py) against the jnp reference.

CPU: the wrapper's algebra (one batch row a token with its H query heads on the KV heads (GQA), KV length =
position + 1, each token's sequence's page table, padding tokens) with a jnp stand-in for the cuDNN call that
implements its contract with a dense softmax, independent of the reference's online-softmax loop. GPU (`pytest
-m gpu`): the real cuDNN call at the 8B attention shape, decode and mixed steps, against the reference.
"""
from types import SimpleNamespace

import numpy as np
import pytest
import jax
import jax.numpy as jnp

from pallas_kernels.paged_attention.cudnn_paged import cudnn_paged_attention
from pallas_kernels.paged_attention.cudnn_prefill_forms import cudnn_sequence_attention, cudnn_tile_attention
from pallas_kernels.paged_attention.kernel import ragged_paged_attention
from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference
from tests.kernels.paged_cases import build, cases, kernel_args, rel_err, unreferenced


@pytest.fixture(autouse=True)
def _float32_matmuls():
    """IEEE float32 dots in the references and stand-ins: on the GPU XLA's default for float32 dots is TF32, ~1e-3
    off (an H100 run failed the 2e-5 bounds below at 1.3e-3, 12-06), which would hide the algebra these check."""
    with jax.default_matmul_precision("highest"):
        yield


def dense_sdpa(q, k_pages, v_pages, q_len, kv_len, table, *, scale, causal=False, return_lse=False):
    """cuDNN's paged contract in plain jnp, dense softmax: q [B, L, H, D]; row b's keys are its table's pages in
    order; key j is visible to query i when j < kv_len[b] (and, causal, j <= kv_len[b] - q_len[b] + i);
    return_lse: also the log-sum-exp of each row's visible scaled scores, [B, H, L]."""
    B, L, H, D = q.shape
    kvh = k_pages.shape[2]
    if table is None:                                                       # dense K / V [B, S, kvh, D]
        k, v = k_pages, v_pages
    else:
        pages = table[:, 0, :, 0]                                           # [B, W]
        k = k_pages[pages].reshape(B, -1, kvh, D)                            # [B, S, kvh, D]
        v = v_pages[pages].reshape(B, -1, kvh, D)
    k, v = jnp.repeat(k, H // kvh, axis=2), jnp.repeat(v, H // kvh, axis=2)
    s = jnp.einsum("blhd,bshd->bhls", q, k, precision="highest") * scale
    j, i = jnp.arange(k.shape[1]), jnp.arange(L)
    vis = j[None, None, :] < kv_len[:, None, None]
    if causal:
        vis &= j[None, None, :] <= (kv_len - q_len)[:, None, None] + i[None, :, None]
    s = jnp.where(vis[:, None], s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    out = jnp.einsum("bhls,bshd->blhd", jnp.nan_to_num(p), v, precision="highest")
    return (out, jax.nn.logsumexp(s, axis=-1)) if return_lse else out


IMPLS = {"rows": cudnn_paged_attention, "tiles": cudnn_tile_attention}


@pytest.mark.parametrize("impl", ["rows", "tiles"])
@pytest.mark.parametrize("heads,kv_heads,ps,query_tile", [(8, 2, 16, 8), (4, 4, 16, 4), (8, 1, 32, 16),
                                                           (8, 2, 16, 16)])
def test_token_and_tile_rows_match_reference(impl, heads, kv_heads, ps, query_tile):
    """Prefill chunks after cached context, fresh prompts and decodes in one step, with empty tiles and padding
    tokens, through one cuDNN row a token (correct for any mix; the engine uses it for decode-shaped buckets) and
    one row a query tile (cudnn_tile_attention: the context part, the tile part alone for fresh prompts, merged)."""
    d = build(np.random.default_rng(heads + ps + query_tile), cases(ps), heads, kv_heads, 32, ps,
              query_tile=query_tile)
    assert d["batch"].bucket.num_tiles > int((d["a"]["tile_kv_len"] > 0).sum())  # some tiles are empty
    args = kernel_args(d)
    ref = np.asarray(ragged_paged_attention_reference(*args, sm_scale=32 ** -0.5, kv_chunk_pages=2))
    out = np.asarray(IMPLS[impl](*args, sm_scale=32 ** -0.5, sdpa=dense_sdpa))
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)
    assert np.all(out[unreferenced(d)] == 0)


def test_decode_step_of_one_token_tiles():
    """A decode step in one-token tiles (query_tile 1; every row a sequence) matches the reference too."""
    ps = 16
    steps = [(c, 1) for c in (0, 5, 15, 16, 40, 100)]
    d = build(np.random.default_rng(5), steps, 8, 2, 32, ps, query_tile=1, max_seqs=8, max_tokens=8)
    args = kernel_args(d)
    ref = np.asarray(ragged_paged_attention_reference(*args, sm_scale=0.2, kv_chunk_pages=2))
    out = np.asarray(cudnn_paged_attention(*args, sm_scale=0.2, sdpa=dense_sdpa))
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("impl", ["rows", "tiles"])
def test_garbage_in_padding_and_unused_pages(impl):
    """Large values in unused pages, page 0, each last page's tail, unused table entries and the padding rows of
    q / positions: referenced rows match the reference, padding rows come back zero."""
    d = build(np.random.default_rng(3), cases(16)[1:], 8, 2, 32, 16, garbage=1e4)
    args = kernel_args(d)
    ref = np.asarray(ragged_paged_attention_reference(*args, sm_scale=0.2, kv_chunk_pages=2))
    out = np.asarray(IMPLS[impl](*args, sm_scale=0.2, sdpa=dense_sdpa))
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-5)
    unref = unreferenced(d)
    assert unref.sum() > 0 and np.all(out[unref] == 0)


def test_a_key_past_the_position_would_be_caught():
    """The test can fail: a stand-in that lets each row see one key past its KV length (position + 1) differs from
    the reference."""
    def one_more(q, kp, vp, q_len, kv_len, table, *, scale, causal=False):
        return dense_sdpa(q, kp, vp, q_len, kv_len + 1, table, scale=scale, causal=causal)
    d = build(np.random.default_rng(9), cases(16), 8, 2, 32, 16)
    args = kernel_args(d)
    ref = np.asarray(ragged_paged_attention_reference(*args, sm_scale=0.2, kv_chunk_pages=2))
    out = np.asarray(cudnn_paged_attention(*args, sm_scale=0.2, sdpa=one_more))
    assert rel_err(out[:d["n_tok"]], ref[:d["n_tok"]]) > 0.05


# ---- prefill-shaped buckets: one cuDNN row a query tile, the tile's own keys in jnp, merged by log-sum-exp --------
@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the GPU runs the real call (test_gpu_cudnn_...)")
@pytest.mark.parametrize("query_tile", [16, 64])
def test_tile_form_lowers_for_cuda_with_its_lse(monkeypatch, query_tile):
    """On the CPU, lowered for CUDA (cuDNN's version stood in for): this jax takes the tile form's paged call with
    return_residual, one fused-attention custom call whose second result is the f32 [tiles, heads, rows] log-sum-exp
    the merge reads (folded: 8 KV heads x 64 rows at 16-token tiles; 64-token tiles: 32 heads x 64 rows)."""
    import re

    from jax._src.cudnn import fused_attention_stablehlo as fa

    monkeypatch.setattr(fa, "check_cudnn_version", lambda: 91900)
    d = build(np.random.default_rng(2), [(0, 100), (40, 30), (7, 1)], 32, 8, 128, 16, max_tokens=256,
              query_tile=query_tile)
    args = kernel_args(d, jnp.bfloat16)
    text = jax.jit(lambda *a: cudnn_tile_attention(*a, sm_scale=0.1)).trace(*args).lower(
        lowering_platforms=("cuda",)).as_text()
    calls = [line for line in text.splitlines() if "custom_call @__cudnn$fmha" in line]
    config = calls[0].replace("\\22", '"') if len(calls) == 1 else ""       # (the backend config's quotes: \22)
    assert '"is_paged_attention": true' in config, calls
    NT = d["batch"].bucket.num_tiles
    heads, rows = (8, query_tile * 4) if query_tile * 4 <= 64 else (32, query_tile)   # folded or cuDNN's GQA
    assert re.search(rf"tensor<{NT}x{heads}x{rows}xf32>", calls[0]), calls[0][-400:]


@pytest.mark.parametrize("flaw", ["context_key_short", "lse_off"])
def test_tile_merge_would_be_caught(flaw):
    """The test can fail: a context part that misses the last cached key, or whose log-sum-exp is off by log 2
    (the merge weighting the parts wrongly), differs from the reference."""
    def flawed(q, kp, vp, q_len, kv_len, table, *, scale, causal=False, return_lse=False):
        if flaw == "context_key_short":
            return dense_sdpa(q, kp, vp, q_len, jnp.maximum(kv_len - 1, 1), table, scale=scale,
                              return_lse=return_lse)
        out, lse = dense_sdpa(q, kp, vp, q_len, kv_len, table, scale=scale, return_lse=True)
        return out, lse + jnp.log(2.0)
    d = build(np.random.default_rng(17), cases(16), 8, 2, 32, 16, query_tile=8)
    args = kernel_args(d)
    ref = np.asarray(ragged_paged_attention_reference(*args, sm_scale=0.2, kv_chunk_pages=2))
    out = np.asarray(cudnn_tile_attention(*args, sm_scale=0.2, sdpa=flawed))
    assert rel_err(out[:d["n_tok"]], ref[:d["n_tok"]]) > 1e-3


def sequence_rows(d, case_list, L):
    """The sequence form's rows of a built step: one row a sequence (its tokens' flat indices, T past its chunk),
    its page-table row, its cached context; one more all-empty row."""
    T = d["batch"].bucket.num_tokens
    rows = np.full((len(case_list) + 1, L), T, np.int32)
    for i, (ctx, n) in enumerate(case_list):
        s0 = d["batch"].token_offsets[i]
        rows[i, :n] = np.arange(s0, s0 + n)
    seq = np.arange(len(case_list) + 1, dtype=np.int32)
    p0 = np.array([c for c, _ in case_list] + [0], np.int32)
    return jnp.asarray(rows), jnp.asarray(seq), jnp.asarray(p0)


def sequence_form(args, rows, sm_scale, sdpa=None):
    """cudnn_sequence_attention on kernel_args' arguments and sequence_rows' rows (sdpa None: the real cuDNN)."""
    q, kp, vp, positions, tile_tokens, tile_seq, tile_kv_len, page_tables = args
    kw = {} if sdpa is None else dict(sdpa=sdpa)
    return cudnn_sequence_attention(q, kp, vp, *rows, page_tables, sm_scale=sm_scale, **kw)


@pytest.mark.parametrize("flaw", [None, "context_key_short", "lse_off"])
def test_sequence_form_matches_reference(flaw):
    """One cuDNN row a sequence's chunk (context part paged without a mask, chunk part dense and causal, merged):
    the reference on prefill chunks after context, fresh prompts and decodes; the flawed stand-ins (a context short
    of its last key, a log-sum-exp off by log 2) are caught."""
    def sdpa(q, kp, vp, q_len, kv_len, table, *, scale, causal=False, return_lse=False):
        if flaw == "context_key_short" and table is not None:
            kv_len = jnp.maximum(kv_len - 1, 1)
        out, lse = dense_sdpa(q, kp, vp, q_len, kv_len, table, scale=scale, causal=causal, return_lse=True)
        return out, (lse + jnp.log(2.0) if flaw == "lse_off" and table is not None else lse)
    case_list = cases(16)
    d = build(np.random.default_rng(23), case_list, 8, 2, 32, 16, query_tile=8, garbage=3.0)
    args = kernel_args(d)
    rows = sequence_rows(d, case_list, 64)
    ref = np.asarray(ragged_paged_attention_reference(*args, sm_scale=0.2, kv_chunk_pages=2))
    out = np.asarray(sequence_form(args, rows, 0.2, sdpa))
    n = d["n_tok"]
    if flaw is None:
        assert rel_err(out[:n], ref[:n]) < 2e-5
        assert np.all(out[n:] == 0)
    else:
        assert rel_err(out[:n], ref[:n]) > 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(jax.default_backend() != "gpu", reason="needs a GPU")
@pytest.mark.parametrize("kind,query_tile", [("decode", 16), ("mixed", 16), ("tiles", 16), ("tiles", 64),
                                             ("seq", 16)])
def test_gpu_cudnn_matches_reference(kind, query_tile):
    """The real cuDNN call at 32 q heads / 8 KV heads / D 128, page 16, bf16: one row a token on decode and mixed
    steps; the tile form (cudnn_tile_attention, cuDNN's log-sum-exp) on prefill chunks after context, fresh
    prompts and decodes; the sequence form (cudnn_sequence_attention) on the mixed step."""
    ps, H, KVH, D = 16, 32, 8, 128
    rng = np.random.default_rng(11)
    if kind == "decode":
        steps = [(int(c), 1) for c in [0, 14, 15, 16, 17, 100, 511, 1024, 2000] + rng.integers(1, 2000, 10).tolist()]
        max_tokens = 64
    else:
        steps = [(0, 37), (300, 100), (1000, 16), (31, 50), (0, 1), (900, 1), (1999, 1), (64, 200)]
        steps, max_tokens = (steps + [(0, 300)], 1024) if kind == "tiles" else (steps, 512)
    d = build(rng, steps, H, KVH, D, ps, max_tokens=max_tokens, max_seqs=32, query_tile=query_tile,
              max_model_len=4096)
    args = kernel_args(d, jnp.bfloat16)
    n = d["n_tok"]
    with jax.default_matmul_precision("highest"):
        ref = np.asarray(ragged_paged_attention_reference(*args, sm_scale=D ** -0.5, kv_chunk_pages=16), np.float32)
    if kind == "seq":   # the sequence form: one row a sequence's chunk
        rows = sequence_rows(d, steps, 256)
        out = np.asarray(jax.jit(lambda *a: sequence_form(a, rows, D ** -0.5))(*args), np.float32)
    else:
        impl = IMPLS["tiles" if kind == "tiles" else "rows"]
        out = np.asarray(jax.jit(lambda *a: impl(*a, sm_scale=D ** -0.5))(*args), np.float32)
    assert rel_err(out[:n], ref[:n]) < 1e-2
    assert np.all(out[unreferenced(d)] == 0)


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the CPU's error")
def test_engine_option_on_cpu_says_what_to_use():
    import jaxinfer
    with pytest.raises(ValueError, match="attention_backend='cudnn' needs a CUDA GPU.*use attention_backend='auto'"):
        jaxinfer.LLM(model="tiny-llama", load_format="dummy", attention_backend="cudnn", warmup=False,
                     progress=False)


def test_this_jax_takes_our_call_to_its_private_cudnn_attention():
    """cudnn_paged.available() reads the private function's signature (the 'auto' backend asks it before choosing
    cuDNN): on this jax the call cudnn_sdpa makes must still fit, else the GPU would silently lose the backend."""
    from pallas_kernels.paged_attention import cudnn_paged
    assert cudnn_paged.available()


@pytest.mark.skipif(jax.default_backend() == "gpu", reason="the CPU's choice")
def test_auto_backend_is_the_reference_off_the_gpu(monkeypatch):
    from jaxinfer.config import EngineConfig
    from jaxinfer.runner import attention_backend
    monkeypatch.setattr(attention_backend, "AUTO_CUDNN", True)
    assert attention_backend.auto_attention_backend(None, EngineConfig()) == "reference"


def _attention_and_reference(d, opts):
    """models/attention.paged_attention on a built step (its K / V already in the pages: no slot written) under
    `opts`, and the reference on the same step: (out, ref), both [T, H, D]."""
    from jaxinfer.models import attention as attn
    a, D = d["a"], d["q"].shape[-1]
    md = attn.AttentionMetadata(*(jnp.asarray(a[n]) for n in ("positions", "slot_mapping", "tile_tokens",
                                                             "tile_seq", "tile_kv_len", "page_tables")))
    T, KVH = d["q"].shape[0], d["kp"].shape[2]
    zeros = jnp.zeros((T, KVH, D), jnp.float32)
    slotless = md._replace(slot_mapping=jnp.full((T,), -1, jnp.int32))
    out, _, _ = attn.paged_attention(d["q"], zeros, zeros, d["kp"], d["vp"], slotless, opts, sm_scale=D ** -0.5)
    return out, ragged_paged_attention_reference(*kernel_args(d), sm_scale=D ** -0.5, kv_chunk_pages=2)


@pytest.mark.parametrize("decode_shaped,below_min", [(True, False), (True, True), (False, False)])
def test_engine_attention_picks_cudnn_for_decode_shaped_buckets(monkeypatch, decode_shaped, below_min):
    """models/attention.py with backend 'cudnn': buckets of no more tokens than sequences and at least
    cudnn_min_tokens go through cuDNN (here its stand-in), the others (prefill-shaped, or below the minimum: 'auto'
    keeps small buckets on the Pallas kernel) through the Pallas kernel (interpret mode on CPU); both match the
    reference."""
    from jaxinfer.models import attention as attn

    calls = []

    def standin(*a, **kw):
        calls.append(a[0].shape[0])
        return cudnn_paged_attention(*a, **kw, sdpa=dense_sdpa)
    monkeypatch.setattr(attn, "cudnn_paged_attention", standin)
    ps, H, KVH, D = 16, 8, 2, 32
    steps = [(c, 1) for c in (0, 5, 17, 40)] if decode_shaped else cases(ps)
    d = build(np.random.default_rng(4), steps, H, KVH, D, ps, max_seqs=16, max_tokens=64 if decode_shaped else 256,
              query_tile=4)
    T, S = d["batch"].bucket.num_tokens, d["batch"].bucket.num_seqs
    assert (T <= S) == decode_shaped, d["batch"].bucket
    opts = attn.AttentionOptions(2, False, "cudnn", interpret=True, cudnn_min_tokens=T + 1 if below_min else T)
    out, ref = _attention_and_reference(d, opts)
    np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=2e-5, atol=2e-5)
    assert calls == ([T] if decode_shaped and not below_min else [])


MIXED = [(0, 1), (5, 1), (3, 5), (17, 1), (20, 3), (40, 1)]  # decodes beside a prompt chunk and a verification


def _mixed_step(rng, H=8, KVH=2, D=32, ps=16):
    d = build(rng, MIXED, H, KVH, D, ps, max_seqs=16, max_tokens=64, query_tile=4)
    assert d["batch"].bucket.num_tokens <= d["batch"].bucket.num_seqs, d["batch"].bucket  # decode-shaped bucket
    return d


@pytest.mark.parametrize("step", ["mixed", "prefill"])
def test_cudnn_backend_matches_the_reference_on_mixed_steps(monkeypatch, step):
    """Decodes beside a prompt chunk and a verification: in a decode-shaped bucket whole through cuDNN (its
    stand-in, one row a token); in a prefill-shaped bucket (more tokens than sequences) through the Pallas kernel
    (interpret mode) alone, every tile as given. Both match the reference."""
    from jaxinfer.models import attention as attn

    calls = []

    def whole(*a, **kw):
        calls.append(("whole", a[0].shape[0]))
        return cudnn_paged_attention(*a, **kw, sdpa=dense_sdpa)
    kernel_kv_lens = []

    def kernel(*a, **kw):  # the Pallas kernel, recording which tiles it reads
        kernel_kv_lens.append(np.asarray(a[6]))
        return ragged_paged_attention(*a, **kw)
    monkeypatch.setattr(attn, "cudnn_paged_attention", whole)
    monkeypatch.setattr(attn, "ragged_paged_attention", kernel)
    D, KVH, ps = 32, 2, 16
    steps = MIXED if step == "mixed" else cases(ps)
    d = (_mixed_step(np.random.default_rng(6), KVH=KVH, D=D) if step == "mixed" else
         build(np.random.default_rng(7), steps, 8, KVH, D, ps, max_seqs=16, max_tokens=256, query_tile=4))
    a, T, S = d["a"], d["batch"].bucket.num_tokens, d["batch"].bucket.num_seqs
    assert (T > S) == (step == "prefill"), d["batch"].bucket
    out, ref = _attention_and_reference(d, attn.AttentionOptions(2, False, "cudnn", interpret=True))
    n = sum(n for _, n in steps)
    np.testing.assert_allclose(np.asarray(out)[:n], np.asarray(ref)[:n], rtol=2e-5, atol=2e-5)
    decodes = sum(m == 1 for _, m in steps)
    assert decodes >= 3 and n > decodes  # decodes beside prompt tokens
    assert calls == ([("whole", T)] if step == "mixed" else [])
    if step == "prefill":
        (kv_len,) = kernel_kv_lens
        np.testing.assert_array_equal(kv_len, a["tile_kv_len"])


@pytest.mark.parametrize("backend,speculative,expected", [
    ("auto", False, ("cudnn", 16)), ("auto", True, ("pallas", 16)), ("cudnn", True, ("cudnn", 1)),
    ("pallas", False, ("pallas", 1))])
def test_auto_attention_policy_on_a_gpu(monkeypatch, backend, speculative, expected):
    """What runner/attention_backend.py chooses on a GPU (the device and jax's private cuDNN call stood in for): 'auto'
    takes cuDNN without speculation (verification rows would re-read their KV per token) and only in buckets of >= 16
    tokens; an explicit backend is kept, an explicit 'cudnn' in every decode-shaped bucket."""
    from jaxinfer.config import EngineConfig, KernelConfig, SpeculativeConfig
    from jaxinfer.runner import attention_backend
    monkeypatch.setattr(attention_backend.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(attention_backend.cudnn_paged, "available", lambda: True)
    monkeypatch.setattr(attention_backend.cudnn_paged, "runtime_problem", lambda head_dim: None)
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=4) if speculative else None
    config = EngineConfig(kernels=KernelConfig(attention_backend=backend), speculative=spec)
    loaded = SimpleNamespace(cfg=SimpleNamespace(sliding_window=None, head_dim=128), dtype=jnp.bfloat16)  # (read)
    assert (attention_backend.resolve(loaded, config), attention_backend.cudnn_min_tokens(config)) == expected


def test_an_old_cudnn_keeps_auto_on_the_kernel_and_explicit_cudnn_names_it(monkeypatch):
    """A GPU whose cuDNN cannot take the paged call: 'auto' stays on the Pallas kernel (start-up must not fail
    where it would work), an explicit 'cudnn' is a ValueError naming the problem and attention_backend='pallas'."""
    from jaxinfer.config import EngineConfig, KernelConfig
    from jaxinfer.runner import attention_backend
    from pallas_kernels.paged_attention import cudnn_paged
    monkeypatch.setattr(attention_backend.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(attention_backend.cudnn_paged, "available", lambda: True)
    real = cudnn_paged.runtime_problem
    monkeypatch.setattr(cudnn_paged, "runtime_problem", lambda head_dim: real(head_dim, 90400, "9.0"))
    loaded = SimpleNamespace(cfg=SimpleNamespace(sliding_window=None, head_dim=128), dtype=jnp.bfloat16)
    assert attention_backend.resolve(loaded, EngineConfig()) == "pallas"
    with pytest.raises(ValueError, match=r"90400.*attention_backend='pallas'"):
        attention_backend.resolve(loaded, EngineConfig(kernels=KernelConfig(attention_backend="cudnn")))


@pytest.mark.parametrize("page_size,head_dim,itemsize,fits", [
    (16, 128, 2, True), (64, 128, 2, True), (128, 128, 2, True), (256, 128, 2, False), (512, 128, 2, False),
    (64, 128, 4, True), (128, 128, 4, False), (64, 256, 2, True), (128, 256, 2, False), (256, 128, 1, True)])
def test_kernel_page_problem_bounds(page_size, head_dim, itemsize, fits):
    """Pages the Pallas kernel can take (a page of one KV head <= 32 KiB: 128 bf16 keys of D 128 are seen to
    compile, 128 float32 keys cannot launch, kernel.py), and an error naming page_size and a size that fits."""
    from jaxinfer.runner.attention_backend import kernel_page_problem
    got = kernel_page_problem(page_size, head_dim, itemsize)
    assert (got is None) == fits, got
    if not fits:
        largest = int(got.split("use page_size <= ")[1].split()[0])
        assert f"page_size={page_size}" in got and kernel_page_problem(largest, head_dim, itemsize) is None
        assert kernel_page_problem(2 * largest, head_dim, itemsize) is not None


@pytest.mark.parametrize("backend", ["auto", "pallas", "cudnn"])
def test_pages_too_large_for_the_gpu_kernel_fail_at_build_with_the_fix(monkeypatch, backend):
    """On a GPU (stood in for), page_size 256 of a bf16 D-128 model fails when the runner resolves its backend, with
    the fix (page_size <= 128), not when the step compiles (RESOURCE_EXHAUSTED from Triton); an fp8 KV cache (one
    byte an element) takes it; on the CPU (the jnp reference) any page size works."""
    from jaxinfer.config import CacheConfig, EngineConfig, KernelConfig
    from jaxinfer.runner import attention_backend
    loaded = SimpleNamespace(cfg=SimpleNamespace(sliding_window=None, head_dim=128), dtype=jnp.bfloat16)  # (read)
    config = EngineConfig(kernels=KernelConfig(attention_backend=backend), cache=CacheConfig(page_size=256))
    if backend != "cudnn":  # (CPU: 'auto' is the reference; an explicit 'pallas' runs interpreted)
        assert attention_backend.resolve(loaded, config) == ("reference" if backend == "auto" else "pallas")
    monkeypatch.setattr(attention_backend.jax, "default_backend", lambda: "gpu")
    monkeypatch.setattr(attention_backend.cudnn_paged, "available", lambda: True)
    monkeypatch.setattr(attention_backend.cudnn_paged, "runtime_problem", lambda head_dim: None)
    with pytest.raises(ValueError, match=r"page_size=256 .*use page_size <= 128"):
        attention_backend.resolve(loaded, config)
    assert attention_backend.resolve(loaded, config.replace(page_size=128)) in ("cudnn", "pallas")
    fp8 = config.replace(kv_cache_dtype="fp8")
    if backend == "cudnn":  # (cuDNN takes no quantized KV: its own error first)
        with pytest.raises(ValueError, match="bf16 / fp16 KV pages"):
            attention_backend.resolve(loaded, fp8)
    else:
        assert attention_backend.resolve(loaded, fp8) == "pallas"


@pytest.mark.parametrize("version,cc,head_dim,problem", [
    (91000, "9.0", 128, None), (90500, "8.0", 64, None), (90400, "9.0", 128, "9.5"), (91000, "7.5", 128, "SM 8.0"),
    (91000, "9.0", 256, "head dim 256")])
def test_cudnn_runtime_problem(version, cc, head_dim, problem):
    from pallas_kernels.paged_attention import cudnn_paged
    got = cudnn_paged.runtime_problem(head_dim, version, cc)
    assert (got is None) if problem is None else (problem in got), got


def test_cudnn_runtime_problem_without_cudnn():
    """On this machine's CPU jax there is no cuDNN: a problem, not an exception."""
    from pallas_kernels.paged_attention import cudnn_paged
    if jax.default_backend() == "gpu":
        pytest.skip("the CPU's answer")
    assert cudnn_paged.runtime_problem(128) is not None
