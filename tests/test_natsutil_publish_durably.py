"""natsutil.publish_durably's verdict when every attempt fails: an attempt that timed out may have
stored the message (its ack is what was lost), so the failure is MaybeStored; attempts that were
all refused outright (no responders: no stream leader) stored nothing, and their error is raised."""

from __future__ import annotations

import pytest
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout
from tokenyard.shared import natsutil


class Attempts:
    """JetStream's publish as the test scripts it: each attempt raises the next error given."""

    def __init__(self, *errors: type[Exception]) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def publish(self, subject, data, headers=None, timeout=None):
        self.calls += 1
        raise self.errors[min(self.calls, len(self.errors)) - 1]()


async def publish(js: Attempts) -> None:
    await natsutil.publish_durably(js, "q", b"x", "id-1", deadline_s=0.35, attempt_timeout_s=0.1)


async def test_a_timed_out_retry_after_refusals_makes_the_failure_maybe_stored():
    js = Attempts(NoRespondersError, NatsTimeout, NoRespondersError)
    with pytest.raises(natsutil.MaybeStored):
        await publish(js)
    assert js.calls >= 3  # the refusal after the timeout did not clear it


async def test_attempts_all_refused_raise_the_refusal():
    js = Attempts(NoRespondersError)
    with pytest.raises(NoRespondersError):
        await publish(js)
    assert js.calls >= 2
