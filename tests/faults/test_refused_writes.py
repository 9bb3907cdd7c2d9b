"""Writes the API server refuses (422 invalid, 413 too large): on the deployment's status, on a generated
Deployment, on the benchmark Jobs. Each is reported as Reconciled=False naming the object and the fix, with
one Warning Event however often it is retried, and the object is reconciled again once the write passes
(a refused status patch used to end kopf's timers for the object until the operator restarted)."""

from __future__ import annotations

import pytest

from tests.faults.conftest import SKU, assert_no_duplicate_jobs, reconciled
from tests.operator.scenario import (H100, condition, deployment, events, jobs, node, profiles,
                                     publish_results, sdep)

pytestmark = [pytest.mark.operator, pytest.mark.slow]


RETRIED = "(retrying in 20 s)"
"""What the operator logs when a reconciliation failed again on its first retry, after the 10 s back-off."""


async def test_a_refused_status_write_is_reported_once_retried_and_the_timers_go_on(sandbox, operators):
    op = operators()
    await sandbox.create(node("gpu-a", H100, "h100"))
    # Refused 5 times: each failed attempt is 2 writes (the status, then fail()'s Reconciled=False condition);
    # the create handler's and the periodic timer's first attempts take 4, and the first of their retries after
    # the 10 s back-off has its status write refused (its condition write passes). The other retry then writes
    # the status: the timers were not stopped by the refusals.
    fault = sandbox.refuse("speculativedeployments", "llama", subresource="status", code=422, times=5,
                           message='SpeculativeDeployment.specpilot.io "llama" is invalid: status.pools: Too many')
    await sandbox.create(sdep())
    warning = await sandbox.wait_for(lambda: events(sandbox, "WriteRefused"), timeout_s=30, what="a WriteRefused Event")
    assert "speculativedeployments team/llama (status)" in warning[0]["message"]
    assert "HTTP 422" in warning[0]["message"] and "status.pools: Too many" in warning[0]["message"]
    await sandbox.wait_for(lambda: RETRIED in op.log(), timeout_s=60, what="a retry after the back-off, refused")
    assert fault.hits == 5

    # The timers were not stopped: the status is written, profiling goes on and the pool is served.
    await sandbox.wait_for(lambda: len(profiles(sandbox)) == 3, timeout_s=60, what="three profiles")
    await publish_results(sandbox, SKU, timeout_s=90)
    await sandbox.wait_for(lambda: deployment(sandbox, "h100"), timeout_s=90, what="the serving Deployment")
    final = await reconciled(sandbox)
    assert final["phase"] == "Serving"
    assert_no_duplicate_jobs(sandbox)
    # Refused by every handler and a retry: still one Event.
    assert len(events(sandbox, "WriteRefused")) == 1


async def test_a_refused_deployment_is_named_with_the_fix_then_created(sandbox, operators):
    op = operators()
    # Refused 3 times: the create handler's and the periodic timer's first attempts, and the first of their
    # retries after the 10 s back-off; the other retry creates it.
    fault = sandbox.refuse("deployments", "llama-h100", code=422, times=3, message=(
        'Deployment.apps "llama-h100" is invalid: spec.template.spec.containers[0].image: denied by policy '
        'allowed-registries'))
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep())
    cond = await sandbox.wait_for(
        lambda: (c := condition(sandbox, "Reconciled")) and c["status"] == "False" and c, timeout_s=60,
        what="Reconciled=False")
    assert cond["reason"] == "WriteRefused"
    assert "deployments team/llama-h100" in cond["message"]
    assert "containers[0].image: denied by policy" in cond["message"] and "admission" in cond["message"]
    assert deployment(sandbox, "h100") is None
    await sandbox.wait_for(lambda: len(profiles(sandbox)) == 3, timeout_s=30, what="three profiles")
    await publish_results(sandbox, SKU, timeout_s=90)
    await sandbox.wait_for(lambda: RETRIED in op.log(), timeout_s=60, what="a retry after the back-off, refused")
    assert fault.hits == 3

    await sandbox.wait_for(lambda: deployment(sandbox, "h100"), timeout_s=90, what="the serving Deployment")
    final = await reconciled(sandbox)
    assert final["phase"] == "Serving"
    # Refused by every handler and a retry: still one Event.
    assert len(events(sandbox, "WriteRefused")) == 1


async def test_jobs_refused_as_too_large_are_reported_then_run(sandbox, operators):
    operators()
    fault = sandbox.refuse("jobs", code=413, verbs=frozenset({"create"}))
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep())
    cond = await sandbox.wait_for(
        lambda: (c := condition(sandbox, "Reconciled")) and c["status"] == "False" and c, timeout_s=60,
        what="Reconciled=False")
    assert cond["reason"] == "WriteRefused" and "jobs team/" in cond["message"]
    assert "HTTP 413" in cond["message"] and "too large" in cond["message"]
    warning = await sandbox.wait_for(lambda: events(sandbox, "WriteRefused"), timeout_s=30, what="a WriteRefused Event")
    assert warning[0]["type"] == "Warning"
    # The periodic timer is refused too (the create handler was first): it posts no second Event (below).
    await sandbox.wait_for(lambda: fault.hits >= 2, timeout_s=30, what="a second refused attempt")
    assert jobs(sandbox) == []

    sandbox.allow(fault)
    await publish_results(sandbox, SKU, timeout_s=120)
    await sandbox.wait_for(lambda: deployment(sandbox, "h100"), timeout_s=90, what="the serving Deployment")
    final = await reconciled(sandbox)
    assert final["phase"] == "Serving"
    assert_no_duplicate_jobs(sandbox)
    assert {p["status"]["phase"] for p in profiles(sandbox)} == {"Succeeded"}
    assert len(events(sandbox, "WriteRefused")) == 1


async def test_a_job_created_but_not_recorded_on_its_profile_is_recorded_on_the_next_pass(sandbox, operators):
    """The API server fails the write that names a new Job on its profile (status.jobName), as when it goes away
    right after the Job's create: the next reconciliation records the Job it finds (its name, uid and nonce)
    instead of leaving the profile without one (a user would see no Job on it, and a test waiting for it hang),
    and its result is accepted."""
    operators()
    fault = sandbox.refuse("speculationprofiles", subresource="status", code=500, times=2, field="jobName",
                           message="etcdserver: request timed out")
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep())
    await sandbox.wait_for(lambda: fault.hits >= 2, timeout_s=60, what="the refused jobName writes")
    await sandbox.wait_for(lambda: sum(1 for p in profiles(sandbox) if (p.get("status") or {}).get("jobName")) >= 2,
                           timeout_s=60, what="the Jobs named on their profiles after all")
    await publish_results(sandbox, SKU, timeout_s=120)
    final = await reconciled(sandbox)
    assert final["phase"] == "Serving"
    assert_no_duplicate_jobs(sandbox)
    assert {p["status"]["phase"] for p in profiles(sandbox)} == {"Succeeded"}
