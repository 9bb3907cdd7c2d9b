"""Status is made acceptable to the API server before it is written (specpilot.api.sanitize), and a failed
reconciliation is explained in the operator's own words (controller.handlers.explain_failure)."""

from __future__ import annotations

import json
import math

import kopf
from hypothesis import given, strategies as st

from specpilot.api.sanitize import MAX_NUMBER, STATUS_BUDGET_BYTES, bounded_status, sanitize, size_bytes
from specpilot.controller.handlers import (BoundedDiffBaseStorage, DIFFBASE_INLINE_BYTES, explain_failure,
                                           retry_delay, with_condition)
from specpilot.controller.kube import Refused, Unreachable


def test_non_finite_numbers_become_null_and_absurd_ones_are_clamped():
    status = {"observedConcurrency": float("nan"), "costPerMtok": float("inf"),
              "pools": [{"observed": {"concurrency": -float("inf"), "rate": 1e300, "count": 10**30}}],
              "phase": "Serving", "ok": True}
    out = sanitize(status)
    assert out["observedConcurrency"] is None and out["costPerMtok"] is None
    observed = out["pools"][0]["observed"]
    assert observed["concurrency"] is None
    assert observed["rate"] == MAX_NUMBER and observed["count"] == int(MAX_NUMBER)
    assert out["phase"] == "Serving" and out["ok"] is True
    json.dumps(out, allow_nan=False)  # what the API server accepts


def test_a_status_over_its_budget_is_cut_until_it_fits():
    status = {"conditions": [{"type": "A", "message": "x" * 30000}] * 40, "history": list(range(100000))}
    out, report = bounded_status(status)
    assert size_bytes(out) <= STATUS_BUDGET_BYTES
    assert report.strings_cut and report.lists_cut


def test_a_valid_status_passes_unchanged():
    status = {"phase": "Serving", "pools": [{"name": "h100", "decision": {"method": "eagle3", "k": 2.5}}],
              "conditions": [{"type": "Valid", "status": "True", "reason": "SpecValid", "message": "ok"}]}
    out, report = bounded_status(status)
    assert out == status and not report


@given(st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=50),
                    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=5), children,
                                                                                       max_size=5), max_leaves=40))
def test_whatever_goes_in_comes_out_as_strict_json(value):
    json.dumps(sanitize(value), allow_nan=False)


def test_refused_writes_name_the_object_and_the_fix():
    exc = Refused(422, "PATCH", "/apis/apps/v1/namespaces/team/deployments/llama-h100",
                  'Deployment.apps "llama-h100" is invalid: spec.replicas: Invalid value')
    reason, message = explain_failure(exc)
    assert reason == "WriteRefused"
    assert "deployments team/llama-h100" in message and "HTTP 422" in message and "spec.replicas" in message
    too_big = Refused(413, "PATCH", "/apis/specpilot.io/v1alpha1/namespaces/team/speculativedeployments/x/status",
                      "Request entity too large")
    reason, message = explain_failure(too_big)
    assert "speculativedeployments team/x (status)" in message and "too large" in message
    assert explain_failure(Unreachable("API server unreachable on GET /x", delay=5))[0] == "ApiServerUnavailable"
    assert explain_failure(kopf.TemporaryError("API server 503 on GET /x"))[0] == "ApiServerUnavailable"


def test_an_unexpected_exception_is_named_by_type_and_place_never_by_its_text():
    try:
        raise ValueError("secret answer of a hostile endpoint")
    except ValueError as exc:
        reason, message = explain_failure(exc)
        again = explain_failure(exc)
    assert reason == "ReconcileError" and "ValueError" in message and "secret" not in message
    assert again == (reason, message)  # stable: one Event per cause, not per retry


def test_retries_back_off_to_a_bound():
    assert [retry_delay(n) for n in range(6)] == [10, 20, 40, 60, 60, 60]


def test_the_condition_moves_its_transition_time_only_when_it_flips():
    first = with_condition({"phase": "Serving"}, "Reconciled", False, "WriteRefused", "m", 3)
    again = with_condition(first, "Reconciled", False, "WriteRefused", "m", 3)
    (c1,), (c2,) = first["conditions"], again["conditions"]
    assert c1["status"] == "False" and c1["lastTransitionTime"] == c2["lastTransitionTime"]
    assert again["phase"] == "Serving"


def test_a_huge_spec_is_kept_as_a_digest_in_kopfs_annotation():
    storage = BoundedDiffBaseStorage(prefix="specpilot.io", key="last-handled-configuration")
    small = kopf.Body({"metadata": {"name": "a"}, "spec": {"x": "y"}})
    assert storage.build(body=small)["spec"] == {"x": "y"}
    huge = kopf.Body({"metadata": {"name": "a"}, "spec": {"x": "y" * 300_000}})
    essence = storage.build(body=huge)
    assert set(essence) == {"digest", "bytes"} and len(json.dumps(essence)) < DIFFBASE_INLINE_BYTES
    other = kopf.Body({"metadata": {"name": "a"}, "spec": {"x": "z" * 300_000}})
    assert storage.build(body=other) != essence
    assert not math.isnan(essence["bytes"])


async def test_every_status_the_operator_writes_is_sanitised(monkeypatch):
    from specpilot.controller.kube import Kube

    sent = []

    async def call(self, method, path, body=None, content_type="", query=None, **_):
        sent.append(body)
        return {}

    monkeypatch.setattr(Kube, "_call", call)
    kube = Kube.__new__(Kube)
    await kube.patch("speculationprofiles", "team", "p", {"status": {"message": "x", "rate": float("nan")}},
                     subresource="status")
    await kube.patch("deployments", "team", "d", {"spec": {"replicas": 2}})
    assert sent == [{"status": {"message": "x", "rate": None}}, {"spec": {"replicas": 2}}]
