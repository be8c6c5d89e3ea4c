"""The worker's side of EcoServe: it obeys phase commands (a decode-phase worker takes no new
request; its engine runs decode-only once the prefills it accepted are done) and reports
what the controller and the router's constraint check need in its heartbeat."""

from __future__ import annotations

from tokenyard.services.worker.core import WorkerConfig, WorkerCore
from tokenyard.shared.schemas import GenerateReply, Phase, WorkerControl
from tokenyard.shared.tokenizer import ByteTokenizer

from tests.builders import req, stats


def core() -> WorkerCore:
    return WorkerCore(WorkerConfig("w0", "m"), ByteTokenizer())


def test_a_decode_phase_worker_refuses_new_requests_a_prefill_phase_one_takes_them():
    c = core()
    c.on_control(WorkerControl("w0", Phase.DECODE, "m0", epoch=3))
    assert c.offer(req("r1"), stats()) == (GenerateReply("r1", False, "decode phase"), False)
    c.on_control(WorkerControl("w0", Phase.PREFILL, "m0", epoch=4))
    assert c.offer(req("r2"), stats()) == (GenerateReply("r2", True), True)
    c.on_control(WorkerControl("w0", Phase.MIXED, "m0", epoch=5))
    assert c.offer(req("r3"), stats()) == (GenerateReply("r3", True), True)


def test_the_engine_finishes_accepted_prefills_before_it_decodes_only():
    c = core()
    c.on_control(WorkerControl("w0", Phase.DECODE, "m0"))
    assert c.engine_phase(stats(queued=300)) == Phase.PREFILL
    assert c.engine_phase(stats(queued=0)) == Phase.DECODE
    c.on_control(WorkerControl("w0", Phase.PREFILL, "m0"))
    assert c.engine_phase(stats(queued=0)) == Phase.PREFILL
    c.on_control(WorkerControl("w0", Phase.MIXED, "m0"))
    assert c.engine_phase(stats(queued=5)) == Phase.MIXED


def test_the_heartbeat_carries_phase_and_ecoserve_inputs():
    c = core()
    c.on_control(WorkerControl("w0", Phase.PREFILL, "m1"))
    hb = c.heartbeat(stats(queued=512, tpot_slack_ms=250.0, compute_util=0.5, prefill_ms_per_token=0.07), 12.0)
    assert (hb.phase, hb.macro_id, hb.stats.tpot_slack_ms, hb.stats.compute_util, hb.stats.prefill_ms_per_token) == (
        "prefill", "m1", 250.0, 0.5, 0.07)
    assert c.heartbeat(stats(), 12.1).stats.tpot_slack_ms is None
