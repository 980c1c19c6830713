"""The Triton prefill attention kernel through its JAX entry point (jax-triton) on the GPU, bf16 at the Llama-3-8B
attention shape (32 q / 8 KV heads, head_dim 128, page 16), against the jnp reference in float32 on the engine's
packed ragged batches. Run with `pytest -m gpu tests/kernels/test_triton_prefill_gpu.py` (jax-triton carried as a
wheel)."""
import jax.numpy as jnp
import numpy as np
import pytest

from pallas_kernels.paged_attention import triton_prefill as TP
from pallas_kernels.paged_attention.reference import ragged_paged_attention_reference
from tests.kernels.paged_cases import build, cases, kernel_args, rel_err, unreferenced

pytestmark = pytest.mark.gpu


def test_usable_on_gpu():
    assert TP.usable(), "triton + jax-triton + a GPU backend are needed for the Triton prefill kernel"


@pytest.mark.parametrize("query_tile,block_n,num_warps,num_stages", [
    (16, 64, 4, 2), (32, 64, 8, 3), (32, 128, 8, 2), (16, 32, 8, 2)])
def test_matches_reference_bf16(query_tile, block_n, num_warps, num_stages):
    ps = 16
    rng = np.random.default_rng(query_tile + block_n)
    step = cases(ps) + [(300, 700), (0, 1000), (37, 5)]
    d = build(rng, step, 32, 8, 128, ps, query_tile=query_tile, max_tokens=2048, max_model_len=2048)
    args32 = kernel_args(d)
    ref = np.asarray(ragged_paged_attention_reference(*args32, sm_scale=128 ** -0.5, kv_chunk_pages=8))
    out = TP.prefill_attention(*kernel_args(d, jnp.bfloat16), sm_scale=128 ** -0.5, block_n=block_n,
                               num_warps=num_warps, num_stages=num_stages)
    assert out.dtype == jnp.bfloat16
    out = np.asarray(out.astype(jnp.float32))
    n = d["n_tok"]
    assert rel_err(out[:n], ref[:n]) < 1e-2                 # bf16 inputs, probabilities and output
    assert np.all(out[unreferenced(d)] == 0)
