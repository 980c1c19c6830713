"""runner/batch.pack (vectorised numpy) against a plain per-sequence loop that states the layout directly."""
import random

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from jaxinfer.outputs import SeqInput
from jaxinfer.runner.batch import pack
from jaxinfer.runner.buckets import BucketLadder

Any = object


def loop_pack(seqs, bucket, page_size):
    T, S, NT, Bq, W = bucket.num_tokens, bucket.num_seqs, bucket.num_tiles, bucket.query_tile, bucket.table_width
    n_seqs = len(seqs)
    if n_seqs > S:
        raise ValueError(f"{n_seqs} sequences do not fit bucket {bucket}")
    lens = np.fromiter((len(s.token_ids) for s in seqs), np.int64, n_seqs)
    offsets = np.zeros(n_seqs + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    n_tok = int(offsets[-1])
    if n_tok > T:
        raise ValueError(f"{n_tok} tokens do not fit bucket {bucket}")

    input_ids = np.zeros(T, np.int32)
    prev_src = np.full(T, -1, np.int32)  # row of the previous step's tokens that fills a placeholder
    positions = np.zeros(T, np.int32)
    slot_mapping = np.full(T, -1, np.int32)  # padding: no slot
    # Row S stays all zeros: empty tiles point at it, so they gather only the reserved page 0 (L2-resident)
    # instead of re-reading a real sequence's pages.
    page_tables = np.zeros((S + 1, W), np.int32)
    tile_tokens = np.full((NT, Bq), T, np.int32)
    tile_seq = np.full(NT, S, np.int32)
    tile_kv_len = np.zeros(NT, np.int32)
    sample_idx = np.zeros(S, np.int32)
    temperature = np.zeros(S, np.float32)
    top_k = np.full(S, -1, np.int32)
    top_p = np.ones(S, np.float32)
    min_p = np.zeros(S, np.float32)
    seed = np.zeros(S, np.uint32)
    step = np.zeros(S, np.int32)
    want_logprobs = np.zeros(S, np.int32)
    R, K = bucket.spec_rows, bucket.spec_len
    verify_idx = np.zeros((R, K + 1), np.int32)
    verify_row = np.full(R, S, np.int32)
    draft_tokens = np.zeros((R, K), np.int32)
    num_draft = np.zeros(R, np.int32)
    n_verify = 0
    penalty_slot = np.full(S, -1, np.int32)
    presence_penalty = np.zeros(S, np.float32)
    frequency_penalty = np.zeros(S, np.float32)
    repetition_penalty = np.ones(S, np.float32)

    tile = 0
    for i, s in enumerate(seqs):
        a, b = int(offsets[i]), int(offsets[i + 1])
        n = b - a
        input_ids[a:b] = s.token_ids
        if s.prev_row >= 0:
            input_ids[b - 1] = 0
            prev_src[b - 1] = s.prev_row
        pos = np.arange(s.start_pos, s.start_pos + n, dtype=np.int32)
        positions[a:b] = pos
        pt = np.asarray(s.page_table, np.int32)
        if len(pt) > W:
            raise ValueError(f"sequence has {len(pt)} pages but the page-table width is {W}")
        if len(pt) * page_size < s.start_pos + n:
            raise ValueError(
                f"page table of {len(pt)} pages cannot hold {s.start_pos + n} tokens (page_size {page_size})")
        page_tables[i, :len(pt)] = pt
        slot_mapping[a:b] = pt[pos // page_size] * page_size + pos % page_size
        for t0 in range(0, n, Bq):
            t1 = min(t0 + Bq, n)
            tile_tokens[tile, : t1 - t0] = np.arange(a + t0, a + t1)
            tile_seq[tile] = i
            tile_kv_len[tile] = s.start_pos + t1
            tile += 1
        sample_idx[i] = b - 1
        temperature[i] = s.temperature
        top_k[i] = s.top_k
        top_p[i] = s.top_p
        min_p[i] = s.min_p
        seed[i] = s.seed & 0xFFFFFFFF
        step[i] = s.step
        want_logprobs[i] = int(s.want_logprobs)
        if s.num_spec:
            k = s.num_spec
            verify_idx[n_verify, :k + 1] = np.arange(b - 1 - k, b)
            verify_idx[n_verify, k + 1:] = b - 1
            verify_row[n_verify] = i
            draft_tokens[n_verify, :k] = s.token_ids[n - k:]
            num_draft[n_verify] = k
            n_verify += 1
        penalty_slot[i] = s.penalty_slot
        presence_penalty[i] = s.presence_penalty
        frequency_penalty[i] = s.frequency_penalty
        repetition_penalty[i] = s.repetition_penalty
    if tile > NT:
        raise AssertionError(f"{tile} query tiles exceed the bucket's {NT}")  # impossible by construction
    arrays: dict[str, Any] = dict(
        input_ids=input_ids, prev_src=prev_src, positions=positions, slot_mapping=slot_mapping, page_tables=page_tables,
        tile_tokens=tile_tokens, tile_seq=tile_seq, tile_kv_len=tile_kv_len, sample_idx=sample_idx,
        temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, step=step,
        want_logprobs=want_logprobs, penalty_slot=penalty_slot, presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty, repetition_penalty=repetition_penalty, verify_idx=verify_idx,
        verify_row=verify_row, draft_tokens=draft_tokens, num_draft=num_draft,
    )
    return arrays, offsets


def _random_seqs(rng: random.Random, n_seqs: int, page_size: int, max_pages: int):
    seqs, next_page = [], 1
    n_spec = [0]  # at most 4 speculating sequences (the bucket's verify rows)
    for _ in range(n_seqs):
        n = rng.choice([1, 1, 1, rng.randint(1, 40)])
        start = rng.randint(0, page_size * (max_pages - 1) - n) if rng.random() < 0.8 else 0
        need = -(-(start + n) // page_size)
        pages = rng.sample(range(1, 10_000), need + rng.randint(0, 1))
        toks = [rng.randint(0, 999) for _ in range(n)]
        prev = -1
        num_spec = min(n - 1, rng.randint(1, 3)) if (n > 1 and rng.random() < 0.3 and n_spec[0] < 4) else 0
        n_spec[0] += bool(num_spec)
        if rng.random() < 0.3:
            toks[-1] = -1
            prev = rng.randint(0, 7)
        seqs.append(SeqInput(token_ids=toks, start_pos=start, page_table=pages, temperature=rng.random(),
                             top_k=rng.choice([-1, 5]), top_p=rng.random(), min_p=rng.random() / 10,
                             seed=rng.getrandbits(40), step=rng.randint(0, 100), want_logprobs=rng.random() < 0.5,
                             penalty_slot=rng.choice([-1, rng.randint(0, 5)]), presence_penalty=rng.random(),
                             frequency_penalty=rng.random(), repetition_penalty=1 + rng.random(),
                             prev_row=prev, num_spec=num_spec))
    return seqs


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_seqs=st.integers(0, 12), page_size=st.sampled_from([4, 16]))
def test_vectorised_pack_equals_loop(seed, n_seqs, page_size):
    rng = random.Random(seed)
    max_pages = 16
    ladder = BucketLadder.build(max_num_batched_tokens=512, max_num_seqs=16, max_model_len=max_pages * page_size,
                                page_size=page_size, query_tile=8, kv_chunk_pages=4, max_spec_seqs=4,
                                num_spec_tokens=3)
    seqs = _random_seqs(rng, n_seqs, page_size, max_pages)
    n_tok = sum(len(s.token_ids) for s in seqs)
    bucket = ladder.pick(max(n_tok, 1), max(n_seqs, 1))
    got = pack(seqs, bucket, page_size)
    want, offsets = loop_pack(seqs, bucket, page_size)
    np.testing.assert_array_equal(got.token_offsets, offsets)
    assert set(got.arrays) == set(want)
    for name, arr in want.items():
        assert got.arrays[name].dtype == arr.dtype, name
        np.testing.assert_array_equal(got.arrays[name], arr, err_msg=name)


def test_pack_errors_name_the_problem():
    ladder = BucketLadder.build(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64, page_size=16,
                                query_tile=8, kv_chunk_pages=4)
    b = ladder.pick(16, 4)
    with pytest.raises(ValueError, match="cannot hold 20 tokens"):
        pack([SeqInput(token_ids=[1] * 4, start_pos=16, page_table=[3])], b, 16)
    with pytest.raises(ValueError, match="page-table width"):
        pack([SeqInput(token_ids=[1], start_pos=0, page_table=list(range(1, 10)))], b, 16)
    with pytest.raises(ValueError, match="do not fit bucket"):
        pack([SeqInput(token_ids=[1], start_pos=0, page_table=[1])] * 5, b, 16)


def test_pack_verify_row_errors_name_the_problem():
    ladder = BucketLadder.build(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=64, page_size=16,
                                query_tile=8, kv_chunk_pages=4, max_spec_seqs=1, num_spec_tokens=2)
    b = ladder.pick(16, 4)
    with pytest.raises(ValueError, match="sequence 0 verifies 3 drafts of 4 tokens"):
        pack([SeqInput([1, 2, 3, 4], 0, [1], num_spec=3)], b, 16)
    with pytest.raises(ValueError, match="sequence 1 verifies 1 drafts of 2 tokens .* 1 verify rows of 2 drafts"):
        pack([SeqInput([1, 2], 0, [1], num_spec=1), SeqInput([3, 4], 0, [2], num_spec=1)], b, 16)


@pytest.mark.parametrize("max_num_seqs", [1, 4, 64])
def test_smallest_bucket_uses_decode_tiles(max_num_seqs):
    """A single-sequence decode runs in the smallest bucket: its query tiles are 4 tokens whatever max_num_seqs
    (16-token tiles padded one query token to a 64-row attention tile: 2.7x slower per layer on the H200), and a
    16-token prefill chunk still fits it (ceil(16 / 4) tiles)."""
    ladder = BucketLadder.build(max_num_batched_tokens=256, max_num_seqs=max_num_seqs, max_model_len=256,
                                page_size=16, query_tile=16, kv_chunk_pages=4)
    small, big = ladder.buckets[0], ladder.buckets[-1]
    assert small.num_tokens == 16 and small.query_tile == 4
    assert big.query_tile == (4 if big.num_tokens <= max_num_seqs else 16)
    hb = pack([SeqInput(token_ids=list(range(16)), start_pos=5, page_table=[1, 2])], small, 16)
    assert (hb.arrays["tile_kv_len"] > 0).sum() == 4
    np.testing.assert_array_equal(hb.arrays["tile_kv_len"][:4], [9, 13, 17, 21])


@pytest.mark.parametrize("max_num_seqs", [1, 4, 64])
def test_gpu_ladder_adds_one_token_bucket_below_decode_tiled_sixteen(max_num_seqs):
    """The GPU ladder (runner/cpu_defaults.py GPU_LADDER): a 1-token bucket for the batch-1 decode, then 16, 32, ...
    as before; the 16-token bucket keeps 4-token query tiles (a decode of 2..15 sequences runs there whatever
    max_num_seqs), and a step picks the 1-token bucket only when it is one token of one sequence."""
    from jaxinfer.runner.cpu_defaults import GPU_LADDER

    ladder = BucketLadder.build(max_num_batched_tokens=256, max_num_seqs=max_num_seqs, max_model_len=256,
                                page_size=16, query_tile=16, kv_chunk_pages=4, **GPU_LADDER)
    assert [b.num_tokens for b in ladder.buckets] == [1, 16, 32, 64, 128, 256]
    one, sixteen = ladder.buckets[:2]
    assert (one.num_seqs, one.query_tile, one.num_tiles) == (1, 4, 2)
    assert sixteen.query_tile == 4
    assert ladder.pick(1, 1) is one and ladder.pick(2, 1) is sixteen
    assert max_num_seqs < 2 or ladder.pick(2, 2) is sixteen
    hb = pack([SeqInput(token_ids=[7], start_pos=40, page_table=[1, 2, 3])], one, 16)
    np.testing.assert_array_equal(hb.arrays["tile_kv_len"][:1], [41])


def test_min_bucket_tokens_overrides_the_backend_ladder():
    from jaxinfer.config import ConfigError, EngineConfig
    from jaxinfer.runner.cpu_defaults import ladder_args

    assert ladder_args(4)["min_tokens"] == 4 and "small_buckets" not in ladder_args(4)
    ladder = BucketLadder.build(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=64, page_size=16,
                                query_tile=16, kv_chunk_pages=4, **ladder_args(4))
    assert ladder.buckets[0].num_tokens == 4
    with pytest.raises(ConfigError, match="min_bucket_tokens must be an integer >= 1"):
        EngineConfig.from_options(min_bucket_tokens=0)
