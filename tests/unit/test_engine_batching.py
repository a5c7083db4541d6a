"""The sim engine's continuous-batching scheduler: KV admission, FCFS queue, chunked prefill."""

from __future__ import annotations

import pytest

from coral_replica_sim.batching import Scheduler, Sequence, blocks_for


def _run_until_done(
    s: Scheduler, engine: int = 0, limit: int = 10_000
) -> list[list[tuple[str, int, bool]]]:
    """Step engine ``engine`` until it has nothing to do; the token events of each step."""
    steps = []
    for _ in range(limit):
        batch = s.schedule(engine)
        if batch is None:
            return steps
        steps.append([(e.seq.seq_id, e.index, e.finished) for e in s.complete(batch)])
    raise AssertionError("scheduler did not finish")


def test_blocks_round_up():
    assert blocks_for(1, 16) == 1
    assert blocks_for(16, 16) == 1
    assert blocks_for(17, 16) == 2


def test_request_waits_until_blocks_for_its_prompt_are_free():
    # 4 blocks of 16 tokens. A's prompt takes 3 blocks; B's prompt needs 2, only 1 is free.
    s = Scheduler(kv_capacity_tokens=64, block_size=16)
    a, b = Sequence("a", 40, 8), Sequence("b", 20, 12)
    s.add(a)
    s.add(b)
    first = s.schedule()
    assert [seq.seq_id for seq, _ in first.prefill] == ["a"]
    assert (s.num_running, s.num_waiting, s.used_blocks) == (1, 1, 3)
    assert s.kv_usage == pytest.approx(0.75)
    s.complete(first)
    for _ in range(7):  # A decodes its remaining 7 tokens (at most 47 in KV: 3 blocks)
        batch = s.schedule()
        assert [q.seq_id for q in batch.decode] == ["a"] and not batch.prefill
        s.complete(batch)
    assert a.finished and s.used_blocks == 0 and s.num_waiting == 1
    batch = s.schedule()
    assert [seq.seq_id for seq, _ in batch.prefill] == ["b"]
    assert s.used_blocks == 2


def test_blocks_grow_with_the_sequence_as_it_decodes():
    s = Scheduler(kv_capacity_tokens=256, block_size=16)
    seq = Sequence("g", 16, 20)
    s.add(seq)
    used = []
    while (batch := s.schedule()) is not None:
        used.append(s.used_blocks)
        s.complete(batch)
    # the prompt fills block 1; the 2nd output token's KV (token 17) opens block 2, and so on
    assert used == [1] + [2] * 16 + [3] * 3
    assert s.used_blocks == 0


def test_out_of_blocks_preempts_the_latest_sequence_which_later_resumes():
    # 4 blocks. Two 16-token prompts take one block each, then grow until both need a third.
    s = Scheduler(kv_capacity_tokens=64, block_size=16)
    a, b = Sequence("a", 16, 40), Sequence("b", 16, 40)
    s.add(a)
    s.add(b)
    tokens: dict[str, list[int]] = {"a": [], "b": []}
    preempted_at = None
    while (batch := s.schedule()) is not None:
        assert s.used_blocks <= s.total_blocks
        if s.preemptions and preempted_at is None:
            preempted_at = (len(tokens["a"]), len(tokens["b"]))
            assert s.num_waiting == 1 and b.computed == 0  # b went back to the queue
        for event in s.complete(batch):
            tokens[event.seq.seq_id].append(event.index)
    assert preempted_at == (17, 17)  # both hold 32 tokens; a needs block 3: b is preempted
    assert s.preemptions == 1
    # b resumed where it stopped: it re-prefilled prompt + generated, then went on
    assert tokens["a"] == list(range(40)) and tokens["b"] == list(range(40))
    assert s.used_blocks == 0


def test_fcfs_head_of_line_is_not_overtaken():
    s = Scheduler(kv_capacity_tokens=64, block_size=16)
    big1, big2, small = Sequence("big1", 40, 8), Sequence("big2", 40, 8), Sequence("small", 4, 4)
    for seq in (big1, big2, small):
        s.add(seq)
    batch = s.schedule()
    # big1 takes 3 of 4 blocks; big2 (3 blocks) does not fit; small (1 block) would, but waits.
    assert [seq.seq_id for seq, _ in batch.prefill] == ["big1"]
    assert s.num_waiting == 2


def test_chunked_prefill_and_first_token_on_the_step_that_ends_the_prompt():
    s = Scheduler(kv_capacity_tokens=1024, max_num_seqs=4, max_num_batched_tokens=8)
    seq = Sequence("p", 20, 3)
    s.add(seq)
    chunks, events = [], []
    while (batch := s.schedule()) is not None:
        chunks.append(batch.prefill_tokens)
        events.append([(e.index, e.finished) for e in s.complete(batch)])
    assert chunks == [8, 8, 4, 0, 0]
    assert events == [[], [], [(0, False)], [(1, False)], [(2, True)]]


def test_decodes_share_the_step_budget_with_prefill_chunks():
    s = Scheduler(kv_capacity_tokens=4096, max_num_seqs=8, max_num_batched_tokens=10)
    s.add(Sequence("a", 4, 5))
    s.complete(s.schedule())  # a's prompt done: it decodes from now on
    s.add(Sequence("b", 30, 2))
    batch = s.schedule()
    assert batch.decode_seqs == 1 and batch.prefill_tokens == 9  # 10 - one decode token


def test_context_tokens_count_every_scheduled_sequence_after_the_step():
    s = Scheduler(kv_capacity_tokens=4096, max_num_seqs=8, max_num_batched_tokens=64)
    s.add(Sequence("a", 10, 5))
    s.complete(s.schedule())  # a: 10 prompt tokens in KV, 1 token generated
    s.add(Sequence("b", 6, 5))
    batch = s.schedule()
    # a decodes its 2nd token (KV: 10 prompt + its 1st output), b prefills 6 tokens
    assert batch.context_tokens == 11 + 6


def test_exactly_max_tokens_then_blocks_freed():
    s = Scheduler(kv_capacity_tokens=256)
    s.add(Sequence("x", 5, 4))
    steps = _run_until_done(s)
    assert [ev for step in steps for ev in step] == [
        ("x", 0, False),
        ("x", 1, False),
        ("x", 2, False),
        ("x", 3, True),
    ]
    assert s.used_blocks == 0 and s.num_unfinished == 0


def test_max_num_seqs_caps_running():
    s = Scheduler(kv_capacity_tokens=10_000, max_num_seqs=2, max_num_batched_tokens=100)
    for i in range(3):
        s.add(Sequence(str(i), 4, 4))
    s.schedule()
    assert (s.num_running, s.num_waiting) == (2, 1)


def test_abort_waiting_and_running_frees_blocks_and_skips_in_flight_batch():
    s = Scheduler(kv_capacity_tokens=64, block_size=16)
    a, b = Sequence("a", 40, 8), Sequence("b", 40, 8)
    s.add(a)
    s.add(b)
    batch = s.schedule()
    assert s.abort(b) and s.num_waiting == 0
    assert s.abort(a) and s.used_blocks == 0 and s.num_running == 0
    assert s.complete(batch) == []  # a was aborted while its step ran
    assert not s.abort(a)


def test_sequence_longer_than_the_cache_is_refused():
    s = Scheduler(kv_capacity_tokens=64, block_size=16)
    with pytest.raises(ValueError, match="exceeds the KV cache"):
        s.add(Sequence("long", 60, 10))
    assert s.fits(64) and not s.fits(65)


def test_virtual_engines_split_a_burst_and_never_share_sequences():
    s = Scheduler(kv_capacity_tokens=4096, num_engines=2, max_num_seqs=8, max_num_batched_tokens=64)
    for i in range(5):
        s.add(Sequence(str(i), 8, 3))
    b0 = s.schedule(0)  # engine 0 takes its fair share (3 of 5), in arrival order
    b1 = s.schedule(1)  # engine 1 the rest
    assert [q.seq_id for q, _ in b0.prefill] == ["0", "1", "2"]
    assert [q.seq_id for q, _ in b1.prefill] == ["3", "4"]
    s.complete(b0)
    s.complete(b1)
    assert {q.seq_id for q in s.schedule(1).decode} == {"3", "4"}  # only its own sequences
    assert s.used_blocks == 5  # one shared pool: 11 tokens -> 1 block each


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"kv_capacity_tokens": 8}, "less than one block"),
        ({"kv_capacity_tokens": 1024, "max_num_seqs": 64, "max_num_batched_tokens": 32},
         "must be ≥ max_num_seqs"),
    ],
)  # fmt: skip
def test_invalid_settings_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Scheduler(**kwargs)
