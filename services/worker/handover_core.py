"""The worker core's hand-over bookkeeping, pure (shared/adoption.py; the I/O is
services/worker/handover.py). WorkerCore takes it on; it reads the core's streams.

Each request placed here follows the router that placed it (placed_by: its offer's reply prefix +
`.alive`, the subscription that lives as long as its connection), probed as leases are
(router_probes / on_router_answer, services/worker/leases.py). A gone router's requests are
handed to a surviving one in one hand-over (a serial), in pieces that fit the max payload
(adopt_asks); the adopter asks their state (stream_states: the request, the token ids sent, the
next seq), told to one router per hand-over, and the stream moves to it when:

    its AdoptReply names it                              adoption_done → placed_by = adopter
    the reply is lost, and the adopter, asked, names it  adoption_lost, adopter_asks,
                                                         on_adopter_answer → placed_by = adopter

A stream not named, or whose adopter is proven gone ("no responders" twice, ORPHAN_AFTER_S
apart), stays the gone router's and is handed over again at a later probe; one whose state was
never told, at once. Until then it is in no other hand-over: two routers would follow it, and
both re-issue it if this worker died.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tokenyard.services.worker.leases import LeaseProbe, LeaseWatch
from tokenyard.shared import codec
from tokenyard.shared.adoption import LIST_HEADER, AdoptAsk, AdoptedAsk, StreamState, adopted_ask, ask_pieces
from tokenyard.shared.schemas import AdmittedRequest

if TYPE_CHECKING:
    from tokenyard.services.worker.core import WorkerConfig, _Stream


@dataclass(frozen=True)
class AdopterAsk:
    """Ask the adopter `probe.lease` (its `alive` subject), on `probe.subject`, `ask`: which of
    these streams it follows; its answer goes to WorkerCore.on_adopter_answer."""

    probe: LeaseProbe
    ask: AdoptedAsk


class HandOvers:
    """The hand-over methods of WorkerCore; what they read of it is declared here."""

    cfg: WorkerConfig
    streams: dict[str, _Stream]
    _aborted: OrderedDict[str, str | None]
    routers: LeaseWatch
    """The placing routers' `alive` subjects, followed as leases are."""
    adopters: LeaseWatch
    """The routers that streams' state was told to, whose AdoptReply never came (keyed by
    `alive` subject): asked at once, then again every ORPHAN_AFTER_S while no answer comes;
    "no responders" twice, that far apart, proves one gone (LeaseWatch's rule)."""
    _handovers: int
    """Hand-overs started (their serials)."""

    def placed_by(self, request_id: str, alive: str) -> None:
        """The request just taken was placed by the router whose `alive` subject this is: follow
        it, and keep the token ids sent from now on (a hand-over needs them). Not a P/D decode
        leg: its first token went out from another worker."""
        st = self.streams.get(request_id)
        if st is not None and alive and not st.req.kv_from:
            st.placed_by, st.token_ids = alive, array("q", st.req.resume_token_ids)

    def router_probes(self, now: float) -> list[LeaseProbe]:
        """The placing routers to probe now (LeaseWatch.tick, keyed by `alive` subject)."""
        return self.routers.tick(now, {st.placed_by: st.placed_by for st in self.streams.values()
                                       if st.placed_by and not st.silenced})

    def on_router_answer(self, alive: str, gone: bool, sent_s: float) -> list[AdmittedRequest]:
        """A router probe's outcome; the requests to hand to another router (it is gone). They
        stay its until one adopts them (stream_states): a failed hand-over is tried again at
        the next probe."""
        if not self.routers.on_answer(alive, gone, sent_s):
            return []
        out = [st for rid, st in sorted(self.streams.items())
               if st.placed_by == alive and not st.silenced and rid not in self._aborted and not st.handing]
        self._handovers += 1
        for st in out:
            st.handing = self._handovers
        return [st.req for st in out]

    def adopt_asks(self, reqs: list[AdmittedRequest], room: int) -> list[AdoptAsk]:
        """The hand-over of `reqs` (on_router_answer's) in AdoptAsks that fit `room` with their
        states (shared/adoption.ask_pieces)."""
        sizes = [len(codec.encode(self._state(self.streams[r.request_id]))) if r.request_id in self.streams else 0
                 for r in reqs]
        serial = next((self.streams[r.request_id].handing for r in reqs if r.request_id in self.streams), 0)
        return ask_pieces(self.cfg.worker_id, reqs, sizes, room, serial)

    @staticmethod
    def _state(st: _Stream) -> StreamState:
        return StreamState(st.req.request_id, st.token_ids.tolist() if st.token_ids is not None else [], st.seq)

    def stream_states(self, request_ids: list[str], adopter: str, adopter_at: str, handover: int,
                      room: int | None = None) -> list[StreamState]:
        """What a router adopting these requests needs to migrate them: the ones still running
        here and still in hand-over `handover` (an ask that comes after the worker gave that one
        up, or during a later one, gets nothing: two routers would follow the stream), whose
        state was told to no other router in it, as many as fit `room` bytes encoded (a stream
        left out stays its old router's and is handed over again later). `adopter` (its `alive`
        subject) is followed once it says it adopted them; `adopter_at` is where it says so if
        its AdoptReply is lost (without one nothing is told: the worker could not ask)."""
        out, used = [], LIST_HEADER
        for rid in request_ids:
            st = self.streams.get(rid)
            if (not adopter or not adopter_at or st is None or st.silenced or st.token_ids is None
                    or rid in self._aborted or not handover or st.handing != handover or st.unconfirmed
                    or st.adopting not in ("", adopter)):
                continue
            state = self._state(st)
            if room is not None:
                size = len(codec.encode(state))
                if used + size > room:
                    continue
                used += size
            st.adopting, st.adopter_at = adopter, adopter_at
            out.append(state)
        return out

    def adoption_done(self, handover: int, asked: Iterable[str], adopted: list[str]) -> None:
        """The AdoptReply to a piece of hand-over `handover` (its `asked` requests): those it names
        whose state was told are followed as the adopter's; the rest may be handed over again."""
        said = set(adopted)
        for rid in asked:
            st = self.streams.get(rid)
            if st is not None and st.handing == handover:
                self._settle(st, rid in said and bool(st.adopting))

    def adoption_lost(self, handover: int, asked: Iterable[str]) -> None:
        """No AdoptReply to `asked` in hand-over `handover` (a timeout, a dropped or bad answer, or
        never sent): a stream whose state was told stays in the hand-over, unconfirmed, until its
        adopter answers for it (adopter_asks); the rest may be handed over again."""
        for rid in asked:
            st = self.streams.get(rid)
            if st is None or st.handing != handover or st.unconfirmed:
                continue
            if st.adopting:
                st.unconfirmed = True
            else:
                self._settle(st, False)

    def adopter_asks(self, now: float, room: int) -> list[AdopterAsk]:
        """The asks due now to adopters whose AdoptReply was lost (one out per adopter), each of
        the ids unconfirmed with it that fit `room` (shared/adoption.adopted_ask)."""
        pending: dict[str, tuple[str, list[str]]] = {}
        for rid, st in self.streams.items():
            if st.unconfirmed and not st.silenced:
                pending.setdefault(st.adopting, (st.adopter_at, []))[1].append(rid)
        probes = self.adopters.tick(now, {alive: at for alive, (at, _) in pending.items()})
        return [AdopterAsk(p, adopted_ask(self.cfg.worker_id, sorted(pending[p.lease][1]), room)) for p in probes]

    def on_adopter_answer(self, ask: AdopterAsk, adopted: list[str] | None, gone: bool) -> None:
        """An adopter's answer: `adopted`, those of the ask's ids it follows (None: no answer, a
        timeout), or `gone` ("no responders"). Those it follows are followed as its; the rest of
        the ask's, and all unconfirmed with an adopter proven gone, may be handed over again."""
        alive = ask.probe.lease
        if self.adopters.on_answer(alive, gone, ask.probe.sent_s):
            for st in self.streams.values():
                if st.unconfirmed and st.adopting == alive:
                    self._settle(st, False)
            return
        if adopted is None:
            return
        said = set(adopted)
        for rid in ask.ask.request_ids:
            st = self.streams.get(rid)
            if st is not None and st.unconfirmed and st.adopting == alive:
                self._settle(st, rid in said)

    @staticmethod
    def _settle(st: _Stream, adopted: bool) -> None:
        """The hand-over ends for `st`: its adopter followed from now, or (not adopted) it stays
        its placing router's, to be handed over again at a later probe if that one is gone."""
        if adopted:
            st.placed_by = st.adopting
        st.adopting, st.adopter_at, st.handing, st.unconfirmed = "", "", 0, False
