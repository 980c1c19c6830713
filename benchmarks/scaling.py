"""Tensor-parallel scaling: batch-1 decode latency and offline throughput for TP = 1, 2, 4, 8 on 8B- and
70B-shaped dummy models, plus the communication volume per step read from the compiled, partitioned step.

  # GPU host (1, 2, 4 or 8 H200s): every TP degree that fits the visible GPUs; writes results/scaling-*.json
  python benchmarks/scaling.py
  # CPU, 8 simulated devices: communication volume only (what the shardings make XLA send), no timing
  python benchmarks/scaling.py --comm-only

Measured per (model, TP): load + first-compile time, batch-1 decode tok/s (prompt 128, 128 new tokens, greedy,
ignore_eos) and offline throughput (64 requests of 256 prompt + 128 new tokens in one continuous batch). Configs
that cannot fit (weights > 85% of the TP devices' memory) are recorded as skipped. `--layers-70b` shortens the
70B shape (default 20 of 80 layers: all per-layer work and communication identical, compile 4x shorter) so the
default run finishes in < 8 minutes on a 1- or 2-GPU machine; the JSON records the layer count used.

Communication volume (`--comm-only`; a CPU run does only this): the step of a decode bucket of 16 sequences is
compiled with 1 and with 2 layers from abstract, sharded weights (no memory needed, so it runs for every TP on
8 simulated CPU devices); the difference is what one layer adds, the rest is the embedding all-reduce and the
logit gather. Expected (Megatron): per layer per token 2 x hidden x 2 bytes (bf16) all-reduced.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

_HLO_DUMP = None
if "--comm-only" in sys.argv:
    # 8 simulated CPU devices, and the HLO right after SPMD partitioning dumped: the collectives there are
    # backend independent (the CPU backend later widens bf16 all-reduces to f32; GPUs keep bf16).
    import tempfile

    _HLO_DUMP = tempfile.mkdtemp(prefix="jaxinfer-spmd-")
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
        flags += " --xla_force_host_platform_device_count=8"
    os.environ["XLA_FLAGS"] = f"{flags} --xla_dump_to={_HLO_DUMP} --xla_dump_hlo_pass_re=spmd-partitioning".strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import RESULTS_DIR, device_name, git_commit  # noqa: E402

MODELS = ("llama3-8b", "llama3-70b")
NOTES = ("comm_volume: collectives of the decode step (16 sequences, bf16 weights) read from the HLO right after "
         "XLA's SPMD partitioning, compiled on 8 simulated CPU devices from abstract sharded weights; bytes are "
         "per device (the result size of each collective). per_layer = step(2 layers) - step(1 layer). "
         "timed: dummy weights, greedy, ignore_eos; the 70B shape may run with fewer layers (see 'layers').")
COMM_BATCH = 16  # decode bucket of the communication-volume compile: 16 sequences, 16 tokens


# ---- communication volume from the compiled step --------------------------------------------------------------

def _abstract_model(hf: dict, tp: int, dtype=jnp.bfloat16):
    """A LoadedModel whose params are ShapeDtypeStructs carrying the plan's shardings (nothing allocated)."""
    from flax import nnx

    from jaxinfer.config import ModelConfig
    from jaxinfer.models.llama import LlamaForCausalLM
    from jaxinfer.weights.loader import LoadedModel
    from jaxinfer.parallel import make_plans, tp_model_config

    plan = make_plans(tp, 1)[0]
    cfg, layout = tp_model_config(ModelConfig.from_hf(hf), tp)
    graphdef, state = nnx.split(nnx.eval_shape(lambda: LlamaForCausalLM(cfg, dtype, mlp_blocks=tp)))
    leaves, treedef = jax.tree.flatten(state)
    variables = jax.tree.leaves(state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    assert len(variables) == len(leaves)
    params = [jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=plan.sharding(v.get_metadata().get("logical_axes"),
                                                                            x.shape))
              for x, v in zip(leaves, variables)]
    return LoadedModel(cfg, None, graphdef, params, treedef, dtype, plan=plan, layout=layout)


def step_collectives(hf: dict, tp: int, batch: int = COMM_BATCH) -> dict:
    """Collectives of the compiled decode step of `batch` sequences: {kind: bytes}, and the op count."""
    from jaxinfer.models.attention import AttentionOptions
    from jaxinfer.parallel import KV_CACHE_AXES, collective_ops
    from jaxinfer.outputs import SeqInput
    from jaxinfer.runner.batch import pack
    from jaxinfer.runner.buckets import BucketLadder
    from jaxinfer.runner.step import make_step_fn

    loaded = _abstract_model(hf, tp)
    cfg, plan = loaded.cfg, loaded.plan
    page, pages = 16, 64
    bucket = BucketLadder.build(max_num_batched_tokens=batch, max_num_seqs=batch, max_model_len=128,
                                page_size=page, query_tile=16, kv_chunk_pages=8).pick(batch, batch)
    width = bucket.table_width
    shape = (pages, page, cfg.num_kv_heads, cfg.head_dim)
    kv_sh = plan.sharding(KV_CACHE_AXES, shape)
    kv = [(jax.ShapeDtypeStruct(shape, loaded.dtype, sharding=kv_sh),) * 2 for _ in range(cfg.num_layers)]
    opts = AttentionOptions(width, True, "reference", mesh=plan.mesh if tp > 1 else None)
    step = make_step_fn(loaded, opts, batch, [(kv_sh, kv_sh)] * cfg.num_layers)
    ints, floats = pack([SeqInput(token_ids=[0], start_pos=0, page_table=[0])], bucket, page).flat()
    rep = plan.replicated
    spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rep)  # noqa: E731
    prev = jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=rep)
    before = set(os.listdir(_HLO_DUMP)) if _HLO_DUMP else set()
    hlo = step.lower(loaded.params, kv, spec(ints), spec(floats), prev, bucket=bucket).compile().as_text()
    if _HLO_DUMP:
        new = sorted(f for f in set(os.listdir(_HLO_DUMP)) - before
                     if "jit_step" in f and "after_spmd-partitioning" in f)
        if new:
            with open(os.path.join(_HLO_DUMP, new[-1])) as f:
                hlo = f.read()
    out: dict = {"count": 0}
    for kind, n in collective_ops(hlo):
        out[kind] = out.get(kind, 0) + n
        out["count"] += 1
    return out


def comm_volume(model: str, tps, batch: int = COMM_BATCH) -> list[dict]:
    from jaxinfer.weights.presets import preset_config

    rows = []
    for tp in tps:
        per_l = {}
        for layers in (1, 2):
            hf = {**preset_config(model), "num_hidden_layers": layers}
            t0 = time.perf_counter()
            per_l[layers] = step_collectives(hf, tp, batch)
            print(f"  {model} tp={tp} layers={layers}: {per_l[layers]} ({time.perf_counter() - t0:.1f} s)",
                  flush=True)
        hf = preset_config(model)
        kinds = sorted(set(per_l[1]) | set(per_l[2]))
        layer = {k: per_l[2].get(k, 0) - per_l[1].get(k, 0) for k in kinds}
        fixed = {k: per_l[1].get(k, 0) - layer[k] for k in kinds}
        L = hf["num_hidden_layers"]
        ar_layer = layer.get("all-reduce", 0)
        rows.append({
            "model": model, "tp": tp, "decode_batch": batch,
            "per_layer_bytes": {k: v for k, v in layer.items() if k != "count"},
            "per_layer_collectives": layer.get("count", 0),
            "outside_layers_bytes": {k: v for k, v in fixed.items() if k != "count"},
            "allreduce_bytes_per_layer_per_token": ar_layer / batch,
            "expected_megatron_allreduce_bytes_per_layer_per_token": 0 if tp == 1 else 2 * hf["hidden_size"] * 2,
            "bytes_per_step_full_model": {k: fixed.get(k, 0) + L * layer.get(k, 0) for k in kinds if k != "count"},
            "collectives_per_step_full_model": fixed.get("count", 0) + L * layer.get("count", 0),
            "bytes_per_token_full_model": sum(fixed.get(k, 0) + L * layer.get(k, 0)
                                              for k in kinds if k != "count") / batch,
        })
    return rows


# ---- timed runs (GPU) ---------------------------------------------------------------------------------------

def _fits(model: str, tp: int, layers: int | None, frac: float = 0.85) -> tuple[bool, str]:
    from jaxinfer.config import ModelConfig
    from jaxinfer.weights.presets import preset_config

    hf = preset_config(model)
    cfg = ModelConfig.from_hf({**hf, "num_hidden_layers": layers or hf["num_hidden_layers"]})
    need = cfg.num_params() * 2 / tp
    from jaxinfer.runner.device_memory import memory_budget

    have = (memory_budget(jax.devices()[0]) or (0, 0))[0]  # the CUDA driver's figure under the VMM allocator
    if have and need > frac * have:
        return False, f"weights {need / 1e9:.1f} GB per device > {frac:.0%} of {have / 1e9:.1f} GB"
    return True, ""


def timed_run(model: str, tp: int, layers: int | None, requests: int, prompt_len: int, new_tokens: int) -> dict:
    from jaxinfer import LLM, SamplingParams
    from jaxinfer.weights.presets import PRESETS

    name = model
    if layers is not None and layers != PRESETS[model]["num_hidden_layers"]:
        name = f"{model}-{layers}l"
        PRESETS[name] = {**PRESETS[model], "num_hidden_layers": layers}
    t0 = time.perf_counter()
    llm = LLM(name, load_format="dummy", tensor_parallel_size=tp, max_num_seqs=requests,
              max_num_batched_tokens=2048, max_model_len=1024, warmup=False, progress=False)
    rng = np.random.default_rng(0)
    vocab = llm.model_config.vocab_size
    greedy = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    llm.generate([rng.integers(0, vocab, prompt_len).tolist()], greedy, use_tqdm=False)  # compiles its buckets
    startup = time.perf_counter() - t0
    # batch 1: decode tok/s after the first token
    eng = llm.engine
    eng.add_request("b1", rng.integers(0, vocab, 128).tolist(), SamplingParams(max_tokens=128, temperature=0.0,
                                                                                 ignore_eos=True))
    first, t_first = None, None
    while eng.has_unfinished():
        outs = eng.step()
        if first is None and outs:
            first, t_first = outs, time.perf_counter()
    t_end = time.perf_counter()
    b1 = 127 / (t_end - t_first)
    # offline throughput (one warm-up pass compiles the buckets of this shape)
    prompts = [rng.integers(0, vocab, prompt_len).tolist() for _ in range(requests)]
    llm.generate(prompts[:requests], greedy, use_tqdm=False)
    t0 = time.perf_counter()
    outs = llm.generate(prompts, greedy, use_tqdm=False)
    dt = time.perf_counter() - t0
    gen = sum(len(o.outputs[0].token_ids) for o in outs)
    row = {"model": model, "layers": llm.model_config.num_layers, "tp": tp, "startup_s": round(startup, 1),
           "batch1_decode_tok_s": round(b1, 1), "batch1_ms_per_token": round(1000 / b1, 2),
           "throughput_requests": requests, "prompt_len": prompt_len, "new_tokens": new_tokens,
           "throughput_output_tok_s": round(gen / dt, 1),
           "throughput_total_tok_s": round((gen + requests * prompt_len) / dt, 1)}
    del llm, eng
    return row


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--tp", nargs="+", type=int, default=[1, 2, 4, 8])
    p.add_argument("--layers-70b", type=int, default=20, help="layers of the 70B shape in timed runs (80 = full)")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-len", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--budget-s", type=float, default=300, help="skip the remaining timed configs after this")
    p.add_argument("--comm-only", action="store_true", help="only the communication volume (CPU is fine)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    n_dev = len(jax.devices())
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    result = {"benchmark": "scaling", "notes": NOTES, "date": now,
              "device": f"{device_name()} x {n_dev}" + (" (simulated)" if jax.default_backend() == "cpu" else ""),
              "jax": jax.__version__, "commit": git_commit(), "comm_volume": [], "timed": []}
    stamp = datetime.date.today().isoformat()
    kind = "comm-volume" if a.comm_only else f"{jax.default_backend()}x{n_dev}"
    path = a.out or os.path.join(RESULTS_DIR, f"scaling-{kind}-{stamp}.json")

    def save():
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
        if os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], os.path.basename(path)), "w") as f:
                json.dump(result, f, indent=2)

    tps = [t for t in a.tp if t <= n_dev]
    if a.comm_only or jax.default_backend() == "cpu":
        for model in a.models:
            result["comm_volume"] += comm_volume(model, [t for t in a.tp if t <= n_dev])
            save()
        if _HLO_DUMP:
            import shutil

            shutil.rmtree(_HLO_DUMP, ignore_errors=True)
        print(f"wrote {path}")
        return
    t_start = time.perf_counter()
    for model in a.models:
        for tp in tps:
            layers = a.layers_70b if "70b" in model else None
            ok, why = _fits(model, tp, layers)
            if not ok:
                result["timed"].append({"model": model, "tp": tp, "skipped": why})
            elif time.perf_counter() - t_start > a.budget_s:
                result["timed"].append({"model": model, "tp": tp, "skipped": f"time budget {a.budget_s:.0f} s spent"})
            else:
                try:
                    row = timed_run(model, tp, layers, a.requests, a.prompt_len, a.new_tokens)
                except Exception as e:  # noqa: BLE001 - e.g. out of memory: record and go on
                    row = {"model": model, "tp": tp, "error": f"{type(e).__name__}: {str(e)[:300]}"}
                result["timed"].append(row)
            print(result["timed"][-1], flush=True)
            save()
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
