"""SamplingParams: defaults, normalisation, and validation of every field (bad values and wrong types)."""
import dataclasses

import numpy as np
import pytest

from jaxinfer.sampling_params import MAX_LOGPROBS, RequestOutputKind, SamplingParams


def test_defaults_match_the_spec():
    p = SamplingParams()
    assert (p.n, p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (1, 16, 1.0, 1.0, -1, 0.0, None)
    assert p.stop == [] and p.stop_token_ids == [] and p.ignore_eos is False
    assert p.logprobs is None and p.prompt_logprobs is None
    assert (p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert p.skip_special_tokens is True and p.include_stop_str_in_output is False
    assert p.min_tokens == 0
    assert p.output_kind is RequestOutputKind.CUMULATIVE
    assert MAX_LOGPROBS == 20
    assert not p.greedy


def test_normalisation():
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=("a", "bc")).stop == ["a", "bc"]
    assert SamplingParams(stop_token_ids=(3, np.int64(7))).stop_token_ids == [3, 7]
    assert type(SamplingParams(stop_token_ids=[np.int32(5)]).stop_token_ids[0]) is int
    p = SamplingParams(temperature=np.float32(0.5), top_k=np.int64(40), max_tokens=np.int32(8), top_p=1)
    assert type(p.temperature) is float and p.temperature == 0.5
    assert type(p.top_k) is int and p.top_k == 40
    assert type(p.max_tokens) is int and type(p.top_p) is float
    assert SamplingParams(top_k=0).top_k == -1  # vLLM's other spelling of "off"
    assert SamplingParams(max_tokens=None).max_tokens is None
    assert SamplingParams(ignore_eos=np.bool_(True)).ignore_eos is True
    assert SamplingParams(temperature=0).greedy and SamplingParams(temperature=0.0).greedy
    # output_kind: the enum, or its name in any case
    assert SamplingParams(output_kind="delta").output_kind is RequestOutputKind.DELTA
    assert SamplingParams(output_kind="FINAL_ONLY").output_kind is RequestOutputKind.FINAL_ONLY
    assert SamplingParams(output_kind=RequestOutputKind.DELTA).output_kind is RequestOutputKind.DELTA


def test_stop_list_is_copied():
    stops = ["a"]
    p = SamplingParams(stop=stops)
    stops.append("b")
    assert p.stop == ["a"]


def test_boundaries_accepted():
    SamplingParams(n=1, max_tokens=1, temperature=0.0, top_p=1.0, top_k=1, min_p=0.0)
    SamplingParams(top_p=1e-6, top_k=50_000, min_p=1.0, seed=0, logprobs=0, prompt_logprobs=MAX_LOGPROBS)
    SamplingParams(presence_penalty=-2, frequency_penalty=2, repetition_penalty=2.0, seed=2**40)
    SamplingParams(presence_penalty=2, frequency_penalty=-2, repetition_penalty=1e-3, seed=-1)
    SamplingParams(logprobs=MAX_LOGPROBS, min_tokens=16, max_tokens=16)
    SamplingParams(min_tokens=1000, max_tokens=None)


BAD_VALUES = [
    ("n", 0, "n must be >= 1 (and <= 2147483647), got 0"),
    ("n", -3, "n must be >= 1"),
    ("max_tokens", 0, "max_tokens must be >= 1 (and <= 2147483647) or None, got 0"),
    ("max_tokens", -1, "max_tokens must be >= 1"),
    ("temperature", -0.5, "temperature must be >= 0 (0 means greedy), got -0.5"),
    ("temperature", float("inf"), "temperature must be >= 0"),
    ("temperature", float("nan"), "temperature"),
    ("top_p", 1.5, "top_p must be in (0, 1], got 1.5"),
    ("top_p", 0.0, "top_p must be in (0, 1], got 0.0"),
    ("top_p", -0.1, "top_p must be in (0, 1]"),
    ("top_p", float("nan"), "top_p"),
    ("top_k", -2, "top_k must be -1 (off) or in [1, 2147483647] (it is int32 on the device), got -2"),
    ("min_p", -0.01, "min_p must be in [0, 1], got -0.01"),
    ("min_p", 1.01, "min_p must be in [0, 1]"),
    ("stop", [""], "stop[0] is an empty string"),
    ("stop", "", "stop[0] is an empty string"),
    ("stop", ["ok", ""], "stop[1] is an empty string"),
    ("stop_token_ids", [-1], "stop_token_ids[0] must be a token id >= 0 (and <= 2147483647), got -1"),
    ("logprobs", -1, "logprobs must be in [0, 20] or None, got -1"),
    ("logprobs", MAX_LOGPROBS + 1, "logprobs must be in [0, 20] or None, got 21"),
    ("prompt_logprobs", 21, "prompt_logprobs must be in [0, 20]"),
    ("prompt_logprobs", -1, "prompt_logprobs must be in [0, 20]"),
    ("presence_penalty", 2.5, "presence_penalty must be in [-2, 2], got 2.5"),
    ("presence_penalty", -2.01, "presence_penalty must be in [-2, 2]"),
    ("frequency_penalty", -3, "frequency_penalty must be in [-2, 2], got -3.0"),
    ("repetition_penalty", 0.0, "repetition_penalty must be in (0, 2], got 0.0"),
    ("repetition_penalty", 2.5, "repetition_penalty must be in (0, 2]"),
    ("min_tokens", -1, "min_tokens must be >= 0"),
    # integers past int32 would fail the whole batch's step when packed (issue 18): refused here
    ("top_k", 2**31, "top_k must be -1 (off) or in [1, 2147483647]"),
    ("top_k", -2**63, "top_k must be -1 (off) or in [1, 2147483647]"),
    ("n", 2**31, "n must be >= 1 (and <= 2147483647)"),
    ("max_tokens", 2**31, "max_tokens must be >= 1 (and <= 2147483647)"),
    ("min_tokens", 2**40, "min_tokens must be >= 0 (and <= 2147483647)"),
    ("stop_token_ids", [5, 2**31], "stop_token_ids[1] must be a token id >= 0 (and <= 2147483647)"),
    ("temperature", 1e39, "temperature must be >= 0"),
    ("top_p", 1e-40, "top_p must be in (0, 1]"),
    ("output_kind", "deltas", "output_kind must be one of CUMULATIVE, DELTA, FINAL_ONLY"),
]


@pytest.mark.parametrize("field,value,message", BAD_VALUES, ids=[f"{f}={v!r}" for f, v, _ in BAD_VALUES])
def test_bad_values_raise_value_error_naming_the_field(field, value, message):
    with pytest.raises(ValueError) as e:
        SamplingParams(**{field: value})
    assert message in str(e.value)
    assert field in str(e.value)


def test_min_tokens_above_max_tokens():
    with pytest.raises(ValueError, match="min_tokens must be <= max_tokens"):
        SamplingParams(min_tokens=17, max_tokens=16)


WRONG_TYPES = [
    ("n", 2.0), ("n", "2"), ("n", True), ("n", None),
    ("max_tokens", 16.0), ("max_tokens", "16"), ("max_tokens", False),
    ("temperature", "hot"), ("temperature", None), ("temperature", True), ("temperature", [0.5]),
    ("top_p", "0.9"), ("top_p", None),
    ("top_k", 2.5), ("top_k", "40"), ("top_k", None), ("top_k", True),
    ("min_p", "0"), ("min_p", None),
    ("seed", 1.5), ("seed", "42"), ("seed", True),
    ("stop", 5), ("stop", [5]), ("stop", ["ok", None]), ("stop", b"stop"), ("stop", {"a": 1}),
    ("stop_token_ids", 5), ("stop_token_ids", [1.5]), ("stop_token_ids", ["1"]), ("stop_token_ids", "12"),
    ("stop_token_ids", [True]),
    ("ignore_eos", 1), ("ignore_eos", "false"), ("ignore_eos", None),
    ("logprobs", 1.0), ("logprobs", "5"), ("logprobs", True),
    ("prompt_logprobs", 2.0),
    ("presence_penalty", "0"), ("frequency_penalty", None), ("repetition_penalty", "1"),
    ("skip_special_tokens", 0), ("skip_special_tokens", "yes"),
    ("include_stop_str_in_output", 1),
    ("min_tokens", 1.0), ("min_tokens", None),
    ("output_kind", 1), ("output_kind", None), ("output_kind", True),
]


@pytest.mark.parametrize("field,value", WRONG_TYPES, ids=[f"{f}={v!r}" for f, v in WRONG_TYPES])
def test_wrong_types_raise_naming_the_field(field, value):
    with pytest.raises((TypeError, ValueError)) as e:
        SamplingParams(**{field: value})
    # the message names the field (or the offending element of a list field)
    assert field in str(e.value)


def test_every_field_is_validated():
    """Each dataclass field appears in BAD_VALUES or WRONG_TYPES, so a new field cannot go unchecked silently."""
    checked = {f for f, *_ in BAD_VALUES} | {f for f, *_ in WRONG_TYPES}
    assert {f.name for f in dataclasses.fields(SamplingParams)} <= checked


def test_clone_validates_and_copies():
    p = SamplingParams(temperature=0.7, stop=["x"], stop_token_ids=[5], seed=1)
    q = p.clone(temperature=0.0, max_tokens=None)
    assert q.greedy and q.max_tokens is None and q.seed == 1 and q.stop == ["x"]
    assert p.temperature == 0.7 and p.max_tokens == 16  # original untouched
    q.stop.append("y")
    q.stop_token_ids.append(6)
    assert p.stop == ["x"] and p.stop_token_ids == [5]  # no shared lists
    with pytest.raises(ValueError, match="top_p must be in"):
        p.clone(top_p=2.0)
    with pytest.raises(TypeError):
        p.clone(no_such_field=1)
    assert p.clone() == p
