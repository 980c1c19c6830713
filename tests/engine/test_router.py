"""DataParallelEngine routing, with exact assertions: host code only, replicas replaced by scripted engines."""
import dataclasses

import pytest

from jaxinfer.engine.router import DataParallelEngine


@dataclasses.dataclass
class _Out:
    request_id: str
    finished: bool


class _Replica:
    """Finishes a request after `steps[prompt]` of its steps; records what it was given."""

    def __init__(self):
        self.tokenizer, self.max_model_len = None, 128
        self.live: dict[str, int] = {}
        self.added, self.aborted = [], []
        self.scheduler = dataclasses.make_dataclass("S", ["num_running", "num_waiting", "max_num_seqs"])(0, 0, 8)
        self.kv = dataclasses.make_dataclass("K", ["num_usable_pages", "num_used_pages"])(100, 0)

    def add_request(self, rid, prompt, params=None, *, stream=True):
        if prompt == "bad":
            raise ValueError("bad prompt")
        self.live[rid] = prompt
        self.added.append(rid)
        return rid

    def abort(self, rid):
        self.aborted.append(rid)
        return self.live.pop(rid, None) is not None

    def has_unfinished(self):
        return bool(self.live)

    def step(self):
        outs = []
        for rid in list(self.live):
            self.live[rid] -= 1
            outs.append(_Out(rid, self.live[rid] == 0))
            if self.live[rid] == 0:
                del self.live[rid]
        return outs


def test_least_loaded_routing_follows_finishes_and_aborts():
    reps = [_Replica(), _Replica(), _Replica()]
    eng = DataParallelEngine(reps)
    ids = [eng.add_request(None, 1), eng.add_request(None, 3), eng.add_request(None, 3), eng.add_request(None, 3)]
    assert ids == ["0", "1", "2", "3"]
    assert [r.added for r in reps] == [["0", "3"], ["1"], ["2"]]  # ties -> lowest index
    assert eng.replica_loads() == [2, 1, 1]
    outs = eng.step()  # request 0 (1 step) finishes on replica 0
    assert [o.request_id for o in outs if o.finished] == ["0"]
    assert eng.replica_loads() == [1, 1, 1]
    assert eng.abort("2") and reps[2].aborted == ["2"] and eng.replica_loads() == [1, 1, 0]
    assert not eng.abort("2")  # unknown / already gone
    assert eng.add_request("mine", 2) == "mine" and reps[2].added == ["2", "mine"]
    with pytest.raises(ValueError, match="already in use"):
        eng.add_request("mine", 2)
    with pytest.raises(ValueError, match="bad prompt"):  # the replica's error; nothing recorded
        eng.add_request(None, "bad")
    assert eng.replica_loads() == [1, 1, 1]
    while eng.has_unfinished():
        eng.step()
    assert eng.replica_loads() == [0, 0, 0]
    assert eng.scheduler.max_num_seqs == 24 and eng.kv.num_usable_pages == 300
