"""The heartbeat carries the engine's stats whole (`Heartbeat.stats: EngineStats`): every stat,
set to a value of its own, reaches the router's fleet view after the worker core built the
heartbeat and it crossed the wire — so a stat added to EngineStats and dropped on the way fails
here, without this test naming it."""

from __future__ import annotations

import math
from typing import Annotated, get_args, get_origin

import msgspec
import numpy as np
import pytest
from tokenyard.services.router.core import RouterConfig, RouterCore
from tokenyard.services.router.fleet import FleetView
from tokenyard.services.worker.core import WorkerConfig, WorkerCore
from tokenyard.shared import codec
from tokenyard.shared.schemas import EngineStats, Heartbeat, Int64
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.builders import hb

FIELDS = msgspec.structs.fields(EngineStats)

COLUMNS = {
    "running": ("running", "bs"),
    "waiting": ("waiting",),
    "queued_prefill_tokens": ("queued_prefill",),
    "kv_blocks_used": ("kv_used",),
    "kv_blocks_free": ("kv_free",),
    "block_size": ("block_size",),
    "step_time_ms": ("step_ms",),
    "tpot_slack_ms": ("slack_ms",),
    "prefill_ms_per_token": ("ms_per_token",),
    "vbs": ("vbs",),
    "min_tpot_slo_ms": ("min_stp_ms",),
    "vbs_limit": ("vbs_limit",),
}
"""The stats the scorers read as vectorised columns (FleetView), and those columns."""


def distinct_stats() -> EngineStats:
    """Every field a value no other field and no default has: ints 1001, 1002, …; floats 2001.25, …"""
    values = {}
    for k, f in enumerate(FIELDS, start=1):
        kind = get_args(f.type)[0] if get_origin(f.type) is Annotated else f.type  # Int64 = int with bounds
        if kind is int:
            values[f.name] = 1000 + k
        elif kind in (float, float | None):
            values[f.name] = 2000 + k + 0.25
        elif kind == list[Int64]:
            values[f.name] = [3000 + k, 3100 + k]
        else:  # a new kind of stat: give it a distinct value here
            raise TypeError(f"EngineStats.{f.name}: no distinct value for {f.type}")
    return EngineStats(**values)


def hashable(value):
    return tuple(value) if isinstance(value, list) else value


def test_the_distinct_stats_differ_from_every_default_and_from_each_other():
    s = distinct_stats()
    values = [hashable(getattr(s, f.name)) for f in FIELDS]
    assert len(set(values)) == len(FIELDS) == 22
    assert all(v != f.default for v, f in zip(values, FIELDS, strict=True))


@pytest.mark.parametrize("json", [False, True], ids=["msgpack", "json"])
def test_every_engine_stat_reaches_the_routers_fleet_view(json):
    stats = distinct_stats()
    beat = WorkerCore(WorkerConfig("w7", "m"), ByteTokenizer()).heartbeat(stats, 5.0)
    wire = codec.decode(codec.encode(beat, json=json), Heartbeat, json=json)
    router = RouterCore(RouterConfig())
    router.on_heartbeat(wire, 5.0)
    view = router.view
    arrived = view.stats_of("w7")
    assert arrived is not None
    i = view.slot["w7"]
    for f in FIELDS:
        sent = getattr(stats, f.name)
        assert getattr(arrived, f.name) == sent, f.name
        for col in COLUMNS.get(f.name, ()):
            assert getattr(view, col)[i] == sent, (f.name, col)


def test_every_column_the_view_fills_from_the_stats_is_named_above():
    """A column added to FleetView.upsert from a stat, and not listed in COLUMNS, would go
    unchecked: upsert a heartbeat with distinct stats into an empty view and find every column
    holding one of those values."""
    stats = distinct_stats()
    view = FleetView()
    i = view.upsert(Heartbeat("w0", "m", 1, 0.0, stats), 3.0)
    sent = {hashable(getattr(stats, f.name)) for f in FIELDS}
    filled = {name for name, col in vars(view).items()
              if isinstance(col, np.ndarray) and len(col) > i and col[i] in sent}  # (not the kept row index)
    assert filled == {col for cols in COLUMNS.values() for col in cols}


def test_an_idle_engines_defaults_arrive_as_defaults():
    """omit_defaults leaves the unset stats off the wire; the reader gets the defaults back,
    and `tpot_slack_ms` None (nothing decodes) becomes the view's NaN, not 0."""
    router = RouterCore(RouterConfig())
    beat = hb("w0", running=0, free=50)
    router.on_heartbeat(codec.decode(codec.encode(beat), Heartbeat), 1.0)
    assert router.view.stats_of("w0") == beat.stats
    assert math.isnan(router.view.slack_ms[0])


def test_the_view_keeps_each_workers_stats_on_its_row_when_a_silent_one_is_forgotten():
    view = FleetView(capacity=1)
    for k, wid in enumerate(("w0", "w1", "w2")):
        view.upsert(hb(wid, running=k, preemptions=10 * k), float(k))
    assert view.forget_silent(now=10.0, forget_after_s=9.5) == ["w0"]  # w2 swapped into row 0
    assert view.stats_of("w0") is None
    assert [(view.stats_of(w).running, view.stats_of(w).preemptions) for w in ("w1", "w2")] == [(1, 10), (2, 20)]
    assert view.stats[view.slot["w2"]].running == view.running[view.slot["w2"]] == 2
