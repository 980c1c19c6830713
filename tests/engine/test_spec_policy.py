"""engine/spec_policy.py: the table lookup against hand-computed values, the cost model against the closed form,
and the decision's invariants (k in [0, k_max]; off whenever nothing beats 1 + margin)."""
import pytest

from jaxinfer.engine import spec_policy as sp


def test_tokens_per_cycle_is_the_geometric_sum():
    for a in (0.0, 0.3, 0.7, 0.95, 1.0):
        for k in (1, 4, 7):
            assert sp.tokens_per_cycle(a, k) == pytest.approx(sum(a ** i for i in range(k + 1)))


def test_measured_entries_and_interpolation(monkeypatch):
    # a fixed table, so the lookup rules are tested independently of the shipped measurements
    monkeypatch.setitem(sp.SPEEDUP, ("free", 4), {1: {0.5: None, 0.7: 1.907, 0.9: 2.824}, 8: {0.7: 1.4},
                                                  128: {0.7: 0.95}})
    assert sp.measured("free", 1, 0.7, 4) == pytest.approx(1.907)
    assert sp.measured("free", 1, 0.8, 4) == pytest.approx((1.907 + 2.824) / 2)  # linear between measurements
    assert sp.measured("free", 100, 0.7, 4) == pytest.approx(0.95)  # next table batch up: 128
    assert sp.measured("free", 200, 0.7, 4) is None  # past every measured batch
    assert sp.measured("host", 8, 0.7, 4) is None  # UNMEASURED row is no evidence
    assert sp.measured("free", 1, 0.6, 4) is None  # below the smallest measured acceptance
    assert sp.measured("free", 1, 0.95, 4) == pytest.approx(2.824)  # above the largest: the largest
    monkeypatch.setitem(sp.SPEEDUP, ("free", 2), {1: {0.5: 1.0, 0.9: 2.0, 0.7: None}})
    assert sp.measured("free", 1, 0.6, 2) == pytest.approx(1.25)


def test_estimate_matches_closed_form():
    k, a, b = 4, 0.7, 1
    want = sp.tokens_per_cycle(a, k) / sp.CYCLE_COST["model"]
    assert sp.estimate("model", b, a, k) == pytest.approx(want)
    assert sp.estimate("free", 64, a, k) < sp.estimate("free", 1, a, k)


def test_choose_uses_measurements_and_turns_off():
    p = sp.SpecPolicy("model")
    assert p.speedup(1, 0.7, 4) == (pytest.approx(1.202), True)
    assert p.choose(1, 0.7, 4) == 4   # the 1B-shaped draft pays at batch 1 ...
    assert p.choose(1, 0.5, 4) == 0   # ... unless its drafts are rejected too often (0.73x)
    assert p.choose(2, 0.9, 4) == 0   # above batch 1 it measured below 1x (batch 8: 0.65-0.99x)
    assert p.choose(32, 0.9, 4) == 0  # measured 0.65x there
    free = sp.SpecPolicy("free")
    assert free.choose(1, 0.7, 4) >= 1
    assert free.choose(1, 0.0, 4) == 0  # nothing is ever accepted: off
    assert sp.SpecPolicy("free", margin=10.0).choose(1, 0.99, 8) == 0
    for batch in (1, 8, 64, 128, 512):
        for a in (0.0, 0.5, 0.9, 1.0):
            k = free.choose(batch, a, 3)
            assert 0 <= k <= 3
            if k:
                assert free.speedup(batch, a, k)[0] > 1.05


def test_unknown_kind_is_an_error():
    with pytest.raises(ValueError, match="nope"):
        sp.SpecPolicy("nope")


def test_estimates_at_other_k_are_calibrated_by_a_measurement():
    free = sp.SpecPolicy("free")
    s3, is_measured = free.speedup(128, 0.7, 3)
    assert not is_measured
    want = sp.estimate("free", 128, 0.7, 3) * 0.949 / sp.estimate("free", 128, 0.7, 4)
    assert s3 == pytest.approx(want)
    assert free.choose(128, 0.7, 4) == 0  # measured 0.95x at k=4; the calibrated others stay below 1.05


class _NullProposer:
    """A proposer with no drafts (SpecControl's decisions are what these tests look at)."""

    def propose(self, seqs):
        return {}

    def rollback(self, rid, n):
        pass

    def free(self, rid):
        pass


def test_spec_control_follows_the_policy():
    from jaxinfer.engine.spec_control import SpecControl

    calls = []

    class Policy:
        def choose(self, batch, acceptance, k_max):
            calls.append((batch, acceptance, k_max))
            return 0 if batch > 4 else 2

    c = SpecControl(_NullProposer(), 4, 64, policy=Policy())
    assert c.active(3) and c._policy_k == 2
    assert not c.active(5) and c.stats.num_skipped_batch == 1
    assert [b for b, _, _ in calls] == [3, 5] and all(k == 4 for _, _, k in calls)
    assert calls[0][1] == pytest.approx(0.7, abs=1e-6) == calls[1][1]  # the prior: nothing verified yet
    for _ in range(8):
        c.record("a", 2, 1, 10)  # accepted/drafted 0.5
    c.active(1)
    # 16 drafts at rate 0.5 beside the prior's 16 (its rate at agreement 0.7), the latter decayed by two steps
    prior = (sp.tokens_per_cycle(0.7, 4) - 1) / 4
    rate = (8 + 16 * prior) / (16 + 16)
    assert calls[-1][0] == 1 and calls[-1][1] == pytest.approx(sp.agreement(rate, 4), abs=1e-6)


def test_policy_off_for_low_acceptance_tries_again():
    """A policy that switched speculation off because drafts were rejected gets no new evidence while off; the
    decayed evidence drifts back to the prior, so speculation is tried again, and turns off again if the drafts are
    still rejected (with lifetime counts it stayed off for good)."""
    from jaxinfer.engine.spec_control import SpecControl

    # batch 1: on at the prior (1.2x), off at a = 0.5
    c = SpecControl(_NullProposer(), 4, 64, policy=sp.SpecPolicy("model"))
    assert c.active(1)
    for _ in range(20):
        c.record("a", 4, 0, 10)  # every draft rejected
    assert not c.active(1)
    off = 1
    while not c.active(1):
        off += 1
        assert off < 200, "speculation never resumed"
    assert 10 < off < 200  # not at once: the evidence decays over tens of steps
    for _ in range(20):
        c.record("a", 4, 0, 10)
    assert not c.active(1)  # still rejected: off again
    for _ in range(40):
        c.record("a", 4, 4, 10)  # drafts accepted now
    assert c.active(1) and c._policy_k == 4


def test_agreement_inverts_the_rate():
    for a in (0.0, 0.2, 0.7, 0.9, 1.0):
        for k in (1, 4):
            rate = (sp.tokens_per_cycle(a, k) - 1) / k
            assert sp.agreement(rate, k) == pytest.approx(a, abs=1e-6)
    # the H200 run: nominal agreement 0.7 with k = 4 measured accepted/drafted 0.477
    assert sp.agreement(0.477, 4) == pytest.approx(0.7, abs=0.03)
