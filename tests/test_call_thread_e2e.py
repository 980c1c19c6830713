"""The engine's exactness tests again with every compiled call on the call thread (runner/call_thread.py: on by
default with a GPU; the rest of the suite runs on the CPU, where calls stay inline).

The tests below are the functions and fixtures of tests/test_engine_e2e.py (continuous batching equals solo
decoding, preemption, aborts that free pages, n samples and logprobs, bad requests that leave the engine serving)
and tests/test_spec_pipelined.py (pipelined speculative steps with stop tokens, max_tokens, preemption and an abort
with a step in flight equal plain decoding, no page leaked; draft-model and layer-skip cycles), imported: collected
here, they run in this module, whose module-scoped autouse fixture turns the thread on for steps of any size before
the module's engines are built (pytest sets up autouse fixtures first within a scope).
tests/runner/test_call_thread.py compares threaded and inline engines token for token."""
import sys

import pytest

from jaxinfer.runner.model_runner import ModelRunner
from tests.test_engine_e2e import (llm, test_abort_frees_pages, test_bad_requests_leave_engine_serving,  # noqa: F401
                                   test_continuous_batching_equals_solo, test_n_samples_and_logprobs,
                                   test_preemption_keeps_outputs)
from tests.test_spec_pipelined import (base, spec_llm, test_draft_model_cycles_are_pipelined,  # noqa: F401
                                       test_pipelined_greedy_identical_to_plain)

__all__ = ["llm", "base", "spec_llm", "test_abort_frees_pages", "test_bad_requests_leave_engine_serving",
           "test_continuous_batching_equals_solo", "test_n_samples_and_logprobs", "test_preemption_keeps_outputs",
           "test_pipelined_greedy_identical_to_plain",
           "test_draft_model_cycles_are_pipelined"]  # (collected here; the fixtures are used by name)


@pytest.fixture(scope="module", autouse=True)
def every_call_threaded():
    before = sys.getswitchinterval()  # (a CallThread lowers it at its first call)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ModelRunner, "call_thread", True)
        mp.setattr(ModelRunner, "call_thread_min_tokens", 1)
        yield
    sys.setswitchinterval(before)


def test_the_engines_here_call_on_the_thread(llm, spec_llm):  # noqa: F811 (the imported fixtures)
    for engine in (llm, spec_llm):
        calls = engine.runner._calls
        assert calls is not None
        before = calls.num_calls
        engine.generate([[5, 6, 7]], use_tqdm=False)
        assert calls.num_calls > before
