"""Quantized weights (int8, int4 with and without zero points, fp8 W8A8; RTN on load and a pre-quantized GPTQ
checkpoint) and quantized KV caches (int8, fp8) under tensor and data parallelism, on 8 simulated CPU devices.

Reference: the SAME quantized model on one device (plan None). Quantization is computed per output column /
per group / per token-and-head, so the sharded model holds exactly the single-device quantized values (checked
leaf by leaf, after the TP column re-layout); greedy tokens must match exactly and prompt / sampled log-probs
within 1e-4 (float32 model; only the summation order of the split matmuls differs, observed <= 5e-6).
"""
import jax
import numpy as np
import pytest

from jaxinfer.parallel import collective_bytes, make_plans, relayout_for_tp
from tests.parallel.test_tensor_parallel import _assert_same, _results
from tests.parallel.tp_cases import ENGINE_OPTIONS, save_tiny

_ENGINES: dict = {}


@pytest.fixture(scope="module")
def few_kv16_dir(tmp_path_factory):
    """8 query heads, 2 KV heads, head_dim 16: o-projection input 128, so int4 group 32 fits TP = 4 (32 rows
    per device) and the 2 KV heads are replicated over 4 devices. One layer: compilation dominates the time."""
    return save_tiny(tmp_path_factory.mktemp("gqa_8x2_hd16"), 2, num_attention_heads=8, num_key_value_heads=2,
                     head_dim=16, num_hidden_layers=1)


@pytest.fixture(scope="module")
def tied16_dir(tmp_path_factory):
    """few_kv16_dir's shape with the LM head tied to the embedding: quantized on load, it gets an int8 head of its
    own (RTN of embed.T, logical axes ("embed", "vocab") like an untied head)."""
    return save_tiny(tmp_path_factory.mktemp("tied_8x2_hd16"), 3, num_attention_heads=8, num_key_value_heads=2,
                     head_dim=16, num_hidden_layers=1, tie_word_embeddings=True)


@pytest.fixture(scope="module")
def gptq_dir(tmp_path_factory, gqa_many_kv_dir):
    """A GPTQ checkpoint (int4, group 32, zero points) of the 4-KV-head model, packed by the format's packer."""
    from tests.numerics.test_quant_formats import _gptq_checkpoint

    path, _ = _gptq_checkpoint(tmp_path_factory.mktemp("gptq_8x4"), gqa_many_kv_dir, g=32, sym=False)
    return path


@pytest.fixture(scope="module")
def build():
    def build(path, quantization=None, kv="auto", tp=1, dp=1, backend="reference"):
        from jaxinfer import LLM

        key = (path, quantization, kv, tp, dp, backend)
        if key not in _ENGINES:
            _ENGINES[key] = LLM(path, quantization=quantization, kv_cache_dtype=kv, tensor_parallel_size=tp,
                                data_parallel_size=dp, attention_backend=backend, **ENGINE_OPTIONS)
        return _ENGINES[key]

    yield build
    _ENGINES.clear()


def _leaves(llm, replica=0):
    """{(layer path..., leaf): jax.Array} of the quantized projections of replica `replica`."""
    from flax import nnx

    state = nnx.to_flat_state(nnx.state(llm.models[replica].module()))
    return {tuple(p): v[...] for p, v in state if p[-1] in ("q", "scale", "offset")}


def _check_sharded_like_single_device(one, par, replica=0, q_out_in=False):
    """Every quantized leaf of `par` equals the single-device leaf after the TP re-layout, and each device holds
    exactly its block (its addressable shard shapes are the global shape divided along the split axis).
    q_out_in: the int8 q leaves are [out, in] ('xla-nk'), like fp8's."""
    lay = par.model.layout
    tp = par.config.parallel.tensor_parallel_size
    a, b = _leaves(one), _leaves(par, replica)
    assert a.keys() == b.keys() and a
    devices = set(par.runners[replica].plan.devices)
    for path, x in a.items():
        y = b[path]
        w_path = path[:-1] + ("w",)
        want = np.asarray(x)
        if x.dtype == jax.numpy.float8_e4m3fn or (q_out_in and path[-1] == "q"):  # q [out, in]: the output axis
            want = relayout_for_tp(w_path, want.T, lay).T
        elif want.ndim:
            want = relayout_for_tp(w_path, want, lay)
        np.testing.assert_array_equal(np.asarray(y).astype(np.float32), want.astype(np.float32), err_msg=str(path))
        spec = tuple(y.sharding.spec) + (None,) * (y.ndim - len(tuple(y.sharding.spec)))
        block = tuple(d // tp if ax == "model" else d for d, ax in zip(y.shape, spec))
        assert {s.data.shape for s in y.addressable_shards} == {block}, path
        assert {s.device for s in y.addressable_shards} == devices
        if tp > 1 and path[-1] == "q":
            assert "model" in spec, f"{path} is not split: {y.sharding}"


@pytest.mark.parametrize("quant,kv,tp,dp", [
    ("int8", "int8", 4, 1),           # 2 KV heads replicated over 4 devices; int8 weights and int8 KV pages
    ("int4-g32", "fp8", 4, 1),        # int4 symmetric, groups of 32 split over the row-parallel layers
    ("fp8", "auto", 2, 2),            # fp8 W8A8 weights, two TP=2 replicas
])
def test_fewer_kv_heads_than_tp(build, few_kv16_dir, quant, kv, tp, dp):
    one = build(few_kv16_dir, quant, kv)
    par = build(few_kv16_dir, quant, kv, tp, dp)
    _assert_same(_results(par), _results(one))
    for r in range(dp):
        _check_sharded_like_single_device(one, par, r)
    if kv != "auto":  # pages and their per-token scales split by (replicated) KV head: one head per device
        k = par.runner.kv_caches[0][0]
        assert {s.data.shape for s in k.data.addressable_shards} == {(64, 16, 1, 16)}
        assert {s.data.shape for s in k.scale.addressable_shards} == {(64, 16, 1)}
        assert len({s.device for s in k.scale.addressable_shards}) == tp
    if dp > 1:
        devs = [set(d.id for d in r.plan.devices) for r in par.runners]
        assert not devs[0] & devs[1] and all(r._compiled for r in par.runners)


def test_more_kv_heads_than_tp_with_pallas_attention(build, gqa_many_kv_dir):
    """int4 with zero points, int8 KV, 4 KV heads over TP=2; the Pallas attention kernel (interpret mode on CPU)
    runs per shard on each device's int8 pages and their scales."""
    one = build(gqa_many_kv_dir, "int4-g32-asym", "int8", backend="pallas")
    par = build(gqa_many_kv_dir, "int4-g32-asym", "int8", 2, backend="pallas")
    _assert_same(_results(par), _results(one))
    _check_sharded_like_single_device(one, par)
    k = par.runner.kv_caches[0][0]
    assert {s.data.shape for s in k.data.addressable_shards} == {(64, 16, 2, 16)}
    assert {s.data.shape for s in k.scale.addressable_shards} == {(64, 16, 2)}


def test_prequantized_gptq_checkpoint_at_tp2(build, gptq_dir):
    """A GPTQ checkpoint (QuantizedTensors from the reader, not RTN) shards the same way."""
    one, par = build(gptq_dir), build(gptq_dir, tp=2)
    assert par.model.quantization.method == "int4" and not par.model.quantization.symmetric
    _assert_same(_results(par), _results(one))
    _check_sharded_like_single_device(one, par)


def test_quantized_collectives_are_the_float_ones(build, few_kv16_dir):
    """int8 weights + int8 KV at TP=4: the compiled step communicates exactly like the float model (an all-reduce
    of [T, hidden] for the embedding and per row-parallel layer, one logits all-gather): no quantized weight,
    scale or KV page is ever gathered."""
    llm = build(few_kv16_dir, "int8", "int8", 4)
    cfg, bucket = llm.model.cfg, llm.runner.ladder.buckets[0]
    step, _ = llm.runner._programs(bucket)
    f32 = 4
    assert collective_bytes(step.as_text()) == {
        "all-reduce": (1 + 2 * cfg.num_layers) * bucket.num_tokens * cfg.hidden_size * f32,
        "all-gather": bucket.num_seqs * cfg.vocab_size * f32}


@pytest.mark.parametrize("backend", ["auto", "xla-nk"])
def test_tied_int8_head_under_tp(tied16_dir, backend):
    """A tied model's int8 head at TP=2 (the [in, out] layout and 'xla-nk''s [out, in] one, the GPU default):
    built from the sharded embedding, split over the vocabulary like an untied head, equal leaf by leaf to the
    single-device model's (the head included), the same results; the step communicates like the float model
    (the embedding's and the row-parallel layers' all-reduces, one logits all-gather)."""
    from jaxinfer import LLM
    from jaxinfer.models.quant_linear import QuantLinear

    one = LLM(tied16_dir, quantization="int8", quantized_matmul=backend, **ENGINE_OPTIONS)
    par = LLM(tied16_dir, quantization="int8", quantized_matmul=backend, tensor_parallel_size=2, **ENGINE_OPTIONS)
    head = par.model.module().lm_head
    assert par.model.cfg.tie_word_embeddings and isinstance(head, QuantLinear)
    assert ("lm_head", "q") in _leaves(par)
    _assert_same(_results(par), _results(one))
    _check_sharded_like_single_device(one, par, q_out_in=backend == "xla-nk")
    cfg, bucket = par.model.cfg, par.runner.ladder.buckets[0]
    step, _ = par.runner._programs(bucket)
    assert collective_bytes(step.as_text()) == {
        "all-reduce": (1 + 2 * cfg.num_layers) * bucket.num_tokens * cfg.hidden_size * 4,
        "all-gather": bucket.num_seqs * cfg.vocab_size * 4}


def test_int4_groups_straddling_shards_is_a_clear_error():
    """tiny-llama's o-projection has 64 input rows: TP=4 leaves 16 per device, fewer than a group of 32."""
    from jaxinfer import LLM
    from jaxinfer.config import QuantizationError

    with pytest.raises(QuantizationError, match=r"layers\.0\.attn\.o: int4 group size 32 straddles tensor-parallel "
                                                r"shards: tensor_parallel_size=4 gives each device 16 of its 64 "
                                                r"input rows.*use int8 or fp8, or tensor_parallel_size in \[1, 2\]"):
        LLM("tiny-llama", load_format="dummy", quantization="int4-g32", tensor_parallel_size=4, max_model_len=64,
            num_pages=8, warmup=False, progress=False)


def test_dummy_weights_quantize_the_sharded_float_weights():
    """load_format='dummy' at TP=2: each device generates and quantizes only its block, and the result equals
    RTN of the float dummy model at the same TP (the same random values). quantized_matmul='pallas' runs the XLA
    matmul under TP (a pallas_call is not partitioned by XLA: it would gather the weights)."""
    from flax import nnx

    from jaxinfer.weights.loader import load_model, resolve_model
    from jaxinfer.weights.quantize import quantize_rtn
    from jaxinfer.config import parse_quantization

    src, plan = resolve_model("tiny-llama", "dummy"), make_plans(2)[0]
    spec = parse_quantization("int8", backend="pallas")  # the Pallas matmul is replaced by the XLA path under TP
    quant = load_model(src, progress=False, quantization=spec, plan=plan).module()
    assert quant.layers[0].attn.qkv.backend == "xla"
    flt = load_model(src, progress=False, plan=plan).module()
    for got, w in [(quant.layers[1].mlp.down, flt.layers[1].mlp.down.w), (quant.layers[0].attn.qkv,
                                                                           flt.layers[0].attn.qkv.w)]:
        want = quantize_rtn(np.asarray(w[...]), "int8")
        np.testing.assert_array_equal(np.asarray(got.q[...]), want.q)
        np.testing.assert_array_equal(np.asarray(got.scale[...]), want.scale)
        assert got.q[...].sharding.is_equivalent_to(w[...].sharding, 2)
        assert {s.data.shape[0] * s.data.shape[1] for s in got.q[...].addressable_shards} == {w[...].size // 2}


def test_orbax_float_checkpoint_quantized_at_tp4_equals_safetensors_path(few_kv16_dir, tmp_path):
    """An orbax float checkpoint (canonical layout) quantized on load at TP=4 holds the same sharded leaves as
    the safetensors checkpoint quantized on load at TP=4 (load only, nothing compiled for a step)."""
    from flax import nnx

    from jaxinfer.weights.checkpoint import save_checkpoint
    from jaxinfer.weights.loader import load_model, resolve_model
    from jaxinfer.config import parse_quantization

    src = resolve_model(few_kv16_dir)
    flt = load_model(src, progress=False)
    save_checkpoint(str(tmp_path / "orbax"), nnx.to_pure_dict(jax.tree.unflatten(flt.treedef, flt.params)),
                    src.hf_config, None)
    spec, plan = parse_quantization("int4-g32-asym"), make_plans(4)[0]
    want = load_model(src, progress=False, quantization=spec, plan=plan)
    got = load_model(resolve_model(str(tmp_path / "orbax")), progress=False, quantization=spec, plan=plan)
    assert got.source.kind == "orbax" and len(got.params) == len(want.params)
    for a, b in zip(got.params, want.params):
        assert a.sharding.is_equivalent_to(b.sharding, a.ndim)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_w8a8_under_tp(few_kv16_dir):
    """W8A8 int8 is plain XLA: it keeps its backend under TP and gives the single-device model's results (the
    per-token activation scales are computed on the whole row: column-parallel layers see all of K, row-parallel
    ones take the max over the devices' slices, which XLA's partitioner all-reduces)."""
    from jaxinfer import LLM

    one = LLM(few_kv16_dir, quantization="int8", quantized_matmul="w8a8", **ENGINE_OPTIONS)
    par = LLM(few_kv16_dir, quantization="int8", quantized_matmul="w8a8", tensor_parallel_size=2, **ENGINE_OPTIONS)
    assert par.model.module().layers[0].mlp.down.backend == "w8a8"
    _assert_same(_results(par), _results(one))
    _check_sharded_like_single_device(one, par)


def test_xla_nk_int8_under_tp(few_kv16_dir):
    """int8 in the [out, in] layout ('xla-nk'): the leaves are sharded by their swapped logical axes (as fp8's)
    and the TP=2 model gives the single-device model's results."""
    from jaxinfer import LLM

    one = LLM(few_kv16_dir, quantization="int8", quantized_matmul="xla-nk", **ENGINE_OPTIONS)
    par = LLM(few_kv16_dir, quantization="int8", quantized_matmul="xla-nk", tensor_parallel_size=2,
              **ENGINE_OPTIONS)
    down = par.model.module().layers[0].mlp.down
    assert down.backend == "xla-nk" and down.q[...].shape[0] == down.scale[...].shape[0]
    _assert_same(_results(par), _results(one))
    _check_sharded_like_single_device(one, par, q_out_in=True)


@pytest.mark.parametrize("quant,tp,dp", [("int4-g32", 2, 1), ("int4-g32-asym", 1, 2)])
def test_packed_nk_int4_under_parallelism(few_kv16_dir, quant, tp, dp):
    """int4 in the [out, in/2] layout ('triton-int4', the GPU int4 default): the leaves are sharded by their
    swapped logical axes like 'xla-nk' int8's, the TP / DP model gives the single-device model's results, and
    under TP its layers take no small-M kernel path (a pallas_call would be gathered whole onto every device)."""
    from jaxinfer import LLM
    from jaxinfer.models import quant_paths

    one = LLM(few_kv16_dir, quantization=quant, quantized_matmul="triton-int4", **ENGINE_OPTIONS)
    par = LLM(few_kv16_dir, quantization=quant, quantized_matmul="triton-int4", tensor_parallel_size=tp,
              data_parallel_size=dp, **ENGINE_OPTIONS)
    down = par.model.module().layers[0].mlp.down
    assert down.backend == "triton-int4" and down.q[...].shape[1] * 2 == down.scale[...].shape[0] * 32
    assert down.kernels == (tp == 1)
    assert quant_paths.path_for("int4", down.backend, 1, 4096, 4096, 128, down.kernels) in (
        "pallas-int4-nk" if tp == 1 and quant_paths.kernel_runs("pallas-int4-nk", 1, 4096, 4096, 128)
        else "xla-packed-nk",)
    _assert_same(_results(par), _results(one))
    for replica in range(dp):
        _check_sharded_like_single_device(one, par, replica, q_out_in=True)


@pytest.mark.parametrize("tp,dp", [(2, 1), (1, 2)])
def test_native_int4_under_parallelism_is_a_clear_error(few_kv16_dir, tp, dp):
    from jaxinfer import LLM
    from jaxinfer.config import QuantizationError

    with pytest.raises(QuantizationError, match="'xla-int4' .* does not run with tensor or data parallelism"):
        LLM(few_kv16_dir, quantization="int4-g32", quantized_matmul="xla-int4", tensor_parallel_size=tp,
            data_parallel_size=dp, **ENGINE_OPTIONS)
