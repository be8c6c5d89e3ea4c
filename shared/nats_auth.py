"""NATS security: one user per service kind, each allowed only the subjects its role needs.

    FleetAuth.generate(dir) ─> <dir>/<kind>.creds (mode 0600)  +  server_config() for nats-server
    resolve(url, kind)      ─> the Credentials a connection of that kind uses (or None: anonymous)

Every user lives in one account, TOKENYARD, with JetStream. A user may publish and subscribe
only where ROLES allows (an allow list: anything not named is refused by the server, which
answers `-ERR Permissions Violation` and drops the message or subscription). Each user's
inbox prefix is `_INBOX.<user>`, and a client may subscribe only below its own, so it cannot
read another client's stream. Services answer requests through `allow_responses` (a reply to a
message they received), except those that stream events to an inbox named in a payload (the
worker, the queue), which may publish on `_INBOX.>`.

Where a connection's credentials come from, first match wins:
  1. explicit `Credentials` (a test, a caller that holds them);
  2. the server this very process started for that URL (`register`): a test session or
     `tokenyard up` holds its fleet's keys, so its own connections need no flags;
  3. `TOKENYARD_NATS_CREDS`: a creds file, or a directory holding `<kind>.creds` (what `up`
     hands its children, so a worker the macro-instance starts finds `worker.creds`);
  4. `TOKENYARD_NATS_USER` + `TOKENYARD_NATS_PASSWORD`;
  5. for the `client` and `observer` users of a loopback URL, the creds `tokenyard up` left for
     this machine's users (`local_creds`: ~/.cache/tokenyard/nats-<port>/<user>.creds, 0600).
A kind of None means the operator (`admin`): launchers, tests, benchmarks. Clients pass
kind="client". The CLI flags `--nats-creds`, `--nats-user`, `--nats-password` set those
variables (`apply_args`). A NATS JWT `.creds` file (`-----BEGIN NATS USER JWT-----`) is passed
to nats-py as such, for servers run by an operator with nsc.

A creds file is TOML: `user = "…"`, `password = "…"`, optionally `tls_ca = "PATH"` (the CA that
signed the server's certificate; with it the connection uses TLS).
"""

from __future__ import annotations

import argparse
import os
import secrets
import ssl
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from tokenyard.shared import subjects

ACCOUNT = "TOKENYARD"
CREDS_ENV = "TOKENYARD_NATS_CREDS"
USER_ENV = "TOKENYARD_NATS_USER"
PASSWORD_ENV = "TOKENYARD_NATS_PASSWORD"
TLS_CA_ENV = "TOKENYARD_NATS_TLS_CA"
LOG_FILE = "nats-server.log"
"""In the server's store dir: refused connections and permission violations are logged here."""
ADMIN = "admin"
CLIENT = "client"
OBSERVER = "observer"
"""`tokenyard top`: reads the fleet's state, sends no work."""
LOCAL_USERS = (CLIENT, OBSERVER)
"""The users whose creds `tokenyard up` leaves for the machine's other commands."""

_P = subjects.PREFIX
_SRV = "$SRV.>"  # nats.micro discovery: every service answers PING / INFO / STATS
_KV = subjects.TOPOLOGY_BUCKET
_ALIVE = subjects.worker_alive("*")
_Q = subjects.QUEUE_STREAM


@dataclass(frozen=True)
class Role:
    """What one kind of user may do. `{inbox}` in a subject is replaced by the user's inbox
    prefix; `responses` = how many replies a user may send to a request it received."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    responses: int = 0
    why: str = ""


ROLES: dict[str, Role] = {
    ADMIN: Role((">",), (">",), why="the launcher, tests, operators: creates the stream and bucket, pings"),
    CLIENT: Role(
        (subjects.SUBMIT, subjects.RESUME, subjects.ABORT, subjects.LEASE_ALL, _ALIVE), ("{inbox}.>",),
        why="submit and abort; its own stream arrives on its own inbox; its lease says it is alive; "
            "a silent stream's worker is probed, the stream resumed once if it is gone",
    ),
    "edge": Role(
        (subjects.SUBMIT, subjects.RESUME, subjects.ABORT, subjects.LEASE_ALL, _ALIVE, subjects.ADMISSION_HEALTH),
        ("{inbox}.>", _SRV, f"{_P}.edge.*.health"),
        responses=1,
        why="a client on behalf of HTTP callers; asks admission how many workers are up (its /health)",
    ),
    "admission": Role(
        (subjects.QUEUE, subjects.ABORT, "$JS.API.INFO", f"$JS.API.STREAM.CREATE.{_Q}",
         f"$JS.API.STREAM.UPDATE.{_Q}", f"$JS.API.STREAM.INFO.{_Q}"),
        (subjects.SUBMIT, subjects.RESUME, subjects.HEARTBEAT_ALL, subjects.QUEUE_STATE, subjects.ADMISSION_HEALTH,
         "{inbox}.>", _SRV),
        responses=2,  # `accepted`, then `error` if the enqueue fails
        why="the only publisher onto the queue stream; answers the submitter; aborts a request handed to "
            "the queue in its process whose store failed",
    ),
    "queue": Role(
        ("_INBOX.>", subjects.ROUTE, subjects.QUEUE_STATE, "$JS.API.INFO", f"$JS.API.STREAM.CREATE.{_Q}",
         f"$JS.API.STREAM.UPDATE.{_Q}", f"$JS.API.STREAM.INFO.{_Q}", f"$JS.API.CONSUMER.CREATE.{_Q}.>",
         f"$JS.API.CONSUMER.DURABLE.CREATE.{_Q}.>", f"$JS.API.CONSUMER.INFO.{_Q}.>",
         f"$JS.API.CONSUMER.MSG.NEXT.{_Q}.>", f"$JS.ACK.{_Q}.>", f"$JS.API.STREAM.MSG.DELETE.{_Q}"),
        (subjects.HEARTBEAT_ALL, subjects.ABORT, subjects.QUEUE_STATS, subjects.QUEUE_STATE, "{inbox}.>", _SRV),
        responses=1,
        why="consumes the stream; deletes a routed request's stored copy; ends a request it drops on "
            "the request's inbox; hears which other replicas live",
    ),
    "router": Role(
        (f"{_P}.worker.*.generate", f"{_P}.worker.*.status", f"{_P}.worker.*.state", subjects.ABORT, subjects.FENCE,
         "_INBOX.>"),
        (subjects.ROUTE, subjects.HEARTBEAT_ALL, subjects.KV_EVENTS_ALL, subjects.MACRO_STATE_ALL, subjects.LEASE_ALL,
         subjects.ABORT, subjects.ADOPT, subjects.ROUTER_ADOPTED_ALL,
         "_INBOX.>", _SRV),
        responses=1,
        why="the only sender of work to workers; follows the streams it placed (migration: probes workers, "
            "re-issues behind a fence, aborts orphans, ends a stream it cannot move) and those it adopts, and says which "
            "it adopted when a worker asks again",
    ),
    "macro": Role(
        (f"{_P}.worker.*.control", subjects.MACRO_STATE_ALL, f"$KV.{_KV}.>", "$JS.API.INFO",
         f"$JS.API.STREAM.INFO.KV_{_KV}", f"$JS.API.STREAM.CREATE.KV_{_KV}"),
        (subjects.HEARTBEAT_ALL, subjects.QUEUE_STATE, f"{_P}.macro.topology", "{inbox}.>", _SRV),
        responses=1,
        why="groups workers, switches their phase, keeps the topology bucket; scales on the queue's backlog",
    ),
    "worker": Role(
        ("_INBOX.>", subjects.HEARTBEAT_ALL, subjects.KV_EVENTS_ALL, subjects.ROUTE, subjects.ADOPT,
         subjects.ROUTER_ADOPTED_ALL),
        (f"{_P}.worker.*.generate", f"{_P}.worker.*.control", f"{_P}.worker.*.status", f"{_P}.worker.*.state",
         _ALIVE, subjects.ABORT, subjects.FENCE, "{inbox}.>", _SRV),
        responses=1,
        why="the only publisher of heartbeats and KV events; streams tokens to the request's inbox; "
            "a spatial P/D prefill worker asks the router to place the decode leg; hands a gone router's "
            "streams over, and asks an adopter whose reply was lost which it adopted",
    ),
    OBSERVER: Role(
        ("$SRV.>",), (subjects.HEARTBEAT_ALL, subjects.QUEUE_STATE, "{inbox}.>"),
        why="`tokenyard top`: asks every service for its stats, reads heartbeats and the queue's state; "
            "sends no work",
    ),
}
SERVICE_KINDS = ("edge", "admission", "queue", "router", "macro", "worker")


def permission_table() -> str:
    """ROLES as a markdown table (docs/security.md holds this very text; a test compares)."""
    rows = ["| user | may publish | may subscribe | replies | why |", "|---|---|---|---|---|"]
    for name, role in ROLES.items():
        pub = ", ".join(f"`{s}`" for s in role.publish)
        sub = ", ".join(f"`{s}`" for s in role.subscribe)
        rows.append(f"| `{name}` | {pub} | {sub} | {role.responses or ''} | {role.why} |")
    return "\n".join(rows) + "\n"


def inbox_prefix(user: str) -> str:
    return f"_INBOX.{user}"


@dataclass(frozen=True)
class Credentials:
    user: str = ""
    password: str = field(default="", repr=False)
    jwt_file: str = ""
    """A NATS JWT creds file (decentralised auth), instead of user + password."""
    tls_ca: str = ""

    def connect_options(self) -> dict:
        """Keyword arguments for nats-py's `Client.connect`."""
        opts: dict = {}
        if self.jwt_file:
            opts["user_credentials"] = self.jwt_file
        elif self.user:
            opts.update(user=self.user, password=self.password, inbox_prefix=inbox_prefix(self.user))
        if self.tls_ca:
            opts["tls"] = ssl.create_default_context(cafile=self.tls_ca)
        return opts

    @property
    def who(self) -> str:
        return self.user or (Path(self.jwt_file).name if self.jwt_file else "anonymous")


def load_creds(path: str | os.PathLike) -> Credentials:
    text = Path(path).read_text()
    if "BEGIN NATS USER JWT" in text:
        return Credentials(jwt_file=str(path), tls_ca=os.environ.get(TLS_CA_ENV, ""))
    doc = tomllib.loads(text)
    if not doc.get("user"):
        raise ValueError(f"{path}: a creds file needs `user = \"…\"` (and `password`)")
    return Credentials(str(doc["user"]), str(doc.get("password", "")), tls_ca=str(doc.get("tls_ca", "")))


@dataclass(frozen=True)
class TlsFiles:
    cert: str
    key: str
    ca: str = ""
    """The CA clients verify the server with (default: the certificate itself, self-signed)."""


@dataclass
class FleetAuth:
    """One fleet's users and passwords, written as creds files into `dir`."""

    dir: Path
    users: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False)
    """user → (role, password); not in the repr, which logs and test reports show."""
    tls: TlsFiles | None = None

    @classmethod
    def generate(cls, dir: str | os.PathLike, clients: tuple[str, ...] = (CLIENT,),
                 tls: TlsFiles | None = None) -> FleetAuth:
        """A fresh random password for admin, each service kind, the observer and each named
        client user."""
        auth = cls(Path(dir), tls=tls)
        auth.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        for kind in (ADMIN, *SERVICE_KINDS, OBSERVER):
            auth.users[kind] = (kind, secrets.token_urlsafe(24))
        for name in clients:
            if name in auth.users or not name.replace("-", "").replace("_", "").isalnum():
                raise ValueError(f"client user name {name!r} is taken or not [A-Za-z0-9_-]")
            auth.users[name] = (CLIENT, secrets.token_urlsafe(24))
        for user in auth.users:
            auth._write_creds(user)
        return auth

    def path(self, user: str) -> Path:
        return self.dir / f"{user}.creds"

    def credentials(self, user: str) -> Credentials:
        return Credentials(user, self.users[user][1], tls_ca=self._ca())

    def dir_for(self, *users: str) -> Path:
        """A directory holding only these users' creds files: what a child process gets, so a
        service cannot read another kind's password (the macro-instance, which starts
        workers, gets `macro` and `worker`)."""
        sub = self.dir / ("for-" + "-".join(users))
        sub.mkdir(exist_ok=True, mode=0o700)
        for user in users:
            target = sub / f"{user}.creds"
            if not target.exists():
                fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o600)
                with os.fdopen(fd, "w") as f:
                    f.write(self.path(user).read_text())
        return sub

    def _ca(self) -> str:
        return (self.tls.ca or self.tls.cert) if self.tls else ""

    def _write_creds(self, user: str) -> None:
        role, password = self.users[user]
        lines = [f"# tokenyard NATS credentials: user {user!r}, role {role!r}", f'user = "{user}"',
                 f'password = "{password}"']
        if self._ca():
            lines.append(f'tls_ca = "{self._ca()}"')
        fd = os.open(self.path(user), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write("\n".join(lines) + "\n")

    def server_config(self, host: str, port: int, store_dir: str, max_payload: int) -> str:
        """nats-server's configuration: listen, JetStream, TLS, the account and its users."""
        users = []
        for user, (role_name, password) in self.users.items():
            role = ROLES[role_name]
            fill = inbox_prefix(user)
            pub = ", ".join(_quote(s.replace("{inbox}", fill)) for s in role.publish)
            sub = ", ".join(_quote(s.replace("{inbox}", fill)) for s in role.subscribe)
            responses = f", allow_responses: {{max: {role.responses}}}" if role.responses else ""
            users.append(f"      {{user: {_quote(user)}, password: {_quote(password)}, permissions: "
                         f"{{publish: {{allow: [{pub}]}}, subscribe: {{allow: [{sub}]}}{responses}}}}}")
        tls = ""
        if self.tls:
            tls = f"tls {{\n  cert_file: {_quote(self.tls.cert)}\n  key_file: {_quote(self.tls.key)}\n}}\n"
        return (
            f"listen: {_quote(f'{host}:{port}')}\nmax_payload: {max_payload}\n"
            f"log_file: {_quote(str(Path(store_dir) / LOG_FILE))}\n"
            f"jetstream {{\n  store_dir: {_quote(store_dir)}\n}}\n{tls}"
            f"accounts {{\n  {ACCOUNT}: {{\n    jetstream: enabled\n    users: [\n" + ",\n".join(users)
            + "\n    ]\n  }\n}\n"
        )


def _quote(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ── which credentials a connection uses ──

_LOCAL: dict[str, FleetAuth] = {}
"""URL → the FleetAuth of a server this process started."""


def register(url: str, auth: FleetAuth) -> None:
    _LOCAL[url] = auth


def unregister(url: str) -> None:
    _LOCAL.pop(url, None)


def resolve(url: str, kind: str | None = None) -> Credentials | None:
    """The credentials a connection of `kind` to `url` uses (see the module header)."""
    user = kind or ADMIN
    auth = _LOCAL.get(url)
    if auth is not None:
        if user not in auth.users:
            raise KeyError(f"the NATS server at {url} has no user {user!r}")
        return auth.credentials(user)
    creds = os.environ.get(CREDS_ENV)
    if creds:
        path = Path(creds)
        if path.is_dir():
            path = path / f"{user}.creds"
        if not path.exists():
            raise FileNotFoundError(f"{CREDS_ENV}={creds}: no credentials file {path}")
        found = load_creds(path)
        return found if found.tls_ca or not os.environ.get(TLS_CA_ENV) else _with_ca(found)
    if os.environ.get(USER_ENV):
        return Credentials(os.environ[USER_ENV], os.environ.get(PASSWORD_ENV, ""),
                           tls_ca=os.environ.get(TLS_CA_ENV, ""))
    if os.environ.get(TLS_CA_ENV):
        return Credentials(tls_ca=os.environ[TLS_CA_ENV])
    local = local_creds(url, user) if user in LOCAL_USERS else None
    if local is not None and local.exists():
        return load_creds(local)
    return None


def local_client_creds(url: str) -> Path | None:
    return local_creds(url, CLIENT)


def local_creds(url: str, user: str) -> Path | None:
    """Where `tokenyard up` leaves a LOCAL_USERS user's creds of a fleet on this machine, so a
    command here (`tokenyard request`, `bench serve`, TokenyardClient as `client`; `tokenyard
    top` as `observer`) finds them with no flag: $XDG_RUNTIME_DIR (else ~/.cache)/tokenyard/
    nats-<port>/<user>.creds. None for a remote URL."""
    first = url.split(",")[0]
    host, _, port = first.rpartition("://")[2].rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1", "[::1]") or not port.isdigit():
        return None
    root = Path(os.environ.get("XDG_RUNTIME_DIR") or Path.home() / ".cache")
    return root / "tokenyard" / f"nats-{port}" / f"{user}.creds"


def child_env(url: str, *users: str) -> dict[str, str]:
    """Environment for a child process that connects to `url` as one of `users`: the creds
    directory of just those users when this process started that server, else nothing (the
    child inherits this process's `TOKENYARD_NATS_*`)."""
    auth = _LOCAL.get(url)
    return {CREDS_ENV: str(auth.dir_for(*users))} if auth is not None else {}


def _with_ca(c: Credentials) -> Credentials:
    return Credentials(c.user, c.password, c.jwt_file, os.environ[TLS_CA_ENV])


# ── command-line flags ──


def add_arguments(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("NATS credentials (default: from the environment)")
    g.add_argument("--nats-creds", metavar="PATH",
                   help=f"a creds file, or a directory of <kind>.creds files (env {CREDS_ENV})")
    g.add_argument("--nats-user", help=f"NATS user name (env {USER_ENV})")
    g.add_argument("--nats-password", help=f"NATS password (env {PASSWORD_ENV}; prefer the env or a file)")
    g.add_argument("--nats-tls-ca", metavar="PATH", help=f"CA of the server's TLS certificate (env {TLS_CA_ENV})")


def apply_args(args: argparse.Namespace) -> None:
    """Flags win over the environment: they are written into it, where `resolve` (and any
    child process, such as a worker the macro-instance starts) reads them."""
    for attr, env in (("nats_creds", CREDS_ENV), ("nats_user", USER_ENV), ("nats_password", PASSWORD_ENV),
                      ("nats_tls_ca", TLS_CA_ENV)):
        value = getattr(args, attr, None)
        if value:
            os.environ[env] = value
