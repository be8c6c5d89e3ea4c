"""`tokenyard queue --nats URL [--policy hybrid] [--flow-control on|off] [--deadline-reject on|off]
[--aging 30,15,5] [--bubble-width W] [--with-router [--router-policy P] [router options]]`.

`--with-router` runs a router in this process (what `tokenyard up` starts): the queue asks it
by a call, one NATS crossing fewer per request; it still serves `llm.v1.route` for others.

`--with-admission` runs admission in this process too (also what `tokenyard up` starts): each
admitted request is handed to the queue by a call while JetStream stores it, one crossing fewer
again; admission's options are taken as `tokenyard admission` takes them.

`--http-port P` (with `--with-admission`) serves the OpenAI HTTP API from this process too (also
what `tokenyard up` starts): the edge hands each request to admission by a call, not over NATS
(services/edge/shell.py); `tokenyard edge` still runs the HTTP front on its own, to scale it apart.
Several such processes may run side by side, each an admission, queue and router replica, on one
HTTP port too (SO_REUSEPORT: the kernel spreads the connections, and after one's crash sends them
to the rest).

`make_policy(name)` is the one registry of queue policies (services.priority_queue.policies
.registry), shared with `tokenyard sim --queue-policy`."""

from __future__ import annotations

from tokenyard.services.priority_queue.policies.registry import (  # noqa: F401
    DEFAULT_POLICY,
    POLICY_NAMES,
    make_policy,
    parse_aging,
)
from tokenyard.shared import config


def register(sub) -> None:
    p = sub.add_parser("queue", help="the priority queue between admission and the router")
    p.add_argument("--nats", default=config.nats_url_from_env(), help="NATS server URL (env TOKENYARD_NATS_URL)")
    config.add_metrics_port_argument(p)
    p.add_argument("--policy", "--queue-policy", dest="policy", choices=POLICY_NAMES, default=DEFAULT_POLICY,
                   help="ordering policy (default: %(default)s)")
    p.add_argument("--flow-control", choices=("on", "off"), default="on",
                   help="hold the backlog here while the fleet is saturated, judged from heartbeats "
                        "(default: on); off: fill every worker up to --slots-per-worker")
    p.add_argument("--deadline-reject", choices=("on", "off"), default="on",
                   help="reject a waiting request once its TTFT deadline has passed, 429 (default: on)")
    p.add_argument("--aging", default="30,15,5", help="seconds in P1,P2,P3 before moving up a class, or 'off'")
    p.add_argument("--bubble-width", type=float, default=1024.0, help="width of a bubble queue, in tokens")
    p.add_argument("--slots-per-worker", type=int, default=64,
                   help="with --flow-control off: waiting requests a worker may hold (default: 64)")
    p.add_argument("--batch-cap", type=int, default=0,
                   help="with --flow-control off: a worker is full at this many running + waiting requests "
                        "(default 0: no cap)")
    p.add_argument("--p0-reserve", type=int, default=4,
                   help="P0 requests per worker and heartbeat released beyond the headroom (default: 4)")
    from tokenyard.services.router.cli import add_router_arguments

    g = p.add_argument_group("a router in this process (with --with-router)")
    g.add_argument("--with-router", action="store_true",
                   help="run a router in this process and ask it directly: one NATS crossing fewer per request "
                        "(default: ask the routers on llm.v1.route)")
    g.add_argument("--router-metrics-port", type=int, default=None,
                   help="that router's Prometheus /metrics port (0: any free port)")
    add_router_arguments(g, policy_flag="--router-policy")
    from tokenyard.services.admission.cli import add_admission_arguments

    g = p.add_argument_group("admission in this process (with --with-admission)")
    g.add_argument("--with-admission", action="store_true",
                   help="run admission in this process: it hands each admitted request to this queue at once, "
                        "while JetStream stores it (default: the queue hears of it from JetStream)")
    g.add_argument("--admission-metrics-port", type=int, default=None,
                   help="that admission's Prometheus /metrics port (0: any free port)")
    add_admission_arguments(g)
    g = p.add_argument_group("the HTTP edge in this process (with --with-admission)")
    g.add_argument("--http-port", type=int, default=None,
                   help="serve the OpenAI-compatible HTTP API on this port from this process, its requests handed "
                        "to admission by a call (0: any free port; default: no HTTP here, run `tokenyard edge`)")
    g.add_argument("--http-host", default="127.0.0.1", help="the HTTP bind address (default: %(default)s)")
    p.set_defaults(func=main)


def main(args) -> int:
    if args.http_port is not None and not args.with_admission:
        raise SystemExit("tokenyard queue: error: --http-port needs --with-admission (the edge hands its requests "
                         "to admission in this process)")
    from tokenyard.services.priority_queue.core import QueueConfig
    from tokenyard.services.priority_queue.shell import QueueShell
    from tokenyard.shared.feed import ProcessFeeds
    from tokenyard.shared.service import run

    policy = make_policy(args.policy, aging_s=parse_aging(args.aging), bubble_width=args.bubble_width)
    cfg = QueueConfig(flow_control=args.flow_control == "on", expire_deadlines=args.deadline_reject == "on",
                      slots_per_worker=args.slots_per_worker, p0_reserve_per_worker=args.p0_reserve,
                      batch_cap_per_worker=args.batch_cap)
    also = []  # started before the queue, stopped after it
    router = None
    feeds = ProcessFeeds()  # one heartbeat subscription for the process, on the first started's connection
    if args.with_router:
        from tokenyard.services.router.cli import router_shell

        router = router_shell(args, feeds=feeds)
        also.append((router, args.router_metrics_port))
    queue = QueueShell(cfg, policy, router=router, feeds=feeds)
    if not args.with_admission:
        run(queue, args.nats, args.metrics_port, also=also)
        return 0
    from tokenyard.services.admission.cli import admission_shell

    # admission after its queue: it takes requests only once its queue serves, and stops taking
    # them first; the edge after admission, for the same reason
    admission = admission_shell(args, queue=queue, feeds=feeds)
    also = [*also, (queue, args.metrics_port)]
    if args.http_port is None:
        run(admission, args.nats, args.admission_metrics_port, also=also, name="queue")
        return 0
    from tokenyard.services.edge.shell import EdgeConfig, EdgeShell

    # SO_REUSEPORT: replicas of this process serve one port together, as edge processes do; when
    # one dies the kernel hands new connections to the others (a crashed front is not a dead port)
    edge = EdgeShell(EdgeConfig(host=args.http_host, http_port=args.http_port, reuse_port=True,
                                models=args.model or [config.DEFAULT_MODEL]), admission=admission)
    if router is not None:  # the router follows this edge's streams on its client, not by subscriptions of its own
        router.follows.local = lambda: edge.client
    run(edge, args.nats, None, also=[*also, (admission, args.admission_metrics_port)], name="queue")
    return 0
