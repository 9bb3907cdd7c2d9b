"""The sandbox API server behaves like the real one where the operator relies on it."""

from __future__ import annotations

import asyncio
import itertools
import uuid

import pytest

from specpilot_sandbox import apiserver
from tests.operator.scenario import NAMESPACE

pytestmark = pytest.mark.operator


def event(reason: str) -> dict:
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": "kopf-event-", "namespace": NAMESPACE},
            "reason": reason, "message": reason, "type": "Normal",
            "involvedObject": {"kind": "Namespace", "name": NAMESPACE}}


async def test_a_generated_name_that_is_taken_is_drawn_again(sandbox, monkeypatch):
    # Every draw repeats the first until the second object's name has collided with the first's; the API
    # server draws a taken generated name again instead of answering 409.
    draws = (uuid.UUID(int=n << 108) for n in itertools.chain([1, 1, 1], itertools.count(2)))
    monkeypatch.setattr(apiserver.uuid, "uuid4", lambda: next(draws))
    first = await sandbox.create(event("First"))
    second = await sandbox.create(event("Second"))
    assert first["metadata"]["name"] != second["metadata"]["name"]
    assert {e["reason"] for e in sandbox.objects("events", NAMESPACE)} == {"First", "Second"}


async def test_a_change_made_while_a_watch_sends_its_snapshot_reaches_that_watch(sandbox):
    """A watch starts with the objects that exist (ADDED), then streams changes. A change made while the
    snapshot is still being sent (kopf starts or restarts a watch while the cluster works) must reach the
    watcher: in the snapshot or after it, never neither (kmock marks the event stream only after sending the
    snapshot; the sandbox marks it with the snapshot)."""
    import json

    import aiohttp

    first = await sandbox.create({**event("First"), "metadata": {"name": "e-0", "namespace": NAMESPACE}})
    resource = next(key[0] for key in sandbox.emulator.objects if key[1] == NAMESPACE and key[2] == "e-0")
    # A snapshot far larger than the socket buffers: the server is stuck sending it until the client reads.
    filler = "x" * 8192
    for n in range(1, 2000):
        sandbox.emulator.objects[(resource, NAMESPACE, f"e-{n}")] = {
            **first, "metadata": {**first["metadata"], "name": f"e-{n}"}, "message": filler}
    url = f"{sandbox.url}/api/v1/namespaces/{NAMESPACE}/events?watch=true"
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        await response.content.readline()  # the snapshot has begun, and stalls on the unread socket
        await sandbox.create({**event("Late"), "metadata": {"name": "late", "namespace": NAMESPACE}})
        seen = set()
        while "late" not in seen:
            line = await asyncio.wait_for(response.content.readline(), 10)
            assert line, "the watch ended"
            seen.add(json.loads(line)["object"]["metadata"]["name"])
    assert len(seen) == 2000  # e-1..e-1999 and the late one; e-0 was the first line
