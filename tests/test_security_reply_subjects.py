"""Whoever receives a NATS request may publish on its reply subject, whatever its own permissions
(the server's `allow_responses`), so the requester chooses where a service's answer lands. A
client (alice, on the session's secured server) names JetStream's API as the reply of each door
it may knock on: a worker's `alive` probe (an empty answer there deletes the queue's stream, and
every admitted request stored in it), a submit and a resume (their answers on the API or the
fleet's own subjects). Every door answers only on an inbox (subjects.is_inbox): nothing reaches
the API, the stream lives on, and a submit with such a reply is not run."""

from __future__ import annotations

import asyncio
import json
import uuid

import nats
import pytest
from tokenyard.shared import schemas, subjects
from tokenyard.shared.client import TokenyardClient

JSON = {"Content-Type": "application/json"}

DOORS = [
    # door, who knocks, subject, payload, headers, where its answer would land, what it answers an inbox
    ("a worker's alive probe", "alice", subjects.worker_alive("tw0"), b"", None, "$JS.API.STREAM.DELETE.LLM_QUEUE",
     b""),
    ("a malformed submit", "alice", subjects.SUBMIT, b"{", JSON, "$JS.API.STREAM.PURGE.LLM_QUEUE", b"malformed"),
    ("a malformed resume", "alice", subjects.RESUME, b"{", JSON, "$JS.API.STREAM.PURGE.LLM_QUEUE", b"malformed"),
    # the read-only observer: a service's $SRV answer would overwrite a key of the topology bucket
    ("a micro PING", "observer", "$SRV.PING.tokenyard-admission", b"", None, "$KV.tokenyard_topology.forged",
     b"ping_response"),
    ("a micro STATS", "observer", "$SRV.STATS.tokenyard-admission", b"", None, "$KV.tokenyard_topology.forged",
     b"stats_response"),
]


async def connect_as(server, user: str):
    return await nats.connect(server.url, name=f"reply-{user}", allow_reconnect=False,
                              **server.auth.credentials(user).connect_options())


@pytest.mark.parametrize("door,user,subject,payload,headers,target,answers", DOORS, ids=[d[0] for d in DOORS])
async def test_no_door_answers_on_a_subject_that_is_not_an_inbox(nats_server, fleet, door, user, subject, payload,
                                                                  headers, target, answers):
    admin = fleet.nats
    spy = await admin.subscribe(target)
    await admin.flush()
    knocker = await connect_as(nats_server, user)
    try:
        await knocker.publish(subject, payload, reply=target, headers=headers)
        await knocker.flush()  # the server has handed it to the door before the admin's ask below
        # A door handles its messages in order and answers on one connection: its answer to this
        # ask reaches the admin's connection after any answer to the knocker's would have.
        answer = await admin.request(subject, payload, headers=headers, timeout=5)
        if answers:
            assert answers in answer.data
        else:
            assert answer.data == b""
        assert spy.pending_msgs == 0, f"{door} answered on {target}"
        assert (await admin.jetstream().stream_info(subjects.QUEUE_STREAM)).config.name == subjects.QUEUE_STREAM
    finally:
        await spy.unsubscribe()
        await knocker.close()


async def test_a_submit_whose_reply_is_not_an_inbox_is_not_run(nats_server, fleet):
    """Nothing could read its stream (a worker may publish on inboxes only): it takes no id, no
    queue slot and no worker, and is counted as refused. The same id from an inbox then runs."""
    admission = next(h.shell for h in fleet.hosts if h.shell.kind == "admission")
    rid = f"not-an-inbox-{uuid.uuid4().hex[:8]}"
    alice = await connect_as(nats_server, "alice")
    try:
        body = json.dumps({"prompt": "x", "max_tokens": 4, "request_id": rid}).encode()
        await alice.publish(subjects.SUBMIT, body, reply="tokenyard.not.an.inbox", headers=JSON)
        await alice.flush()  # admission takes it before the client's submit below
    finally:
        await alice.close()
    async with await TokenyardClient.connect(nats_server.url, "bob", creds=nats_server.auth.credentials("bob")) as bob:
        done = await asyncio.wait_for(bob.generate(schemas.GenerateRequest(prompt="x", max_tokens=4, request_id=rid)), 20)
    assert done.finish_reason == "length" and len(done.token_ids) == 4
    assert admission.metrics.snapshot()["refusals"].get("reply_not_an_inbox") == 1


@pytest.mark.parametrize("reply,ok", [
    ("_INBOX.client.0123456789abcdef.7", True), ("_INBOX.x", True),
    ("$JS.API.STREAM.DELETE.LLM_QUEUE", False), ("llm.v1.abort", False), ("$KV.tokenyard_topology.m0", False),
    ("_INBOX", False), ("_INBOX.", False), ("_INBOX..x", False), ("_INBOX.a.*", False), ("_INBOX.a.>", False),
    ("_INBOX.a b", False), ("x._INBOX.a", False), ("", False), (None, False),
])
def test_only_an_inbox_is_answered(reply, ok):
    assert subjects.is_inbox(reply) is ok
