"""The SpeculativeDeployment lifecycle, scenario by scenario, with the real operator over HTTP."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import kmock
import kubernetes_validate
import pytest
import yaml

from specpilot.api import seal
from specpilot.api.validate import validate_custom_resource
from specpilot_sandbox.apiserver import SandboxEmulator
from tests.conftest import REPO
from tests.operator.scenario import (
    H100,
    H200,
    NAMESPACE,
    complete_job,
    condition,
    deployment,
    events,
    fail_job,
    measured_status,
    jobs,
    node,
    profiles,
    publish_results,
    sdep,
    speculative_config,
    status,
)

pytestmark = pytest.mark.operator

CRDS = {yaml.safe_load(p.read_text())["spec"]["names"]["kind"]: yaml.safe_load(p.read_text())
        for p in (REPO / "crds").glob("*.yaml")}


def assert_valid(obj: dict) -> None:
    kind = obj["kind"]
    if kind in CRDS:
        assert validate_custom_resource(CRDS[kind], obj) == [], obj["metadata"]["name"]
    elif kind != "PodMonitor":
        kubernetes_validate.validate(obj, "1.34", strict=True)


async def test_create_profiles_decide_serve(sandbox, operator):
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep())

    # Baseline + two methods on the pool's one SKU, at most two Jobs at once.
    await sandbox.wait_for(lambda: len(profiles(sandbox)) == 3, what="3 profiles")
    await sandbox.wait_for(lambda: len(jobs(sandbox)) == 2, what="2 Jobs")
    await operator.wait_periodic_runs(sandbox, 2)
    assert len(jobs(sandbox)) == 2, "maxParallelJobsPerPool=2 must hold"
    for job in jobs(sandbox):
        assert_valid(job)
        pod = job["spec"]["template"]["spec"]
        assert pod["nodeSelector"] == {"pool": "h100"}
        assert pod["serviceAccountName"] == "specpilot-bench"
        assert job["metadata"]["ownerReferences"][0]["kind"] == "SpeculationProfile"
    assert {p["spec"]["sku"] for p in profiles(sandbox)} == {"H100-SXM"}
    assert {(p["spec"].get("method") or {}).get("method") for p in profiles(sandbox)} == {None, "ngram", "eagle3"}
    for obj in profiles(sandbox) + sandbox.objects("serviceaccounts", NAMESPACE) + \
            sandbox.objects("rolebindings", NAMESPACE):
        assert_valid(obj)
    # The benchmark identity is bound to the chart's ClusterRole; the operator mints no Role.
    assert sandbox.objects("roles", NAMESPACE) == []
    binding = sandbox.get("rolebindings", NAMESPACE, "specpilot-bench")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": "specpilot-bench"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "specpilot-bench", "namespace": NAMESPACE}]

    # Until profiles exist the pool serves without speculation.
    serving = await sandbox.wait_for(lambda: deployment(sandbox, "h100"), what="the serving Deployment")
    assert speculative_config(serving) is None
    assert serving["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert_valid(serving)
    assert_valid(sandbox.get("services", NAMESPACE, "llama"))
    assert status(sandbox)["phase"] == "Profiling"

    # Results arrive: the third Job starts, then everything is decided.
    assert len(await publish_results(sandbox, "H100-SXM")) == 3
    await sandbox.wait_for(lambda: status(sandbox).get("phase") == "Serving", what="phase Serving")
    pool = status(sandbox)["pools"][0]
    decision = pool["decision"]
    assert decision["method"] in ("ngram", "eagle3")
    assert decision["reason"]
    ks = [r["numSpeculativeTokens"] for r in decision["schedule"]]
    assert ks[0] > 0 and ks == sorted(ks, reverse=True), "K must shrink as concurrency grows"
    config = await sandbox.wait_for(lambda: speculative_config(deployment(sandbox, "h100")),
                                    what="speculative config in the Deployment")
    assert config["method"] == decision["method"]
    assert config["num_speculative_tokens_per_batch_size"][0][0] == 1
    assert [r[2] for r in config["num_speculative_tokens_per_batch_size"]] == ks
    assert status(sandbox)["history"][-1]["pool"] == "h100"
    # Each change is announced once, however many handlers (create, timers, profile watch) ran meanwhile.
    changes = [entry["change"] for entry in status(sandbox)["history"]]
    assert len(changes) == len(set(changes)), changes
    await sandbox.wait_for(lambda: events(sandbox, "DecisionChanged"), what="a DecisionChanged Event")
    assert_valid(sandbox.get("speculativedeployments", NAMESPACE, "llama"))
    assert (condition(sandbox, "Profiled") or {}).get("status") == "True"
    # No Deployment controller runs here: the decided configuration is still rolling out.
    rolling = condition(sandbox, "RolledOut")
    assert (rolling["status"], rolling["reason"]) == ("False", "RollingOut") and "h100" in rolling["message"]
    assert pool["rollout"] == "RollingOut"


async def test_a_result_written_as_soon_as_the_job_exists_is_kept(sandbox, operator, monkeypatch):
    """The fastest Job possible: its result lands before the operator's own bookkeeping for the Job (the
    status patch that records its name). That patch must not undo the result (CI once caught it doing so)."""
    handle = SandboxEmulator._handle

    async def job_finishes_at_once(emulator, request):
        response = await handle(emulator, request)
        if request.action == kmock.action.CREATE and getattr(request.resource, "plural", None) == "jobs":
            profile = request.data["metadata"]["ownerReferences"][0]["name"]
            spec = sandbox.get("speculationprofiles", NAMESPACE, profile)["spec"]
            method = spec.get("method") or {}
            result = measured_status("H100-SXM", method.get("method"), method.get("numSpeculativeTokens", 4),
                                     levels=spec["concurrencyLevels"],
                                     requests_per_level=spec.get("requestsPerLevel", 64))
            await sandbox.patch("speculationprofiles", NAMESPACE, profile,
                                {"status": seal.sealed(result, request.data)}, subresource="status")
        return response

    monkeypatch.setattr(SandboxEmulator, "_handle", job_finishes_at_once)
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep())
    await sandbox.wait_for(lambda: status(sandbox).get("phase") == "Serving", what="phase Serving")
    assert {p["status"]["phase"] for p in profiles(sandbox)} == {"Succeeded"}
    assert {p["status"]["jobName"] for p in profiles(sandbox)} == {j["metadata"]["name"] for j in jobs(sandbox)}


async def test_restart_mid_profiling_resumes_without_duplicate_jobs(sandbox, operator):
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep())
    await sandbox.wait_for(lambda: len(jobs(sandbox)) == 2, what="2 Jobs")
    before = {j["metadata"]["name"]: j["metadata"]["uid"] for j in jobs(sandbox)}
    await operator.stop()
    operator.start()
    await operator.wait_periodic_runs(sandbox, 2)  # the restarted process resumed, then reconciled twice
    after = {j["metadata"]["name"]: j["metadata"]["uid"] for j in jobs(sandbox)}
    assert after == before
    assert len(profiles(sandbox)) == 3
    # It still makes progress after the restart.
    first = sorted(before)[0].removeprefix("bench-")
    await publish_results(sandbox, "H100-SXM", names=[first])
    await sandbox.wait_for(lambda: len(jobs(sandbox)) == 3, what="the third Job after the restart")


async def test_failed_job_is_retried_then_reported(sandbox, operator):
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep(profiling={"maxParallelJobsPerPool": 3, "backoffLimit": 2}))
    await sandbox.wait_for(lambda: len(jobs(sandbox)) == 3, what="3 Jobs")
    job = jobs(sandbox)[0]
    assert job["spec"]["backoffLimit"] == 2
    profile_name = job["metadata"]["ownerReferences"][0]["name"]

    await fail_job(sandbox, job, failed=1, final=False)
    await sandbox.wait_for(lambda: (sandbox.get("speculationprofiles", NAMESPACE, profile_name)["status"]
                                    .get("reason")) == "Retrying", what="the retry to show")
    await fail_job(sandbox, job, failed=3, final=True)
    await sandbox.wait_for(lambda: sandbox.get("speculationprofiles", NAMESPACE, profile_name)["status"]
                           .get("phase") == "Failed", what="profile Failed")
    failed = sandbox.get("speculationprofiles", NAMESPACE, profile_name)["status"]
    assert failed["reason"] == "BackoffLimitExceeded"
    assert "specpilot.io/reprofile" in failed["message"]
    warning = await sandbox.wait_for(lambda: events(sandbox, "ProfilingFailed"), what="a ProfilingFailed Event")
    assert warning[0]["type"] == "Warning"
    await sandbox.wait_for(lambda: status(sandbox).get("phase") == "Degraded", what="phase Degraded")
    assert "1 failed" in status(sandbox)["progress"]

    # The annotation asks for a new measurement: the profile goes back to Pending with a fresh Job.
    await sandbox.patch("speculativedeployments", NAMESPACE, "llama",
                        {"metadata": {"annotations": {"specpilot.io/reprofile": "try-2"}}})
    await sandbox.wait_for(lambda: sandbox.get("speculationprofiles", NAMESPACE, profile_name)["status"]
                           .get("phase") == "Pending", what="the failed profile reset")


async def test_a_job_that_completes_without_a_result_is_reported_after_a_grace(sandbox, operator):
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep())
    await sandbox.wait_for(lambda: len(jobs(sandbox)) == 2, what="2 Jobs")
    late, recent = sorted(jobs(sandbox), key=lambda j: j["metadata"]["name"])
    late_profile = late["metadata"]["ownerReferences"][0]["name"]
    recent_profile = recent["metadata"]["ownerReferences"][0]["name"]
    # Both pods exited 0, neither result arrived: one completed long ago, the other just now.
    await complete_job(sandbox, late, datetime.now(tz=UTC) - timedelta(minutes=5))
    await complete_job(sandbox, recent, datetime.now(tz=UTC))

    failed = await sandbox.wait_for(
        lambda: (sandbox.get("speculationprofiles", NAMESPACE, late_profile)["status"].get("phase") == "Failed"
                 and sandbox.get("speculationprofiles", NAMESPACE, late_profile)["status"]),
        what="the profile whose result never came to fail")
    assert failed["reason"] == "NoResult"
    assert f"kubectl logs job/{late['metadata']['name']}" in failed["message"]
    assert "specpilot.io/reprofile" in failed["message"]
    warning = await sandbox.wait_for(lambda: events(sandbox, "ProfilingFailed"), what="a ProfilingFailed Event")
    assert "NoResult" in warning[0]["message"] and warning[0]["type"] == "Warning"
    # The recent one is still inside the grace: its result may yet arrive, and when it does it counts.
    assert sandbox.get("speculationprofiles", NAMESPACE, recent_profile)["status"]["phase"] != "Failed"
    assert await publish_results(sandbox, "H100-SXM", names=[recent_profile]) == [recent_profile]
    await sandbox.wait_for(lambda: "1 failed" in (status(sandbox).get("progress") or "")
                           and status(sandbox).get("phase") == "Degraded", what="phase Degraded, 1 failed")


async def test_a_stalled_rollout_is_reported_with_the_fix(sandbox, operator):
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep(serving={"rollout": {"maxSurge": 0, "maxUnavailable": 1}}))
    serving = await sandbox.wait_for(lambda: deployment(sandbox, "h100"), what="the serving Deployment")
    assert serving["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    generation = serving["metadata"]["generation"]
    # The Deployment controller gives up on the new pods (e.g. Pending for want of a GPU).
    await sandbox.patch("deployments", NAMESPACE, "llama-h100", {"status": {
        "observedGeneration": generation, "replicas": 2, "updatedReplicas": 1, "availableReplicas": 1,
        "unavailableReplicas": 1, "conditions": [{"type": "Progressing", "status": "False",
                                                  "reason": "ProgressDeadlineExceeded",
                                                  "message": 'ReplicaSet "llama-h100-5d8" has timed out progressing.'}]}},
        subresource="status")
    stalled = await sandbox.wait_for(
        lambda: (condition(sandbox, "RolledOut") or {}).get("reason") == "ProgressDeadlineExceeded"
        and condition(sandbox, "RolledOut"), what="RolledOut=False, ProgressDeadlineExceeded")
    assert stalled["status"] == "False" and "kubectl describe deployment/llama-h100" in stalled["message"]
    assert status(sandbox)["pools"][0]["rollout"] == "Stalled"
    warning = await sandbox.wait_for(lambda: events(sandbox, "RolloutStalled"), what="a RolloutStalled Event")
    assert warning[0]["type"] == "Warning" and "maxSurge: 0 and maxUnavailable: 1" in warning[0]["message"]

    # The pods come up after all: the condition clears.
    generation = deployment(sandbox, "h100")["metadata"]["generation"]
    replicas = deployment(sandbox, "h100")["spec"].get("replicas") or 1
    await sandbox.patch("deployments", NAMESPACE, "llama-h100", {"status": {
        "observedGeneration": generation, "replicas": replicas, "updatedReplicas": replicas,
        "availableReplicas": replicas, "unavailableReplicas": 0,
        "conditions": [{"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable"}]}},
        subresource="status")
    await sandbox.wait_for(lambda: (condition(sandbox, "RolledOut") or {}).get("status") == "True",
                           what="RolledOut=True")
    assert len(events(sandbox, "RolloutStalled")) == 1


async def test_new_gpu_product_joins_and_is_profiled(sandbox, operator):
    await sandbox.create(node("gpu-a", H100, "mixed"))
    await sandbox.create(sdep(gpuPools=[{"name": "mixed", "nodeSelector": {"pool": "mixed"}},
                                        {"name": "empty", "nodeSelector": {"pool": "nowhere"}}]))
    await sandbox.wait_for(lambda: len(profiles(sandbox)) == 3, what="3 H100 profiles")
    nodes = await sandbox.wait_for(lambda: condition(sandbox, "NodesAvailable"), what="NodesAvailable")
    assert nodes["status"] == "False" and "empty" in nodes["message"]

    await sandbox.create(node("gpu-b", H200, "mixed"))
    await sandbox.wait_for(lambda: len(profiles(sandbox)) == 6, what="3 more profiles for the H200")
    assert {p["spec"]["sku"] for p in profiles(sandbox)} == {"H100-SXM", "H200"}
    await sandbox.wait_for(lambda: {H100, H200} == set(next(
        p for p in status(sandbox)["pools"] if p["name"] == "mixed").get("gpuProducts", [])),
        what="both GPU products in the pool status")


async def test_deletion_cleans_up_owned_objects(sandbox, operator):
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep())
    await sandbox.wait_for(lambda: deployment(sandbox, "h100"), what="the serving Deployment")
    await sandbox.wait_for(lambda: sandbox.get("services", NAMESPACE, "llama"), what="the Service")
    await sandbox.delete("speculativedeployments", NAMESPACE, "llama")
    await sandbox.wait_for(lambda: deployment(sandbox, "h100") is None and
                           sandbox.get("services", NAMESPACE, "llama") is None, what="owned objects gone")
    # Profiles are shared measurements and stay for reuse.
    assert len(profiles(sandbox)) == 3


async def test_hand_edit_of_the_deployment_is_put_back(sandbox, operator):
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep())
    serving = await sandbox.wait_for(lambda: deployment(sandbox, "h100"), what="the serving Deployment")
    image = serving["spec"]["template"]["spec"]["containers"][0]["image"]
    await sandbox.patch("deployments", NAMESPACE, "llama-h100", {
        "metadata": {"annotations": {"team.example.com/owner": "alice"}},
        "spec": {"template": {"spec": {"containers": [{"name": "engine", "image": "hacked:latest"}]}}}})
    await sandbox.wait_for(
        lambda: deployment(sandbox, "h100")["spec"]["template"]["spec"]["containers"][0]["image"] == image,
        what="the image put back")
    assert deployment(sandbox, "h100")["metadata"]["annotations"]["team.example.com/owner"] == "alice"
