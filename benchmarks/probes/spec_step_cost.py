"""Host cost of one speculative engine step (k drafts verified per request), split by where it goes; the
`--speculative` scenario of host_step_cost.py (run it through that script).

Drafts come from benchmarks/spec_speed.py's OracleProposer (the true greedy continuation with probability
`accept` per position, else a random token), either free ("oracle": a host lookup) or after running a draft model
for its cost ("draft": a --draft-model preset, default tiny-llama, random weights, runs catch-up + k steps on its
own runner, its tokens replaced by the oracle's). The true continuation is the same engine's plain greedy run
(float32 on CPU: speculation keeps greedy outputs identical, so the measured acceptance is ~accept; in bf16 on a
GPU near-ties can make it a little lower). Every timed step speculates (batch <= max_batch_size,
all requests decode-ready: a speculative step is finished before the next is scheduled). Sections, µs per step:

  spec         SpecControl.propose + record: eligibility, k per request, drafts onto requests, acceptance counters
  oracle       OracleProposer.propose's own work (the free drafts' host lookup)
  d_host       draft proposer: its own Python (page allocation, SeqInput lists, results), no runner calls
  d_pack       draft runner: runner/batch.pack
  d_disp       draft runner: dispatch without pack (device_put + compiled call), catch-up and the k steps (one
               dispatch when they are fused: runner/draft_steps.py; --per-step-drafts: k dispatches)
  d_wait       waiting for the draft's device programs (wall time)
  d_fetch      draft runner: fetch after the wait
  d_roll       draft proposer: rollback (its KV truncated to the accepted tokens) and free
  schedule     Scheduler.schedule (the drafts become k+1-token chunks; page allocation included)
  seq_inputs   LLMEngine._launch without runner.dispatch
  pack         runner/batch.pack of the target step (verify rows included)
  dispatch     target runner.dispatch without pack
  wait         waiting for the target's verification step (wall time)
  fetch        target runner.fetch after the wait (tokens, accepted counts and spec tokens to the host)
  update       Scheduler.update (accept: append tokens; rollback of num_computed_tokens and pages)
  outputs      the rest of LLMEngine._finish_step (per-token bookkeeping, RequestOutputs)
  other        the rest of LLMEngine.step
host = CPU time of the engine thread per step less its CPU time blocked in the two waits. Also reported: the
draft runner's dispatches per step (catch-up + k, or + 1 fused) and its host µs per dispatch (d_pack + d_disp +
d_fetch). Each number is the smallest over --repeat runs of --steps steps (per number: they may come from
different runs, so the sections need not add up to host exactly).
"""
from __future__ import annotations

import time

import numpy as np

import jaxinfer.runner.batch as batch_mod
import jaxinfer.runner.model_runner as model_runner_mod
from benchmarks.spec_speed import OracleProposer
from jaxinfer import LLM, SamplingParams
from jaxinfer.engine.gc_freeze import startup_objects_frozen
from jaxinfer.engine.spec_control import SpecControl

SPEC_SECTIONS = ("spec", "oracle", "d_host", "d_pack", "d_disp", "d_wait", "d_fetch", "d_roll", "schedule",
                 "seq_inputs", "pack", "dispatch", "wait", "fetch", "update", "outputs", "other")


def build(model: str, load_format: str, max_batch: int, k: int, max_len: int, max_num_batched_tokens: int,
          draft_model: str = "tiny-llama") -> LLM:
    """A speculative engine whose proposer is a draft model of the preset's shape (random weights)."""
    # num_pages explicit (as spec_speed.py): the draft's cache gets as many pages as the target's, which sized from
    # the GPU memory budget would not fit beside it
    return LLM(model, load_format=load_format, max_model_len=max_len, max_num_seqs=max_batch, num_pages=2048,
               max_num_batched_tokens=max_num_batched_tokens, progress=False,
               speculative_config=dict(method="draft", draft_model=draft_model, draft_load_format="dummy",
                                       num_speculative_tokens=k, max_batch_size=max_batch, adaptive=False,
                                       batch_policy=False))


def instrument(llm: LLM, sec) -> None:
    """Timers on the engine, its runner, the draft proposer and its runner (sec: host_step_cost.Sections)."""
    eng = llm.engine
    draft = eng.spec.proposer
    sec.draft_depth = 0  # > 0 while inside the draft proposer: pack then counts as the draft's

    for obj, name, key in ((eng.scheduler, "schedule", "schedule"), (eng, "_launch", "launch_total"),
                           (eng.runner, "dispatch", "dispatch_total"), (eng.scheduler, "update", "update"),
                           (eng, "_finish_step", "finish_total"), (eng, "step", "step"),
                           (draft, "propose", "draft_total"), (draft.runner, "dispatch", "d_dispatch_total"),
                           (draft, "rollback", "d_roll"), (draft, "free", "d_roll")):
        sec.wrap(obj, name, key)
    sec.split_wait(eng.runner)
    sec.split_wait(draft.runner, "d_wait", "d_fetch")
    fused = getattr(draft, "fused", None)  # the k draft steps in one program (runner/draft_steps.py)
    if fused is not None:
        sec.wrap(fused, "dispatch", "d_dispatch_total")
        sec.split_wait(fused, "d_wait", "d_fetch", lambda tokens: tokens)
    propose = draft.propose

    def in_draft(seqs):
        sec.draft_depth += 1
        try:
            return propose(seqs)
        finally:
            sec.draft_depth -= 1

    draft.propose = in_draft
    for obj in (draft.runner, fused) if fused is not None else (draft.runner,):  # count the draft's dispatches
        def counted(*a, _dispatch=obj.dispatch, **kw):
            sec.t["d_dispatches"] += sec.on
            return _dispatch(*a, **kw)

        obj.dispatch = counted


def wrap_pack(sec) -> None:
    """runner/batch.pack, as model_runner calls it, timed as "pack" or "d_pack" (inside the draft proposer)."""
    pack = model_runner_mod.pack

    def timed(*a, **kw):
        if not sec.on:
            return pack(*a, **kw)
        t0 = sec.clock()
        try:
            return pack(*a, **kw)
        finally:
            sec.t["d_pack" if sec.draft_depth else "pack"] += sec.clock() - t0

    model_runner_mod.pack = timed
    assert batch_mod.pack is pack


def install_control(llm: LLM, sec, refs: dict, prompt_len: int, accept: float, k: int, max_batch: int,
                    with_draft: bool, seed: int) -> None:
    """A fresh SpecControl (new acceptance counters) over an OracleProposer, with spec/oracle timers."""
    eng = llm.engine
    inner = eng._probe_draft if with_draft else None
    oracle = OracleProposer(refs, {rid: prompt_len for rid in refs}, accept, llm.model_config.vocab_size, inner,
                            seed=seed)
    sec.wrap(oracle, "propose", "oracle_total")
    ctl = SpecControl(oracle, k, max_batch, adaptive=False)
    sec.wrap(ctl, "propose", "spec_propose")
    sec.wrap(ctl, "record", "spec_record")
    eng.spec = ctl


def split(t: dict) -> dict:
    """Exclusive section times from the nested totals (see the module docstring)."""
    d_runner = t["d_dispatch_total"] + t["d_wait_cpu"] + t["d_fetch"]  # pack is inside dispatch
    out = dict(
        d_pack=t["d_pack"], d_disp=t["d_dispatch_total"] - t["d_pack"], d_wait=t["d_wait"], d_fetch=t["d_fetch"],
        d_host=t["draft_total"] - d_runner, oracle=t["oracle_total"] - t["draft_total"],
        d_roll=t["d_roll"],
        schedule=t["schedule"], seq_inputs=t["launch_total"] - t["dispatch_total"], pack=t["pack"],
        dispatch=t["dispatch_total"] - t["pack"], wait=t["wait"], fetch=t["fetch"], update=t["update"])
    out["spec"] = t["spec_propose"] - t["oracle_total"] + t["spec_record"] - t["d_roll"]
    out["outputs"] = t["finish_total"] - t["fetch"] - t["wait_cpu"] - t["update"] - t["spec_record"]
    inside = (t["spec_propose"] + t["schedule"] + t["launch_total"] + t["finish_total"])
    out["other"] = t["step"] - inside
    # the draft's "free" calls come from the engine's loop (other) and its rollbacks from record: both are in d_roll
    return out


def _requests(eng, tag, batch, prompt_len, max_tokens):
    sp = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids = [f"{tag}-{i}" for i in range(batch)]
    for i, rid in enumerate(ids):
        eng.add_request(rid, [(7 * i + j) % 500 + 3 for j in range(prompt_len)], sp, stream=False)
    return ids


def run(llm: LLM, sec, batch: int, steps: int, prompt_len: int, k: int, accept: float, with_draft: bool,
        tag: str, instrumented: bool) -> dict:
    """The plain greedy continuation first (the oracle), then `steps` timed speculative steps."""
    eng = llm.engine
    max_tokens = (steps + 8) * (k + 1) + 8  # never finishes inside the timed steps
    cache = eng.__dict__.setdefault("_probe_refs", {})  # the prompts depend only on the batch size
    if (batch, max_tokens) not in cache:
        eng.spec = None
        ref_ids = _requests(eng, tag + "ref", batch, prompt_len, max_tokens)
        outs = {}
        while eng.has_unfinished():
            for o in eng.step():
                outs[o.request_id] = o.outputs[0].token_ids
        cache[batch, max_tokens] = [outs[r] for r in ref_ids]
    ids = [f"{tag}-{i}" for i in range(batch)]
    refs = dict(zip(ids, cache[batch, max_tokens]))
    install_control(llm, sec, refs, prompt_len, accept, k, batch, with_draft, seed=batch)
    _requests(eng, tag, batch, prompt_len, max_tokens)
    with startup_objects_frozen():
        while any(r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.running) or eng.scheduler.waiting:
            eng.step()
        for _ in range(3):
            eng.step()
        sec.t.clear()
        sec.on = instrumented
        before = eng.spec.stats.as_dict()
        t0, c0 = time.perf_counter(), sec.clock()
        for _ in range(steps):
            eng.step()
            assert eng.scheduler.num_running == batch, "a request finished or was preempted inside the timed steps"
        wall, cpu = time.perf_counter() - t0, sec.clock() - c0
        sec.on = False
        after = eng.spec.stats.as_dict()
    for rid in ids:  # the rest is not needed
        eng.abort(rid)
    while eng.has_unfinished():
        eng.step()
    verifies = after["num_verify_steps"] - before["num_verify_steps"]
    res = dict(wall=wall, cpu=cpu, verifies_per_step=verifies / steps,
               acceptance=(after["num_accepted_tokens"] - before["num_accepted_tokens"])
               / max(1, after["num_draft_tokens"] - before["num_draft_tokens"]),
               tokens_per_verify=(after["num_emitted_tokens"] - before["num_emitted_tokens"]) / max(1, verifies))
    if instrumented:
        res.update(split(sec.t), wait_cpu=sec.t["wait_cpu"] + sec.t["d_wait_cpu"],
                   d_dispatches=sec.t["d_dispatches"])
    return res


def _fastest(runs: list[dict]) -> dict:
    """Per number, the smallest over the runs (other processes on the machine only ever add time)."""
    return {key: float(np.min([r[key] for r in runs])) for key in runs[0]}


def main(a, Sections) -> list[dict]:
    """The speculative scenarios of host_step_cost.py (a: its parsed arguments)."""
    max_batch = max(a.batch)
    max_len = a.prompt_len + (a.steps + 8) * (a.k + 1) + 64
    llm = build(a.model, a.load_format, max_batch, a.k, max_len, a.max_num_batched_tokens, a.draft_model)
    llm.engine._probe_draft = llm.engine.spec.proposer
    if a.per_step_drafts and hasattr(llm.engine._probe_draft, "fused"):
        llm.engine._probe_draft.fused = None  # the k draft steps dispatched one by one (the path before the fusion)
    sec = Sections()  # its clock: the engine thread's CPU time
    wrap_pack(sec)
    instrument(llm, sec)
    rows = []
    print(f"speculative steps, k={a.k}, oracle acceptance {a.accept}; µs per step (every step verifies drafts of "
          f"every request; host excludes the waits; d_*: the draft proposer's runner; d_us/disp: its host µs per "
          f"dispatch; wall: uninstrumented wall ms per step)")
    print(f"{'drafts':6s} {'batch':>5s} | " + " ".join(f"{s:>8s}" for s in SPEC_SECTIONS)
          + f" | {'host':>7s} {'uninstr':>7s} {'disp/st':>7s} {'d_us/disp':>9s} {'acc':>5s} {'tok/ver':>7s}"
          f" {'wall ms':>7s}")
    for drafts in a.spec_drafts:
        with_draft = drafts == "draft"
        for b in a.batch:
            # the fastest of --repeat runs (the machine is shared: single runs scatter by tens of percent)
            plain = _fastest([run(llm, sec, b, a.steps, a.prompt_len, a.k, a.accept, with_draft, f"{drafts}p{b}.{i}",
                                 False) for i in range(a.repeat)])
            r = _fastest([run(llm, sec, b, a.steps, a.prompt_len, a.k, a.accept, with_draft, f"{drafts}{b}.{i}", True)
                         for i in range(a.repeat)])
            us = {s: 1e6 * r[s] / a.steps for s in SPEC_SECTIONS}
            host = 1e6 * (r["cpu"] - r["wait_cpu"]) / a.steps
            host_plain = 1e6 * (plain["cpu"] - r["wait_cpu"]) / a.steps
            n_disp = r["d_dispatches"] / a.steps
            d_us = (us["d_pack"] + us["d_disp"] + us["d_fetch"]) / n_disp if n_disp else 0.0
            rows.append(dict(scenario=f"spec-{drafts}", batch=b, steps=a.steps, repeat=a.repeat, k=a.k, accept=a.accept,
                             **{f"{s}_us": us[s] for s in SPEC_SECTIONS}, host_us_per_step=host,
                             host_us_per_step_uninstrumented=host_plain, draft_dispatches_per_step=n_disp,
                             draft_host_us_per_dispatch=d_us, measured_acceptance=r["acceptance"],
                             tokens_per_verification=r["tokens_per_verify"],
                             wall_ms_per_step=1e3 * plain["wall"] / a.steps))
            print(f"{drafts:6s} {b:5d} | " + " ".join(f"{us[s]:8.1f}" for s in SPEC_SECTIONS)
                  + f" | {host:7.1f} {host_plain:7.1f} {n_disp:7.2f} {d_us:9.1f} {r['acceptance']:5.2f} "
                  f"{r['tokens_per_verify']:7.2f} {1e3 * plain['wall'] / a.steps:7.2f}", flush=True)
    return rows
