"""runner/param_arena.py: the step's 1-D weights packed one buffer a dtype, unpacked inside the step."""
import numpy as np
import jax
import jax.numpy as jnp

import jaxinfer
from jaxinfer import SamplingParams
from jaxinfer.runner import param_arena
from jaxinfer.runner.model_runner import ModelRunner


def _params():
    rng = np.random.default_rng(0)
    return [jnp.asarray(rng.standard_normal(s), d) for s, d in
            [((4, 3), jnp.float32), ((5,), jnp.float32), ((2,), jnp.bfloat16), ((7,), jnp.float32),
             ((3, 3), jnp.bfloat16), ((1,), jnp.bfloat16)]]


def test_unpack_of_pack_is_the_params():
    params = _params()
    arena = param_arena.plan(params)
    assert arena.big == (0, 4) and [dt for dt, _ in arena.groups] == ["float32", "bfloat16"]
    packed = param_arena.pack(params, arena)
    assert len(packed[0]) == 2 and [a.shape for a in packed[1]] == [(12,), (3,)]
    out = jax.jit(lambda p: param_arena.unpack(p, arena))(packed)
    assert len(out) == len(params)
    for a, b in zip(out, params):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_abstract_params_give_abstract_arenas_and_nothing_to_pack_gives_none():
    params = _params()
    arena = param_arena.plan(params)
    abstract = [jax.ShapeDtypeStruct(p.shape, p.dtype) for p in params]
    big, arenas = param_arena.pack(abstract, arena)
    assert all(isinstance(a, jax.ShapeDtypeStruct) for a in arenas) and arenas[0].shape == (12,)
    assert param_arena.plan([params[0], params[1]]) is None  # one vector: nothing to gain
    assert param_arena.plan(params, [False] * len(params)) is None
    assert param_arena.pack(params[:2], None) is not None and param_arena.unpack(params[:2], None) == params[:2]


def test_engine_step_takes_the_packed_weights_and_decodes_the_same(tiny_llama_dir, monkeypatch):
    """The step program's arguments hold one buffer for the 1-D weights (5 norms of the 2-layer model -> 1), and the
    engine's greedy tokens equal those of a runner without the arena (the flat list)."""
    llm = jaxinfer.LLM(tiny_llama_dir, num_pages=64, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=4,
                       warmup=False, progress=False)
    r = llm.runner
    n_vec = sum(len(p.shape) == 1 for p in r.loaded.params)
    assert n_vec == 5 and r._arena is not None
    assert len(jax.tree.leaves(r.step_params)) == len(r.loaded.params) - n_vec + 1
    assert r.step_params is r.step_params  # packed once
    prompts = [[5, 6, 7], list(range(10, 40))]
    sp = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, sp, use_tqdm=False)]
    monkeypatch.setattr(ModelRunner, "pack_norm_scales", False)
    flat = jaxinfer.LLM(tiny_llama_dir, num_pages=64, max_model_len=256, max_num_batched_tokens=64, max_num_seqs=4,
                        warmup=False, progress=False)
    assert len(jax.tree.leaves(flat.runner.step_params)) == len(flat.runner.loaded.params)
    want = [o.outputs[0].token_ids for o in flat.generate(prompts, sp, use_tqdm=False)]
    assert got == want


def test_only_norm_scales_are_packed():
    """An int8 model's per-channel scales are 1-D too, but they feed the quantized-matmul kernels (XLA would copy
    them out of an arena): only the norms' scales are packed."""
    llm = jaxinfer.LLM(model="tiny-llama", load_format="dummy", quantization="int8", warmup=False, progress=False)
    r = llm.runner
    state = jax.tree.unflatten(r.loaded.treedef, r.loaded.params)
    paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    packed = {i for _, items in r._arena.groups for i, _, _ in items}
    assert sorted(paths[i] for i in packed) == sorted(k for k in paths if "norm']['weight']" in k)
    assert any("['scale']" in k and len(r.loaded.params[i].shape) == 1 for i, k in enumerate(paths))
