"""From per-sequence results to RequestOutputs (as each request's SamplingParams.output_kind asks), and the
logprob bookkeeping they read. Host code only; engine/engine.py calls these with its state."""
from __future__ import annotations

import itertools
import time

from .input_batch import InputBatch
from .scheduler import ScheduledSeq
from .seq_state import Group, SeqState
from ..outputs import CompletionOutput, Logprob, RequestOutput
from ..sampling_params import RequestOutputKind

_DELTA, _FINAL_ONLY = RequestOutputKind.DELTA, RequestOutputKind.FINAL_ONLY

# Groups of one sequence take _single_outputs (off: the general loop for every group; tests compare the two)
fast_outputs = True


def add_logprob(ib: InputBatch, st: SeqState, lp: float) -> None:
    """Add lp to the sequence's sum of sampled-token logprobs: its InputBatch slot's while it holds one (the slot is
    then the value build_outputs reports), else its own."""
    s = ib.slot(st.request.request_id)
    if s is not None and ib.owner[s] is st:
        ib.cum_logprob[s] += lp
    else:
        st.cumulative_logprob += lp


def build_outputs(seqs: dict[str, SeqState], groups: dict[str, Group], ib: InputBatch, spec,
                  seq_ids: set[str], finished: set[str]) -> list[RequestOutput]:
    """RequestOutputs of the groups of seq_ids (sequences that progressed), in sorted order of their first
    sequence id there, each as its group's kind asks (RequestOutputKind). A FINAL_ONLY group is reported only
    once all its sequences have finished, which can first be true in the step one of them finished: the
    others are only stamped with first_token_time (the per-step cost of a batch of non-streaming decodes is
    then a dict lookup each, not a group scan).

    Invariant (DELTA): a sequence's reported token_ids / logprobs / text, concatenated over the outputs, are
    its CUMULATIVE final ones: st.num_reported counts the output tokens (and logprobs, one per token) already
    reported, st.text_delta holds the detokenizer's deltas since the last report. Output tokens are only ever
    appended (preemption keeps them; a stop string truncates them in the step it matched, before this runs),
    so output_token_ids[num_reported:] is exactly what is new."""
    now = time.monotonic()
    all_seqs, all_groups = seqs, groups
    gids = set()
    key = {}  # sort key of a group: its smallest sequence id in seq_ids
    # Groups of one sequence without logprobs that report every progress (CUMULATIVE / DELTA: what streaming asks
    # at every step) take _single_outputs, which builds the same outputs without the per-group generality; their
    # sort key is their one sequence id. Off (`fast_outputs`): every group takes the general loop (the reference).
    single = [] if fast_outputs and spec is None else None
    for sid in seq_ids:
        st = all_seqs.get(sid)
        if st is not None and st.single and st.keep_deltas and single is not None:  # (keep_deltas: not FINAL_ONLY)
            single.append(sid)
            continue
        g = all_groups.get(st.group_id) if st is not None else None
        if g is None:
            continue
        first = key.get(g.request_id)
        if first is None or sid < first:
            key[g.request_id] = sid
        if g.first_token_time is None:
            g.first_token_time = now
            if g.kind is _FINAL_ONLY:  # nothing more to do for it until it finishes
                for s in g.seq_ids:
                    all_seqs[s].report_progress = False
                    slot = ib.slot(s)
                    if slot is not None and ib.owner[slot] is all_seqs[s]:
                        ib.progress[slot] = False
        if g.kind is not _FINAL_ONLY or sid in finished:
            gids.add(g.request_id)
    outs = []
    cums = None  # the InputBatch's logprob sums as floats, converted once a call (not one numpy scalar a request)
    if single:
        if not gids:  # (the streaming step: every reporting group is a single one)
            single.sort()  # (in place: one list fewer a step for the young generation's count)
            return _single_outputs(seqs, groups, ib, single, now, outs)
        general = {key[gid]: gid for gid in gids}  # the first sequence ids are distinct: one order for both kinds
        order = sorted(itertools.chain(single, general))
    else:
        general = None
        order = sorted(gids, key=key.__getitem__)
    slot_of, owner = ib.slot, ib.owner
    for gid in order:
        if general is not None:
            if gid not in general:
                _single_outputs(seqs, groups, ib, (gid,), now, outs)
                continue
            gid = general[gid]
        g = all_groups[gid]
        kind = g.kind
        if kind is _FINAL_ONLY and not all(all_seqs[sid].request.status.is_finished for sid in g.seq_ids):
            continue
        comps = []
        done = True  # every sequence finished (a finished request always has a finish_reason)
        for idx, sid in enumerate(g.seq_ids):
            st = all_seqs[sid]
            r = st.request
            fin = r.status.is_finished
            done = done and fin
            ids, k = r.output_token_ids, st.num_reported
            new_ids = ids[k:]
            if kind is _FINAL_ONLY:  # nothing reported before: everything is new (no delta was kept)
                text = st.detok.text if st.detok is not None else ""
                delta_text = text
            else:
                delta_text, st.text_delta = st.text_delta, ""
                if kind is _DELTA:
                    if not new_ids and not delta_text and (not fin or st.finish_reported):
                        continue  # nothing new for this completion
                    text = delta_text
                else:
                    text = st.detok.text if st.detok is not None else ""
            st.num_reported = len(ids)
            lps = st.logprobs
            if lps is not None:
                lps = lps[k:] if kind is _DELTA else list(lps)
            st.finish_reported = fin
            s = slot_of(sid)
            if s is not None and owner[s] is st:  # (cum_logprob, for a whole step's requests)
                if cums is None:
                    cums = ib.cum_logprob.tolist()
                cum = cums[s]
            else:
                cum = st.cumulative_logprob
            comps.append(CompletionOutput(
                idx, text, new_ids if kind is _DELTA else list(ids), cum, lps,
                r.finish_reason if fin else None, r.stop_reason if fin else None, delta_text, new_ids))
        if not comps:
            continue
        first = all_seqs[g.seq_ids[0]]
        prompt_lps = first.prompt_logprobs
        if prompt_lps is not None:
            prompt_lps = None if kind is _DELTA and g.reported else list(prompt_lps)
        g.reported = True
        metrics = {"arrival_time": g.arrival_time, "first_token_time": g.first_token_time,
                   "finished_time": now if done else None}
        if spec is not None:
            metrics.update(spec.request_metrics(g.seq_ids))
        outs.append(RequestOutput(gid, g.prompt, g.prompt_token_ids, prompt_lps, comps, done, metrics))
        if done:
            for sid in g.seq_ids:
                seqs.pop(sid, None)
                if spec is not None:
                    spec.free(sid, forget=True)
            del groups[gid]
    return outs


def _single_outputs(seqs: dict[str, SeqState], groups: dict[str, Group], ib: InputBatch, sids, now: float,
                    outs: list[RequestOutput]) -> list[RequestOutput]:
    """build_outputs of groups of one sequence (`sids`, in order; SeqState.single: no logprobs or prompt logprobs)
    whose kind is CUMULATIVE or DELTA, appended to `outs`: the general loop's outputs and state changes (tested
    against it: tests/engine/test_stream_outputs.py) with what such a group makes constant folded in (one
    completion, no logprobs, done == its finish) and no spec metrics (its caller's condition)."""
    slot_get, owner = ib._slot_of.get, ib.owner  # (InputBatch.slot's lookup, without its call a request)
    cums = None
    for sid in sids:
        st = seqs[sid]
        gid = st.group_id
        g = groups.get(gid)
        if g is None:
            continue
        if g.first_token_time is None:
            g.first_token_time = now
        r = st.request
        fin = r.status.is_finished
        ids, k = r.output_token_ids, st.num_reported
        new_ids = ids[k:]
        delta_text = st.text_delta
        if delta_text:
            st.text_delta = ""
        if g.kind is _DELTA:
            if not new_ids and not delta_text and (not fin or st.finish_reported):
                continue  # nothing new (the general loop then reports no group without completions)
            text, token_ids = delta_text, new_ids
        else:
            text, token_ids = (st.detok.text if st.detok is not None else ""), list(ids)  # (a snapshot)
        st.num_reported = len(ids)
        st.finish_reported = fin
        s = slot_get(sid)
        if s is not None and owner[s] is st:
            if cums is None:
                cums = ib.cum_logprob.tolist()
            cum = cums[s]
        else:
            cum = st.cumulative_logprob
        g.reported = True
        if fin:
            comp = CompletionOutput(0, text, token_ids, cum, None, r.finish_reason, r.stop_reason, delta_text, new_ids)
            outs.append(RequestOutput(gid, g.prompt, g.prompt_token_ids, None, [comp], True,
                                      {"arrival_time": g.arrival_time, "first_token_time": g.first_token_time,
                                       "finished_time": now}))
            seqs.pop(sid, None)
            del groups[gid]
        else:
            comp = CompletionOutput(0, text, token_ids, cum, None, None, None, delta_text, new_ids)
            outs.append(RequestOutput(gid, g.prompt, g.prompt_token_ids, None, [comp], False,
                                      {"arrival_time": g.arrival_time, "first_token_time": g.first_token_time,
                                       "finished_time": None}))
    return outs


def logprob_dict(tokenizer, tok, lp, top_ids, top_lps, n) -> dict[int, Logprob]:
    """{token: Logprob} of a position: its top-n, plus the chosen token with its rank if not among them."""
    d = {}
    for rank, (t, l) in enumerate(zip(top_ids[:n], top_lps[:n]), start=1):
        d[int(t)] = Logprob(float(l), rank, decode_token(tokenizer, int(t)))
    if tok not in d:
        rank = next((k + 1 for k, t in enumerate(top_ids) if int(t) == tok), None)
        d[tok] = Logprob(lp, rank, decode_token(tokenizer, tok))
    return d


def decode_token(tokenizer, tok: int) -> str | None:
    return None if tokenizer is None else tokenizer.decode([tok], skip_special_tokens=False)


def prompt_logprob_targets(st: SeqState, s: ScheduledSeq):
    """The prompt tokens chunk `s` of st's request predicts whose logprobs are still unknown (None: none)."""
    if st.prompt_logprobs is None:
        return None
    n_prompt = len(st.request.prompt_token_ids)
    # Position j predicts token j+1; only prompt tokens are targets, each computed once.
    first = max(s.start_pos, st.num_prompt_logprobs_done)
    last = min(s.start_pos + len(s.token_ids), n_prompt - 1)
    if first >= last:
        return None
    return st.request.prompt_token_ids[s.start_pos + 1: last + 1]


def record_prompt_logprobs(tokenizer, st: SeqState, s: ScheduledSeq, arrays) -> None:
    """Append the prompt logprobs of chunk `s` (arrays: logprobs, top ids, top logprobs per position)."""
    lp, ids, top = arrays
    n = st.params.prompt_logprobs
    for j in range(len(lp)):
        pos = s.start_pos + j  # predicts prompt token pos + 1
        if pos < st.num_prompt_logprobs_done:
            continue
        tok = st.request.prompt_token_ids[pos + 1]
        st.prompt_logprobs.append(logprob_dict(tokenizer, tok, float(lp[j]), ids[j], top[j], n))
        st.num_prompt_logprobs_done = pos + 1
