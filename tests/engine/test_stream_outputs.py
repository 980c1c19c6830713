"""The streaming outputs' fast path (engine/output_builder._single_outputs: groups of one sequence without logprobs
whose kind is CUMULATIVE or DELTA) against the general loop of build_outputs (`fast_outputs = False`), step by
step: two LLMEngines with a fake runner (tests/engine/test_step_continuation.PackingRunner: no jax) get the same
workload, mixed with what the fast path leaves to the general loop (n = 2, logprobs, prompt logprobs, FINAL_ONLY,
stream=False) so that both run in one step; with and without a tokenizer (texts, text deltas, stop strings). Every
field of every output must be equal (times: only whether set, and their order), and a CUMULATIVE output's token
ids must stay the snapshot of its step (never the request's list, which grows)."""
import random

import pytest

from jaxinfer.config.engine import SchedulerConfig
from jaxinfer.engine import output_builder
from jaxinfer.engine.engine import LLMEngine
from jaxinfer.sampling_params import RequestOutputKind, SamplingParams
from jaxinfer.tokenizer import Tokenizer
from tests.engine.test_detokenizer import _save, _train_byte_level
from tests.engine.test_step_continuation import PackingRunner

_KINDS = (RequestOutputKind.CUMULATIVE, RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return Tokenizer.from_pretrained(_save(_train_byte_level(), tmp_path_factory.mktemp("tok") / "byte"))


def _params(rng, i, text):
    kw = dict(temperature=rng.choice((0.0, 0.8)), seed=i, max_tokens=rng.randrange(5, 60),
              output_kind=_KINDS[0] if i % 3 == 0 else rng.choice(_KINDS))
    pick = rng.random()
    if pick < 0.1:
        kw["n"] = 2
    elif pick < 0.2:
        kw["logprobs"] = 1
    elif pick < 0.25:
        kw["prompt_logprobs"] = 1
    elif pick < 0.4:
        kw["stop_token_ids"] = [rng.randrange(3, 300) for _ in range(4)]
    if text and rng.random() < 0.4:
        kw["stop"] = [rng.choice(("e", "th", "o ", "an"))]
        kw["include_stop_str_in_output"] = rng.random() < 0.5
    return SamplingParams(**kw), rng.random() < 0.85


def _plain(o):
    """Everything an output carries, times replaced by whether they are set."""
    m = o.metrics
    times = [m["arrival_time"] is not None, m["first_token_time"] is not None, m["finished_time"] is not None,
             m["arrival_time"] <= m["first_token_time"]]
    return (o.request_id, o.prompt, list(o.prompt_token_ids), repr(o.prompt_logprobs), o.finished, o.error,
            sorted(m), times, [(c.index, c.text, type(c.token_ids), list(c.token_ids), round(c.cumulative_logprob, 5),
                                repr(c.logprobs), c.finish_reason, c.stop_reason, c.delta_text,
                                type(c.delta_token_ids), list(c.delta_token_ids)) for c in o.outputs])


def _drive(fast: bool, seed: int, tokenizer, monkeypatch):
    monkeypatch.setattr(output_builder, "fast_outputs", fast)
    runner = PackingRunner(400, 4, 24, 128, 120)
    eng = LLMEngine(runner, tokenizer, SchedulerConfig(max_num_batched_tokens=128, max_num_seqs=24),
                    max_model_len=120, eos_token_ids={2}, vocab_size=400)
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 300) for _ in range(rng.randrange(1, 20))] for _ in range(50)]
    nxt, log, kept, step = 0, [], [], 0
    while nxt < 16:
        sp, stream = _params(rng, nxt, tokenizer is not None)
        eng.add_request(f"r{nxt:02d}", prompts[nxt], sp, stream=stream)
        nxt += 1
    while eng.has_unfinished():
        outs = eng.step()
        log.append([_plain(o) for o in outs])
        kept.extend((c, list(c.token_ids)) for o in outs for c in o.outputs)
        step += 1
        if nxt < len(prompts) and rng.random() < 0.3:
            sp, stream = _params(rng, nxt, tokenizer is not None)
            eng.add_request(f"r{nxt:02d}", prompts[nxt], sp, stream=stream)
            nxt += 1
        if step in (9, 33):
            eng.abort(f"r{rng.randrange(nxt):02d}")
        assert step < 2000
    for c, ids in kept:  # no output's token ids changed after its step (a snapshot, or a delta of its own)
        assert c.token_ids == ids
    return log


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("with_tokenizer", [False, True])
def test_single_sequence_outputs_equal_the_general_loop(seed, with_tokenizer, tokenizer, monkeypatch):
    tok = tokenizer if with_tokenizer else None
    calls = []
    real = output_builder._single_outputs

    def counting(*a):
        calls.append(len(a[3]))
        return real(*a)

    monkeypatch.setattr(output_builder, "_single_outputs", counting)
    ref = _drive(False, seed, tok, monkeypatch)
    assert not calls
    fast = _drive(True, seed, tok, monkeypatch)
    assert sum(calls) > 200, sum(calls)  # the fast path ran, also beside the general loop
    assert len(fast) == len(ref)
    for k, (x, y) in enumerate(zip(fast, ref)):
        assert x == y, f"seed {seed} step {k}"
    assert sum(len(x) for x in ref) > 300
