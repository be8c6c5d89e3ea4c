"""Seed 004's fixed-partition baseline (services/priority_queue/policies/bubble_partitions.py):
a request of length L goes only to the instances of its length range; the instances are split
over the ranges in proportion to their work, each range with requests at least one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tokenyard.loadgen.workloads.heavy_tail import HeavyTailWorkload
from tokenyard.services.priority_queue.policies.bubble_partitions import (
    FixedPartitions,
    range_of,
    split_instances,
)
from tokenyard.simulator.cluster import SimConfig
from tokenyard.tuning.evaluate import PartitionedSetup, run_partitioned


def test_lengths_fall_in_the_base_ranges_bounds_included_below():
    assert [range_of(n) for n in (0, 511, 512, 2047, 2048, 8191, 8192, 10**6)] == [0, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError):
        range_of(-1)


def test_the_routing_rule_gives_each_range_its_own_instances():
    parts = FixedPartitions((1, 1, 2, 4))
    assert parts.instances == 8
    assert [list(parts.route(n)) for n in (100, 1000, 5000, 20000)] == [[0], [1], [2, 3], [4, 5, 6, 7]]
    with pytest.raises(ValueError, match="no instance serves"):
        FixedPartitions((1, 0, 1, 1)).route(1000)
    with pytest.raises(ValueError):
        FixedPartitions((1, 1, 1))


def test_the_split_follows_the_work_with_one_instance_per_busy_range():
    assert split_instances([1, 1, 1, 1], 4) == [1, 1, 1, 1]
    assert split_instances([0.024, 0.086, 0.212, 0.678], 8) == [1, 1, 2, 4]
    assert split_instances([5, 0, 0, 5], 5) == [2, 0, 0, 3]  # a tie goes to the longer range
    with pytest.raises(ValueError, match="cannot give each one"):
        split_instances([1, 1, 1, 1], 3)
    with pytest.raises(ValueError):
        split_instances([0, 0, 0, 0], 4)


@given(st.lists(st.floats(0, 1e6), min_size=4, max_size=4).filter(lambda w: sum(w) > 0), st.integers(4, 64))
def test_split_invariants(work, n):
    counts = split_instances(work, n)
    assert sum(counts) == n
    spare, total = n - sum(1 for w in work if w > 0), sum(work)
    for c, w in zip(counts, work, strict=True):
        if w == 0:
            assert c == 0
        else:  # one instance, then its share of the rest, within one
            assert abs(c - 1 - spare * w / total) < 1


def test_in_the_simulator_every_request_runs_on_its_own_ranges_instances():
    w = HeavyTailWorkload(60, rate=4.0, seed=1)
    items = w.items()
    parts = FixedPartitions((1, 1, 1, 1))
    served = run_partitioned(items, SimConfig(instances=4), w.block_tokens, parts)
    assert len(served) == len(items)
    ranges = {}
    for it in items:
        k = parts.range_of(it.prompt_len + it.max_tokens)
        instance, state = served[f"r{it.index}"]
        assert state.finished and instance in parts.route(it.prompt_len + it.max_tokens)
        ranges.setdefault(instance, set()).add(k)
    assert all(len(ks) == 1 for ks in ranges.values())  # no instance serves two ranges
    assert len(ranges) == 4
    with pytest.raises(ValueError, match="covers 4 instances"):
        run_partitioned(items, SimConfig(instances=5), w.block_tokens, parts)


def test_the_bench_split_weighs_ranges_by_prefill_time():
    # the heavy-tail mix's prefill time is ~2/3 in the 8k+ range: half the instances go there
    setup = PartitionedSetup(HeavyTailWorkload(2000, rate=20.0, seed=0), SimConfig(instances=8))
    assert setup.partitions().counts == (1, 1, 2, 4)
    assert PartitionedSetup(setup.workload, SimConfig(instances=8), counts=(2, 2, 2, 2)).partitions().counts == (2, 2, 2, 2)
