"""The edge's `/health`: its readiness (shared/readiness.py judges), from admission's view of the
fleet — asked by a call where admission runs in the edge's process (`tokenyard up`), else on
`llm.v1.admission.health` (any replica answers), one ask at a time: probes that come while one
is out share its answer, so a probe storm costs admission one request per round trip.
"""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from nats.errors import Error as NatsError
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from tokenyard.shared import codec, readiness, schemas, subjects
from tokenyard.shared.local_admission import LocalAdmission
from tokenyard.shared.readiness import Readiness

Asked = tuple[schemas.FleetHealth | None, str]
"""Admission's answer, or None and why none came."""


class HealthProbe:
    def __init__(self, nc: Client, admission: LocalAdmission | None = None, ask_s: float = readiness.ASK_S):
        self.nc = nc
        self.admission = admission
        self.ask_s = ask_s
        self._asking: asyncio.Future[Asked] | None = None

    async def readiness(self) -> Readiness:
        if not self.nc.is_connected:
            return readiness.judge(False, None)
        if self.admission is not None:
            return readiness.judge(True, self.admission.fleet_health())
        if self._asking is None:
            self._asking = asyncio.ensure_future(self._ask())
            self._asking.add_done_callback(self._asked)
        fleet, why = await asyncio.shield(self._asking)  # a probe that leaves does not end the others' ask
        return readiness.judge(self.nc.is_connected, fleet, why)

    def _asked(self, _: asyncio.Future) -> None:
        self._asking = None

    async def _ask(self) -> Asked:
        try:
            msg = await self.nc.request(subjects.ADMISSION_HEALTH, b"", timeout=self.ask_s)
        except NoRespondersError:
            return None, f"no responders on {subjects.ADMISSION_HEALTH}"
        except (NatsTimeout, TimeoutError):
            return None, f"no answer on {subjects.ADMISSION_HEALTH} within {self.ask_s:g} s"
        except NatsError as e:  # a closed or reconnecting connection
            return None, f"the ask failed: {e!r}"[:200]
        try:
            return codec.decode(msg.data, schemas.FleetHealth, json=codec.is_json(msg.headers)), ""
        except codec.DecodeError as e:
            return None, f"admission's answer did not decode: {e}"[:200]
