"""Scheduler: exact batches for chunked prefill, decode priority, max_num_seqs, FIFO admission, preemption,
abort, stop conditions and admission errors. Pure host code: every test runs in milliseconds."""

from dataclasses import dataclass

import pytest

from jaxinfer.engine.kv_cache import KVCacheManager
from jaxinfer.engine.request import Request, RequestStatus
from jaxinfer.engine.scheduler import Scheduler, SchedulerOutput

EOS = 2
TOK = 7  # default sampled token (not eos)


@dataclass
class SP:  # the three fields the scheduler reads from SamplingParams (+ optional min_tokens)
    max_tokens: int | None = 16
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    min_tokens: int = 0


def make(num_pages=64, page_size=4, budget=128, max_seqs=8, max_model_len=1024, threshold=None):
    kv = KVCacheManager(num_pages, page_size)
    return Scheduler(kv, max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len=max_model_len,
                     eos_token_ids={EOS}, long_prefill_token_threshold=threshold)


def req(rid, n_prompt, max_tokens=16, **kw):
    return Request(rid, list(range(100, 100 + n_prompt)), SP(max_tokens, **kw))


def step(s: Scheduler, tokens=None) -> tuple[SchedulerOutput, list[Request]]:
    """schedule + update, sampling tokens[rid] (a list) or [TOK] for every seq with sample=True."""
    out = s.schedule()
    tokens = tokens or {}
    sampled = {q.request_id: list(tokens.get(q.request_id, [TOK])) for q in out.scheduled if q.sample}
    return out, s.update(out, sampled)


def summary(out):
    """(request_id, start_pos, n, sample) per scheduled seq."""
    return [(q.request_id, q.start_pos, q.num_tokens, q.sample) for q in out.scheduled]


# ---- basic flow ------------------------------------------------------------------------------------
def test_prefill_then_decode_exact_batches():
    s = make(page_size=4)
    r = req("a", 10)
    s.add_request(r)
    assert r.arrival_index == 0 and s.num_waiting == 1 and s.has_unfinished()

    out, fin = step(s)
    (q,) = out.scheduled
    assert (q.request_id, q.token_ids, q.start_pos, q.page_table, q.sample, q.is_prefill) == (
        "a", list(range(100, 110)), 0, [1, 2, 3], True, True)
    assert out.num_batched_tokens == 10 and out.preempted_ids == [] and fin == []
    assert r.status is RequestStatus.RUNNING and r.num_computed_tokens == 10 and r.output_token_ids == [TOK]

    out, _ = step(s, {"a": [11]})
    (q,) = out.scheduled
    assert (q.token_ids, q.start_pos, q.page_table, q.sample, q.is_prefill) == ([TOK], 10, [1, 2, 3], True, False)
    out, _ = step(s, {"a": [12]})
    assert out.scheduled[0].token_ids == [11] and out.scheduled[0].start_pos == 11
    out, _ = step(s)
    assert out.scheduled[0].token_ids == [12] and out.scheduled[0].page_table == [1, 2, 3, 4]  # 13th token
    assert r.output_token_ids == [TOK, 11, 12, TOK] and r.num_computed_tokens == 13


def test_chunked_prefill_300_tokens_with_budget_128_while_decodes_continue():
    s = make(num_pages=200, page_size=4, budget=128)
    s.add_request(req("d1", 5, max_tokens=100))
    s.add_request(req("d2", 5, max_tokens=100))
    out, _ = step(s)
    assert summary(out) == [("d1", 0, 5, True), ("d2", 0, 5, True)]
    s.add_request(req("long", 300, max_tokens=10))

    out, _ = step(s)
    assert summary(out) == [("d1", 5, 1, True), ("d2", 5, 1, True), ("long", 0, 126, False)]
    assert out.num_batched_tokens == 128
    assert out.scheduled[2].token_ids == list(range(100, 226)) and out.scheduled[2].is_prefill
    assert len(out.scheduled[2].page_table) == 32  # ceil(126 / 4)
    assert s.get("long").output_token_ids == []

    out, _ = step(s)
    assert summary(out) == [("d1", 6, 1, True), ("d2", 6, 1, True), ("long", 126, 126, False)]
    out, _ = step(s, {"long": [55]})
    assert summary(out) == [("d1", 7, 1, True), ("d2", 7, 1, True), ("long", 252, 48, True)]
    assert out.num_batched_tokens == 50 and s.get("long").output_token_ids == [55]
    out, _ = step(s)
    assert summary(out) == [("d1", 8, 1, True), ("d2", 8, 1, True), ("long", 300, 1, True)]
    assert out.scheduled[2].token_ids == [55] and not out.scheduled[2].is_prefill


def test_waiting_requests_share_the_budget_fifo():
    s = make(budget=16)
    for rid, n in (("a", 10), ("b", 10), ("c", 3)):
        s.add_request(req(rid, n))
    out, _ = step(s)
    assert summary(out) == [("a", 0, 10, True), ("b", 0, 6, False)]   # budget exhausted: c waits
    assert [r.request_id for r in s.waiting] == ["c"]
    out, _ = step(s)
    assert summary(out) == [("a", 10, 1, True), ("b", 6, 4, True), ("c", 0, 3, True)]


def test_long_prefill_token_threshold_caps_one_requests_chunk():
    s = make(budget=128, threshold=32)
    s.add_request(req("a", 100))
    s.add_request(req("b", 10))
    assert summary(step(s)[0]) == [("a", 0, 32, False), ("b", 0, 10, True)]
    assert summary(step(s)[0]) == [("a", 32, 32, False), ("b", 10, 1, True)]
    assert summary(step(s)[0]) == [("a", 64, 32, False), ("b", 11, 1, True)]
    assert summary(step(s)[0]) == [("a", 96, 4, True), ("b", 12, 1, True)]


def test_max_num_seqs_respected():
    s = make(max_seqs=2)
    for i in range(4):
        s.add_request(req(f"r{i}", 3, max_tokens=2))
    out, _ = step(s)
    assert [q.request_id for q in out.scheduled] == ["r0", "r1"] and s.num_running == 2 and s.num_waiting == 2
    out, fin = step(s)
    assert [q.request_id for q in out.scheduled] == ["r0", "r1"]
    assert [r.request_id for r in fin] == ["r0", "r1"] and all(r.finish_reason == "length" for r in fin)
    out, _ = step(s)
    assert [q.request_id for q in out.scheduled] == ["r2", "r3"]
    assert out.finished_ids == ["r0", "r1"]


def test_fifo_admission_never_skips_the_head():
    s = make(num_pages=5, page_size=4)              # 4 usable pages
    s.add_request(req("a", 8, max_tokens=4))         # 2 pages now
    s.add_request(req("b", 12, max_tokens=4))        # needs 3 pages, only 2 left
    s.add_request(req("c", 1, max_tokens=1))         # would fit, but must not jump ahead of b
    out, _ = step(s)
    assert [q.request_id for q in out.scheduled] == ["a"]
    assert [r.request_id for r in s.waiting] == ["b", "c"]
    assert s.kv.num_free_pages == 2


# ---- preemption ------------------------------------------------------------------------------------
def test_preempts_most_recently_started_and_it_comes_back_first_with_outputs():
    s = make(num_pages=5, page_size=4, max_seqs=2)   # 4 usable pages of 4 tokens
    s.add_request(req("A", 4, max_tokens=8))
    s.add_request(req("B", 4, max_tokens=8))
    s.add_request(req("C", 4, max_tokens=1))         # waits: max_num_seqs=2
    n = iter(range(10, 1000))
    def tok(out):
        return {q.request_id: [next(n)] for q in out}

    for _ in range(5):  # A and B each compute 8 tokens (2 pages each: cache full) and hold 5 outputs
        out = s.schedule()
        assert [q.request_id for q in out.scheduled] == ["A", "B"]
        s.update(out, tok(out.scheduled))
    b = s.get("B")
    assert s.kv.num_free_pages == 0 and s.kv.page_table("A") == [1, 3] and s.kv.page_table("B") == [2, 4]
    b_outputs = list(b.output_token_ids)
    assert len(b_outputs) == 5

    out = s.schedule()  # A needs a 3rd page -> B (last started) is preempted
    assert summary(out) == [("A", 8, 1, True)] and out.preempted_ids == ["B"]
    assert out.scheduled[0].page_table == [1, 3, 4]
    assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert b.output_token_ids == b_outputs and s.kv.page_table("B") == []
    assert [r.request_id for r in s.waiting] == ["B", "C"]  # front of the queue, ahead of C
    assert s.stats().num_preemptions_total == 1
    s.update(out, tok(out.scheduled))

    fin = []
    while not fin:  # B needs 3 pages to recompute 9 tokens, only 1 free: A runs alone until it finishes
        out = s.schedule()
        assert [q.request_id for q in out.scheduled] == ["A"]
        fin = s.update(out, tok(out.scheduled))
    assert fin[0].request_id == "A" and len(fin[0].output_token_ids) == 8

    out = s.schedule()  # B recomputes prompt + its 5 kept outputs, then C is admitted
    assert summary(out) == [("B", 0, 9, True), ("C", 0, 4, True)]
    assert out.scheduled[0].token_ids == [100, 101, 102, 103] + b_outputs
    assert out.scheduled[0].is_prefill
    s.update(out, tok(out.scheduled))
    assert b.status is RequestStatus.RUNNING and len(b.output_token_ids) == 6


def test_last_running_request_preempts_itself():
    s = make(num_pages=5, page_size=4)
    s.add_request(req("A", 8, max_tokens=4))   # 2 pages
    s.add_request(req("B", 4, max_tokens=4))   # 1 page
    out, _ = step(s)
    assert [(q.request_id, q.page_table) for q in out.scheduled] == [("A", [1, 2]), ("B", [3])]
    out = s.schedule()  # A takes the last page (4); B (last) cannot grow and preempts itself
    assert summary(out) == [("A", 8, 1, True)] and out.preempted_ids == ["B"]
    assert s.kv.free_pages() == [3] and [r.request_id for r in s.waiting] == ["B"]
    s.update(out, {"A": [TOK]})
    names = []
    while s.has_unfinished():
        out, _ = step(s)
        names.append([q.request_id for q in out.scheduled])
    assert names == [["A"], ["A"], ["B"], ["B"], ["B"]]
    s.kv.check_invariants()
    assert s.kv.num_free_pages == 4


def test_no_admission_in_a_step_that_preempted():
    s = make(num_pages=4, page_size=2, budget=3)     # 3 usable pages of 2 tokens
    s.add_request(req("A", 2, max_tokens=4))
    s.add_request(req("B", 1, max_tokens=4))
    assert summary(step(s)[0]) == [("A", 0, 2, True), ("B", 0, 1, True)]
    assert summary(step(s)[0]) == [("A", 2, 1, True), ("B", 1, 1, True)]
    out, _ = step(s)   # B cannot grow and preempts itself; a 2-token chunk of B would fit its freed page
    assert summary(out) == [("A", 3, 1, True)] and out.preempted_ids == ["B"]
    assert s.kv.free_pages() == [2] and [r.request_id for r in s.waiting] == ["B"]


# ---- abort / finish --------------------------------------------------------------------------------
def test_abort_waiting_and_running_frees_pages():
    s = make(num_pages=9, page_size=4, max_seqs=1)
    s.add_request(req("run", 10))
    s.add_request(req("wait", 10))
    step(s)
    assert s.kv.page_table("run") == [1, 2, 3]
    w = s.abort("wait")
    assert w.status is RequestStatus.FINISHED_ABORTED and w.finish_reason == "abort" and s.num_waiting == 0
    r = s.abort("run")
    assert r.status is RequestStatus.FINISHED_ABORTED and s.num_running == 0
    assert s.kv.num_free_pages == 8 and s.kv.free_pages()[-3:] == [3, 2, 1]
    assert s.abort("run") is None and s.abort("nope") is None
    assert not s.has_unfinished()
    out = s.schedule()
    assert out.is_empty and out.finished_ids == ["wait", "run"]
    s.kv.check_invariants()


def test_abort_between_schedule_and_update_is_skipped():
    s = make()
    s.add_request(req("a", 5))
    s.add_request(req("b", 5))
    out = s.schedule()
    s.abort("a")
    fin = s.update(out, {"b": [TOK]})   # no token for a: fine, it is gone
    assert fin == [] and s.get("a") is None and s.get("b").num_computed_tokens == 5
    assert s.kv.page_table("a") == []


def test_finish_for_stop_string():
    s = make()
    s.add_request(req("a", 5))
    step(s)
    r = s.finish("a", "stop", stop_reason="\n\n")
    assert r.status is RequestStatus.FINISHED_STOPPED and r.stop_reason == "\n\n" and r.finish_reason == "stop"
    assert s.kv.num_free_pages == s.kv.num_usable_pages and s.num_running == 0
    assert s.finish("a", "stop") is None
    with pytest.raises(ValueError, match="reason='eos' must be one of"):
        s.finish("a", "eos")


def test_finish_by_stop_string_truncates_and_frees():
    s = make()
    s.add_request(req("a", 5))
    s.add_request(req("b", 5, max_tokens=3))
    step(s)
    step(s, {"a": [11], "b": [12]})
    # a (running): the match completed at its first output token; the second is dropped, pages freed
    r = s.finish_by_stop_string("a", "xy", keep_tokens=1)
    assert r.status is RequestStatus.FINISHED_STOPPED and r.stop_reason == "xy" and r.output_token_ids == [TOK]
    assert s.get("a") is None and s.kv.page_table("a") == []
    # b: the same update() that finished it by length brought the token completing the match: the string wins
    out, fin = step(s, {"b": [13]})
    assert [q.request_id for q in fin] == ["b"] and fin[0].finish_reason == "length"
    r = s.finish_by_stop_string("b", "zz", keep_tokens=2)
    assert r is fin[0] and r.finish_reason == "stop" and r.stop_reason == "zz" and r.output_token_ids == [TOK, 12]
    assert s.kv.num_free_pages == s.kv.num_usable_pages and s.num_running == 0
    assert s.finish_by_stop_string("nobody", "zz", 1) is None
    with pytest.raises(ValueError, match=r"keep_tokens=0 must be in \[1, 2\]"):
        s.finish_by_stop_string("b", "zz", 0)
    assert r.output_token_ids == [TOK, 12]  # a bad call changes nothing


# ---- stop conditions -------------------------------------------------------------------------------
def test_stop_on_eos_frees_pages_at_once():
    s = make()
    s.add_request(req("a", 5))
    step(s)
    out, fin = step(s, {"a": [EOS]})
    assert fin[0].request_id == "a" and fin[0].status is RequestStatus.FINISHED_STOPPED
    assert fin[0].stop_reason is None and fin[0].output_token_ids == [TOK, EOS]
    assert s.kv.num_free_pages == s.kv.num_usable_pages and not s.has_unfinished()


def test_ignore_eos_keeps_going_until_max_tokens():
    s = make()
    s.add_request(req("a", 5, max_tokens=3, ignore_eos=True))
    assert step(s, {"a": [EOS]})[1] == []
    assert step(s, {"a": [EOS]})[1] == []
    (r,) = step(s, {"a": [EOS]})[1]
    assert r.status is RequestStatus.FINISHED_LENGTH and r.output_token_ids == [EOS, EOS, EOS]


def test_stop_token_ids_records_the_token_and_drops_extra_tokens():
    s = make()
    s.add_request(req("a", 5, stop_token_ids=[42]))
    (r,) = step(s, {"a": [9, 42, 8, 7]})[1]      # several tokens at once (speculative-style)
    assert r.status is RequestStatus.FINISHED_STOPPED and r.stop_reason == 42
    assert r.output_token_ids == [9, 42]


def test_min_tokens_suppresses_eos_and_stop_ids():
    s = make()
    s.add_request(req("a", 5, min_tokens=2, stop_token_ids=[42]))
    assert step(s, {"a": [EOS]})[1] == []
    (r,) = step(s, {"a": [42]})[1]
    assert r.output_token_ids == [EOS, 42] and r.stop_reason == 42


def test_stop_on_max_tokens():
    s = make()
    s.add_request(req("a", 5, max_tokens=3))
    assert step(s)[1] == [] and step(s)[1] == []
    (r,) = step(s)[1]
    assert r.status is RequestStatus.FINISHED_LENGTH and r.finish_reason == "length"
    assert r.output_token_ids == [TOK] * 3 and r.stop_reason is None


def test_stop_on_max_model_len():
    s = make(max_model_len=8)
    s.add_request(req("a", 5, max_tokens=None))
    s.add_request(req("b", 6, max_tokens=None))
    fins = []
    for _ in range(3):
        fins += [(r.request_id, r.num_tokens, r.finish_reason) for r in step(s, {"a": [1, 3], "b": [1, 3]})[1]]
    assert fins == [("b", 8, "length"), ("a", 8, "length")]


# ---- admission errors ------------------------------------------------------------------------------
def test_oversize_for_max_model_len_is_rejected_with_numbers():
    s = make(num_pages=1024, page_size=16, max_model_len=4096)
    with pytest.raises(ValueError) as e:
        s.add_request(req("r3", 4000, max_tokens=1000))
    assert str(e.value) == ("request 'r3' needs 5000 tokens (prompt 4000 + max_tokens 1000) but max_model_len is "
                            "4096; shorten the prompt or lower max_tokens")
    with pytest.raises(ValueError, match="prompt of 4096 tokens but max_model_len is 4096"):
        s.add_request(req("r4", 4096, max_tokens=None))
    assert not s.has_unfinished()


def test_oversize_for_the_cache_is_rejected_with_numbers():
    s = make(num_pages=256, page_size=16, max_model_len=8192)
    with pytest.raises(ValueError) as e:
        s.add_request(req("r3", 4000, max_tokens=1120))
    assert str(e.value) == ("request 'r3' needs 320 KV pages (5120 tokens: prompt 4000 + max_tokens 1120) but the "
                            "cache has only 255 usable pages of 16 tokens (4080 tokens); raise "
                            "gpu_memory_utilization/num_pages or shorten the request")
    with pytest.raises(ValueError, match=r"needs 512 KV pages \(8192 tokens: prompt 10, max_tokens=None runs to "
                                         r"max_model_len 8192\)"):
        s.add_request(req("r5", 10, max_tokens=None))
    s.add_request(req("ok", 4000, max_tokens=80))   # exactly 4080 tokens fits
    assert s.num_waiting == 1


def test_bad_requests_rejected():
    s = make()
    s.add_request(req("a", 3))
    with pytest.raises(ValueError, match="'a' is already queued"):
        s.add_request(req("a", 3))
    with pytest.raises(ValueError, match="empty prompt"):
        s.add_request(req("e", 0))
    with pytest.raises(ValueError, match="max_num_seqs=0"):
        make(max_seqs=0)
    with pytest.raises(ValueError, match="long_prefill_token_threshold=0"):
        make(threshold=0)


def test_update_requires_a_sampled_token_and_changes_nothing_otherwise():
    s = make()
    s.add_request(req("a", 5))
    s.add_request(req("b", 5))
    out = s.schedule()
    with pytest.raises(ValueError, match="sampled has no token for it; pass sampled\\['b'\\]"):
        s.update(out, {"a": [TOK]})
    # schedule() already advanced the counters; the failed update() changed nothing further.
    a = s.get("a")
    assert a.num_computed_tokens == 5 and a.num_pending_tokens == 1 and a.output_token_ids == []
    s.update(out, {"a": [TOK], "b": [TOK]})
    assert a.num_pending_tokens == 0 and a.output_token_ids == [TOK]
    with pytest.raises(RuntimeError, match="update\\(\\) exactly once per schedule"):
        s.update(out, {"a": [TOK], "b": [TOK]})


def test_pipelined_schedule_uses_placeholders_and_stops_at_max_tokens():
    """With one step in flight, the next schedule() runs before update(): decodes carry a -1 placeholder for
    the token being sampled, and a request whose in-flight token is its last is not scheduled again."""
    s = make()
    s.add_request(req("a", 5, max_tokens=2))
    out1 = s.schedule()
    assert [(q.request_id, q.token_ids, q.sample, q.output_index) for q in out1.scheduled] == [
        ("a", [100, 101, 102, 103, 104], True, 0)]
    out2 = s.schedule()  # step 1 still in flight
    (q2,) = out2.scheduled
    assert q2.start_pos == 5 and q2.token_ids == [-1] and q2.num_placeholders == 1 and q2.output_index == 1
    assert s.schedule().scheduled == []  # outputs 0 and 1 are in flight: max_tokens=2 reached
    assert s.update(out1, {"a": [TOK]}) == []
    (fin,) = s.update(out2, {"a": [TOK + 1]})
    assert fin.output_token_ids == [TOK, TOK + 1] and fin.finish_reason == "length"
    assert s.kv.num_used_pages == 0
