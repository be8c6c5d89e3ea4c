"""The simulated engine hands a reader that fell behind the steps it missed as one output (as
vLLM's output collector merges a slow consumer's deltas): every token once, in order, the
finish last; a P/D hand-off still ends the stream without a token of its own."""

from __future__ import annotations

from tokenyard.services.worker.sim.core import SimEngineCore
from tokenyard.services.worker.sim.engine import HANDED_OFF, SimEngine
from tokenyard.services.worker.sim.latency import profile

from tests.builders import req
from tests.conftest import until


async def test_a_reader_that_fell_behind_gets_the_steps_it_missed_as_one_output():
    engine = SimEngine(SimEngineCore(profile("zero"), 16, 1024))
    await engine.start()
    try:
        gen = engine.generate(req("r1", tokens=list(range(40)), max_tokens=20))
        first = await anext(gen)
        await until(lambda: "r1" not in engine.core.seqs)  # the engine ran the rest while nobody read
        # A step's outputs go out after its modelled time: r1's last ones are delivered once a
        # request started after it has its first token (a later step's output).
        later = engine.generate(req("r2", tokens=list(range(40)), max_tokens=1))
        assert (await anext(later)).finished
        await later.aclose()
        rest = [out async for out in gen]
        assert len(rest) == 1 and rest[0].finished and rest[0].finish_reason == "length"
        tokens = first.new_token_ids + rest[0].new_token_ids
        assert len(tokens) == 20 and not first.finished
    finally:
        await engine.stop()


async def test_a_hand_off_behind_unread_tokens_ends_the_stream_after_them():
    engine = SimEngine(SimEngineCore(profile("zero"), 16, 1024))
    engine.set_hand_off(True)  # a P/D prefill worker: the first token, then the request goes on
    await engine.start()
    try:
        outs = [out async for out in engine.generate(req("r1", tokens=list(range(40)), max_tokens=20))]
        assert [len(o.new_token_ids) for o in outs] == [1] and not outs[0].finished
        assert all(o.finish_reason != HANDED_OFF for o in outs)
        assert engine.take_hand_off("r1") is not None
    finally:
        await engine.stop()


async def test_at_debug_level_each_request_logs_what_the_engine_held_and_did_with_it(monkeypatch):
    from tokenyard.services.worker.sim import engine as engine_module

    class Debug:  # the module's logger at TOKENYARD_LOG_LEVEL=debug, whatever an earlier test configured
        lines: list[tuple[str, dict]] = []

        def is_enabled_for(self, level):
            return True

        def debug(self, event, **kw):
            self.lines.append((event, kw))

    monkeypatch.setattr(engine_module, "log", Debug())
    engine = SimEngine(SimEngineCore(profile("zero"), 16, 1024))
    await engine.start()
    try:
        [_ async for _ in engine.generate(req("r1", tokens=list(range(40)), max_tokens=3))]
        [_ async for _ in engine.generate(req("r2", tokens=list(range(40)), max_tokens=3))]  # r1's prefix
    finally:
        await engine.stop()
    lines = [kw for event, kw in Debug.lines if event == "first_token"]
    assert [(x["request_id"], x["prompt_tokens"], x["cached_tokens"]) for x in lines] == [("r1", 40, 0), ("r2", 40, 32)]
    assert lines[0]["running"] == lines[0]["waiting"] == lines[0]["queued_prefill"] == 0  # an idle engine
    assert all(x["ttft_ms"] >= 0 and x["arrived_s"] > 0 for x in lines)
