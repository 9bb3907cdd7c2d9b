"""The controller's half of a model the Hugging Face Hub refuses (controller.profiles over policy.model_access): the
bench's sealed account fails the profile while its Job is still Active and the Job is deleted; an account the seal
does not hold decides nothing; a Job that failed for good is judged by its engine container's own message."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from profile_steps import reconcile_profiles
from specpilot.api import seal
from specpilot.api.deployment_spec import SpeculativeDeploymentSpec
from specpilot.config import OperatorConfig
from specpilot.controller.context import Context
from specpilot.controller.metrics import OperatorMetrics
from specpilot.manifests import names
from specpilot.policy.profiling import Need
from specpilot.policy.verdict import VERDICT_ANNOTATION
from specpilot.sim.synthetic import Scenario, synthetic_profiles

NOW = datetime(2026, 12, 1, tzinfo=UTC)
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
REFUSED = (f"the engine for k=0 exited with code 1 before it became ready\nEngine log (engine container) ends with:\n"
           f"OSError: You are trying to access a gated repo.\nMake sure to have access to it at https://huggingface.co/"
           f"{LLAMA}.\n401 Client Error.\n\nCannot access gated repo for url https://huggingface.co/{LLAMA}/resolve/main/"
           f"config.json.")
SPEC = SpeculativeDeploymentSpec.model_validate({
    "model": {"id": LLAMA}, "gpuPools": [{"name": "h100", "nodeSelector": {"gpu": "h100"}}],
    "methods": [{"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}]})


class FakeKube:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict]] = []
        self.deleted: list[tuple[str, str, str]] = []
        self.pods: list[dict] = []

    async def patch(self, kind, namespace, name, body, subresource=None):
        self.patches.append((name, body))
        return body

    async def list(self, plural, namespace=None, label_selector=None):
        return list(self.pods)

    async def delete(self, plural, namespace, name):
        self.deleted.append((plural, namespace, name))


def _world(ctx: Context, sealed_by: str | None, bench_message: str | None, job_state: str) -> tuple[Need, dict, dict]:
    """A measuring profile of the eagle3 drafter on LLAMA, its bench's account (sealed by its own Job's token, by
    another, or not at all) and its Job (Active after a failed attempt, or Failed for good)."""
    _, profile = synthetic_profiles(Scenario("H100-SXM", LLAMA, "eagle3"), noise=0.0)
    need = Need.of(pool="h100", sku="H100-SXM", candidate=profile.spec.method, spec=profile.spec)
    body = profile.dump()
    body["metadata"] = {"name": need.name, "namespace": "team", "resourceVersion": "3",
                        "annotations": {seal.NONCE_ANNOTATION: "n1", "specpilot.io/job-uid": "j1"}}
    body["status"] = {"phase": "Running", "runs": [], "jobName": names.bench_job_name(need.name)}
    if bench_message is not None:
        body["status"]["benchFailure"] = {"reason": "EngineStartFailed", "message": bench_message}
    if sealed_by:
        token = seal.job_token(ctx.result_key if sealed_by == "own" else b"other", "team", need.name, "n1")
        body["status"]["seal"] = seal.seal(token, body["status"])
    conditions = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                   "message": "Job has reached the specified backoff limit"}] if job_state == "Failed" else []
    job = {"metadata": {"name": names.bench_job_name(need.name), "uid": "j1"},
           "status": {"active": 0 if job_state == "Failed" else 1, "failed": 3 if job_state == "Failed" else 1,
                      "conditions": conditions}}
    return need, body, job


def _reconcile(ctx: Context, need: Need, profile: dict, job: dict) -> tuple[dict[str, str], list]:
    events: list = []
    states = asyncio.run(reconcile_profiles(ctx, SPEC, "team", "llama", [need], {need.name: profile},
                                            {f"team/{job['metadata']['name']}": job}, None, NOW, events))
    return states, events


def _context() -> Context:
    return Context(kube=FakeKube(), config=OperatorConfig(), metrics=OperatorMetrics(), connection=SimpleNamespace())


def test_the_benchs_sealed_account_fails_the_profile_at_once_and_deletes_the_job():
    ctx = _context()
    need, profile, job = _world(ctx, "own", REFUSED, "Active")
    states, events = _reconcile(ctx, need, profile, job)
    assert states == {need.name: "Failed"}
    verdict, status = ctx.kube.patches[-2][1], ctx.kube.patches[-1][1]["status"]
    assert '"reason": "ModelAccessDenied"' in verdict["metadata"]["annotations"][VERDICT_ANNOTATION]
    assert status["reason"] == "ModelAccessDenied" and status["attempts"] == 1
    assert status["message"].startswith(f"the engine could not download the model {LLAMA} from Hugging Face (HTTP "
                                        "401): it is gated, and the engine had no valid token: set "
                                        "spec.model.hfTokenSecretRef")
    assert ctx.kube.deleted == [("jobs", "team", job["metadata"]["name"])]
    [event] = events
    assert (event.type, event.reason) == ("Warning", "ProfilingFailed")
    assert event.message.startswith(f"eagle3 on H100-SXM: ModelAccessDenied: the engine could not download the model "
                                    f"{LLAMA} from Hugging Face (HTTP 401)")


@pytest.mark.parametrize("sealed_by", ["other", None])
def test_an_account_the_seal_does_not_hold_decides_nothing(sealed_by):
    """Anyone with the benchmark identity may patch a profile's status: a benchFailure its own Job did not seal
    neither fails the profile nor deletes the Job."""
    ctx = _context()
    need, profile, job = _world(ctx, sealed_by, REFUSED, "Active")
    states, events = _reconcile(ctx, need, profile, job)
    assert states == {need.name: "Running"} and ctx.kube.deleted == [] and events == []
    assert ctx.kube.patches[-1][1]["status"]["reason"] == "Retrying"


def test_a_job_failed_for_good_is_judged_by_its_engine_containers_message():
    """The bench published nothing (it could not reach the API server): the engine container's termination
    message, with the Hub's answer the supervisor kept, gives the reason; the Job is gone already."""
    ctx = _context()
    need, profile, job = _world(ctx, None, None, "Failed")
    drafter = need.spec.method.model
    ctx.kube.pods = [{"metadata": {"name": "bench-x-abcde", "ownerReferences": [{"kind": "Job", "uid": "j1"}]},
             "status": {"phase": "Failed", "containerStatuses": [
                 {"name": "engine", "state": {"terminated": {"exitCode": 1, "reason": "Error", "message": (
                     "the engine for k=1 exited with code 1; the Hugging Face Hub's answer, earlier in its log:\n"
                     f"huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error.\nRepository Not Found for url: "
                     f"https://huggingface.co/{drafter}/resolve/main/config.json.\nits log ends with:\nOSError: "
                     f"{drafter} is not a local folder and is not a valid model identifier")}}}]}}]
    states, events = _reconcile(ctx, need, profile, job)
    assert states == {need.name: "Failed"} and ctx.kube.deleted == []
    status = ctx.kube.patches[-1][1]["status"]
    assert (status["reason"], status["attempts"]) == ("ModelNotFound", 3)
    assert status["message"].startswith(f"the engine could not download the drafter {drafter} of method eagle3 from "
                                        "Hugging Face (HTTP 404): no such repository: check spec.methods[].model of "
                                        "method eagle3")
    # the engine's own words follow, quoted as its text
    assert "engine container exited 1 (Error); its last log lines (the engine container's own text, unverified): «" \
        in status["message"]
    assert events[-1].message.startswith("eagle3 on H100-SXM: ModelNotFound: ")
