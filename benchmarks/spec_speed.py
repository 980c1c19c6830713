"""Decode speed with speculative decoding as a function of the acceptance rate (GPU benchmark; CPU smoke test).

Random weights give no real acceptance, so acceptance is controlled. Method ("oracle drafts with agreement a"):
each draft token is the true next greedy token with probability a, independently per position, and a random other
token otherwise. With k drafts a verification then yields (1 - a^(k+1)) / (1 - a) tokens on average (a = 0.7,
k = 4: 2.77; a short run's measured value scatters around it, so the measured tokens per verification is reported).
"True next token" is a fixed point: random bf16 weights give near-tied logits, and a verification step (k+1 query
tokens per sequence, another bucket shape) may break a tie differently from a plain decode step, so the plain run's
continuation is only the first guess. The speculative run is repeated with the previous run's own outputs as the
oracle (same draft randomness) until its outputs equal the oracle's (<= --max-oracle-runs runs); the last run is
the one reported, with `oracle_fixed_point` saying whether it converged. Draft cost:
  none        drafts are free (host lookup only): the ceiling for a perfect, free drafter;
  <preset>    a draft model of that shape (e.g. llama3.2-1b, random weights) runs for real — catch-up, k
              autoregressive steps, its own KV cache — and its tokens are then replaced by the oracle's;
  layer_skip:N  the same with the target's first N layers as the draft.
Pipelining (default; --unpipelined for the old path): free drafts ("none") come from a device table
(runner/spec_carry.TableProposer: prompt + the oracle continuation with each position corrupted with probability
1 - a, the same per-position agreement), so verification steps are pipelined (engine/spec_pipeline.py). Draft
models pipeline too: their one-program cycle (runner/draft_cycle.py) runs for its cost, then the table overwrites
its drafts on the device (DeviceOracle); --per-step-drafts rows run unpipelined (the `pipelined` field says).
Reported: decode tokens/s after each request's first token (as benchmarks/latency.py), speedup over plain
decoding of the same engine settings, measured acceptance, tokens per verification.

GPU (H200):  python benchmarks/spec_speed.py
CPU smoke:   python benchmarks/spec_speed.py --model tiny-llama --drafts none tiny-llama --batch 1 2 --accept 0.7 \
                 --new-tokens 12 --prompt-len 16
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from benchmarks.common import (add_engine_flags, engine_config,  # noqa: E402
                               write_result)
from jaxinfer import LLM, SamplingParams  # noqa: E402
from jaxinfer.config import SpeculativeConfig  # noqa: E402
from jaxinfer.engine.spec_control import SpecControl  # noqa: E402
from jaxinfer.runner.spec_carry import TableProposer  # noqa: E402


class OracleProposer:
    """Drafts that agree with the known greedy continuation with probability `accept` per position. `inner` (a
    model proposer or None) is run first so its cost is paid, and its KV bookkeeping follows the requests."""

    def __init__(self, refs: dict, prompt_lens: dict, accept: float, vocab: int, inner=None, seed=0):
        self.refs, self.prompt_lens, self.accept, self.vocab, self.inner = refs, prompt_lens, accept, vocab, inner
        self.rng = np.random.default_rng(seed)

    def propose(self, seqs):
        if self.inner is not None:
            # Run for its cost only. Its cache then holds KV of its own drafts where the oracle's were accepted;
            # that is wrong content but the same amount of work (catch-up is one token per step either way).
            self.inner.propose(seqs)
        # "Free" drafts: their host cost is part of every measured cycle, so the random draws are made once for
        # the whole batch (one draw per sequence cost ~12 µs a sequence: 0.4 ms per step at batch 32).
        kmax = max(k for _, _, k in seqs)
        agree = (self.rng.random((len(seqs), kmax)) < self.accept).tolist()
        shift = (1 + self.rng.integers(0, self.vocab - 1, (len(seqs), kmax))).tolist()  # != 0 mod vocab
        out = {}
        for i, (rid, tokens, k) in enumerate(seqs):
            done = len(tokens) - self.prompt_lens[rid]
            true = self.refs[rid][done:done + k]
            g, sh = agree[i], shift[i]
            out[rid] = [t if g[j] else (t + sh[j]) % self.vocab for j, t in enumerate(true)]
        return out

    def rollback(self, rid, n):
        if self.inner is not None:
            self.inner.rollback(rid, n)

    def free(self, rid):
        if self.inner is not None:
            self.inner.free(rid)


class DeviceOracle:
    """Pipelined draft-model rows: the draft model's device cycle runs for its cost (runner/draft_cycle.py), then the
    oracle table overwrites its drafts in the carry (same device stream: no host sync)."""

    def __init__(self, table, inner):
        self.table, self.inner = table, inner

    def propose_device(self, flight, todo):
        return self.table.propose_device(self.inner.propose_device(flight, todo), todo)

    def rollback(self, rid, n):
        self.inner.rollback(rid, n)

    def free(self, rid):
        self.inner.free(rid)


def _corrupt(ref, accept: float, vocab: int, rng) -> list[int]:
    """ref with each position replaced by another token with probability 1 - accept (a fixed draw per position)."""
    ref = np.asarray(ref, np.int64)
    bad = rng.random(len(ref)) >= accept
    shift = 1 + rng.integers(0, vocab - 1, len(ref))
    return np.where(bad, (ref + shift) % vocab, ref).tolist()


def _expected_tokens(a: float, k: int) -> float:
    """Mean tokens per verification with k drafts each right with probability a: 1 + a + ... + a^k."""
    return sum(a ** i for i in range(k + 1))


def _thresholds(rows) -> dict:
    """Per (draft, acceptance): the largest measured batch at which speculation is still faster than plain decoding
    (None: slower already at the smallest batch). SpeculativeConfig.max_batch_size is chosen from this."""
    out = {}
    for r in rows:
        if r["draft"] == "plain" or r.get("buckets", "default") != "default":
            continue
        key = f"{r['draft']}@{r['accept']}"
        if r["speedup"] > 1.0 and (out.get(key) is None or r["batch"] > out[key]):
            out[key] = r["batch"]
        out.setdefault(key, None)
    return out


def decode_run(llm, prompts, new_tokens, tag):
    """Returns (tokens/s after each request's first token, outputs by request id)."""
    eng = llm.engine
    sp = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(prompts):
        eng.add_request(f"{tag}-{i}", p, sp)
    t_first, outs = None, {}
    while eng.has_unfinished():
        for o in eng.step():
            if t_first is None:
                t_first = time.perf_counter()
            if o.finished:
                outs[o.request_id] = o
    dt = time.perf_counter() - t_first
    return len(prompts) * (new_tokens - 1) / dt, outs


def _bucket_variants(plain, spec_llm, inners) -> list:
    """--ab-min16: [(name, apply)], each switched from what is compiled (runner/ladders.py):
      ""             the engines as built (the verify bucket on, the draft cycle's (2, 1) pair off)
      "/min16"       as --min-bucket-tokens 16 builds them: ladders without the buckets below 16 tokens
      "/cycle-pair"  as built, with the draft cycles' batch-1 pair (DraftCycle.small_pair; compiled here first)"""
    from jaxinfer.runner.buckets import BucketLadder

    built = [(r, r.ladder) for r in (plain.runner, spec_llm.runner)]
    cycles = [(p.cycle, p.carry_shape) for p in inners.values() if getattr(p, "cycle", None) is not None]

    def use(min16: bool, pair: bool):
        for r, ladder in built:
            r.ladder = BucketLadder(tuple(b for b in ladder.buckets if b.num_tokens >= 16)) if min16 else ladder
        for cycle, carry_shape in cycles:
            cycle.small_pair = pair
            cycle.warmup(carry_shape)  # (compiles only a pair not compiled yet)

    return [("", lambda: use(False, False)), ("/min16", lambda: use(True, False)),
            ("/cycle-pair", lambda: use(False, True))]


def profiled_run(llm, prompts, new_tokens, tag, profile_root, top=12):
    """decode_run under jax.profiler: device µs per generated token by kernel family and the top kernels, and the
    share of the run's wall time the device was busy (what is not busy is host time / launch gaps)."""
    import collections
    import tempfile

    import jax

    from benchmarks.probes.step_profile import device_op_times, op_family

    os.makedirs(profile_root, exist_ok=True)
    d = tempfile.mkdtemp(prefix=f"{tag}-", dir=profile_root)
    jax.profiler.start_trace(d)
    t0 = time.perf_counter()
    decode_run(llm, prompts, new_tokens, tag)
    wall = time.perf_counter() - t0
    jax.profiler.stop_trace()
    tokens = len(prompts) * new_tokens
    ops, _ = device_op_times(d, tokens)
    fam = collections.Counter()
    for k, v in ops.items():
        fam[op_family(k)] += v
    busy = sum(ops.values()) * tokens / 1e6 / wall
    out = dict(wall_us_per_token=round(wall / tokens * 1e6, 1), device_us_per_token=round(sum(ops.values()), 1),
               device_busy=round(busy, 3), families_us_per_token={k: round(v, 1) for k, v in fam.most_common()},
               top_ops_us_per_token={k: round(v, 1) for k, v in collections.Counter(ops).most_common(top)})
    print(f"  profile {tag}: wall {out['wall_us_per_token']} µs/token, device {out['device_us_per_token']} µs/token "
          f"(busy {100 * busy:.0f}%); " + ", ".join(f"{k} {v:.0f}" for k, v in out["families_us_per_token"].items()),
          flush=True)
    for k, v in out["top_ops_us_per_token"].items():
        print(f"      {v:8.1f} µs  {k[:100]}", flush=True)
    return out


def host_profiled_run(llm, prompts, new_tokens, tag, top=25):
    """decode_run under cProfile: the host functions with the most own time (tottime), per generated token."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.runcall(decode_run, llm, prompts, new_tokens, tag)
    wall = time.perf_counter() - t0
    tokens = len(prompts) * new_tokens
    st = pstats.Stats(prof)
    rows = sorted(((v[2], v[3], f"{os.path.basename(k[0])}:{k[1]} {k[2]}") for k, v in st.stats.items()), reverse=True)
    out = dict(wall_us_per_token=round(wall / tokens * 1e6, 1),
               top_tottime_us_per_token={name: [round(tt / tokens * 1e6, 1), round(ct / tokens * 1e6, 1)]
                                         for tt, ct, name in rows[:top]})
    print(f"  host profile {tag}: wall {out['wall_us_per_token']} µs/token under cProfile; own / cumulative µs per "
          "token:", flush=True)
    for name, (tt, ct) in out["top_tottime_us_per_token"].items():
        print(f"      {tt:8.1f} {ct:9.1f}  {name[:110]}", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--drafts", nargs="+", default=["none", "llama3.2-1b"],
                    help="'none' (free oracle drafts), a preset (draft model of that shape; PRESET@int8 / @int4: its "
                         "weights quantized, draft_quantization; PRESET@int8+floathead: with a float head; "
                         "PRESET@int8+vocab32768: its head cut to the first 32768 ids, draft_head_vocab; options "
                         "combine with +), or "
                         "layer_skip:N")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    ap.add_argument("--accept", type=float, nargs="+", default=[0.5, 0.7, 0.9])
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-oracle-runs", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=3,
                    help="timed runs per row (plain, and each draft once its oracle is at the fixed point): the "
                         "median is reported (one 128-token run at batch 1 is ~0.5 s, noisy on its own)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--unpipelined", action="store_true",
                    help="free drafts from the host (each speculative step finished before the next; the old path)")
    ap.add_argument("--ab-min16", action="store_true",
                    help="each batch also with the buckets below 16 tokens out of use (plain decoding's 1-token "
                         "bucket and the verify bucket: --min-bucket-tokens 16's ladders, rows /min16) and with the "
                         "draft cycle's (2, 1) pair on (rows /cycle-pair), switched in one process "
                         "(runner/ladders.py)")
    ap.add_argument("--tag", default="", help="appended to the result file's name")
    ap.add_argument("--per-step-drafts", action="store_true",
                    help="draft models dispatch their k steps one by one (not fused into one program)")
    ap.add_argument("--profile", default=None, metavar="DIR",
                    help="trace one more run of plain decoding and of each draft at the first --accept value under "
                         "jax.profiler (traces in DIR) and add its per-token device-time table to the row")
    ap.add_argument("--host-profile", action="store_true",
                    help="one more run of plain decoding and of each draft at the first --accept value under "
                         "cProfile; the functions with the most host time per token go into the row")
    ap.add_argument("--stage-inputs", action=argparse.BooleanOptionalAction, default=True,
                    help="the step and the draft programs copy their inputs into donated fixed-address buffers "
                         "(ModelRunner.stage_inputs; --no-stage-inputs: the A/B)")
    add_engine_flags(ap, model="llama3-8b", load_format="dummy", num_pages=2048, max_num_batched_tokens=512)
    a = ap.parse_args(argv)
    from jaxinfer.runner.model_runner import ModelRunner
    ModelRunner.stage_inputs = a.stage_inputs  # (read when a runner builds its programs)

    max_batch = max(a.batch)
    common = dict(max_model_len=a.prompt_len + a.new_tokens + 64, max_num_seqs=max(max_batch, 8))
    config = engine_config(a, **common)
    t0 = time.perf_counter()
    plain = LLM(config=config, progress=False)
    # The speculative engine: verify rows for up to max_batch requests; its proposer is swapped per run below.
    # batch_policy off: this benchmark measures speculation itself (its results fill engine/spec_policy.py's table)
    spec_llm = LLM(config=config.replace(speculative_config=dict(method="ngram", num_speculative_tokens=a.k,
                                                                 max_batch_size=max_batch, adaptive=False,
                                                                 batch_policy=False)),
                   progress=False)
    vocab = spec_llm.model_config.vocab_size
    inners = {"none": None}
    from jaxinfer.draft_model import build_model_proposer

    for d in a.drafts:
        if d == "none":
            continue
        if d.startswith("layer_skip:"):
            sc = SpeculativeConfig(method="layer_skip", num_draft_layers=int(d.split(":")[1]))
        else:
            name, _, quant = d.partition("@")  # llama3.2-1b@int8: the draft quantized on load (draft_quantization)
            quant, *opts = quant.split("+")   # ...@int8+floathead: its head float (draft_quantize_lm_head)
            bad = [o for o in opts if o != "floathead" and not o.startswith("vocab")]
            if bad:
                raise SystemExit(f"unknown draft option(s) {bad} in {d!r}: use +floathead or +vocabN")
            # +vocab32768: the draft's head cut (not `vocab`, the target's, which the prompts below are drawn from)
            head_vocab = next((int(o[len("vocab"):]) for o in opts if o.startswith("vocab")), None)
            sc = SpeculativeConfig(method="draft", draft_model=name, draft_load_format="dummy",
                                   draft_quantization=quant or None, draft_head_vocab=head_vocab,
                                   draft_quantize_lm_head=False if "floathead" in opts else None)
        prop = build_model_proposer(sc, spec_llm.model, spec_llm.config, spec_llm.max_model_len, a.num_pages,
                                    progress=False)
        if a.per_step_drafts:
            prop.fused = prop.cycle = None  # runner/draft_steps.py and draft_cycle.py off: the per-step path
            prop.can_pipeline = False
        prop.warmup(progress=False)
        inners[d] = prop
    # no background compile beside the timed runs (the plain engine's 1-token bucket, the drafts' small buckets)
    for runner in [plain.runner, spec_llm.runner] + [p.runner for p in inners.values() if hasattr(p, "runner")]:
        runner.finish_background_compiles()
    setup_s = time.perf_counter() - t0
    print(f"setup (engines, drafts, warm-ups) {setup_s:.1f} s", flush=True)

    rng = np.random.default_rng(0)
    rows = []
    variants = _bucket_variants(plain, spec_llm, inners) if a.ab_min16 else [("", lambda: None)]

    def save():  # after every batch: a run cut by a time limit keeps what it measured
        return write_result("spec-speed-per-step-drafts" if a.per_step_drafts else "spec-speed", dict(
            model=a.model, drafts=a.drafts, k=a.k, prompt_len=a.prompt_len, new_tokens=a.new_tokens,
            setup_s=round(setup_s, 1),
            fused_draft_steps=not a.per_step_drafts,
            method="oracle drafts: true greedy continuation with probability a per position, else a random token; "
                   "the continuation is the fixed point of the speculative run's own greedy outputs (module "
                   "docstring); draft models run for their cost, their tokens replaced",
            engine=dict(common, load_format=a.load_format, num_pages=a.num_pages,
                        max_num_batched_tokens=a.max_num_batched_tokens), rows=rows, batch_threshold=_thresholds(rows)),
            tag=a.tag)

    for b in a.batch:
        prompts = [rng.integers(0, vocab, a.prompt_len).tolist() for _ in range(b)]
        for vname, apply_variant in variants:
            apply_variant()
            vtag = vname.replace("/", "")
            decode_run(plain, prompts, 8, f"warm{b}{vtag}")  # first-use effects out of the timed run
            base_tps, base_outs = decode_run(plain, prompts, a.new_tokens, f"plain{b}{vtag}")
            base_tps = float(np.median([base_tps] + [
                decode_run(plain, prompts, a.new_tokens, f"plain{b}{vtag}r{r}")[0] for r in range(1, a.repeats)]))
            print(f"batch {b}{vname}: plain {base_tps:.1f} tok/s", flush=True)
            rows.append(dict(batch=b, buckets=vname or "default", draft="plain", accept=None,
                             tokens_per_s=round(base_tps, 2), speedup=1.0))
            if a.profile:
                rows[-1]["profile"] = profiled_run(plain, prompts, a.new_tokens, f"pplain{b}{vtag}", a.profile)
            if a.host_profile:
                rows[-1]["host_profile"] = host_profiled_run(plain, prompts, a.new_tokens, f"hplain{b}{vtag}")
            plain_outs = [base_outs[f"plain{b}{vtag}-{i}"].outputs[0].token_ids for i in range(b)]
            if "none" in inners and not a.unpipelined:  # the device draft table's program compiled outside the timing
                ids = [f"warmspec{b}{vtag}-{i}" for i in range(b)]
                spec_llm.engine.spec = SpecControl(TableProposer({rid: prompts[i] + plain_outs[i] for i, rid in
                                                                  enumerate(ids)}, a.k), a.k, max_batch, adaptive=False)
                decode_run(spec_llm, prompts, 8, f"warmspec{b}{vtag}")
            for d, inner in inners.items():
                for acc in a.accept:
                    oracle = plain_outs
                    piped = not a.unpipelined and (inner is None or getattr(inner, "can_pipeline", False))

                    def use_proposer(ids, oracle):
                        if piped:
                            noise = np.random.default_rng(b)
                            proposer = TableProposer({rid: prompts[i] + _corrupt(oracle[i], acc, vocab, noise)
                                                      for i, rid in enumerate(ids)}, a.k)
                            if inner is not None:
                                proposer = DeviceOracle(proposer, inner)
                        else:
                            proposer = OracleProposer(dict(zip(ids, oracle)), {rid: a.prompt_len for rid in ids}, acc,
                                                      vocab, inner, seed=b)
                        spec_llm.engine.spec = SpecControl(proposer, a.k, max_batch, adaptive=False, pipelined=piped)

                    for run in range(a.max_oracle_runs):
                        tag = f"s{b}{vtag}-{d}-{acc}-{run}"
                        ids = [f"{tag}-{i}" for i in range(b)]
                        use_proposer(ids, oracle)
                        tps, outs = decode_run(spec_llm, prompts, a.new_tokens, tag)
                        got = [outs[rid].outputs[0].token_ids for rid in ids]
                        fixed = got == oracle
                        if fixed:
                            break
                        oracle = got
                    if fixed:  # the same drafts again: the median of a.repeats timed runs
                        more = []
                        for r in range(1, a.repeats):
                            ids = [f"{tag}r{r}-{i}" for i in range(b)]
                            use_proposer(ids, oracle)
                            more.append(decode_run(spec_llm, prompts, a.new_tokens, f"{tag}r{r}")[0])
                        tps = float(np.median([tps] + more))
                    st = spec_llm.engine.spec_stats()
                    rows.append(dict(
                        batch=b, buckets=vname or "default", draft=d, accept=acc, tokens_per_s=round(tps, 2),
                        speedup=round(tps / base_tps, 3), measured_acceptance=round(st["acceptance_rate"], 4),
                        tokens_per_verification=round(st["mean_accepted_length"], 3),
                        expected_tokens_per_verification=round(_expected_tokens(acc, a.k), 3),
                        oracle_runs=run + 1, oracle_fixed_point=fixed, pipelined=piped,
                        outputs_equal_plain=got == plain_outs))
                    print(f"batch {b}{vname}: draft {d} a={acc}: {tps:.1f} tok/s ({tps / base_tps:.2f}x), "
                          f"{st['mean_accepted_length']:.2f} tok/verify, oracle runs {run + 1}, fixed point {fixed}",
                          flush=True)
                    if a.profile and acc == a.accept[0]:  # the same run again, traced
                        tag = f"p{b}{vtag}-{d}-{acc}"
                        use_proposer([f"{tag}-{i}" for i in range(b)], oracle)
                        rows[-1]["profile"] = profiled_run(spec_llm, prompts, a.new_tokens, tag, a.profile)
                    if a.host_profile and acc == a.accept[0]:  # and under cProfile: where the host time goes
                        tag = f"h{b}{vtag}-{d}-{acc}"
                        use_proposer([f"{tag}-{i}" for i in range(b)], oracle)
                        rows[-1]["host_profile"] = host_profiled_run(spec_llm, prompts, a.new_tokens, tag)
        path = save()
    print("wrote", path)


if __name__ == "__main__":
    main()
