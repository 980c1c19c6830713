"""runner/ngram_device.py: the device prompt lookup gives exactly the host proposer's drafts
(engine/ngram_proposer.ngram_propose, the reference) on random histories, and the pipelined proposal keeps its
history buffer equal to the true token sequence across accepted / rejected drafts."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

from jaxinfer.engine.ngram_proposer import NgramProposer, ngram_propose
from jaxinfer.runner.ngram_device import LOOKBACK, DeviceNgramProposer, ngram_lookup
from jaxinfer.runner.spec_carry import DRAFT, LAST, SHIFT, carry_width


def _check(histories, k, min_n, max_n, L=64, lookback=LOOKBACK):
    hist = np.full((len(histories), L), 7, np.int32)  # stale tokens after each history: must be ignored
    for i, h in enumerate(histories):
        hist[i, :len(h)] = h
    lengths = np.asarray([len(h) for h in histories], np.int32)
    d, found = ngram_lookup(jnp.asarray(hist), jnp.asarray(lengths), k, min_n, max_n, lookback)
    d, found = np.asarray(d), np.asarray(found)
    for i, h in enumerate(histories):
        want = ngram_propose(list(h), k, min_n, max_n, max_lookback=lookback)
        assert d[i, :found[i]].tolist() == want, (i, list(h))
        assert (d[i, found[i]:] == 0).all()


@pytest.mark.parametrize("vocab", [2, 3, 8, 50])
@pytest.mark.parametrize("sizes", [(1, 4), (2, 3), (3, 3), (1, 1)])
def test_lookup_equals_host_on_random_histories(vocab, sizes):
    rng = np.random.default_rng(vocab * 10 + sizes[0])
    hs = [rng.integers(0, vocab, size=int(rng.integers(1, 64))).tolist() for _ in range(40)]
    _check(hs, 4, *sizes)
    _check(hs, 1, *sizes)


def test_lookup_edge_cases():
    hs = [
        [5],                        # one token: n-gram sizes > history length
        [5, 6],                     # no match
        [5, 5],                     # 1-gram match, one token follows (the tail itself)
        [1, 2, 3, 4],               # no match anywhere
        [1, 2, 3, 1, 2, 3],         # match of 3; drafts reach the very end
        [9, 1, 2, 8, 1, 2, 7, 1, 2],  # several matches: the most recent wins
        [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4],  # 4-gram match, k tokens follow
        [4, 1, 2, 3, 9, 9, 1, 2, 3, 5, 2, 3],  # longest n first (3-gram absent, 2-gram "2 3" at two places)
        [3, 3, 3, 3, 3, 3],         # overlapping matches, match ending right before the tail
    ]
    for k in (1, 3, 6):
        _check(hs, k, 1, 4)
        _check(hs, k, 2, 4)
        _check(hs, k, 4, 5)


def test_lookup_lookback():
    rng = np.random.default_rng(3)
    hs = [rng.integers(0, 4, size=60).tolist() for _ in range(20)] + [[1, 2, 3] + [9] * 20 + [1, 2]]
    _check(hs, 3, 1, 3, lookback=10)


@dataclasses.dataclass
class _Flight:
    carry: object


def test_pipelined_history_tracks_true_tokens():
    """Drive propose_device as the engine does (one step in flight, worst-case base, the carry's shift) with random
    acceptance; each call's drafts must equal the host proposer's on the true sequence."""
    rng = np.random.default_rng(0)
    K, M, L = 3, 4, 96
    prop = DeviceNgramProposer(NgramProposer(1, 3), M, L, K)
    seqs = {f"r{i}": rng.integers(0, 4, size=int(rng.integers(2, 12))).tolist() for i in range(3)}
    known = {rid: len(t) for rid, t in seqs.items()}  # tokens the host knows (the rest: the step in flight)
    k_n = {rid: 0 for rid in seqs}  # drafts the step in flight verifies (first: a decode of one token)
    for rid, t in seqs.items():  # the step in flight emits one token each
        t.append(int(rng.integers(0, 4)))
    drafts_n = {rid: [] for rid in seqs}
    for step in range(12):
        carry = np.zeros((M, carry_width(K)), np.int32)
        todo = []
        for row, (rid, t) in enumerate(seqs.items()):
            shift = int(k_n[rid] - (len(t) - known[rid] - 1))
            carry[row, LAST], carry[row, SHIFT] = t[-1], shift
            base = len(t) + shift
            todo.append((rid, row, base, K, k_n[rid], lambda rid=rid: seqs[rid][:known[rid]]))
        out = np.asarray(prop.propose_device(_Flight(jnp.asarray(carry)), todo).carry)
        for row, (rid, t) in enumerate(seqs.items()):
            want = ngram_propose(t, K, 1, 3)
            got = out[row, DRAFT:].tolist()
            assert got[:len(want)] == want and all(x == 0 for x in got[len(want):]), (step, rid)
            # step n+1 (now in flight) verifies `got`: accept a random prefix, then one more token
            known[rid] = len(t)
            a = int(rng.integers(0, K + 1))
            t += got[:a] + [int(rng.integers(0, 4))]
            k_n[rid] = K
    assert prop.hist.shape == (M, L)
