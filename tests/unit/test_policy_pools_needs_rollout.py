"""Pure pieces of reconciliation (policy.pools, needs, verdict, rollout, conditions): Job completion and overdue
results, profile freshness, the Job queue, conditions and the overall phase."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from specpilot.policy.conditions import set_condition
from specpilot.policy.needs import engine_image, max_parallel_jobs
from specpilot.policy.rollout import (
    ROLLOUT_DONE,
    ROLLOUT_IN_PROGRESS,
    ROLLOUT_STALLED,
    rolled_out_condition,
    rollout_state,
)
from specpilot.policy.verdict import job_completed_at
from specpilot.policy import profiling

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)


def stamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def complete_job(completed: datetime | None = None, condition_at: datetime | None = None) -> dict:
    status: dict = {"succeeded": 1}
    if completed is not None:
        status["completionTime"] = stamp(completed)
    if condition_at is not None:
        status["conditions"] = [{"type": "Complete", "status": "True", "lastTransitionTime": stamp(condition_at)}]
    return {"metadata": {"name": "bench-x"}, "status": status}


def test_job_completion_time_comes_from_the_status_or_the_complete_condition():
    assert job_completed_at(complete_job(completed=NOW)) == NOW
    assert job_completed_at(complete_job(condition_at=NOW - timedelta(seconds=5))) == NOW - timedelta(seconds=5)
    assert job_completed_at({"status": {"active": 1}}) is None
    assert job_completed_at({}) is None
    # A condition that is not (yet) true says nothing about completion.
    job = {"status": {"conditions": [{"type": "Complete", "status": "False", "lastTransitionTime": stamp(NOW)}]}}
    assert job_completed_at(job) is None


def test_a_result_is_overdue_only_past_the_grace_after_completion():
    """The Job's completion as the controller reads it (job_completed_at), judged by the profiling
    planner (policy.profiling.result_overdue)."""
    def overdue(job: dict, grace_s: float) -> bool:
        return profiling.result_overdue(job_completed_at(job), NOW, grace_s)

    assert not overdue(complete_job(completed=NOW - timedelta(seconds=30)), 60)
    assert not overdue(complete_job(completed=NOW - timedelta(seconds=60)), 60)
    assert overdue(complete_job(completed=NOW - timedelta(seconds=61)), 60)
    assert overdue(complete_job(condition_at=NOW - timedelta(hours=1)), 60)
    # Still running, or no completion time recorded: never overdue.
    assert not overdue({"status": {"active": 1}}, 0)


def test_a_condition_moves_its_transition_time_only_when_its_status_changes():
    first = set_condition([], "Profiled", False, "Profiling", "profiles 0/2", 1, NOW)
    later = NOW + timedelta(minutes=5)
    same = set_condition(first, "Profiled", False, "Profiling", "profiles 1/2", 1, later)
    assert same[0].last_transition_time == NOW and same[0].message == "profiles 1/2"
    flipped = set_condition(same, "Profiled", True, "Profiled", "profiles 2/2", 1, later)
    assert flipped[0].status == "True" and flipped[0].last_transition_time == later
    other = set_condition(flipped, "Valid", None, "Checking", "", 1, later)
    assert [c.type for c in other] == ["Profiled", "Valid"] and other[1].status == "Unknown"


def deployment(replicas: int = 2, generation: int = 3, status: dict | None = None) -> dict:
    return {"metadata": {"name": "llama-h100", "generation": generation},
            "spec": {"replicas": replicas, "progressDeadlineSeconds": 5400}, "status": status or {}}


def test_rollout_state_follows_the_deployment_controller():
    assert rollout_state(None) == (None, "")
    # Not yet looked at by a Deployment controller.
    assert rollout_state(deployment())[0] == ROLLOUT_IN_PROGRESS
    done = {"observedGeneration": 3, "replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}
    assert rollout_state(deployment(status=done))[0] == ROLLOUT_DONE
    moving = {**done, "updatedReplicas": 1, "availableReplicas": 2}
    state, message = rollout_state(deployment(status=moving))
    assert state == ROLLOUT_IN_PROGRESS and "1/2 pods updated" in message
    assert rollout_state(deployment(status={**done, "observedGeneration": 2}))[0] == ROLLOUT_IN_PROGRESS


def test_a_stalled_rollout_names_the_likely_cause_and_the_fix():
    stalled = {"observedGeneration": 3, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 2,
               "unavailableReplicas": 1,
               "conditions": [{"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}
    state, message = rollout_state(deployment(status=stalled))
    assert state == ROLLOUT_STALLED
    assert "within 5400 s (progressDeadlineSeconds)" in message and "spec.gpuPools[].rollout" in message
    assert "maxSurge: 0 and maxUnavailable: 1" in message and "kubectl describe deployment/llama-h100" in message
    # Progressing=False for another reason is not a stall of the rollout.
    other = {**stalled, "conditions": [{"type": "Progressing", "status": "False", "reason": "Other"}]}
    assert rollout_state(deployment(status=other))[0] == ROLLOUT_IN_PROGRESS


def test_the_rolled_out_condition_puts_a_stall_first():
    from specpilot.api.deployment_status import PoolStatus

    def pools(*states):
        return [PoolStatus(name=f"p{i}", rollout=s) for i, s in enumerate(states)]

    assert rolled_out_condition(pools(None), "llama") is None
    assert rolled_out_condition(pools("RolledOut", "RolledOut"), "llama")[:2] == (True, "RolledOut")
    status, reason, message = rolled_out_condition(pools("RolledOut", "RollingOut"), "llama")
    assert (status, reason) == (False, "RollingOut") and "p1" in message
    status, reason, message = rolled_out_condition(pools("Stalled", "RollingOut"), "llama")
    assert (status, reason) == (False, "ProgressDeadlineExceeded")
    assert "pool(s) p0" in message and "kubectl describe deployment/llama-p0" in message


def test_the_operator_configs_job_limit_applies_when_the_deployment_sets_none():
    from specpilot.api import SpeculativeDeploymentSpec
    from specpilot.config import OperatorConfig
    from specpilot.policy.needs import max_parallel_jobs

    body = {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "methods": [{"method": "ngram"}],
            "gpuPools": [{"name": "h100", "nodeSelector": {"pool": "h100"}}]}
    config = OperatorConfig.model_validate({"profilingDefaults": {"maxParallelJobsPerPool": 3}})
    assert max_parallel_jobs(SpeculativeDeploymentSpec.model_validate(body), config) == 3
    assert max_parallel_jobs(SpeculativeDeploymentSpec.model_validate(body), OperatorConfig()) == 1
    own = SpeculativeDeploymentSpec.model_validate({**body, "profiling": {"maxParallelJobsPerPool": 2}})
    assert max_parallel_jobs(own, config) == 2


def test_serving_runs_the_image_the_profiles_measured():
    from specpilot.api import SpeculativeDeploymentSpec
    from specpilot.config import OperatorConfig
    from specpilot.policy.needs import engine_image
    from specpilot.manifests.serving import serving_deployment

    body = {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "methods": [{"method": "ngram"}],
            "gpuPools": [{"name": "h100", "nodeSelector": {"pool": "h100"}}]}
    spec = SpeculativeDeploymentSpec.model_validate(body)
    config = OperatorConfig.model_validate({"defaultEngineImage": "registry.example/vllm:site-build"})
    image = engine_image(spec, config)
    assert image == "registry.example/vllm:site-build"
    deployment = serving_deployment(sdep_name="x", namespace="team", uid="u", spec=spec, pool=spec.gpu_pools[0],
                                    method=None, replicas=1, engine_image=image)
    engine = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "engine")
    assert engine["image"] == "registry.example/vllm:site-build"
