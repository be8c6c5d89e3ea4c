"""The KV relay (services/worker/vllm/kv_relay.py): vLLM's block hashes → the fleet's chain.
Pure: vLLM-shaped events are built here (same field names as vllm.distributed.kv_events),
so these run without vLLM installed."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.services.worker.vllm.kv_relay import KVHashRelay
from tokenyard.shared.hashing import hash_chain
from tokenyard.shared.schemas import AllBlocksCleared, BlockRemoved, BlockStored


@dataclass
class VStored:  # vllm.distributed.kv_events.BlockStored, the fields the relay reads
    block_hashes: list
    parent_block_hash: object
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = "GPU"
    lora_name: str | None = None
    extra_keys: list | None = None
    group_idx: int | None = None


@dataclass
class VRemoved:
    block_hashes: list
    medium: str | None = "GPU"
    group_idx: int | None = None


VStored.__name__ = "BlockStored"
VRemoved.__name__ = "BlockRemoved"


@dataclass
class VCleared:
    x: list = field(default_factory=list)


VCleared.__name__ = "AllBlocksCleared"

PROMPT = list(range(1000, 1300))


def test_one_vllm_block_of_128_is_eight_fleet_blocks_of_the_admission_chain():
    relay = KVHashRelay(16)
    [ev] = relay.translate([VStored([b"v0"], None, PROMPT[:128], 128)])
    assert ev == BlockStored(hash_chain(PROMPT, 16)[:8], None, PROMPT[:128], 16, medium="GPU")


def test_children_chain_on_their_parent_across_events():
    relay = KVHashRelay(16)
    chain = hash_chain(PROMPT, 16)
    relay.translate([VStored([11, 12], None, PROMPT[:64], 32)])
    [ev] = relay.translate([VStored([13, 14], 12, PROMPT[64:128], 32)])
    assert ev.block_hashes == chain[4:8]
    assert ev.parent_block_hash == chain[3]
    assert ev.token_ids == PROMPT[64:128]
    assert relay.fleet_hashes(13) == chain[4:6]


def test_an_engine_block_size_that_is_not_a_multiple_carries_tokens_over():
    relay = KVHashRelay(16)
    chain = hash_chain(PROMPT, 16)
    [a] = relay.translate([VStored([1], None, PROMPT[:24], 24)])  # 1.5 fleet blocks
    [b] = relay.translate([VStored([2], 1, PROMPT[24:48], 24)])  # completes the 2nd, then the 3rd
    assert a.block_hashes == chain[:1] and a.token_ids == PROMPT[:16]
    assert b.block_hashes == chain[1:3] and b.parent_block_hash == chain[0]
    assert b.token_ids == PROMPT[16:48]


def test_removal_reports_fleet_blocks_no_live_vllm_block_still_covers():
    relay = KVHashRelay(16)
    chain = hash_chain(PROMPT, 16)
    relay.translate([VStored([1], None, PROMPT[:32], 32)])
    relay.translate([VStored([2], None, PROMPT[:32], 32)])  # another vLLM hash, same tokens
    assert relay.translate([VRemoved([1])]) == []
    assert relay.translate([VRemoved([2])]) == [BlockRemoved(chain[:2], medium="GPU")]
    assert relay.translate([VRemoved([2])]) == []  # unknown now: nothing to say


def test_a_restored_hash_is_announced_again_but_counted_once():
    relay = KVHashRelay(16)
    chain = hash_chain(PROMPT, 16)
    relay.translate([VStored([1], None, PROMPT[:32], 32)])
    [again] = relay.translate([VStored([1], None, PROMPT[:32], 32)])  # vLLM re-emits on reuse
    assert again.block_hashes == chain[:2]
    assert relay.translate([VRemoved([1])]) == [BlockRemoved(chain[:2], medium="GPU")]


def test_a_child_still_maps_after_its_parent_was_evicted():
    relay = KVHashRelay(16)
    chain = hash_chain(PROMPT, 16)
    relay.translate([VStored([1], None, PROMPT[:32], 32), VRemoved([1])])
    [ev] = relay.translate([VStored([2], 1, PROMPT[32:64], 32)])
    assert ev.block_hashes == chain[2:4]


def test_unknown_parents_and_off_chain_events_are_dropped_and_counted():
    relay = KVHashRelay(16)
    assert relay.translate([VStored([2], 999, PROMPT[:32], 32)]) == []
    assert relay.translate([VStored([3], None, PROMPT[:32], 32, lora_name="adapter")]) == []
    assert relay.translate([VStored([4], None, PROMPT[:32], 32, extra_keys=[("salt",)])]) == []
    assert relay.translate([VStored([5], None, PROMPT[:32], 32, group_idx=1)]) == []
    assert (relay.counters.unmapped, relay.counters.skipped) == (1, 3)
    # no extra keys at all is the ordinary case
    assert relay.translate([VStored([6], None, PROMPT[:32], 32, extra_keys=[None])])


def test_all_blocks_cleared_forgets_live_blocks():
    relay = KVHashRelay(16)
    relay.translate([VStored([1], None, PROMPT[:32], 32)])
    assert relay.translate([VCleared()]) == [AllBlocksCleared()]
    assert relay.translate([VRemoved([1])]) == []
    assert relay.fleet_hashes(1) == []


@settings(max_examples=60, deadline=None)
@given(
    engine_bs=st.sampled_from([16, 32, 48, 128]),
    n_blocks=st.integers(1, 12),
    split=st.lists(st.integers(1, 4), min_size=1, max_size=12),
)
def test_whatever_the_batching_the_stored_hashes_are_the_admission_chain(engine_bs, n_blocks, split):
    """Stored in runs of any length, in order: the fleet hashes concatenate to the chain of
    the engine's whole blocks, and removing everything removes each exactly once."""
    tokens = PROMPT[: n_blocks * engine_bs] if n_blocks * engine_bs <= len(PROMPT) else list(range(n_blocks * engine_bs))
    relay = KVHashRelay(16)
    got: list[int] = []
    k, parent, i = 0, None, 0
    while k < n_blocks:
        run = min(split[i % len(split)], n_blocks - k)
        ids = list(range(k, k + run))
        for ev in relay.translate([VStored(ids, parent, tokens[k * engine_bs : (k + run) * engine_bs], engine_bs)]):
            assert ev.parent_block_hash == (got[-1] if got else None)
            got.extend(ev.block_hashes)
        parent, k, i = ids[-1], k + run, i + 1
    assert got == hash_chain(tokens, 16)
    removed = [h for ev in relay.translate([VRemoved(list(range(n_blocks)))]) for h in ev.block_hashes]
    assert sorted(removed) == sorted(got)


def test_an_offloaded_copy_outlives_its_gpu_block():
    relay = KVHashRelay(16)
    chain = hash_chain(PROMPT, 16)
    relay.translate([VStored([1], None, PROMPT[:32], 32)])
    [cpu] = relay.translate([VStored([1], None, PROMPT[:32], 32, medium="CPU")])
    assert (cpu.block_hashes, cpu.medium) == (chain[:2], "CPU")
    assert relay.translate([VRemoved([1])]) == [BlockRemoved(chain[:2], medium="GPU")]
    assert relay.fleet_hashes(1, "CPU") == chain[:2]
    assert relay.translate([VRemoved([1], medium="CPU")]) == [BlockRemoved(chain[:2], medium="CPU")]


def test_a_placeholder_without_tokens_is_skipped_and_leaves_the_chain_alone():
    relay = KVHashRelay(16)
    chain = hash_chain(PROMPT, 16)
    relay.translate([VStored([1], None, PROMPT[:32], 32)])
    assert relay.translate([VStored([1], None, [], 0, medium="CPU")]) == []
    [ev] = relay.translate([VStored([2], 1, PROMPT[32:64], 32)])
    assert ev.block_hashes == chain[2:4]
