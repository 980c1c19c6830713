"""Host cost of one engine step at batch 1 / 64 / 256 decode, split by where it goes (CPU is fine).

The real LLMEngine, Scheduler, KVCacheManager and ModelRunner run on the "tiny-llama" dummy preset (2 layers,
hidden 64, vocab 512), so the device program is cheap and what is left is host work. Each section is timed with
time.thread_time (CPU time of the engine's thread: robust to other processes sharing the cores; the wait for the
device is wall time) around the engine's own methods (wrappers installed on the instances; the wrappers around
page allocation add ~0.3 µs per request per step, counted in "schedule"; the column "uninstr" is measured without
any wrapper). The step is split into:

  schedule     Scheduler.schedule without page allocation
  page_alloc   KVCacheManager.allocate (called from schedule)
  seq_inputs   LLMEngine._launch without runner.dispatch (the StepBatch from the InputBatch; SeqInputs before)
  pack         runner/batch.pack_step (pack before): numpy packing into the bucket's arrays
  dispatch     runner.dispatch without pack (device_put + the compiled call)
  wait         waiting for the device program (block_until_ready; device time here, not host time)
  fetch        runner.fetch after the wait (device->host copy of the sampled tokens, numpy slicing)
  update       Scheduler.update (append tokens, stop checks, prefix-cache registration)
  outputs      the rest of LLMEngine._finish_step: per-token bookkeeping, detokenization, RequestOutput creation
  gc           Python's cyclic garbage collector (gc.callbacks); NOT extra: it is inside whichever section allocated

host = CPU time of the engine thread per step, less its CPU time blocked in the wait. The timed steps run inside
engine/gc_freeze.startup_objects_frozen(), as LLM.generate does (no-op on commits before it). Scenarios:
  offline      stream=False, no tokenizer (LLM.generate / throughput.py on dummy weights)
  stream       stream=True, no tokenizer (benchmarks/latency.py)
  offline+tok  stream=False with the SmolLM2 tokenizer (LLM.generate of a real model)
  stream+tok   stream=True with the tokenizer, cumulative outputs (each step reports the whole text so far)
  delta+tok    stream=True with the tokenizer, output_kind DELTA (what the OpenAI server asks: only what is new)
Requests decode with greedy sampling and ignore_eos.

  PYTHONPATH=$PWD python benchmarks/probes/host_step_cost.py [--batch 1 64 256] [--steps 40] [--no-tokenizer]
Speculative steps (benchmarks/probes/spec_step_cost.py: oracle drafts, free or after a tiny-llama draft model):
  PYTHONPATH=$PWD python benchmarks/probes/host_step_cost.py --speculative [--batch 1 8 32] [--k 4] [--accept 0.7]
  GPU: python benchmarks/probes/host_step_cost.py --speculative --model llama3-8b --draft-model llama3.2-1b
  GPU: python benchmarks/probes/host_step_cost.py --model llama3-8b --no-tokenizer --batch 1 64 256
"""
from __future__ import annotations

import argparse
import functools
import gc
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402

import jaxinfer.runner.model_runner as model_runner_mod  # noqa: E402
from benchmarks.common import add_engine_flags, engine_config, write_result  # noqa: E402
from jaxinfer.runner.call_thread import wanted  # noqa: E402
from jaxinfer import LLM, SamplingParams  # noqa: E402

try:
    from jaxinfer.engine.gc_freeze import startup_objects_frozen
except ImportError:  # the probe run on an older commit, for the "before" table
    from contextlib import nullcontext as startup_objects_frozen

CLOCK = time.thread_time
SECTIONS = ("schedule", "page_alloc", "seq_inputs", "pack", "dispatch", "wait", "fetch", "update", "outputs", "gc")


class Sections:
    """Accumulated seconds per wrapped function while `on`."""

    def __init__(self):
        self.t = defaultdict(float)
        self.on = False
        self.clock = CLOCK
        self._gc_start = 0.0
        gc.callbacks.append(self._gc)

    def _gc(self, phase, info):
        if phase == "start":
            self._gc_start = CLOCK()
        elif self.on:
            self.t["gc"] += CLOCK() - self._gc_start

    def wrap(self, obj, name: str, key: str, clock=None):
        fn = getattr(obj, name)
        clock = clock or CLOCK

        @functools.wraps(fn)
        def timed(*a, **k):
            if not self.on:
                return fn(*a, **k)
            t0 = clock()
            try:
                return fn(*a, **k)
            finally:
                self.t[key] += clock() - t0

        setattr(obj, name, timed)
        return fn

    def split_wait(self, obj, wait_key: str = "wait", fetch_key: str = "fetch", device_arrays=lambda f: f.out):
        """Wrap obj.fetch(flight): the wait for its device arrays (wall time into wait_key; the CPU spent blocking,
        i.e. spinning, into wait_key + "_cpu", taken off the host time) apart from the copy to the host
        (fetch_key)."""
        fetch = obj.fetch

        def fetch_split(flight):
            if not self.on:
                return fetch(flight)
            t0, c0 = time.perf_counter(), self.clock()
            jax.block_until_ready(device_arrays(flight))
            t1, c1 = time.perf_counter(), self.clock()
            res = fetch(flight)
            self.t[wait_key] += t1 - t0
            self.t[wait_key + "_cpu"] += c1 - c0
            self.t[fetch_key] += self.clock() - c1
            return res

        obj.fetch = fetch_split


def instrument(eng, sec: Sections):
    sec.wrap(eng.scheduler, "schedule", "schedule_total")
    # once per request per step: perf_counter (64 ns a call) rather than thread_time (~0.7 µs a call)
    sec.wrap(eng.kv, "allocate", "page_alloc", time.perf_counter)
    sec.wrap(eng, "_launch", "launch_total")
    sec.wrap(eng.runner, "dispatch", "dispatch_total")
    sec.wrap(eng.scheduler, "update", "update")
    sec.wrap(eng, "_finish_step", "finish_total")
    sec.wrap(eng, "step", "step")
    sec.split_wait(eng.runner)


def split(t: dict) -> dict:
    """Exclusive section times from the nested totals."""
    return dict(schedule=t["schedule_total"] - t["page_alloc"], page_alloc=t["page_alloc"],
                seq_inputs=t["launch_total"] - t["dispatch_total"], pack=t["pack"],
                dispatch=t["dispatch_total"] - t["pack"], wait=t["wait"], fetch=t["fetch"], update=t["update"],
                outputs=t["finish_total"] - t["fetch"] - t["wait_cpu"] - t["update"], gc=t["gc"],
                wait_cpu=t["wait_cpu"])


def run(llm, batch: int, steps: int, prompt_len: int, stream: bool, instrumented: bool, tag: str,
        kind: str = "CUMULATIVE") -> dict:
    """Admit `batch` requests, step until all decode, then time `steps` pure decode steps."""
    eng = llm.engine
    sp = SamplingParams(max_tokens=steps + 64, temperature=0.0, ignore_eos=True,  # + admission / chunked prefill
                        output_kind=kind)
    for i in range(batch):
        eng.add_request(f"{tag}-{batch}-{i}", [(7 * i + j) % 500 + 3 for j in range(prompt_len)], sp, stream=stream)
    with startup_objects_frozen():  # as LLM.generate does
        return _steps(eng, batch, steps, instrumented)


def _steps(eng, batch, steps, instrumented):
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.running) or eng.scheduler.waiting:
        eng.step()
    for _ in range(3):  # pipelined steady state
        eng.step()
    sec = eng._probe_sections
    sec.t.clear()
    sec.on = instrumented
    t0, c0, thr0 = time.perf_counter(), CLOCK(), eng.runner.call_thread_cpu_s
    for _ in range(steps):
        eng.step()
        assert eng.scheduler.num_running == batch, "a request finished or was preempted inside the timed steps"
    wall, cpu, thr = time.perf_counter() - t0, CLOCK() - c0, eng.runner.call_thread_cpu_s - thr0
    sec.on = False
    while eng.has_unfinished():
        eng.step()
    return dict(wall=wall, cpu=cpu, call_thread=thr, **(split(sec.t) if instrumented else {}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, nargs="+", default=None, help="default 1 64 256; --speculative: 1 8 32")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--scenarios", nargs="+", default=None,
                    help="the scenarios to run, in this order, repeats allowed (default: all that apply, offline "
                         "first); 12-07 i's H100 run had its first scenario's sections twice the second's")
    ap.add_argument("--prompt-len", type=int, default=20)
    ap.add_argument("--no-tokenizer", action="store_true", help="only the offline scenario without a tokenizer")
    ap.add_argument("--speculative", action="store_true",
                    help="speculative steps instead (oracle drafts of acceptance --accept, free and from a draft)")
    ap.add_argument("--k", type=int, default=4, help="--speculative: drafts per request per step")
    ap.add_argument("--accept", type=float, default=0.7, help="--speculative: the oracle's per-draft agreement")
    ap.add_argument("--spec-drafts", nargs="+", default=["oracle", "draft"], choices=["oracle", "draft"],
                    help="--speculative: free oracle drafts, and/or a tiny-llama draft model run for its cost")
    ap.add_argument("--repeat", type=int, default=3,
                    help="--speculative: runs per configuration (the fastest is reported)")
    ap.add_argument("--draft-model", default="tiny-llama", help="--speculative: the draft's preset (random weights)")
    ap.add_argument("--per-step-drafts", action="store_true",
                    help="--speculative: the draft model's k steps as k dispatches (not fused into one program)")
    ap.add_argument("--tag", default="", help="appended to the result file's name")
    ap.add_argument("--general-loop", action="store_true",
                    help="A/B: every step through the scheduler's general loop (no columnar decode run, "
                         "engine/decode_run.py)")
    ap.add_argument("--device-put-inputs", action="store_true",
                    help="A/B: jax.device_put the packed inputs before the call (the transfer before 2026-12-05)")
    ap.add_argument("--early-host-copy", action=argparse.BooleanOptionalAction, default=True,
                    help="start the copy of a step's results to the host at dispatch, not in fetch "
                         "(ModelRunner.early_host_copy: on by default since 2026-12-05 e; --no-early-host-copy: A/B)")
    ap.add_argument("--stage-inputs", action=argparse.BooleanOptionalAction, default=True,
                    help="the step copies its inputs into donated fixed-address buffers (ModelRunner.stage_inputs, "
                         "runner/step.stage_inputs; on by default since 2026-12-06; --no-stage-inputs: A/B)")
    ap.add_argument("--call-thread", action=argparse.BooleanOptionalAction, default=None,
                    help="the compiled call on a worker thread (ModelRunner.call_thread, runner/call_thread.py; "
                         "default: JAXINFER_CALL_THREAD, else on with a GPU); its CPU time is the column call_thr, "
                         "not in host")
    # --model: on a GPU, llama3-8b shows the host sections beside the real device time ('wait')
    add_engine_flags(ap, model="tiny-llama", load_format="dummy", max_num_batched_tokens=512)
    a = ap.parse_args()
    if a.speculative:
        a.batch = a.batch or [1, 8, 32]
        from benchmarks.probes import spec_step_cost

        rows = spec_step_cost.main(a, Sections)
        path = write_result("host-step-cost-spec", dict(model=f"{a.model} ({a.load_format})", prompt_len=a.prompt_len,
                                                        k=a.k, accept=a.accept, draft_model=a.draft_model,
                                                        rows=rows,
                                                        fused_draft_steps=not a.per_step_drafts), tag=a.tag)
        print("wrote", path)
        return
    a.batch = a.batch or [1, 64, 256]

    model_runner_mod.ModelRunner.stage_inputs = a.stage_inputs  # (read when a runner builds its step)
    if a.call_thread is not None:
        model_runner_mod.ModelRunner.call_thread = a.call_thread
    max_len = max(128, a.prompt_len + a.steps + 64)
    config = engine_config(a, max_model_len=max_len, max_num_seqs=max(a.batch))
    llms = {"offline": LLM(config=config, progress=False)}
    llms["stream"] = llms["offline"]
    if not a.no_tokenizer:
        from jaxinfer.weights.default_model import default_model_path

        tok_llm = LLM(config=config, tokenizer=default_model_path(), progress=False)
        llms["offline+tok"] = llms["stream+tok"] = llms["delta+tok"] = tok_llm
    for llm in set(llms.values()):  # no background compile beside the timed steps
        llm.runner.finish_background_compiles()
        llm.engine.scheduler.columnar = not a.general_loop
        llm.runner.device_put_inputs = a.device_put_inputs
        llm.runner.early_host_copy = a.early_host_copy
    sec = Sections()  # one for all engines: the module-level pack is wrapped once
    sec.wrap(model_runner_mod, "pack", "pack")  # the names dispatch calls (pack_step: from the engine's StepBatch)
    if hasattr(model_runner_mod, "pack_step"):
        sec.wrap(model_runner_mod, "pack_step", "pack")
    for llm in set(llms.values()):
        llm.engine._probe_sections = sec
        instrument(llm.engine, sec)

    rows = []
    hdr = (f"{'scenario':12s} {'batch':>5s} | " + " ".join(f"{s:>10s}" for s in SECTIONS)
           + f" | {'host/step':>9s} {'host/req':>8s} {'uninstr':>8s} {'wall/step':>9s} {'call_thr':>8s}")
    print("µs per step (host/req: host µs per running request per step; uninstr: host/req without the timers; "
          "wall/step: wall time of an uninstrumented step; wait is wall time too; call_thr: CPU time of the call "
          "thread, --call-thread)")
    print(hdr)
    unknown = set(a.scenarios or ()) - set(llms)
    if unknown:
        raise SystemExit(f"--scenarios: {sorted(unknown)} not available here (have {list(llms)}; the +tok ones need "
                         "a run without --no-tokenizer)")
    for scen in a.scenarios or list(llms):
        llm = llms[scen]
        stream = scen.startswith(("stream", "delta"))
        kind = "DELTA" if scen.startswith("delta") else "CUMULATIVE"
        for b in a.batch:
            plain = run(llm, b, a.steps, a.prompt_len, stream, False, scen + "p", kind)
            r = run(llm, b, a.steps, a.prompt_len, stream, True, scen, kind)
            us = {k: 1e6 * r[k] / a.steps for k in SECTIONS}
            # host = CPU time of the engine thread, less what it spent blocked on the device (the uninstrumented run's
            # blocked CPU is estimated by the instrumented run's)
            host = 1e6 * (r["cpu"] - r["wait_cpu"]) / a.steps
            host_plain = 1e6 * (plain["cpu"] - r["wait_cpu"]) / a.steps
            row = dict(scenario=scen, batch=b, steps=a.steps, **{f"{k}_us": us[k] for k in SECTIONS},
                       host_us_per_step=host, host_us_per_req=host / b, host_us_per_req_uninstrumented=host_plain / b,
                       wall_ms_per_step=1e3 * plain["wall"] / a.steps,
                       call_thread_us_per_step=1e6 * r["call_thread"] / a.steps)
            rows.append(row)
            print(f"{scen:12s} {b:5d} | " + " ".join(f"{us[k]:10.1f}" for k in SECTIONS)
                  + f" | {host:9.1f} {host / b:8.2f} {host_plain / b:8.2f} {1e6 * plain['wall'] / a.steps:9.1f}"
                  f" {1e6 * r['call_thread'] / a.steps:8.1f}")
    marginal = {}
    for scen in llms:
        by_b = {r["batch"]: r["host_us_per_step"] for r in rows if r["scenario"] == scen}
        if len(by_b) > 1:
            lo, hi = min(by_b), max(by_b)
            marginal[scen] = (by_b[hi] - by_b[lo]) / (hi - lo)
            print(f"{scen}: marginal host cost {marginal[scen]:.2f} µs per extra running request per step "
                  f"(batch {lo} -> {hi})")
    path = write_result("host-step-cost", dict(model=f"{a.model} ({a.load_format})", prompt_len=a.prompt_len,
                                               general_loop=a.general_loop, device_put_inputs=a.device_put_inputs,
                                               early_host_copy=a.early_host_copy, stage_inputs=a.stage_inputs,
                                               call_thread=wanted(model_runner_mod.ModelRunner.call_thread,
                                                                  jax.default_backend()),
                                               marginal_us_per_req=marginal,
                                               max_model_len=max_len, page_size=16, rows=rows), tag=a.tag)
    print("wrote", path)


if __name__ == "__main__":
    main()
