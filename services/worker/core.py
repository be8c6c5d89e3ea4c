"""The worker's core: the bookkeeping around its engine, pure.

* offer(req)  → accept, or refuse with a reason: draining; in its decode phase (EcoServe:
  a decode-phase worker takes no new request; the router retries one in its prefill
  phase — a spatial P/D decode leg, `kv_from` set, is what a decode worker does take); wrong model; full (more than `max_waiting` requests waiting in the engine); already aborted (the abort overtook the
  request: answered `aborted` so the router stops trying). A request id seen before is
  accepted again without a second generation when it comes with the same reply subject (a
  queue redelivery after a crash, a re-ask after a lost answer: REOFFERED, nothing is sent);
  with another reply subject the id was reused by another request (Outcome.DUPLICATE),
  which gets an `error` 409 instead of silence.
* Migration (the router re-issues a dead worker's request): the engine prefills prompt +
  `resume_token_ids` and generates max_tokens − len(resume) more; chunks continue at
  `resume_seq`, and usage counts the resumed tokens as completion tokens, so the client's
  stream reads as one. An abort with reason `migrated` (the router moved the request away
  from a worker it believed dead) stops the generation without a word to the client.
* Per request, chunk numbering (seq 0, 1, …) and the finished event with usage; the first
  chunk carries the request's acceptance (Chunk.accepted), so its client need not wait for
  admission's `accepted` to show the first token.
* heartbeat(stats) → the Heartbeat published every ~100 ms.
* Orphans: lease_probes(now) / on_lease_answer(…) follow the leases of the requests it runs
  (services/worker/leases.py): a lease whose holder's `alive` subject has no responders left
  has every request of it here aborted, whoever placed them.
* Adoption (services/worker/handover_core.py, whose methods WorkerCore takes on): the routers
  that placed its requests are followed as leases are; a gone one's requests are handed to a
  surviving one, which then follows them (and migrates them if this worker dies).
Remembered ids are bounded (LRU of `remember` entries).
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass

import msgspec
from tokenyard.services.worker.engine import DEADLINE, EngineOutput, EngineStats
from tokenyard.services.worker.handover_core import HandOvers
from tokenyard.services.worker.leases import LeaseProbe, LeaseWatch
from tokenyard.shared import schemas
from tokenyard.shared.ecoserve import prefill_phase_starved
from tokenyard.shared.schemas import MIGRATED, AdmittedRequest, Outcome, Phase
from tokenyard.shared.slo import NUM_CLASSES, OfferPrefill, engine_saturated, klass, request_deadline_s
from tokenyard.shared.subjects import alive_subject, lease_of
from tokenyard.shared.tokenizer import Tokenizer

OUTPUT_SHARE_DECAY = 1 / 32
"""Heartbeat.output_share: each finished request's weight (about the last 32 requests)."""


@dataclass
class WorkerConfig:
    worker_id: str
    model: str
    engine: str = "sim"
    max_waiting: int = 256
    remember: int = 50_000
    flow_control: bool = True
    """Refuse a new request ("saturated") while the prefill it would wait behind in the engine's
    order already takes more than ENGINE_BACKLOG_S, or the whole prefill backlog more than its
    running decodes' TPOT slack, unless it would recompute more anywhere else
    (shared.slo.engine_saturated): the queue's flow control, enforced where the state is exact
    (the router then tries another worker, or the request waits in the queue)."""


@dataclass
class _Stream:
    req: AdmittedRequest
    seq: int = 0
    tokens: int = 0
    cached_tokens: int = 0
    silenced: bool = False
    """Migrated away: the engine's remaining outputs are dropped, not sent."""
    lease: str = ""
    """Its client's lease (from its reply subject; '' for a client without one)."""
    placed_by: str = ""
    """The `alive` subject of the router that follows it ('': none known, not handed over)."""
    token_ids: array | None = None
    """Resumed + generated token ids sent so far (kept while a router follows it)."""
    adopting: str = ""
    """The `alive` subject of the router its state was told to in this hand-over (one at most);
    followed once that router says it adopted it."""
    adopter_at: str = ""
    """Where that router answers which streams it adopted (`llm.v1.router.<id>.adopted`)."""
    handing: int = 0
    """The hand-over it is in now (its serial; 0: none). Not handed over a second time until
    it ends (adoption_done) or, its state told and the reply lost, the adopter answers for it;
    its state is told only to an adopter asking for that one."""
    unconfirmed: bool = False
    """Its state told to `adopting`, whose AdoptReply never came: that router is asked directly."""


def engine_request(req: AdmittedRequest) -> AdmittedRequest:
    """What the engine runs: the prompt extended by the tokens a resumed request already
    produced (a trace replay without token ids extends only its length). The block hashes
    stay the prompt's: a prefix of the longer prompt's chain, which engines accept."""
    n = len(req.resume_token_ids)
    if not n:
        return req
    ids = req.prompt_token_ids + req.resume_token_ids if req.prompt_token_ids else []
    return msgspec.structs.replace(
        req, prompt_token_ids=ids, prompt_len=req.prompt_len + n, max_tokens=req.max_tokens - n
    )


class WorkerCore(HandOvers):
    def __init__(self, cfg: WorkerConfig, tokenizer: Tokenizer):
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.phase = Phase.MIXED
        self.mode = ""
        """The macro-instance's mode, as its last WorkerControl said."""
        self.macro_id = ""
        self.draining = False
        self.healthy = True
        self.streams: dict[str, _Stream] = {}
        self.leases = LeaseWatch()
        self.routers = LeaseWatch()
        self._seen: OrderedDict[str, tuple[str, int]] = OrderedDict()
        """request id → (reply subject, migrations) of the generations started here."""
        self._aborted: OrderedDict[str, str | None] = OrderedDict()
        """request id → the reply subject of the one generation of it aborted (None: any)."""
        self._hb_seq = 0
        self._ran = 0.0
        self._asked = 0.0
        """Decayed sums of the completion tokens and max_tokens of the requests finished here
        (Heartbeat.output_share)."""
        self._handovers = 0
        self.adopters = LeaseWatch(at_once=True)

    def remembered(self) -> dict[str, tuple[int, int | None]]:
        """The ids it remembers, each memory bounded by `cfg.remember` (shared/service.py)."""
        return {"seen": (len(self._seen), self.cfg.remember), "aborted": (len(self._aborted), self.cfg.remember)}

    def _remember(self, lru: OrderedDict, rid: str, value=None) -> None:
        lru[rid] = value
        lru.move_to_end(rid)
        while len(lru) > self.cfg.remember:
            lru.popitem(last=False)

    def offer(self, req: AdmittedRequest, stats: EngineStats,
              prefill: OfferPrefill | None = None) -> tuple[schemas.GenerateReply, bool]:
        """The reply to the router, and whether to start generating. `prefill`: the router's
        count of r's uncached tokens here and on the best other instance (the `saturated`
        refusal weighs them; None: not sent, the refusal as without it)."""
        rid = req.request_id
        if rid in self._aborted and self._aborted[rid] in (None, req.reply_to):
            return schemas.GenerateReply(rid, False, Outcome.ABORTED), False
        seen = self._seen.get(rid)
        if seen is not None and seen[0] != req.reply_to:
            return schemas.GenerateReply(rid, True, Outcome.DUPLICATE), False
        if seen is not None and (req.migrations <= seen[1] or rid in self.streams):
            return schemas.GenerateReply(rid, True, schemas.REOFFERED), False
        if self.draining or not self.healthy:
            return schemas.GenerateReply(rid, False, "draining"), False
        if self.phase == Phase.DECODE and not req.kv_from:  # a P/D decode leg is what it waits for
            return schemas.GenerateReply(rid, False, "decode phase"), False
        if req.model != self.cfg.model:
            return schemas.GenerateReply(rid, False, f"serves '{self.cfg.model}', not '{req.model}'"), False
        if stats.waiting >= self.cfg.max_waiting:
            return schemas.GenerateReply(rid, False, "full"), False
        if (self.cfg.flow_control and not req.kv_from and self.saturated(stats, self.phase == Phase.MIXED, req.priority, prefill)
                and not prefill_phase_starved(self.phase, self.mode, stats.waiting,
                                              stats.queued_prefill_tokens * stats.prefill_ms_per_token / 1000.0)):
            return schemas.GenerateReply(rid, False, "saturated"), False
        # A decode leg's first token went out from the prefill worker: number on from it.
        self.streams[rid] = (_Stream(req, 1, 1, lease=lease_of(req.reply_to)) if req.kv_from
                             else _Stream(req, seq=req.resume_seq, tokens=len(req.resume_token_ids),
                                          lease=lease_of(req.reply_to)))
        self._remember(self._seen, rid, (req.reply_to, req.migrations))
        return schemas.GenerateReply(rid, True), True

    @staticmethod
    def saturated(stats: EngineStats, decodes_beside: bool = True, priority: int = NUM_CLASSES - 1,
                  prefill: OfferPrefill | None = None) -> bool:
        """The queue's flow-control rule where the state is exact (shared.slo.engine_saturated):
        the prefill a class-`priority` request would wait behind in the engine's order (net of
        the waiting turns' cached prefixes, where the engine reports it) takes longer than
        ENGINE_BACKLOG_S, or the whole prefill backlog longer than the running decodes' TPOT
        slack — unless (`prefill`, the router's counts) the request's first token comes here,
        behind what is ahead of it, before its own recompute alone could end on any other
        instance. An engine that reports no per-class split is judged by its whole backlog for
        every class (shared.slo.prefill_budget_s)."""
        slack = stats.tpot_slack_ms / 1000.0 if decodes_beside and stats.tpot_slack_ms is not None else None
        s_per_token = stats.prefill_ms_per_token / 1000.0
        backlog = stats.queued_prefill_tokens
        _, ahead = WorkerCore.prefill_ahead(stats, priority)  # net: a cached prefix is no wait
        here, elsewhere = (0.0, None) if prefill is None else (prefill.here * s_per_token, prefill.elsewhere * s_per_token)
        return engine_saturated(ahead * s_per_token, backlog * s_per_token, slack, here, elsewhere)

    @staticmethod
    def prefill_ahead(stats: EngineStats, priority: int) -> tuple[int, int]:
        """The prefill tokens a class-`priority` request would wait behind in the engine's order:
        (gross, net of the waiting turns' cached prefixes). An engine without the net split: the
        gross for both; without any per-class split: its whole backlog."""
        c = klass(priority)
        gross_by, net_by = stats.queued_prefill_ahead, stats.queued_prefill_ahead_net
        gross = gross_by[c] if len(gross_by) == NUM_CLASSES else stats.queued_prefill_tokens
        return gross, net_by[c] if len(net_by) == NUM_CLASSES else gross

    @staticmethod
    def refusal_terms(stats: EngineStats, priority: int, prefill: OfferPrefill | None) -> dict:
        """What a `saturated` refusal weighed, for the worker's debug line (tokens, and the
        decodes' slack in ms): which request waited behind what, and the router's counts."""
        ahead, ahead_net = WorkerCore.prefill_ahead(stats, priority)
        return dict(ahead=ahead, ahead_net=ahead_net,
                    backlog=stats.queued_prefill_tokens, slack_ms=stats.tpot_slack_ms,
                    ms_per_token=stats.prefill_ms_per_token, waiting=stats.waiting, running=stats.running,
                    here=None if prefill is None else prefill.here,
                    elsewhere=None if prefill is None else prefill.elsewhere)

    def running_ids(self) -> list[str]:
        """The requests generating here for their client (a migrated-away one is not)."""
        return sorted(rid for rid, st in self.streams.items() if not st.silenced)

    def lease_probes(self, now: float) -> list[LeaseProbe]:
        """The leases of the requests here to probe now (LeaseWatch.tick)."""
        running = {st.lease: alive_subject(st.req.reply_to) for st in self.streams.values()
                   if st.lease and not st.silenced}
        return self.leases.tick(now, running)

    def on_lease_answer(self, lease: str, gone: bool, sent_s: float) -> list[str]:
        """A lease probe's outcome; the ids of the requests here to abort in the engine (their
        client is gone): each is aborted for its reply subject, so a redelivered copy of it is
        refused (`aborted`) and a later request of the id from another client runs."""
        if not self.leases.on_answer(lease, gone, sent_s):
            return []
        rids = sorted(rid for rid, st in self.streams.items() if st.lease == lease and not st.silenced)
        for rid in rids:
            self.on_abort(rid, "orphaned", self.streams[rid].req.reply_to)
        return rids

    def reused_id_error(self, req: AdmittedRequest) -> schemas.Error:
        """The answer to a request whose id another request already used (offer said DUPLICATE)."""
        return schemas.Error(req.request_id, 409, f"request id '{req.request_id}' is already in use")

    def on_abort(self, request_id: str, reason: str = "client", reply_to: str = "",
                 before_migration: int = -1) -> bool:
        """True if the request is running here (the shell aborts it in the engine). A
        `migrated` abort silences the stream but leaves the id open: the request lives on; it
        spares a generation started by the migration it fences for (`before_migration`). One
        with `reply_to` stops only the generation streaming there (Abort.reply_to): another
        request of the id, here or offered later, runs on."""
        st = self.streams.get(request_id)
        if reason == MIGRATED:
            if st is None or 0 <= before_migration <= st.req.migrations:
                return False  # the re-issue the fence is for, taken here before the fence came
            st.silenced = True
            return True
        if reply_to:
            if st is not None and st.req.reply_to != reply_to:
                return False
            if self._aborted.get(request_id, "") is not None:  # not if every generation of it is aborted already
                self._remember(self._aborted, request_id, reply_to)
            seen = self._seen.get(request_id)
            if seen is not None and seen[0] == reply_to:  # the stopped newcomer no longer holds the id
                del self._seen[request_id]                # here: the first request may come (migrated)
            return st is not None
        self._remember(self._aborted, request_id)
        return st is not None

    def on_output(self, out: EngineOutput) -> list[schemas.Chunk | schemas.Finished | schemas.Rejected]:
        """The stream events one engine output makes, numbered; a request the engine
        rejected past its deadline before its first token (finish reason `deadline`) gets a
        `rejected` 429 `deadline_exceeded`, as the queue's expiry sends."""
        st = self.streams[out.request_id]
        if st.silenced:
            if out.finished:
                del self.streams[out.request_id]
            return []
        if out.finish_reason == DEADLINE and out.finished and not st.tokens:
            # the engine rejected it unstarted (SCORPIO's rejection path, SimEngineCore.expire)
            del self.streams[out.request_id]
            return [schemas.Rejected(
                out.request_id, 429, "deadline_exceeded",
                f"the engine could not start the request within its TTFT deadline "
                f"({request_deadline_s(st.req) - st.req.arrival_s:.3g} s) without breaking the running "
                f"requests' TPOT SLOs; retry later")]
        events: list[schemas.Chunk | schemas.Finished] = []
        st.cached_tokens = out.num_cached_tokens
        if out.new_token_ids:
            chunk = schemas.Chunk(out.request_id, st.seq, self.tokenizer.decode(out.new_token_ids), list(out.new_token_ids))
            if st.seq == 0:  # the stream's first: it carries the acceptance (Chunk.accepted)
                chunk.accepted = schemas.Accepted(out.request_id, st.req.priority, st.req.prompt_len)
            if st.tokens == (1 if st.req.kv_from else len(st.req.resume_token_ids)):  # this worker's first
                chunk.worker_id = self.cfg.worker_id  # the client's to probe if the stream goes silent
            events.append(chunk)
            st.seq += 1
            st.tokens += len(out.new_token_ids)
            if st.token_ids is not None:
                st.token_ids.extend(out.new_token_ids)
        if out.finished:
            p = st.req.prompt_len
            usage = schemas.Usage(p, st.tokens, p + st.tokens, st.cached_tokens)
            self._ran = (1.0 - OUTPUT_SHARE_DECAY) * self._ran + st.tokens
            self._asked = (1.0 - OUTPUT_SHARE_DECAY) * self._asked + max(st.req.max_tokens, st.tokens)
            events.append(
                schemas.Finished(out.request_id, st.seq, out.finish_reason or "stop", usage, self.cfg.worker_id)
            )
            del self.streams[out.request_id]
        return events

    def on_control(self, ctl: schemas.WorkerControl) -> None:
        self.phase = Phase(ctl.phase)
        self.mode = ctl.mode
        self.macro_id = ctl.macro_id
        self.draining = ctl.drain

    @property
    def hands_off(self) -> bool:
        """Spatial P/D's prefill worker: each request leaves after its first token."""
        return self.mode == "pd" and self.phase == Phase.PREFILL

    def engine_phase(self, stats: EngineStats) -> Phase:
        """The phase to run the engine in (EcoServe): the commanded one, except that a
        worker told to decode first finishes the prefills it already accepted (the ≤ 2
        requests the switch rule allows; parking them would add a whole rotation to their
        TTFT). It takes no new request meanwhile (offer refuses in the decode phase).
        Spatial P/D runs its engines mixed: the roles are in the offers and the hand-off."""
        if self.mode == "pd":
            return Phase.MIXED
        if self.phase == Phase.DECODE and stats.queued_prefill_tokens > 0:
            return Phase.PREFILL
        return self.phase

    def output_share(self) -> float:
        """Heartbeat.output_share: completion tokens ÷ max_tokens of the requests finished
        lately; 0 before the first."""
        return self._ran / self._asked if self._asked > 0 else 0.0

    def repeats(self, hb: schemas.Heartbeat, stats: EngineStats) -> bool:
        """A heartbeat now, with `stats`, would carry what `hb` (its latest) carried, all but
        its time and sequence number: the same stats object and the same worker state (the
        simulator then sends a keep-alive, which the receiving cores take as `hb` again)."""
        return (stats is hb.stats and hb.phase == self.phase and hb.healthy == self.healthy
                and hb.draining == self.draining and hb.macro_id == self.macro_id and hb.mode == self.mode
                and hb.output_share == self.output_share())

    def heartbeat(self, stats: EngineStats, now: float, interval_s: float = 0.0) -> schemas.Heartbeat:
        """`interval_s`: how often the shell sends one unprompted (0: not said)."""
        self._hb_seq += 1
        return schemas.Heartbeat(
            worker_id=self.cfg.worker_id,
            model=self.cfg.model,
            seq=self._hb_seq,
            ts=now,
            stats=stats,
            phase=self.phase,
            healthy=self.healthy,
            engine=self.cfg.engine,
            draining=self.draining,
            macro_id=self.macro_id,
            mode=self.mode,
            output_share=self.output_share(),
            interval_s=interval_s,
        )
