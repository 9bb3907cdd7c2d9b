"""What the operator keeps per object between reconciliations (controller.reconcile.Context)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from specpilot.controller.reconcile import Context

BODY = {"metadata": {"uid": "u1", "name": "llama"}, "spec": {"model": {"id": "m"}},
        "status": {"phase": "Profiling", "pools": [{"name": "h100", "decision": None}]}}


def _ctx(**written):
    return SimpleNamespace(written=dict(written), locks={})


def test_the_next_reconciliation_starts_from_the_status_computed_last_not_from_an_older_body():
    # kopf writes a handler's status only after it returns; a timer waiting on the lock still holds the
    # body from before that write.
    decided = {"phase": "Serving", "pools": [{"name": "h100", "decision": {"method": "eagle3"}}]}
    view = Context.latest(_ctx(u1=decided), BODY)
    assert view["status"] == decided
    assert view["spec"] == BODY["spec"] and view["metadata"] == BODY["metadata"]
    assert BODY["status"]["phase"] == "Profiling", "the body itself is left as it is"


def test_with_nothing_computed_yet_the_body_is_the_truth():
    assert Context.latest(_ctx(), BODY) is BODY  # e.g. right after the operator (re)started
    assert Context.latest(_ctx(other={"phase": "Serving"}), BODY) is BODY


def test_a_deleted_object_is_forgotten():
    ctx = _ctx(u1={"phase": "Serving"}, u2={"phase": "Profiling"})
    ctx.locks = {"u1": asyncio.Lock(), "u2": asyncio.Lock()}
    Context.forget(ctx, "u1")
    assert set(ctx.written) == set(ctx.locks) == {"u2"}
    Context.forget(ctx, "never-seen")  # no error
