"""Draft proposals from a model: a separate draft checkpoint ("draft") or the target's first layers ("layer_skip").

The draft runs on its own `ModelRunner` (same bucketed, ahead-of-time compiled step as the target) with its own
paged KV cache and its own page allocator (`KVCacheManager`, no prefix caching). Per request it remembers how
many tokens of the sequence have draft KV (`_computed`). To propose k drafts for a sequence of N known tokens:
  catch-up   tokens [computed, N-1) in chunks of at most the largest bucket (prompt, and tokens accepted since);
  k steps    step 1 computes token N-1 and samples d_1 greedily; step j feeds d_{j-1} (a placeholder the device
             fills from step j-1's output, so the k steps are dispatched back to back without host syncs).
The k steps run as one compiled program (runner/draft_steps.py: one pack, copy and launch instead of k) when
the longest proposal wants k = num_speculative_tokens drafts (the usual case; sequences wanting fewer stop early
inside it; when adaptive k has lowered every request's k, the per-step path above). Afterwards the draft has KV
for positions < N + k - 1. rollback(n) forgets everything past the n tokens whose KV the target kept (the
accepted prefix) and releases the pages past it; later steps overwrite the stale slots.
Drafts are the draft's argmax (deterministic): verification treats q as a point mass (runner/spec_decode.py).

Layer skip: the draft is the target's first `num_draft_layers` layers + its final norm and head. The weights are
the target's own device arrays (no copy). Its KV is kept in its own cache: the target's KV of those layers at the
accepted positions is bit-for-bit what the draft would compute (same weights, same inputs), so it could be shared,
but the draft writes its k-1 speculative positions before the target has allocated pages for them, and the two
runners size and donate their caches separately; sharing would need one runner running both programs over one
cache. Cost of not sharing: num_draft_layers / num_layers of the target's KV memory, plus the catch-up compute.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from flax import nnx
import jax

from jaxinfer.config import EngineConfig, SpeculativeConfig
from jaxinfer.engine.kv_cache import KVCacheManager
from jaxinfer.models.loader import LoadedModel
from jaxinfer.runner.batch import SeqInput
from jaxinfer.runner.draft_steps import FusedDraftSteps
from jaxinfer.runner.model_runner import ModelRunner


def layer_skip_model(target: LoadedModel, num_layers: int) -> LoadedModel:
    """A LoadedModel of the target's first num_layers layers + final norm + head, sharing the weight arrays."""
    total = target.cfg.num_layers
    if not 1 <= num_layers < total:
        raise ValueError(f"num_draft_layers={num_layers} must be in [1, {total - 1}] for a target of {total} layers")
    module = target.module()  # merged from the same arrays: nothing is copied
    module.layers = nnx.List(list(module.layers)[:num_layers])
    module.cfg = dataclasses.replace(target.cfg, num_layers=num_layers)
    graphdef, state = nnx.split(module)
    leaves, treedef = jax.tree.flatten(state)
    return LoadedModel(module.cfg, target.source, graphdef, leaves, treedef, target.dtype)


class ModelProposer:
    needs_model = True

    def __init__(self, draft: LoadedModel, config: EngineConfig, max_model_len: int, num_pages: int,
                 fused_steps: bool = True):
        cfg = dataclasses.replace(config, speculative_config=None, num_pages=num_pages)
        self.runner = ModelRunner(draft, cfg, max_model_len)
        # k draft steps in one program (single-device runners; fused_steps=False: always the per-step path)
        k = config.speculative_config.num_speculative_tokens if config.speculative_config is not None else 0
        self.fused = FusedDraftSteps(self.runner, k) if fused_steps and k and draft.plan is None else None
        self.kv = KVCacheManager(self.runner.num_pages, self.runner.page_size)
        self.max_model_len = max_model_len
        self.max_tokens_per_step = self.runner.ladder.max_tokens
        self.max_seqs = config.max_num_seqs
        self._computed: dict[str, int] = {}  # request id -> tokens with draft KV

    def warmup(self, progress: bool = True):
        self.runner.warmup(progress=progress)
        if self.fused is not None:
            self.fused.warmup()

    # ---- proposer protocol (engine/spec_control.py) -----------------------------------------------------
    def propose(self, seqs: Sequence[tuple[str, Sequence[int], int]]) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        live = []  # (rid, tokens, k)
        for rid, tokens, k in seqs:
            n = len(tokens)
            k = min(k, self.max_model_len - n)
            if k <= 0:
                continue
            if self.kv.allocate(rid, n + k - 1) is None:
                self.free(rid)  # the draft cache is full: no drafts for it now; recompute from scratch later
                out[rid] = []
                continue
            live.append((rid, tokens, k))
        if not live:
            return out
        self._catch_up(live)
        if self.fused is not None and max(k for _, _, k in live) == self.fused.num_steps:
            return self._propose_fused(live, out)
        flights, rows = [], []  # step j: (flight, {rid: row})
        prev = None
        for j in range(max(k for _, _, k in live)):
            inputs, row = [], {}
            for rid, tokens, k in live:
                if k <= j:
                    continue
                pos = len(tokens) - 1 + j
                prev_row = rows[-1][rid] if j else -1
                row[rid] = len(inputs)
                inputs.append(SeqInput(token_ids=[tokens[-1] if j == 0 else -1], start_pos=pos,
                                       page_table=self.kv.page_table(rid), temperature=0.0, prev_row=prev_row))
            prev = self.runner.dispatch(inputs, prev)
            flights.append(prev)
            rows.append(row)
        results = [self.runner.fetch(f).tokens for f in flights]  # one wait for the whole chain
        for rid, tokens, k in live:
            out[rid] = [int(results[j][rows[j][rid]]) for j in range(k)]
            self._computed[rid] = len(tokens) + k - 1
        return out

    def rollback(self, request_id: str, num_valid_tokens: int) -> None:
        if request_id not in self._computed:
            return
        self._computed[request_id] = min(self._computed[request_id], num_valid_tokens)
        self.kv.truncate(request_id, self._computed[request_id])

    def free(self, request_id: str) -> None:
        self.kv.free(request_id)
        self._computed.pop(request_id, None)

    # ---- internals ----------------------------------------------------------------------------------------
    def _propose_fused(self, live, out: dict[str, list[int]]) -> dict[str, list[int]]:
        """The k draft steps of every live sequence in one dispatch (runner/draft_steps.py)."""
        inputs = [SeqInput([tokens[-1]], len(tokens) - 1, self.kv.page_table(rid), 0.0) for rid, tokens, _ in live]
        ks = [k for _, _, k in live]
        drafts = self.fused.fetch(self.fused.dispatch(inputs, ks))  # i32[k, max_num_seqs]; one wait
        per_seq = drafts.T.tolist()  # row i: sequence i's drafts (one conversion for all)
        for i, (rid, tokens, k) in enumerate(live):
            out[rid] = per_seq[i][:k]
            self._computed[rid] = len(tokens) + k - 1
        return out

    def _catch_up(self, live) -> None:
        """Compute draft KV for tokens [computed, N-1) of every live sequence, in as many steps as the largest
        bucket needs (results are not waited for: the draft steps that follow run after them on the device)."""
        todo = {rid: (self._computed.get(rid, 0), tokens) for rid, tokens, _ in live}
        prev = None
        while True:
            inputs, budget = [], self.max_tokens_per_step
            for rid, (c, tokens) in list(todo.items()):
                end = min(len(tokens) - 1, c + budget)
                if end <= c or len(inputs) == self.max_seqs:
                    continue
                inputs.append(SeqInput(token_ids=list(tokens[c:end]), start_pos=c,
                                       page_table=self.kv.page_table(rid), temperature=0.0))
                budget -= end - c
                todo[rid] = (end, tokens)
                if budget == 0:
                    break
            if not inputs:
                return
            prev = self.runner.dispatch(inputs, None)


def build_model_proposer(sc: SpeculativeConfig, target: LoadedModel, config: EngineConfig, max_model_len: int,
                         target_num_pages: int, progress: bool = True) -> ModelProposer:
    """The draft for method "draft" (load sc.draft_model) or "layer_skip" (a view of the target)."""
    if sc.method == "layer_skip":
        n = sc.num_draft_layers or max(1, target.cfg.num_layers // 4)
        draft = layer_skip_model(target, n)
    elif sc.method == "draft":
        from jaxinfer.models.loader import load_model, resolve_model

        draft = load_model(resolve_model(sc.draft_model, sc.draft_load_format), target.dtype, seed=config.seed + 1,
                           progress=progress)
        if draft.cfg.vocab_size != target.cfg.vocab_size:
            raise ValueError(f"draft model {sc.draft_model!r} has vocab_size {draft.cfg.vocab_size} but the target "
                             f"has {target.cfg.vocab_size}; the draft must share the target's tokenizer")
    else:
        raise ValueError(f"method {sc.method!r} has no draft model")
    return ModelProposer(draft, config, max_model_len, sc.draft_num_pages or target_num_pages)
