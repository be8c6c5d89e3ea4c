"""The queue's deadlines: a request that can no longer meet its TTFT deadline leaves with a 429
(by its deadline less its own prefill and the engine's backlog); one in flight does not expire."""

from __future__ import annotations

from tokenyard.services.priority_queue.core import QueueConfig, QueueCore
from tokenyard.services.priority_queue.policies.fcfs import FCFS

from tests.test_queue_core import ids
from tests.test_queue_flow_control import fhb, sized


def test_a_request_that_can_no_longer_meet_its_deadline_leaves_with_a_429():
    q = QueueCore(QueueConfig(), FCFS())
    q.offer(sized("p0", 10, 0.0, cls=0), 0.0)  # deadline 0.5 s; leaves once < 0.25 s is left
    q.offer(sized("p1", 10, 0.0, cls=1), 0.0)  # 5 s
    q.offer(sized("p3", 10, 0.0, cls=3), 0.0)  # none
    assert q.expire(0.25) == []
    [(req, rej)] = q.expire(0.26)
    assert req.request_id == "p0" and (rej.status, rej.code, rej.queue_depth) == (429, "deadline_exceeded", 2)
    assert q.stats("pq", 0.26).depth == [0, 1, 0, 1]
    assert ids([r for r, _ in q.expire(1000.0)]) == ["p1"] and len(q) == 1


def test_a_dispatched_request_does_not_expire_and_a_put_back_one_keeps_its_deadline():
    q = QueueCore(QueueConfig(), FCFS())
    q.on_heartbeat(fhb("w0"), 0.0)
    q.offer(sized("a", 10, 0.0, cls=0), 0.0)
    assert ids(q.dispatchable(0.0)) == ["a"]
    assert q.expire(1.0) == []  # in flight, not waiting
    q.on_not_routed("a", 1.0)
    [(req, _)] = q.expire(1.0)
    assert req.request_id == "a" and len(q) == 0


def test_a_long_prompt_leaves_by_its_deadline_less_its_own_prefill_and_the_engine_backlog():
    """Admission stamps deadline = arrival + class target + predicted prefill (shared.slo); the
    queue must release it by deadline − prefill − 0.25 s, i.e. within its class target."""
    from tokenyard.shared.slo import ttft_deadline_s

    q = QueueCore(QueueConfig(), FCFS())
    long = sized("long", 15000, 0.0, cls=1)
    long.prefill_s = 2.0
    long.deadline_s = ttft_deadline_s(0.0, 1, None, long.prefill_s)  # 7 s
    q.offer(long, 0.0)
    assert q.next_expiry() == 4.75
    assert q.expire(4.75) == []
    [(req, rej)] = q.expire(4.76)
    assert req.request_id == "long" and rej.message.endswith("meet its 7 s TTFT deadline (P1); retry later")


def test_a_capped_deadline_leaves_the_queue_by_the_cap_less_the_prefill_and_the_engine_backlog():
    """A prefill of 6 s would give P1 11 s; the cap (2 × 5 s ÷ the measured overshoot, 8.70 s)
    leaves 8.70 − 6 − 0.25 = 2.45 s to wait: the queue expires it then, not at 4.75 s."""
    from tokenyard.shared.slo import deadline_cap_s, ttft_deadline_s

    q = QueueCore(QueueConfig(), FCFS())
    long = sized("long", 30000, 0.0, cls=1)
    long.prefill_s = 6.0
    long.deadline_s = ttft_deadline_s(0.0, 1, None, long.prefill_s)
    assert long.deadline_s == deadline_cap_s(1) and round(long.deadline_s, 2) == 8.70
    q.offer(long, 0.0)
    assert round(q.next_expiry(), 3) == 2.446
    assert q.expire(2.44) == []
    [(req, rej)] = q.expire(2.45)
    assert (rej.status, rej.code) == (429, "deadline_exceeded")
    assert rej.message.endswith("meet its 8.7 s TTFT deadline (P1); retry later") and len(q) == 0


def test_deadline_expiry_can_be_switched_off():
    q = QueueCore(QueueConfig(expire_deadlines=False), FCFS())
    q.offer(sized("a", 10, 0.0, cls=0), 0.0)
    assert q.expire(100.0) == [] and len(q) == 1
