"""A hand-over whose AdoptReply is lost leaves its streams with the router that adopted them, and
no second router follows them (shared/adoption.py). Live, on the session's secured nats-server:
one worker; router A places three long streams; router B starts; A's connection closes. The
worker hands the streams to B, which follows them, but B's AdoptReply never reaches the worker
(dropped here). Router C starts, and any later hand-over B receives is passed to C.

Before the fix the worker, missing the reply, credited the streams to A still, handed them over
again some 6 s later, and C followed them too: if the worker had died then, B and C would both
have re-issued each stream to its client (two generations on one stream). Now the worker asks B
(`llm.v1.router.<id>.adopted`) which it follows and follows B for all three; no second hand-over
happens, C follows nothing. When B's connection closes in turn, the worker, now probing B, hands
the streams to C."""

from __future__ import annotations

from tokenyard.services.router import shell as router_shell
from tokenyard.shared import codec, config
from tokenyard.shared.adoption import AdoptAsk

from tests import adoption_fleet
from tests.builders import req
from tests.conftest import until

STREAMS = 3


async def test_a_lost_adopt_reply_leaves_the_streams_with_their_adopter_and_no_second_router_follows(
        nats_server, monkeypatch):
    real_on_adopt = router_shell.on_adopt
    hosts: dict[str, object] = {}
    b_asks = []

    async def on_adopt(shell, msg):
        """Router B adopts the first hand-over but its AdoptReply is lost; any later one B gets
        goes to C (so a second hand-over, if any, surely reaches another router)."""
        if "b" not in hosts or shell is not hosts["b"].shell:
            return await real_on_adopt(shell, msg)
        b_asks.append(msg.data)
        if len(b_asks) == 1:
            msg.reply = ""  # on_adopt answers only a message with a reply subject
            return await real_on_adopt(shell, msg)
        return await real_on_adopt(hosts["c"].shell, msg)

    monkeypatch.setattr(router_shell, "on_adopt", on_adopt)  # bound by each router's start
    af = await adoption_fleet.start(nats_server.url, "lw0", "_INBOX.lostreply")
    reqs = [req(f"lost-{i}", prompt_len=64, max_tokens=4000, reply_to=f"_INBOX.lostreply.{i}",
                model=config.DEFAULT_MODEL) for i in range(STREAMS)]
    ids = {ar.request_id for ar in reqs}
    core = af.worker.shell.core

    def handovers() -> list[list[str]]:
        return [[r.request_id for r in codec.decode(a, AdoptAsk).requests] for a in af.asks]

    try:
        await adoption_fleet.place(af, reqs, 30)
        [by_a] = {st.placed_by for st in core.streams.values()}
        hosts["b"] = await af.fleet.add(adoption_fleet.router())
        b = hosts["b"].shell
        await af.router_a.nc.close()  # router A is gone from the bus
        await until(lambda: ids <= set(b.migration.tracked), 30, 0.05, what="router B adopts every stream")
        assert len(b_asks) == 1  # its AdoptReply dropped
        hosts["c"] = await af.fleet.add(adoption_fleet.router())
        c = hosts["c"].shell

        def credited_to_b() -> bool:
            return ids <= set(core.streams) and all(core.streams[rid].placed_by not in ("", by_a) for rid in ids)

        # the fix credits B at the missing reply's timeout; before it, C followed the streams ~6 s later
        await until(lambda: credited_to_b() or c.migration.tracked, 40, 0.05,
                    what="the worker to credit B, or C to follow the streams")
        assert not c.migration.tracked, "a second router follows the streams"
        assert credited_to_b()
        [by_b] = {st.placed_by for st in core.streams.values()}
        await until(lambda: by_a not in core.routers.proven, 10, what="the worker to stop following A")
        assert not c.migration.tracked and ids <= set(b.migration.tracked)
        assert handovers() == [sorted(ids)] and len(b_asks) == 1  # one hand-over only
        # B is the one followed now: when it goes, the streams go to C
        await hosts["b"].nc.close()
        await until(lambda: ids <= set(c.migration.tracked), 30, 0.05, what="the worker hands the streams to C")
        await until(lambda: all(core.streams[rid].placed_by not in ("", by_a, by_b) for rid in ids), 10,
                    what="the worker to follow C")
        assert len(handovers()) == 2 and sorted(handovers()[1]) == sorted(ids)
    finally:
        await adoption_fleet.stop(af, reqs)
