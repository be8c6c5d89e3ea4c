"""Keep-alives: every core that takes heartbeats (router, queue, admission, macro-instance
controller) takes a worker's latest heartbeat again as `on_keepalive(worker_id, now)` — only
its time moves — and ends in exactly the state the heartbeat itself would have left, or says
False (a route changed its view since) and changes nothing, so the sender sends the heartbeat.
One property run against each core: two copies, one fed keep-alives, one fed the repeated
heartbeats, through random heartbeats, routes and time, must agree on everything they answer.
The cluster simulator's use of them (and of its stalled-engine list) is checked against the
plain way: the same tokens at the same times."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenyard.loadgen.workloads import open_workload
from tokenyard.services.admission.core import AdmissionConfig, AdmissionCore
from tokenyard.services.macro_instance.core import MacroConfig, MacroCore
from tokenyard.services.priority_queue.core import QueueConfig, QueueCore
from tokenyard.services.priority_queue.policies.fcfs import FCFS
from tokenyard.services.router.core import RouterConfig, RouterCore
from tokenyard.services.router.fleet import FleetView
from tokenyard.shared.tokenizer import ByteTokenizer
from tokenyard.simulator.cluster import ChainCache, ClusterSim, SimConfig

from tests.builders import MODEL, hb, req

WORKERS = ("w0", "w1")


def queue_state(q: QueueCore, now: float) -> tuple:
    workers = {w: (s.waiting, s.takes_new, s.phase, s.mode, s.seen_s, s.sent, s.running, s.queued_prefill, s.kv_free_tokens,
                   s.prefill_s_per_token, s.sent_tokens, s.sent_p0, s.tpot_slack_s) for w, s in q.workers.items()}
    # headroom now, once some heartbeats are stale, and once all are
    return workers, [q.headroom(now + dt) for dt in (0.0, 0.6, 1.2, 5.0)], len(q), len(q.in_flight)


def view_state(v: FleetView, now: float) -> tuple:
    cols = {name: [repr(x) for x in getattr(v, name)[: v.n].tolist()]  # repr: NaN equals NaN
            for name in FleetView.COLUMNS
            if name not in ("hb_decision", "hit", "new", "p", "tree_blocks")}  # scratch and bookkeeping
    return v.ids, v.macro, v.stats, cols, v.fresh(now, 1.0).tolist()


def admission_state(a: AdmissionCore, now: float) -> tuple:
    f = a.fleet
    return (f.workers, f.prefill_cost, f.tpot_slack_s, f.decode_room_s(now), f.own_prefill_s(1000, now),
            f.fleet_down(now), f.fleet_down(now + 2.0))


def macro_state(m: MacroCore, now: float) -> tuple:
    contents = {w: (msgspec.structs.replace(r.hb, ts=0.0, seq=0), r.seen_s) for w, r in m.reported.items()}
    return contents, {w: m.load(w) for w in m.reported}


class QueueCase:
    def make(self):
        return QueueCore(QueueConfig(stale_after_s=1.0), FCFS())

    state = staticmethod(queue_state)

    def route(self, q: QueueCore, wid: str, prompt: int, now: float, n: int) -> None:
        """A request released and routed to `wid` (when the headroom lets one go)."""
        q.offer(req(f"r{n}", prompt_len=prompt, arrival_s=now), now)
        for r in q.dispatchable(now):
            q.on_routed(r.request_id, wid, now)


class ViewPort:
    """The router's FleetView under the cores' names (upsert, keepalive), routes to any row."""

    def __init__(self) -> None:
        self.view = FleetView(capacity=1)
        self.on_heartbeat, self.on_keepalive = self.view.upsert, self.view.keepalive


class ViewCase:
    make = ViewPort

    @staticmethod
    def state(p, now: float) -> tuple:
        return view_state(p.view, now)

    def route(self, p: ViewPort, wid: str, prompt: int, now: float, n: int) -> None:
        i = p.view.slot.get(wid)
        if i is not None:
            p.view.note_routed(i, prompt, -(-prompt // 16))


class RouterCase(ViewCase):
    def make(self):
        return RouterCore(RouterConfig(policy="least-loaded", stale_after_s=1.0))

    @staticmethod
    def state(r: RouterCore, now: float) -> tuple:
        return view_state(r.view, now)

    def route(self, r: RouterCore, wid: str, prompt: int, now: float, n: int) -> None:
        r.route(req(f"r{n}", prompt_len=prompt), now)  # the policy's choice gets the correction


class AdmissionCase:
    def make(self):
        return AdmissionCore(AdmissionConfig(models=[MODEL]), ByteTokenizer())

    state = staticmethod(admission_state)

    def route(self, *args) -> None:  # admission keeps no per-route correction
        pass


class MacroCase:
    def make(self):
        return MacroCore(MacroConfig(size=2, mode="nodg", stale_after_s=1.0))

    state = staticmethod(macro_state)

    def route(self, *args) -> None:
        pass


CASES = {"queue": QueueCase(), "fleet-view": ViewCase(), "router": RouterCase(), "admission": AdmissionCase(),
         "macro": MacroCase()}

heartbeats = st.tuples(
    st.just("hb"), st.sampled_from(WORKERS), st.integers(0, 4), st.integers(0, 3), st.integers(0, 6000),
    st.integers(0, 3000), st.one_of(st.none(), st.floats(-50.0, 400.0)),
    st.sampled_from([True, True, True, False]), st.sampled_from([False, False, False, True]),  # healthy, draining
    st.sampled_from([0.0, 0.05, 0.4]), st.sampled_from(["mixed", "prefill", "decode"]),
)
ops = st.lists(st.one_of(
    heartbeats,
    st.tuples(st.just("keep"), st.sampled_from(WORKERS)),
    st.tuples(st.just("route"), st.sampled_from(WORKERS), st.integers(1, 3000)),
    st.tuples(st.just("wait"), st.sampled_from([0.1, 0.5, 0.9, 1.5])),
), max_size=40)


@pytest.mark.parametrize("name", list(CASES))
@settings(max_examples=100, deadline=None)
@given(ops=ops)
def test_a_keepalive_leaves_a_core_as_the_repeated_heartbeat_would(name, ops):
    case = CASES[name]
    a, b = case.make(), case.make()  # a: keep-alives; b: the heartbeat itself, every time
    last: dict[str, object] = {}
    now, kept, seq = 0.0, 0, 0
    for n, op in enumerate(ops):
        if op[0] == "wait":
            now += op[1]
        elif op[0] == "hb":
            _, wid, running, waiting, queued, free, slack, healthy, draining, rate, phase = op
            seq += 1
            h = hb(wid, running=running, waiting=waiting, queued=queued, free=free, tpot_slack_ms=slack,
                   prefill_ms_per_token=rate, healthy=healthy, draining=draining, phase=phase, ts=now, seq=seq)
            last[wid] = h
            a.on_heartbeat(h, now)
            b.on_heartbeat(h, now)
        elif op[0] == "route":
            case.route(a, op[1], op[2], now, n)
            case.route(b, op[1], op[2], now, n)
        else:
            wid = op[1]
            before = case.state(a, now)
            if wid not in last:
                assert a.on_keepalive(wid, now) is False  # nothing to repeat
                assert case.state(a, now) == before
                continue
            seq += 1
            again = msgspec.structs.replace(last[wid], ts=now, seq=seq)
            if a.on_keepalive(wid, now):
                kept += 1
            else:
                assert case.state(a, now) == before  # refused: nothing moved
                a.on_heartbeat(again, now)
            b.on_heartbeat(again, now)
        assert case.state(a, now) == case.state(b, now), op


def test_a_route_since_the_heartbeat_refuses_the_keepalive_until_the_next_heartbeat():
    q = QueueCore(QueueConfig(stale_after_s=1.0), FCFS())
    v = FleetView()
    h = hb("w0", queued=0, free=1000, prefill_ms_per_token=0.1)
    q.on_heartbeat(h, 0.0)
    v.upsert(h, 0.0)
    assert q.on_keepalive("w0", 0.1) and v.keepalive("w0", 0.1)
    q.offer(req("a", prompt_len=300), 0.1)
    [r] = q.dispatchable(0.1)
    q.on_routed("a", "w0", 0.1)
    v.note_routed(0, 300, 19)
    assert not q.on_keepalive("w0", 0.2) and not v.keepalive("w0", 0.2)
    assert q.workers["w0"].seen_s == 0.1 and v.seen_s[0] == 0.1  # refused: untouched
    q.on_heartbeat(h, 0.3)
    v.upsert(h, 0.3)
    assert q.on_keepalive("w0", 0.4) and v.keepalive("w0", 0.4)


# ───────────── the queue's running headroom sum ─────────────

def brute_headroom(q: QueueCore, now: float) -> int:
    """The module's formula, one pass over the fleet: Σ max(0, room_w) over fresh
    workers, less the prompt tokens in flight."""
    room = sum(max(0, w.room()) for w in q.workers.values()
               if w.takes_new and now - w.seen_s <= q.cfg.stale_after_s)
    return room - sum(max(1, r.prompt_len) for r in q.in_flight.values())


@settings(max_examples=80, deadline=None)
@given(ops=ops)
def test_headroom_kept_as_a_running_sum_equals_the_pass_over_the_fleet(ops):
    q = QueueCase().make()
    now = 0.0
    for n, op in enumerate(ops):
        if op[0] == "wait":
            now += op[1]
        elif op[0] == "hb":
            _, wid, running, waiting, queued, free, slack, healthy, draining, rate, phase = op
            q.on_heartbeat(hb(wid, running=running, waiting=waiting, queued=queued, free=free, tpot_slack_ms=slack,
                              prefill_ms_per_token=rate, healthy=healthy, draining=draining, phase=phase), now)
        elif op[0] == "route":
            q.offer(req(f"r{n}", prompt_len=op[2], arrival_s=now), now)
            released = q.dispatchable(now)
            if released:  # the first back (no capacity), the rest routed
                q.on_not_routed(released[0].request_id, now)
                for r in released[1:]:
                    q.on_routed(r.request_id, op[1], now)
        else:
            q.on_keepalive(op[1], now)
        assert q.room_sum == sum(w.counted for w in q.workers.values())
        for dt in (0.0, 0.3, 0.99, 1.0, 1.01, 3.0):
            assert q.headroom(now + dt) == brute_headroom(q, now + dt)


# ───────────── the simulator: keep-alives and stalled engines, against the plain way ─────────────

def run(items, cfg: SimConfig, plain: bool, block_tokens: int) -> tuple[ClusterSim, int]:
    """A simulation; `plain`: every repeat sent as the heartbeat itself and every engine asked
    every tick (the simulator's reference way). Also how many keep-alives the cores took."""
    sim = ClusterSim(cfg, block_tokens, ChainCache())
    taken = [0]
    if plain:
        sim.keepers = [lambda wid, now: False]
        sim.expiring = True  # the per-tick retry then walks the whole fleet
    else:
        def count(keep):
            def counted(wid, now):
                ok = keep(wid, now)
                taken[0] += ok
                return ok
            return counted
        sim.keepers = [count(k) for k in sim.keepers]
    sim.run(items)
    return sim, taken[0]


@pytest.mark.parametrize("cfg", [SimConfig(instances=32), SimConfig(instances=8, macro_size=4, mode="ecoserve")],
                         ids=["plain-fleet", "ecoserve"])
def test_the_simulator_with_keepalives_gives_the_plain_runs_tokens_at_the_same_times(cfg):
    w = open_workload("mooncake", num_requests=150)
    items = w.items()
    fast, taken = run(items, cfg, False, w.block_tokens)
    plain, _ = run(items, cfg, True, w.block_tokens)
    assert taken > 1000  # idle workers' repeats went as keep-alives
    assert fast.reqs.keys() == plain.reqs.keys()
    for rid, mine in fast.reqs.items():
        ref = plain.reqs[rid]
        assert (list(mine.tokens), mine.worker, mine.error, mine.finished, mine.cached_tokens) == (
            list(ref.tokens), ref.worker, ref.error, ref.finished, ref.cached_tokens), rid
    assert [i.busy_s for i in fast.instances] == [i.busy_s for i in plain.instances]
    assert np.array_equal(np.array(fast.pbs_var), np.array(plain.pbs_var))
    assert sum(r.finished for r in fast.reqs.values()) > 0 and not math.isnan(sum(fast.pbs_var))
