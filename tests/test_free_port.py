"""natsutil.free_port: a port outside the kernel's ephemeral range, never the same twice in one
process, and not one something already listens on."""

from __future__ import annotations

import socket
from pathlib import Path

from tokenyard.shared import natsutil


def ephemeral_low() -> int:
    return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])


def test_picks_below_the_ephemeral_range_and_never_twice():
    ports = [natsutil.free_port() for _ in range(200)]
    assert len(set(ports)) == 200
    lo, hi = natsutil.PICK_RANGE
    assert all(lo <= p <= hi for p in ports)
    assert hi < ephemeral_low()  # no outgoing connection's local port is drawn from here


def test_skips_a_port_in_use(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        # the first draw is the port in use; the later ones random (a fixed second draw could be
        # in use too — an outgoing connection's port, or one this process handed out)
        first, draw = [taken], natsutil._pick.randint
        monkeypatch.setattr(natsutil._pick, "randint", lambda lo, hi: first.pop() if first else draw(lo, hi))
        monkeypatch.setattr(natsutil, "PICK_RANGE", (1024, 65535))
        port = natsutil.free_port()
        assert first == [] and port != taken
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # the port handed out is one a server can bind
