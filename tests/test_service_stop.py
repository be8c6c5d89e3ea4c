"""ServiceHost.stop under STOP_BOUND_S: a shell whose stop never returns is cut off — the host
says where it waited and closes its connection, so its service leaves the bus."""

from __future__ import annotations

import asyncio

from tokenyard.shared import service
from tokenyard.shared.service import ServiceHost


class HangingShell:
    kind = "router"
    instance_id = "router-hangs"

    def __init__(self) -> None:
        self.never = asyncio.Event()

    async def start(self, nc, svc) -> None:
        pass

    async def stop(self) -> None:
        await self.never.wait()


class QuickShell(HangingShell):
    instance_id = "router-quick"

    async def stop(self) -> None:
        pass


async def test_a_stop_that_hangs_is_cut_off_at_the_bound_naming_where_it_waited(nats_server, monkeypatch):
    monkeypatch.setattr(service, "STOP_BOUND_S", 0.3)
    host = await ServiceHost(HangingShell(), nats_server.url).start()
    await asyncio.wait_for(host.stop(), timeout=10)
    assert host.overran is not None
    assert host.overran.startswith("router router-hangs: stop waits at ServiceHost._stop_steps")
    assert "HangingShell.stop" in host.overran.split(" / ")[0]
    assert host.nc.is_closed


async def test_a_stop_within_the_bound_drains_and_says_nothing(nats_server, monkeypatch):
    monkeypatch.setattr(service, "STOP_BOUND_S", 5.0)
    host = await ServiceHost(QuickShell(), nats_server.url).start()
    await host.stop()
    assert host.overran is None
    assert host.nc.is_closed  # drained, then closed by the drain


async def test_a_cancelled_stop_cancels_the_shells_stop(nats_server, monkeypatch):
    monkeypatch.setattr(service, "STOP_BOUND_S", None)
    shell = HangingShell()
    host = await ServiceHost(shell, nats_server.url).start()
    stopping = asyncio.create_task(host.stop())
    await asyncio.sleep(0.05)
    stopping.cancel()
    await asyncio.gather(stopping, return_exceptions=True)
    await asyncio.sleep(0.01)  # the cancelled steps' task ends on the loop's next turn
    assert [t for t in asyncio.all_tasks() if "_stop_steps" in service.await_chain(t)] == []
    await host.nc.close()
