"""`tokenyard queue --nats URL [--policy fcfs]`."""

from __future__ import annotations

from shared import config

POLICIES = ("fcfs",)


def register(sub) -> None:
    p = sub.add_parser("queue", help="the priority queue between admission and the router")
    p.add_argument("--nats", default=config.nats_url_from_env())
    p.add_argument("--policy", choices=POLICIES, default="fcfs")
    p.add_argument("--slots-per-worker", type=int, default=64, help="waiting requests a worker may hold")
    p.set_defaults(func=main)


def make_policy(name: str):
    from services.priority_queue.policies.fcfs import FCFS

    return {"fcfs": FCFS}[name]()


def main(args) -> int:
    from services.priority_queue.core import QueueConfig
    from services.priority_queue.shell import QueueShell
    from shared.service import run

    run(QueueShell(QueueConfig(slots_per_worker=args.slots_per_worker), make_policy(args.policy)), args.nats)
    return 0
