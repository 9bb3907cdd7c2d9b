"""Only the operator's own benchmark Job measures a profile (api.seal.adoption_problem, controller.profiles): a Job
whose nonce the profile does not record is adopted only when the operator created it for the profile's current
measurement. A Job a tenant made after a reprofile with the previous Job's nonce (and its token, read off the old
Job) is refused with an Event and deleted, so a result sealed with the old token never goes Succeeded. And the
text beside a verdict is the operator's: a rewrite of status.reason or status.message alone is restored, with an
Event."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from specpilot.api import seal
from specpilot.api.deployment_spec import SpeculativeDeploymentSpec
from specpilot.config import OperatorConfig
from specpilot.policy.profiling import Need
from specpilot.policy.verdict import VERDICT_ANNOTATION, verdict_annotation
from specpilot.controller.context import Context
from specpilot.controller.metrics import OperatorMetrics
from profile_steps import reconcile_profiles
from specpilot.controller.profiles import JOB_UID_ANNOTATION
from specpilot.manifests import names
from specpilot.sim.synthetic import Scenario, synthetic_profiles

NOW = datetime(2026, 12, 1, tzinfo=UTC)
KEY = b"k" * 32
SPEC = SpeculativeDeploymentSpec.model_validate({
    "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
    "gpuPools": [{"name": "h100", "nodeSelector": {"gpu": "h100"}}],
    "methods": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}]})


class FakeKube:
    def __init__(self, jobs: dict[str, dict]) -> None:
        self.jobs = jobs
        self.patches: list[tuple[str, dict]] = []
        self.deleted: list[tuple[str, str]] = []
        self.created: list[dict] = []

    async def get(self, plural, namespace, name):
        return self.jobs[name]

    async def delete(self, plural, namespace, name):
        self.deleted.append((plural, name))

    async def patch(self, plural, namespace, name, body, subresource=None):
        self.patches.append((name, body))
        return body

    async def create(self, obj):
        self.created.append(obj)
        return obj

    async def ensure(self, obj):
        return obj, False

    async def list(self, plural, namespace=None, label_selector=None):
        return []


def _job(name: str, nonce: str, token: str, uid: str = "j-2") -> dict:
    return {"metadata": {"name": name, "namespace": "team", "uid": uid,
                         "annotations": {seal.NONCE_ANNOTATION: nonce}},
            "spec": {"template": {"spec": {"containers": [
                {"name": "bench", "env": [{"name": seal.TOKEN_ENV, "value": token}]}]}}},
            "status": {"active": 1}}


def _pending_profile(epoch: str) -> tuple[Need, dict]:
    """A profile just restarted by a reprofile: measurement `epoch`, no nonce or Job recorded."""
    _, profile = synthetic_profiles(Scenario("H100-SXM", "meta-llama/Llama-3.1-8B-Instruct", "eagle3"), noise=0.0)
    need = Need.of(pool="h100", sku="H100-SXM", candidate=profile.spec.method, spec=profile.spec)
    body = profile.dump()
    body["metadata"] = {"name": need.name, "namespace": "team", "uid": "p-1", "resourceVersion": "9",
                        "annotations": {seal.EPOCH_ANNOTATION: epoch}}
    body["status"] = {"phase": "Pending", "reason": "Reprofiling"}
    return need, body


def _reconcile(job: dict, epoch: str = "e2") -> tuple[FakeKube, list, dict[str, str]]:
    need, profile = _pending_profile(epoch)
    job_name = names.bench_job_name(need.name)
    job["metadata"]["name"] = job_name
    kube = FakeKube({job_name: job})
    ctx = Context(kube=kube, config=OperatorConfig(), metrics=OperatorMetrics(), connection=SimpleNamespace(),
                  result_key=KEY)
    events: list = []
    index_copy = {"metadata": {k: v for k, v in job["metadata"].items()}, "status": job["status"]}
    states = asyncio.run(reconcile_profiles(ctx, SPEC, "team", "llama", [need], {need.name: profile},
                                            {f"team/{job_name}": index_copy}, None, NOW, events))
    return kube, events, states


def _adopted_annotations(kube: FakeKube) -> dict:
    return {k: v for _, body in kube.patches for k, v in ((body.get("metadata") or {}).get("annotations") or {}).items()}


def _only_the_operators_own_job_recorded(kube: FakeKube, refused_nonce: str) -> None:
    """Nothing of the refused Job is recorded; the Job the operator creates in its place (here at once: the fake
    API server forgets the deleted Job) carries a fresh nonce of the current measurement and its own token."""
    recorded = _adopted_annotations(kube)
    assert recorded.get(seal.NONCE_ANNOTATION) != refused_nonce and recorded.get(JOB_UID_ANNOTATION) != "j-2"
    for job in kube.created:
        nonce = job["metadata"]["annotations"][seal.NONCE_ANNOTATION]
        assert nonce.startswith("e2.") and nonce != refused_nonce
        profile = job["metadata"]["ownerReferences"][0]["name"]
        assert seal.token_of(job) == seal.job_token(KEY, "team", profile, nonce)
        assert recorded.get(seal.NONCE_ANNOTATION) == nonce


def test_a_replayed_nonce_after_a_reprofile_is_refused_and_its_job_deleted():
    need, _ = _pending_profile("e2")
    old_nonce = "e1." + "0" * 32  # the previous measurement's Job, whose token a tenant read off it
    old_token = seal.job_token(KEY, "team", need.name, old_nonce)
    kube, events, _ = _reconcile(_job("", old_nonce, old_token))
    assert [e.reason for e in events] == ["ForeignBenchmarkJob"]
    assert "belongs to an earlier measurement of the profile (a replayed nonce)" in events[0].message
    assert kube.deleted == [("jobs", names.bench_job_name(need.name))]
    _only_the_operators_own_job_recorded(kube, old_nonce)


def test_a_job_someone_else_made_for_the_current_measurement_is_refused():
    need, _ = _pending_profile("e2")
    nonce = "e2." + "1" * 32  # the epoch is readable on the profile; the token is not derivable without the key
    kube, events, _ = _reconcile(_job("", nonce, "f" * 64))
    assert [e.reason for e in events] == ["ForeignBenchmarkJob"]
    assert "the operator did not create it" in events[0].message
    assert kube.deleted
    _only_the_operators_own_job_recorded(kube, nonce)


def test_the_operators_own_job_created_before_it_stopped_is_adopted():
    need, _ = _pending_profile("e2")
    nonce = seal.new_nonce("e2")
    kube, events, states = _reconcile(_job("", nonce, seal.job_token(KEY, "team", need.name, nonce), uid="j-own"))
    assert events == [] and kube.deleted == []
    adopted = _adopted_annotations(kube)
    assert adopted[seal.NONCE_ANNOTATION] == nonce and adopted[JOB_UID_ANNOTATION] == "j-own"
    assert states[need.name] in ("Pending", "Running")


def test_adoption_problem_names_each_refusal():
    profile = {"metadata": {"name": "p", "annotations": {seal.EPOCH_ANNOTATION: "e2"}}}
    own = seal.new_nonce("e2")
    assert seal.adoption_problem(KEY, "team", profile, _job("j", own, seal.job_token(KEY, "team", "p", own))) is None
    other_profile = seal.job_token(KEY, "team", "q", own)
    assert "did not create it" in seal.adoption_problem(KEY, "team", profile, _job("j", own, other_profile))
    other_namespace = seal.job_token(KEY, "other", "p", own)
    assert "did not create it" in seal.adoption_problem(KEY, "team", profile, _job("j", own, other_namespace))
    no_token = _job("j", own, "")
    no_token["spec"]["template"]["spec"]["containers"][0]["env"] = []
    assert "did not create it" in seal.adoption_problem(KEY, "team", profile, no_token)
    assert "no result nonce" in seal.adoption_problem(KEY, "team", profile, {"metadata": {}})
    legacy = {"metadata": {"name": "p", "annotations": {}}}
    assert "records no measurement" in seal.adoption_problem(KEY, "team", legacy, _job("j", own, "x"))


def test_every_measurement_gets_its_own_epoch_and_nonces_carry_it():
    epochs = {seal.new_epoch() for _ in range(50)}
    assert len(epochs) == 50
    epoch = epochs.pop()
    nonces = {seal.new_nonce(epoch) for _ in range(50)}
    assert len(nonces) == 50 and all(n.startswith(epoch + ".") for n in nonces)


def _decided_profile(reason: str, message: str) -> tuple[Need, dict]:
    """A profile the operator failed (its verdict in the annotation), whose status someone then rewrote."""
    need, body = _pending_profile("e2")
    body["metadata"]["annotations"][VERDICT_ANNOTATION] = verdict_annotation(
        "Failed", "BackoffLimitExceeded", "the benchmark Job failed: engine exited 1")
    body["status"] = {"phase": "Failed", "reason": reason, "message": message}
    return need, body


@pytest.mark.parametrize("reason,message,forged", [
    ("BackoffLimitExceeded", "the benchmark Job failed: engine exited 1", False),
    ("BackoffLimitExceeded", "the benchmark Job failed: your GPUs are fine, re-run on the shared pool", True),
    ("Reassured", "the benchmark Job failed: engine exited 1", True),
    ("BackoffLimitExceeded", "the benchmark Job failed: engine exited 1 (and then some)", True),
])
def test_status_text_written_by_anyone_but_the_operator_is_restored_with_an_event(reason, message, forged):
    need, profile = _decided_profile(reason, message)
    kube = FakeKube({})
    ctx = Context(kube=kube, config=OperatorConfig(), metrics=OperatorMetrics(), connection=SimpleNamespace(),
                  result_key=KEY)
    events: list = []
    states = asyncio.run(reconcile_profiles(ctx, SPEC, "team", "llama", [need], {need.name: profile}, {}, None, NOW,
                                            events))
    assert states == {need.name: "Failed"}
    restored = [body["status"] for _, body in kube.patches if "status" in body]
    if forged:
        assert [e.reason for e in events] == ["UnsealedStatusChange"]
        assert "status.reason and status.message were rewritten" in events[0].message
        assert restored == [{"phase": "Failed", "reason": "BackoffLimitExceeded",
                             "message": "the benchmark Job failed: engine exited 1"}]
    else:
        assert events == [] and restored == []
