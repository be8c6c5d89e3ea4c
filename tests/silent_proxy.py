"""A TCP proxy in front of nats-server that can cut its path the way a partition does — no FIN:
bytes stop going through, nothing tells either side — and heal it.

    cut(reset=False)   every connection through it goes silent (what either side sends is dropped);
                       one opened while cut is accepted and then hears nothing (a connect attempt
                       to a silent address waits out its own timeout). reset=True: the connections
                       open now are reset as well (their client starts reconnecting at once, into
                       the silence), as a peer that restarted would. refuse=True: a server gone
                       instead of a partition — new connections are refused (a FIN world).
    heal(reset=True)   new connections go through again. reset=True resets those opened before
                       the cut (the server behind the partition forgot them), at once; reset=False
                       lets them carry bytes again, what the cut dropped missing. An attempt opened
                       during the cut is left hanging either way, as one whose SYN was lost is.

tests/test_natsutil_connect.py keeps its own `Partition`, whose heal resets an old connection only
on its client's next write: the idle connection's PING is what that test is about.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct

from tokenyard.shared import natsutil


class SilentProxy:
    def __init__(self, target_port: int, host: str = "127.0.0.1"):
        self.host, self.target_port = host, target_port
        self.port = 0
        self._server: asyncio.Server | None = None
        self._silent = False
        self._pipes: dict[asyncio.StreamWriter, tuple[bool, list[asyncio.StreamWriter]]] = {}
        """client side → (opened during a cut, its two writers)."""

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    async def start(self) -> SilentProxy:
        self.port = natsutil.free_port()
        self._server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for writers in [w for _, w in self._pipes.values()]:
            for w in writers:
                _reset(w)
        self._pipes.clear()

    async def cut(self, reset: bool = False, refuse: bool = False) -> None:
        self._silent = True
        if refuse and self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        if reset:
            for client, (_, writers) in list(self._pipes.items()):
                for w in writers:
                    _reset(w)
                self._pipes.pop(client, None)

    async def heal(self, reset: bool = True) -> None:
        self._silent = False
        if self._server is None:  # refused while cut: listening again, on the same port
            self._server = await asyncio.start_server(self._accept, self.host, self.port, reuse_address=True)
        if reset:
            for client, (during_cut, writers) in list(self._pipes.items()):
                if not during_cut:
                    for w in writers:
                        _reset(w)
                    self._pipes.pop(client, None)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._silent:  # a silent address: it takes the connection and says nothing, ever
            self._pipes[writer] = (True, [writer])
            with contextlib.suppress(Exception):
                while await reader.read(65536):
                    pass
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.target_port)
        except OSError:
            _reset(writer)
            return
        self._pipes[writer] = (False, [writer, up_writer])
        await asyncio.gather(self._pump(reader, up_writer), self._pump(up_reader, writer), return_exceptions=True)
        self._pipes.pop(writer, None)

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                if not self._silent:
                    writer.write(data)
        finally:
            with contextlib.suppress(Exception):
                writer.close()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with SO_LINGER 0: an RST, not a FIN."""
    sock = writer.get_extra_info("socket")
    with contextlib.suppress(Exception):
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
