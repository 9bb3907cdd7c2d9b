"""The real operator (kopf, against the sandbox API server) refuses a hostile SpeculativeDeployment with a
condition and one Event naming each field, creates nothing for it and keeps running; and fails a profile whose
result is physically impossible instead of deciding on it."""

from __future__ import annotations

import pytest

from specpilot.api import seal
from tests.operator.conftest import operator, operator_config, sandbox  # noqa: F401  (fixtures)
from tests.operator.scenario import (
    H100,
    NAMESPACE,
    condition,
    events,
    jobs,
    measured_status,
    node,
    profiles,
    sdep,
    status,
)

pytestmark = pytest.mark.operator


async def test_a_hostile_spec_gets_a_condition_and_an_event_and_reaches_no_pod(sandbox, operator):  # noqa: F811
    await sandbox.create(node("gpu-1", H100, "h100"))
    hostile = sdep(
        model={"id": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama",
               "env": [{"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db-root", "key": "password"}}}]},
        serving={"podOverrides": {"hostNetwork": True, "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
                                  "containers": [{"name": "engine", "securityContext": {"privileged": True}}]}},
        profiling={"image": "evil.example.com/miner:latest"},
    )
    await sandbox.create(hostile)

    valid = await sandbox.wait_for(lambda: condition(sandbox, "Valid"), what="the Valid condition")
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    for field in ("spec.serving.podOverrides.hostNetwork is not allowed",
                  "spec.serving.podOverrides.volumes[0].hostPath is not allowed",
                  "spec.serving.podOverrides.containers[0].securityContext is not allowed",
                  "spec.model.env[0].valueFrom.secretKeyRef references Secret 'db-root'",
                  "spec.profiling.image 'evil.example.com/miner:latest' is not a benchmark image"):
        assert field in valid["message"], valid["message"]
    warning = await sandbox.wait_for(lambda: events(sandbox, "InvalidSpec"), what="an InvalidSpec Event")
    assert warning[0]["type"] == "Warning" and "hostNetwork" in warning[0]["message"]

    await operator.wait_periodic_runs(sandbox, 2)  # reconciliations: still nothing created, one Event, alive
    assert sandbox.objects("deployments", NAMESPACE) == []
    assert jobs(sandbox) == [] and profiles(sandbox) == []
    assert len(events(sandbox, "InvalidSpec")) == 1
    assert operator.proc.poll() is None
    assert status(sandbox)["phase"] == "Failed"

    fixed = sdep()["spec"]  # a merge patch: the hostile fields are removed with null
    fixed["model"]["env"] = None
    fixed["serving"]["podOverrides"] = None
    fixed["profiling"]["image"] = None
    await sandbox.patch("speculativedeployments", NAMESPACE, "llama", {"spec": fixed})
    await sandbox.wait_for(lambda: (condition(sandbox, "Valid") or {}).get("status") == "True",
                           what="Valid=True after the fix")
    deployment = await sandbox.wait_for(lambda: sandbox.objects("deployments", NAMESPACE), what="a Deployment")
    pod = deployment[0]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["automountServiceAccountToken"] is False
    assert sandbox.get("serviceaccounts", NAMESPACE, pod["serviceAccountName"]) is not None


async def test_a_physically_impossible_result_fails_its_profile(sandbox, operator):  # noqa: F811
    target = await _eagle3_profile_measuring(sandbox)
    poisoned = measured_status("H100-SXM", "eagle3", 4)
    poisoned["runs"][0]["points"][0]["outputThroughput"] = 1e308
    # Sealed by the profile's own Job (its engine misbehaved): the seal holds, the bounds refuse it.
    own_job = next(j for j in jobs(sandbox) if j["metadata"]["name"] == target["status"]["jobName"])
    await sandbox.patch("speculationprofiles", NAMESPACE, target["metadata"]["name"],
                        {"status": seal.sealed(poisoned, own_job)}, subresource="status")

    failed = await _refused(sandbox, target["metadata"]["name"], "ImplausibleResult")
    assert "outputThroughput is 1e+308 tokens/s" in failed["message"] and "physical bound" in failed["message"]


async def _eagle3_profile_measuring(sandbox) -> dict:  # noqa: F811  (sandbox is the fixture's value)
    """A deployment with one candidate (EAGLE-3) whose two benchmark Jobs are running; its EAGLE-3 profile."""
    await sandbox.create(node("gpu-1", H100, "h100"))
    await sandbox.create(sdep(methods=[{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
                                        "numSpeculativeTokens": 4}]))
    await sandbox.wait_for(lambda: len(jobs(sandbox)) == 2 and all(
        (p.get("status") or {}).get("jobName") for p in profiles(sandbox)), what="2 Jobs, recorded")
    return next(p for p in profiles(sandbox) if (p["spec"].get("method") or {}).get("method") == "eagle3")


async def _refused(sandbox, name: str, reason: str) -> dict:  # noqa: F811  (sandbox is the fixture's value)
    """The profile Failed with `reason`, a ProfilingFailed Event says so, and nothing was decided on it."""
    failed = await sandbox.wait_for(
        lambda: (sandbox.get("speculationprofiles", NAMESPACE, name).get("status") or {}).get("phase") == "Failed"
        and sandbox.get("speculationprofiles", NAMESPACE, name)["status"], what=f"{name} Failed")
    assert failed["reason"] == reason and "specpilot.io/reprofile" in failed["message"]
    warning = await sandbox.wait_for(lambda: events(sandbox, "ProfilingFailed"), what="a ProfilingFailed Event")
    assert reason in warning[0]["message"]
    pools = status(sandbox).get("pools") or [{}]
    assert (pools[0].get("decision") or {}).get("method") is None
    return failed


@pytest.mark.parametrize("writer", ["another profile's Job", "a pod with the bench ServiceAccount"])
async def test_a_result_not_written_by_the_profiles_own_job_is_refused(sandbox, operator, writer):  # noqa: F811
    target = await _eagle3_profile_measuring(sandbox)
    other = next(p for p in profiles(sandbox) if p is not target)
    other_job = next(j for j in jobs(sandbox) if j["metadata"]["name"] == other["status"]["jobName"])
    forged = measured_status("H100-SXM", "eagle3", 4)  # looks real, passes every physical bound
    if writer == "another profile's Job":
        forged = seal.sealed(forged, other_job)
    name = target["metadata"]["name"]
    await sandbox.patch("speculationprofiles", NAMESPACE, name, {"status": forged}, subresource="status")

    failed = await _refused(sandbox, name, "UnsealedResult")
    assert "not written by" in failed["message"]


async def test_a_forged_failed_phase_is_ignored_reported_and_the_decision_kept(sandbox, operator):  # noqa: F811
    """The benchmark identity (any benchmark pod of the namespace, tenant engine code included before the pod
    split) may patch profiles' status. A forged `status.phase: Failed` on a profile the operator accepted must
    not remove the decision resting on it: the operator's verdict stands, the change is restored and reported
    in an UnsealedStatusChange Warning Event, and no ProfilingFailed is made up for it."""
    from tests.operator.scenario import publish_results

    target = await _eagle3_profile_measuring(sandbox)
    assert len(await publish_results(sandbox, "H100-SXM")) == 2
    decided = await sandbox.wait_for(
        lambda: ((status(sandbox).get("pools") or [{}])[0].get("decision") or {}).get("method"), what="a decision")
    assert decided == "eagle3"
    name = target["metadata"]["name"]
    await sandbox.wait_for(lambda: "specpilot.io/verdict" in (sandbox.get(
        "speculationprofiles", NAMESPACE, name)["metadata"].get("annotations") or {}), what="the operator's verdict")

    await sandbox.patch("speculationprofiles", NAMESPACE, name,
                        {"status": {"phase": "Failed", "reason": "BackoffLimitExceeded", "message": "forged"}},
                        subresource="status")

    warning = await sandbox.wait_for(lambda: events(sandbox, "UnsealedStatusChange"),
                                     what="an UnsealedStatusChange Event")
    assert warning[0]["type"] == "Warning" and name in warning[0]["message"] and "Failed" in warning[0]["message"]
    restored = await sandbox.wait_for(
        lambda: (sandbox.get("speculationprofiles", NAMESPACE, name)["status"].get("phase") == "Succeeded"
                 and sandbox.get("speculationprofiles", NAMESPACE, name)["status"]), what="the phase restored")
    assert restored["message"] != "forged"
    await operator.wait_periodic_runs(sandbox, 2)  # reconciliations: the decision stays, nothing failed
    assert ((status(sandbox).get("pools") or [{}])[0].get("decision") or {}).get("method") == "eagle3"
    assert events(sandbox, "ProfilingFailed") == []
    assert len(events(sandbox, "UnsealedStatusChange")) == 1


async def test_a_result_published_without_a_phase_is_decided_on(sandbox, operator):  # noqa: F811
    """The benchmark publishes only its sealed result, never a phase (the operator's): the operator accepts it
    and decides on it at once, though the profile it reads still shows the phase from before its own write."""
    from tests.operator.scenario import measured_status

    target = await _eagle3_profile_measuring(sandbox)
    for profile in profiles(sandbox):
        method = profile["spec"].get("method") or {}
        job = next(j for j in jobs(sandbox) if j["metadata"]["name"] == profile["status"]["jobName"])
        result = {k: v for k, v in measured_status("H100-SXM", method.get("method"), 4,
                                                   levels=profile["spec"]["concurrencyLevels"],
                                                   requests_per_level=profile["spec"].get("requestsPerLevel",
                                                                                          64)).items()
                  if k not in ("phase", "reason", "message")}
        await sandbox.patch("speculationprofiles", NAMESPACE, profile["metadata"]["name"],
                            {"status": seal.sealed(result, job)}, subresource="status")
    decided = await sandbox.wait_for(
        lambda: ((status(sandbox).get("pools") or [{}])[0].get("decision") or {}).get("method"), what="a decision")
    assert decided == "eagle3"
    name = target["metadata"]["name"]
    stored = sandbox.get("speculationprofiles", NAMESPACE, name)
    assert stored["status"]["phase"] == "Succeeded" and '"Succeeded"' in stored["metadata"]["annotations"][
        "specpilot.io/verdict"]
    assert events(sandbox, "UnsealedStatusChange") == []
