"""The sim engine's part in disaggregated serving: KV loaded from a prefill replica."""

from __future__ import annotations

import asyncio

import pytest

from coral_hpc.engine.args import UsageError, parse_args
from coral_hpc.engine.disagg import PROMPT_TOKENS_KEY, KvTransfer
from coral_hpc.engine.runner import SimEngine
from coral_replica_sim.batching import Scheduler, Sequence


def test_a_loaded_prompt_is_admitted_with_its_kv_and_computes_only_the_last_token():
    s = Scheduler(kv_capacity_tokens=4096, block_size=16)
    seq = Sequence("1", prompt_tokens=100, max_tokens=3, external=99)
    s.add(seq)
    batch = s.schedule()
    assert batch.prefill == ((seq, 1),) and batch.context_tokens == 100
    assert s.used_blocks == 7  # ceil(100 / 16): the loaded KV occupies the cache
    events = s.complete(batch)
    assert [e.index for e in events] == [0]  # the first token comes from that one step
    # an aggregated request of the same prompt prefills all 100 tokens
    plain = Sequence("2", prompt_tokens=100, max_tokens=3)
    s.add(plain)
    assert {q.seq_id: c for q, c in s.schedule().prefill}["2"] == 100


def test_preemption_drops_loaded_kv_and_the_sequence_recomputes_everything():
    s = Scheduler(kv_capacity_tokens=128, block_size=16, max_num_seqs=4, max_num_batched_tokens=64)
    first = Sequence("1", prompt_tokens=30, max_tokens=40, external=29)
    s.add(first)
    s.complete(s.schedule())
    s._preempt(first)
    assert first.external == 0 and first.computed == 0
    assert s.schedule().prefill == ((first, 31),)  # prompt + its one generated token


@pytest.mark.parametrize("external", [-1, 100])
def test_external_tokens_leave_the_last_prompt_token_to_compute(external):
    with pytest.raises(ValueError, match="external tokens"):
        Sequence("1", prompt_tokens=100, max_tokens=1, external=external)


def _constant(seconds: float):
    def stage_times(batch):
        return (seconds,)

    return stage_times


def test_a_request_waits_for_its_kv_transfer_before_it_queues():
    async def main():
        engine = SimEngine(Scheduler(kv_capacity_tokens=4096), _constant(0.001))
        engine.start()
        handle = engine.submit(50, 2, external_tokens=49, transfer_s=0.05)
        assert engine.scheduler.num_unfinished == 0  # still loading
        while (await handle.events.get()).index < 1:
            pass
        waited = handle.first_token_at - handle.arrival
        assert await engine.wait_idle(1.0)
        await engine.stop()
        return waited

    assert asyncio.run(main()) >= 0.05


def test_abort_while_loading_ends_the_request_and_leaves_the_engine_idle():
    async def main():
        engine = SimEngine(Scheduler(kv_capacity_tokens=4096), _constant(0.001))
        engine.start()
        handle = engine.submit(50, 2, external_tokens=49, transfer_s=10.0)
        engine.abort(handle)
        assert await handle.events.get() is None
        assert await engine.wait_idle(0.1)
        await asyncio.sleep(0.01)
        assert engine.scheduler.num_unfinished == 0
        await engine.stop()

    asyncio.run(main())


def _kv(role: str = "kv_both") -> KvTransfer:
    return KvTransfer({"kv_connector": "ExampleConnector", "kv_role": role}, tp=1,
                      block_size=16, transfer_s=lambda n: n * 1e-4, port=8100)


def test_handoff_names_this_engine_and_the_prompts_blocks_and_the_decode_side_finds_it():
    prefill, decode = _kv(), _kv()
    params = prefill.handoff(100)
    assert params["do_remote_prefill"] is True and params["do_remote_decode"] is False
    assert params["remote_engine_id"] == prefill.engine_id and params["remote_port"] == 8100
    assert params["remote_block_ids"] == list(range(7))
    assert decode.lookup(params, 100) == (99, pytest.approx(0.01))
    assert decode.lookup(params, 101) == (0, 0.0)  # another prompt: a miss, prefilled here
    assert decode.lookup({"do_remote_decode": True}, 100) == (0, 0.0)
    assert decode.lookup(None, 100) == (0, 0.0)


def test_kv_roles_restrict_what_a_server_does():
    params = {"do_remote_prefill": True, PROMPT_TOKENS_KEY: 10}
    assert _kv("kv_producer").lookup(params, 10) == (0, 0.0)
    assert not _kv("kv_consumer").is_prefill({"do_remote_decode": True})
    assert _kv("kv_producer").is_prefill({"do_remote_decode": True})


def test_kv_transfer_config_is_parsed_and_checked():
    base = ["m", "--sim-gpu-types", "a100"]
    args = parse_args(base + ["--kv-transfer-config",
                              '{"kv_connector":"ExampleConnector","kv_role":"kv_both"}'], {})
    assert args.kv_transfer == {"kv_connector": "ExampleConnector", "kv_role": "kv_both"}
    assert parse_args(base, {}).kv_transfer is None
    with pytest.raises(UsageError, match="not JSON"):
        parse_args(base + ["--kv-transfer-config", "{oops"], {})
    with pytest.raises(UsageError, match="kv_role 'kv_sometimes'"):
        parse_args(base + ["--kv-transfer-config",
                           '{"kv_connector":"X","kv_role":"kv_sometimes"}'], {})
