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
