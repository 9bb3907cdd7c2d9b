"""A profile this operator restarted is not restarted again while the index still shows it as it was, or as
the first of restart_profile's two patches left it (controller.profiles): one delete of the old Job, one new
Job, one Reprofiling Event - not a second restart that deletes the Job just created."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from specpilot.api.deployment_spec import SpeculativeDeploymentSpec
from specpilot.api import seal
from specpilot.config import OperatorConfig
from specpilot.policy.profiling import Need
from specpilot.controller.context import Context
from specpilot.controller.kube import Conflict
from specpilot.controller.metrics import OperatorMetrics
from profile_steps import reconcile_profiles
from specpilot.manifests import names
from specpilot.sim.synthetic import Scenario, synthetic_profiles

NOW = datetime(2026, 12, 1, tzinfo=UTC)
SPEC = SpeculativeDeploymentSpec.model_validate({
    "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
    "gpuPools": [{"name": "h100", "nodeSelector": {"gpu": "h100"}}],
    "methods": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}]})


class FakeKube:
    """The profile and its Jobs as the API server holds them: every write bumps the profile's version."""

    def __init__(self, profile: dict) -> None:
        self.profile = copy.deepcopy(profile)
        self.jobs: dict[str, dict] = {}
        self.deleted: list[str] = []
        self.version = int(profile["metadata"]["resourceVersion"])

    def _bump(self) -> dict:
        self.version += 1
        self.profile["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.profile)

    async def patch(self, kind, namespace, name, body, subresource=None):
        if "metadata" in body:
            annotations = self.profile["metadata"].setdefault("annotations", {})
            for key, value in body["metadata"].get("annotations", {}).items():
                if value is None:
                    annotations.pop(key, None)
                else:
                    annotations[key] = value
        if "status" in body:
            self.profile["status"] = {**self.profile.get("status", {}), **body["status"]}
        return self._bump()

    async def delete(self, kind, namespace, name):
        self.deleted.append(name)
        self.jobs.pop(name, None)

    async def create(self, obj):
        name = obj["metadata"]["name"]
        if name in self.jobs:
            raise Conflict(name)
        created = {**obj, "metadata": {**obj["metadata"], "uid": f"job-{len(self.deleted)}-{len(self.jobs)}"}}
        self.jobs[name] = created
        return created


def _aged_view() -> tuple[Need, dict]:
    """A Succeeded profile measured 8 days ago (past the default 168 h), as the index shows it."""
    _, profile = synthetic_profiles(Scenario("H100-SXM", "meta-llama/Llama-3.1-8B-Instruct", "eagle3"), noise=0.0)
    need = Need.of(pool="h100", sku="H100-SXM", candidate=profile.spec.method, spec=profile.spec)
    body = profile.dump()
    body["metadata"] = {"name": need.name, "namespace": "team", "resourceVersion": "7", "uid": "p-1",
                        "annotations": {"specpilot.io/result-nonce": "n1", "specpilot.io/refine-levels": "3 6"}}
    body["status"]["completedAt"] = (NOW - timedelta(days=8)).isoformat()
    return need, body


def test_a_stale_view_of_a_profile_restarted_here_is_not_restarted_again():
    need, view = _aged_view()
    kube = FakeKube(view)
    ctx = Context(kube=kube, config=OperatorConfig(), metrics=OperatorMetrics(), connection=SimpleNamespace())
    job_name = names.bench_job_name(need.name)

    def reconcile(profile: dict, jobs: dict) -> tuple[dict[str, str], list]:
        events: list = []
        states = asyncio.run(reconcile_profiles(ctx, SPEC, "team", "llama", [need], {need.name: profile}, jobs,
                                                None, NOW, events))
        return states, events

    states, events = reconcile(view, {})
    assert states == {need.name: "Pending"}
    assert [e.reason for e in events] == ["Reprofiling"]
    assert kube.deleted == [job_name] and list(kube.jobs) == [job_name]
    new_job = kube.jobs[job_name]
    assert kube.profile["status"]["phase"] == "Pending"
    # A new measurement: a new epoch, the old nonce and a refinement round's levels dropped, and the new Job's
    # nonce of the new epoch (so no Job of the old measurement is adopted again).
    annotations = kube.profile["metadata"]["annotations"]
    epoch = annotations[seal.EPOCH_ANNOTATION]
    assert "specpilot.io/refine-levels" not in annotations
    assert annotations[seal.NONCE_ANNOTATION] == new_job["metadata"]["annotations"][seal.NONCE_ANNOTATION]
    assert annotations[seal.NONCE_ANNOTATION].startswith(epoch + ".") and "n1" not in annotations.values()
    between = copy.deepcopy(view)  # as restart_profile's metadata patch left it, before its status patch
    between["metadata"]["resourceVersion"] = "8"
    between["metadata"]["annotations"] = {}

    # The index has not caught up: the old view, then the one between the two patches, each twice, with the
    # new Job in the Job index or not yet.
    for stale in (view, view, between, between):
        for jobs in ({}, {f"team/{job_name}": new_job}):
            states, events = reconcile(stale, jobs)
            assert states == {need.name: "Pending"}
            assert events == []
    assert kube.deleted == [job_name]  # the new Job was never deleted
    assert kube.jobs[job_name] is new_job

    # Once the index shows the restart, the profile is followed as usual; a later stale version (measured
    # again and aged out again) is judged afresh.
    aged_again = copy.deepcopy(view)
    aged_again["metadata"]["resourceVersion"] = "42"
    states, events = reconcile(aged_again, {f"team/{job_name}": new_job})
    assert [e.reason for e in events] == ["Reprofiling"] and kube.deleted == [job_name, job_name]
