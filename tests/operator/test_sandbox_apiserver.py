"""The sandbox API server behaves like the real one where the operator relies on it."""

from __future__ import annotations

import itertools
import uuid

import pytest

from specpilot.sandbox import apiserver
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
