"""A nats-server that exits at start says why: `tokenyard up --nats-tls-cert` with a missing file
answered "nats-server exited with 1 (port 4222 taken?)" while the port was free and the server
had printed the reason to a stderr nobody kept."""

from __future__ import annotations

import pytest
from tokenyard.shared import nats_auth, natsutil


async def test_a_bad_tls_file_is_named(tmp_path):
    tls = nats_auth.TlsFiles(cert=str(tmp_path / "missing.pem"), key=str(tmp_path / "missing.key"))
    server = natsutil.NatsServer(auth=nats_auth.FleetAuth.generate(tmp_path / "creds", tls=tls))
    try:
        with pytest.raises(RuntimeError) as failed:
            await server.start()
    finally:
        server.stop()
    message = str(failed.value)
    assert message.startswith("nats-server exited with 1: ")
    assert "missing.pem: no such file or directory" in message and "taken?" not in message

