"""Shared pieces of the pipelined-speculation e2e tests (tests/test_spec_pipelined.py,
tests/test_spec_ngram_pipelined.py)."""
from jaxinfer import SamplingParams


def greedy(m, stop=None):
    return SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True, stop_token_ids=stop)


def speculates(inputs) -> bool:
    """A dispatched step verifies drafts (inputs: the engine's StepBatch, or a list of SeqInput)."""
    num_spec = getattr(inputs, "num_spec", None)
    return bool(num_spec.any()) if num_spec is not None else any(i.num_spec for i in inputs)


def run_staggered(eng, prompts, max_tokens, stops, rng, victim_tokens: int, abort_at: int) -> dict:
    """Drive `eng` with requests r<i> arriving over the first steps (5 at once, then 0-2 a step) beside a request
    'victim' that is aborted at step `abort_at` with a step in flight. Returns {i: finished RequestOutput of r<i>}."""
    pending, done, step = list(range(len(prompts))), {}, 0
    eng.add_request("victim", prompts[0], greedy(victim_tokens))
    while pending or eng.has_unfinished():
        for _ in range(5 if step == 0 else int(rng.integers(0, 3))):
            if pending:
                i = pending.pop(0)
                eng.add_request(f"r{i}", prompts[i], greedy(max_tokens[i], stops.get(i)))
        for out in eng.step():
            if out.finished and out.request_id != "victim":
                done[int(out.request_id[1:])] = out
        step += 1
        if step == abort_at:
            assert eng.abort("victim")  # with a step in flight
    return done
