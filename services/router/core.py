"""The router's core: a FleetView fed by heartbeats and macro-instance states, and a policy
pipeline (filter → scorer → picker) that picks the worker for each request.

    route(req, now, exclude) → Choice(worker_id | None, reason)

On a choice the view is updated optimistically (FleetView.note_routed); if the worker then
refuses, the shell asks again with that worker excluded. Policies are built by name
(`POLICIES`); issue 5 adds the KV-aware ones behind the same pipeline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from services.router.filters import AcceptingFilter, HealthyFilter, ModelFilter
from services.router.fleet import FleetView
from services.router.pipeline import ArgminPicker, Choice, Pipeline, Scorer
from services.router.policies.least_loaded import LeastLoadedScorer
from services.router.policies.round_robin import RoundRobinScorer
from shared import config
from shared.schemas import AdmittedRequest, Heartbeat, MacroState

POLICIES: dict[str, Callable[[], Scorer]] = {
    "round-robin": RoundRobinScorer,
    "least-loaded": LeastLoadedScorer,
}


@dataclass
class RouterConfig:
    policy: str = "least-loaded"
    stale_after_s: float = config.STALE_AFTER_S
    forget_after_s: float = 60.0


class RouterCore:
    def __init__(self, cfg: RouterConfig):
        if cfg.policy not in POLICIES:
            raise ValueError(f"unknown policy '{cfg.policy}'; known: {', '.join(POLICIES)}")
        self.cfg = cfg
        self.view = FleetView()
        self.pipeline = Pipeline(
            name=cfg.policy,
            filters=[HealthyFilter(cfg.stale_after_s), AcceptingFilter(), ModelFilter()],
            scorer=POLICIES[cfg.policy](),
            picker=ArgminPicker(),
        )

    def on_heartbeat(self, hb: Heartbeat, now: float) -> None:
        self.view.upsert(hb, now)

    def on_macro_state(self, state: MacroState) -> None:
        for wid in state.workers:
            self.view.set_accepting(wid, wid in state.accepting)

    def route(self, req: AdmittedRequest, now: float, exclude: frozenset[str] = frozenset()) -> Choice:
        choice = self.pipeline.choose(req, self.view, now, exclude)
        if choice.worker_id is not None:
            self.view.note_routed(self.view.slot[choice.worker_id], req.prompt_len)
        return choice

    def housekeeping(self, now: float) -> list[str]:
        return self.view.forget_silent(now, self.cfg.forget_after_s)
