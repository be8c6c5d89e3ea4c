"""NATS security against a real nats-server secured as `tokenyard up` secures it (the session's
server, tests/conftest.py): who may connect, and each refusal of the permission table in
shared/nats_auth.py, proved by the server's own `-ERR Permissions Violation` and by a
subscriber that sees nothing of what was refused. Then the whole fleet serving with zero
violations, TLS, and where credentials come from."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import ssl
import uuid

import nats
import pytest
from tokenyard.shared import nats_auth, natsutil, schemas, subjects
from tokenyard.shared.client import TokenyardClient


class Conn:
    """A connection as one user, its server errors (permission violations) in a queue."""

    def __init__(self, nc, errors: asyncio.Queue):
        self.nc = nc
        self.errors = errors

    async def refused(self, what: str) -> str:
        """Await the server's violation error and return it; nothing else may come first."""
        await self.nc.flush()
        err = str(await asyncio.wait_for(self.errors.get(), 10))
        assert f"permissions violation for {what}" in err, err
        return err


async def connect_as(server, user: str) -> Conn:
    errors: asyncio.Queue = asyncio.Queue()

    async def on_error(e: Exception) -> None:
        errors.put_nowait(e)

    creds = server.auth.credentials(user)
    nc = await nats.connect(server.url, name=f"sec-{user}", error_cb=on_error, allow_reconnect=False,
                            **creds.connect_options())
    return Conn(nc, errors)


async def assert_nothing_arrives(admin, subject: str, publish) -> None:
    """`publish()` (refused) reached no subscriber of `subject`: the first message an admin
    subscriber sees is the marker the admin publishes after the refusal."""
    sub = await admin.subscribe(subject)
    await admin.flush()
    await publish()
    await admin.publish(subject, b"marker")
    msg = await sub.next_msg(timeout=5)
    assert msg.data == b"marker"
    await sub.unsubscribe()


@pytest.fixture
async def admin(nats_server):
    nc = await natsutil.connect(nats_server.url, "sec-admin")
    yield nc
    await nc.close()


# ── who may connect ──


async def test_anonymous_and_wrong_password_are_refused_at_once(nats_server):
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    with pytest.raises(PermissionError, match="anonymous"):
        await natsutil.connect(nats_server.url, "anon", creds=nats_auth.Credentials())
    with pytest.raises(PermissionError, match="'client'"):
        await natsutil.connect(nats_server.url, "bad", creds=nats_auth.Credentials("client", "wrong"))
    assert loop.time() - t0 < 5.0  # refused, not left retrying until the connect timeout
    assert 'authentication error - User "client"' in nats_server.log_text()


# ── what a client may not do ──

CLIENT_REFUSED_PUBLISH = [
    (subjects.heartbeat("tw0"), "forge a heartbeat (the fleet would answer 503)"),
    (subjects.kv_events("tw0"), "forge KV events"),
    (subjects.worker_generate("tw0"), "generate straight on a worker"),
    (subjects.worker_control("tw0"), "switch a worker's phase"),
    (subjects.worker_status("tw0"), "read the ids a worker runs"),
    (subjects.router_adopted("router-x"), "ask a router which streams it adopted"),
    (subjects.QUEUE, "enqueue straight onto the queue stream"),
    ("$JS.API.STREAM.INFO.LLM_QUEUE", "use JetStream at all"),
    (subjects.ROUTE, "ask the router to place a request"),
    (subjects.QUEUE_STATE, "forge the queue's state"),
    (subjects.macro_state("m0"), "forge a macro-instance's state"),
    ("_INBOX.bob.x", "write into another client's stream"),
]


@pytest.mark.parametrize("subject,why", CLIENT_REFUSED_PUBLISH, ids=[w for _, w in CLIENT_REFUSED_PUBLISH])
async def test_a_client_may_not_publish(nats_server, admin, subject, why):
    alice = await connect_as(nats_server, "alice")
    try:
        async def forge():
            await alice.nc.publish(subject, b"forged")
            await alice.refused(f'publish to "{subject.lower()}"')

        await assert_nothing_arrives(admin, subject, forge)
    finally:
        await alice.nc.close()


CLIENT_REFUSED_SUBSCRIBE = [
    ("_INBOX.>", "read every prompt and token"),
    ("_INBOX.bob.>", "read another client's stream"),
    ("_INBOX.edge.>", "read the edge's streams"),
    (subjects.SUBMIT, "intercept requests"),
    (subjects.HEARTBEAT_ALL, "watch the fleet"),
    (subjects.worker_generate("tw0"), "pose as a worker"),
    (">", "everything"),
]


@pytest.mark.parametrize("subject,why", CLIENT_REFUSED_SUBSCRIBE, ids=[w for _, w in CLIENT_REFUSED_SUBSCRIBE])
async def test_a_client_may_not_subscribe(nats_server, subject, why):
    alice = await connect_as(nats_server, "alice")
    try:
        await alice.nc.subscribe(subject)
        await alice.refused(f'subscription to "{subject.lower()}"')
    finally:
        await alice.nc.close()


@pytest.mark.flaky(reruns=2)  # live processes on a shared host: see docs/HOUSE.md "Flaky live tests"
async def test_another_clients_stream_never_reaches_a_snooper(nats_server, fleet):
    """Bob's request streams to bob's inbox; alice, who tried to read every inbox, gets
    nothing, while bob gets his whole stream."""
    alice = await connect_as(nats_server, "alice")
    seen: list = []

    async def snoop(msg) -> None:
        seen.append(msg)

    await alice.nc.subscribe("_INBOX.>", cb=snoop)
    await alice.refused('subscription to "_inbox.>"')
    async with await TokenyardClient.connect(nats_server.url, "bob", creds=nats_server.auth.credentials("bob")) as bob:
        done = await bob.generate(schemas.GenerateRequest(prompt="secret prompt", max_tokens=5))
    assert done.finish_reason == "length" and len(done.token_ids) == 5
    await alice.nc.flush()
    assert seen == []
    await alice.nc.close()


# ── what each service may not do ──

SERVICE_REFUSED = [
    ("edge", "publish", subjects.heartbeat("tw0")),
    ("edge", "publish", subjects.QUEUE),
    ("edge", "subscribe", "_INBOX.client.>"),
    ("admission", "publish", subjects.worker_generate("tw0")),
    ("admission", "publish", subjects.heartbeat("tw0")),
    ("admission", "publish", "_INBOX.client.x"),
    ("queue", "publish", subjects.worker_generate("tw0")),
    ("queue", "publish", subjects.heartbeat("tw0")),
    ("router", "publish", subjects.heartbeat("tw0")),
    ("router", "publish", subjects.QUEUE),
    ("router", "publish", subjects.KV_EVENTS_ALL.replace("*", "tw0").replace(">", "x")),
    ("macro", "publish", subjects.worker_generate("tw0")),
    ("macro", "publish", subjects.heartbeat("tw0")),
    ("worker", "publish", subjects.worker_generate("tw1")),
    ("worker", "publish", subjects.QUEUE),
    ("worker", "publish", subjects.macro_state("m0")),
    ("worker", "subscribe", subjects.SUBMIT),
    ("observer", "publish", subjects.SUBMIT),
    ("observer", "publish", subjects.heartbeat("tw0")),
    ("observer", "publish", subjects.worker_generate("tw0")),
    ("observer", "subscribe", "_INBOX.client.>"),
    ("observer", "subscribe", subjects.SUBMIT),
]


@pytest.mark.parametrize("user,verb,subject", SERVICE_REFUSED, ids=[f"{u}-{v}-{s}" for u, v, s in SERVICE_REFUSED])
async def test_each_service_only_where_its_role_allows(nats_server, user, verb, subject):
    """Only the router sends to workers, only workers publish heartbeats and KV events, only
    admission enqueues, and no service listens where it has no business."""
    conn = await connect_as(nats_server, user)
    try:
        if verb == "publish":
            await conn.nc.publish(subject, b"x")
            await conn.refused(f'publish to "{subject.lower()}"')
        else:
            await conn.nc.subscribe(subject)
            await conn.refused(f'subscription to "{subject.lower()}"')
    finally:
        await conn.nc.close()


def test_the_permission_table_names_every_kind_and_clients_only_submit_resume_abort_lease_and_probe():
    assert set(nats_auth.ROLES) == {nats_auth.ADMIN, nats_auth.CLIENT, nats_auth.OBSERVER, *nats_auth.SERVICE_KINDS}
    assert nats_auth.ROLES[nats_auth.CLIENT].publish == (
        subjects.SUBMIT, subjects.RESUME, subjects.ABORT, subjects.LEASE_ALL, subjects.worker_alive("*"))
    assert nats_auth.ROLES[nats_auth.CLIENT].subscribe == ("{inbox}.>",)
    senders_to_workers = {k for k, r in nats_auth.ROLES.items() if any(".worker.*.generate" in p for p in r.publish)}
    assert senders_to_workers == {"router"}
    heartbeaters = {k for k, r in nats_auth.ROLES.items() if subjects.HEARTBEAT_ALL in r.publish}
    assert heartbeaters == {"worker"}
    enqueuers = {k for k, r in nats_auth.ROLES.items() if subjects.QUEUE in r.publish}
    assert enqueuers == {"admission"}


async def test_a_client_may_probe_a_worker_alive_and_learns_nothing_else(nats_server, fleet):
    """A silent stream's client asks a worker's `alive` subject (shared/stream_watch.py): an empty
    answer from a live worker, "no responders" for a gone one, and no violation."""
    alice = await connect_as(nats_server, "alice")
    try:
        answer = await alice.nc.request(subjects.worker_alive("tw0"), b"", timeout=5)
        assert answer.data == b""
        with pytest.raises(nats.errors.NoRespondersError):
            await alice.nc.request(subjects.worker_alive("gone"), b"", timeout=5)
        await alice.nc.flush()
        assert alice.errors.empty()
    finally:
        await alice.nc.close()


# ── the fleet itself works inside its permissions ──


@pytest.mark.flaky(reruns=2)  # live processes on a shared host: see docs/HOUSE.md "Flaky live tests"
async def test_the_whole_fleet_serves_with_zero_permission_violations(nats_server, fleet):
    """Requests over NATS (a client user), one over HTTP through an edge, an abort and a
    rejection: every hop (edge, admission, queue, router, macro, workers) stays inside its
    role; the server logs no violation from any of the fleet's connections."""
    import aiohttp
    from tokenyard.services.edge.shell import EdgeConfig, EdgeShell

    edge = await fleet.add(EdgeShell(EdgeConfig(http_port=0)))
    async with aiohttp.ClientSession() as http:
        url = f"http://127.0.0.1:{edge.shell.port}/v1/completions"
        async with http.post(url, json={"prompt": "via http", "max_tokens": 3}) as resp:
            assert resp.status == 200, await resp.text()
            assert (await resp.json())["usage"]["completion_tokens"] == 3
    async with await TokenyardClient.connect(nats_server.url) as client:
        for i in range(4):
            done = await client.generate(schemas.GenerateRequest(prompt=f"hello {i}", max_tokens=4))
            assert done.finish_reason == "length", done
        rejected = await client.generate(schemas.GenerateRequest(prompt="x", max_tokens=10**9))
        assert rejected.rejected is not None and rejected.rejected.status == 400
        # last: a long request aborted (what it leaves queued would make admission refuse more)
        rid = f"sec-abort-{uuid.uuid4().hex[:8]}"  # a rerun on the same server must not reuse the id (409)
        stream = client.stream(schemas.GenerateRequest(prompt="long", max_tokens=20000, request_id=rid))
        assert isinstance(await anext(stream), schemas.Accepted)
        await client.abort(rid)
        events = [e async for e in stream]  # the stream still ends, with a terminal event
        assert isinstance(events[-1], schemas.TERMINAL_EVENTS) and len(events) < 20000
    # Anything the fleet's connections were refused shows in the server's log by name.
    log = nats_server.log_text()
    names = [h.shell.instance_id for h in fleet.hosts]
    refused = [line for line in log.splitlines() if "Violation" in line and any(f':{n}"' in line for n in names)]
    assert refused == []


# ── TLS ──


def _self_signed(tmp_path) -> nats_auth.TlsFiles:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tokenyard-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
        .sign(key, hashes.SHA256())
    )
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return nats_auth.TlsFiles(str(tmp_path / "cert.pem"), str(tmp_path / "key.pem"))


async def test_tls_server_takes_its_users_over_tls_only(tmp_path):
    tls = _self_signed(tmp_path)
    auth = nats_auth.FleetAuth.generate(tmp_path / "creds", tls=tls)
    server = await natsutil.NatsServer(auth=auth).start()
    try:
        creds = nats_auth.load_creds(auth.path("client"))
        assert creds.tls_ca == tls.cert  # the creds file carries the CA
        async with await TokenyardClient.connect(server.url, creds=creds) as client:
            assert client.nc.is_connected
            assert isinstance(client.nc._transport._io_writer.get_extra_info("ssl_object"), ssl.SSLObject)
        plain = nats_auth.Credentials("client", auth.users["client"][1])
        with pytest.raises(ConnectionError):
            await natsutil.connect(server.url, "plain", first_connect_timeout_s=1.5, creds=plain)
    finally:
        server.stop()


# ── where credentials come from ──


def test_credentials_resolve_explicit_env_file_dir_and_user(tmp_path, monkeypatch):
    auth = nats_auth.FleetAuth.generate(tmp_path / "c", clients=("client", "carol"))
    url = "nats://127.0.0.1:1"
    for var in (nats_auth.CREDS_ENV, nats_auth.USER_ENV, nats_auth.PASSWORD_ENV, nats_auth.TLS_CA_ENV):
        monkeypatch.delenv(var, raising=False)
    assert nats_auth.resolve(url, "worker") is None  # nothing configured: anonymous
    monkeypatch.setenv(nats_auth.CREDS_ENV, str(auth.dir))
    assert nats_auth.resolve(url, "worker") == auth.credentials("worker")
    assert nats_auth.resolve(url, None) == auth.credentials("admin")  # no kind: the operator
    monkeypatch.setenv(nats_auth.CREDS_ENV, str(auth.path("carol")))
    assert nats_auth.resolve(url, "worker").user == "carol"  # a file is used whatever the kind
    monkeypatch.setenv(nats_auth.CREDS_ENV, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="missing"):
        nats_auth.resolve(url, "worker")
    monkeypatch.delenv(nats_auth.CREDS_ENV)
    monkeypatch.setenv(nats_auth.USER_ENV, "dave")
    monkeypatch.setenv(nats_auth.PASSWORD_ENV, "pw")
    assert nats_auth.resolve(url, "router") == nats_auth.Credentials("dave", "pw")
    nats_auth.register(url, auth)  # a server this process started wins over the environment
    try:
        assert nats_auth.resolve(url, "router") == auth.credentials("router")
        with pytest.raises(KeyError, match="nobody"):
            nats_auth.resolve(url, "nobody")
    finally:
        nats_auth.unregister(url)


def test_creds_files_are_private_and_children_get_only_their_kinds(tmp_path):
    auth = nats_auth.FleetAuth.generate(tmp_path / "c")
    assert {p.name for p in auth.dir.glob("*.creds")} == {f"{k}.creds" for k in auth.users}
    assert all((p.stat().st_mode & 0o077) == 0 for p in auth.dir.glob("*.creds"))
    macro_dir = auth.dir_for("macro", "worker")
    assert sorted(p.name for p in macro_dir.iterdir()) == ["macro.creds", "worker.creds"]
    assert nats_auth.load_creds(macro_dir / "worker.creds") == auth.credentials("worker")
    passwords = [pw for _, pw in auth.users.values()]
    assert len(set(passwords)) == len(passwords) and all(len(pw) >= 32 for pw in passwords)


def test_a_nats_jwt_creds_file_is_passed_to_nats_py_as_such(tmp_path):
    path = tmp_path / "user.creds"
    path.write_text("-----BEGIN NATS USER JWT-----\neyJ0\n------END NATS USER JWT------\n")
    creds = nats_auth.load_creds(path)
    assert creds.connect_options() == {"user_credentials": str(path)}
    bad = tmp_path / "bad.creds"
    bad.write_text('password = "x"\n')
    with pytest.raises(ValueError, match="user"):
        nats_auth.load_creds(bad)


def test_flags_reach_every_nats_command_and_win_over_the_environment(monkeypatch, tmp_path):
    from tokenyard.cli import build_parser

    parser = build_parser()
    for argv in (["router"], ["worker"], ["edge"], ["admission"], ["queue"], ["macro"], ["bench", "serve"], ["up"]):
        args = parser.parse_args([*argv, "--nats-creds", str(tmp_path)])
        assert args.nats_creds == str(tmp_path), argv
    monkeypatch.setenv(nats_auth.CREDS_ENV, "/elsewhere")
    monkeypatch.delenv(nats_auth.USER_ENV, raising=False)
    nats_auth.apply_args(parser.parse_args(["router", "--nats-creds", str(tmp_path), "--nats-user", "u"]))
    import os

    assert os.environ[nats_auth.CREDS_ENV] == str(tmp_path) and os.environ[nats_auth.USER_ENV] == "u"


def test_server_config_quotes_every_value_and_lists_each_user(tmp_path):
    auth = nats_auth.FleetAuth.generate(tmp_path / "c", clients=("client", "team-a"))
    conf = auth.server_config("127.0.0.1", 4222, str(tmp_path / 'store "x"'), 1 << 20)
    assert 'store_dir: "' in conf and '\\"x\\"' in conf
    assert conf.count("{user: ") == len(auth.users)
    assert '"_INBOX.team-a.>"' in conf and "max_payload: 1048576" in conf


def test_the_documented_permission_table_is_the_one_enforced():
    from pathlib import Path

    doc = (Path(__file__).resolve().parent.parent / "docs" / "security.md").read_text()
    assert nats_auth.permission_table() in doc


async def test_every_node_of_a_secured_cluster_refuses_alike(tmp_path):
    """`tokenyard up --nats-cluster 3` secures each node with the same users: anonymous is
    refused on every node, and a client's refusals hold whichever node it reaches."""
    from tokenyard.shared.nats_cluster import NatsCluster

    auth = nats_auth.FleetAuth.generate(tmp_path / "creds")
    async with NatsCluster(3, auth=auth) as cluster:
        for url in cluster.urls:
            with pytest.raises(PermissionError):
                await natsutil.connect(url, "anon", creds=nats_auth.Credentials())
        errors: asyncio.Queue = asyncio.Queue()

        async def on_error(e: Exception) -> None:
            errors.put_nowait(e)

        nc = await nats.connect(cluster.urls[2], error_cb=on_error, allow_reconnect=False,
                                **auth.credentials("client").connect_options())
        conn = Conn(nc, errors)
        await nc.publish(subjects.heartbeat("w0"), b"x")
        await conn.refused('publish to "llm.v1.hb.w0"')
        await nc.close()
        admin = await natsutil.connect(cluster.url, "admin")  # the whole URL: the operator's keys
        await natsutil.ensure_queue_stream(admin)
        assert (await admin.jetstream().stream_info(subjects.QUEUE_STREAM)).config.name == subjects.QUEUE_STREAM
        await admin.close()


def test_a_local_client_finds_the_creds_up_left_for_its_port_and_only_as_client(tmp_path, monkeypatch):
    for var in (nats_auth.CREDS_ENV, nats_auth.USER_ENV, nats_auth.TLS_CA_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    url = "nats://127.0.0.1:14222"
    local = nats_auth.local_client_creds(url)
    assert local == tmp_path / "tokenyard" / "nats-14222" / "client.creds"
    assert nats_auth.local_client_creds("nats://10.0.0.5:4222") is None  # a remote fleet: never guessed
    assert nats_auth.resolve(url, nats_auth.CLIENT) is None  # nothing left there yet: anonymous
    local.parent.mkdir(parents=True)
    local.write_text('user = "client"\npassword = "pw"\n')
    assert nats_auth.resolve(url, nats_auth.CLIENT) == nats_auth.Credentials("client", "pw")
    assert nats_auth.resolve("nats://127.0.0.1:14222,nats://127.0.0.1:14223", nats_auth.CLIENT).user == "client"
    assert nats_auth.resolve(url, "router") is None  # a service never borrows the client's login


def test_top_finds_the_observer_creds_up_left_beside_the_clients(tmp_path, monkeypatch):
    for var in (nats_auth.CREDS_ENV, nats_auth.USER_ENV, nats_auth.TLS_CA_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    url = "nats://127.0.0.1:14223"
    local = nats_auth.local_creds(url, nats_auth.OBSERVER)
    assert local == tmp_path / "tokenyard" / "nats-14223" / "observer.creds"
    local.parent.mkdir(parents=True)
    local.write_text('user = "observer"\npassword = "pw"\n')
    assert nats_auth.resolve(url, nats_auth.OBSERVER) == nats_auth.Credentials("observer", "pw")
    assert nats_auth.resolve(url, nats_auth.CLIENT) is None  # each finds only its own file
    assert nats_auth.resolve(url) is None  # the operator's keys are never left behind


def test_up_leaves_the_client_and_observer_creds_for_this_machine_and_takes_them_away(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from tokenyard import up

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    auth = nats_auth.FleetAuth.generate(tmp_path / "creds")
    url = "nats://127.0.0.1:14224"
    fleet = SimpleNamespace(server=SimpleNamespace(auth=auth), nats_url=url)
    left = up.leave_local_creds(fleet)
    folder = tmp_path / "run" / "tokenyard" / "nats-14224"
    assert left == str(folder / "client.creds")
    for user in (nats_auth.CLIENT, nats_auth.OBSERVER):
        assert nats_auth.load_creds(folder / f"{user}.creds") == auth.credentials(user)
        assert (folder / f"{user}.creds").stat().st_mode & 0o777 == 0o600
    assert sorted(p.name for p in folder.iterdir()) == ["client.creds", "observer.creds"]  # never the operator's
    up.remove_local_creds(url)
    assert not folder.exists()
