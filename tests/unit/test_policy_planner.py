"""The pool planner (policy.planner): one pool's next status, what to serve and what to announce.

Pure, so these tests run it directly; everything it remembers must survive a round trip through the status
(as a restarted operator reads it back)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from specpilot.api.deployment_spec import SpeculativeDeploymentSpec
from specpilot.api.deployment_status import Decision, ObservedLoad, PoolStatus
from specpilot.api.profile import SpeculationProfile
from specpilot.manifests.names import refine_job_name
from specpilot.observe.model import PoolObservation
from specpilot.policy.planner import (
    PoolInputs,
    PoolProfiles,
    basis,
    live_acceptance,
    plan_pool,
)
from specpilot.sim.synthetic import Scenario, synthetic_profiles

NOW = datetime(2026, 6, 1, tzinfo=UTC)
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _typed(per_position=(0.8, 0.6, 0.4, 0.2)) -> SpeculationProfile:
    return SpeculationProfile.model_validate({
        "metadata": {"name": "h100-sxm-ngram-x"},
        "spec": {"model": {"id": MODEL}, "method": {"method": "ngram", "numSpeculativeTokens": 4},
                 "sku": "H100-SXM", "engineImage": "vllm/vllm-openai:v0.11.0", "concurrencyLevels": [1]},
        "status": {"phase": "Succeeded", "completedAt": "2026-11-29T00:00:00Z", "runs": [
            {"numSpeculativeTokens": 4, "acceptance": {"perPosition": list(per_position), "draftsPerStep": 1.0,
                                                       "meanAcceptanceLength": 3.0}}]}})


METHODS = {"ngram": _typed()}


def _pool(decision: Decision, enabled: bool, first: float | None, later: float = 0.05) -> PoolStatus:
    observed = None
    if first is not None:
        observed = ObservedLoad(concurrency=40, acceptance_per_position=[first, later, later, later],
                                drafts_per_step=0.7, mean_acceptance_length=1 + first + 3 * later)
    return PoolStatus(name="h100", decision=decision, speculation_enabled=enabled, observed=observed)


# --- live acceptance: hysteresis, like-for-like comparison -------------------------------------------------

def test_a_schedule_drafting_fewer_tokens_is_not_drift():
    served = Decision(method="ngram", num_speculative_tokens=4)
    # Position 0 as profiled; later positions low only because the schedule drafts k=1 at this load.
    assert live_acceptance(_pool(served, True, 0.79), METHODS) is None


def test_large_drift_scales_the_profile_and_is_kept_while_speculation_is_off():
    served = Decision(method="ngram", num_speculative_tokens=4)
    live = live_acceptance(_pool(served, True, 0.4), METHODS)  # half the profiled first-position acceptance
    assert list(live) == ["ngram"]
    assert live["ngram"][0] == pytest.approx([0.4, 0.3, 0.2, 0.1]) and live["ngram"][1] == 1.0
    off = Decision(method=None, live_method="ngram", live_acceptance_per_position=live["ngram"][0],
                   live_drafts_per_step=1.0)
    assert live_acceptance(_pool(off, False, None), METHODS) == live
    assert basis(1, METHODS["ngram"], METHODS, live_acceptance(_pool(off, False, None), METHODS)) == \
        basis(1, METHODS["ngram"], METHODS, live)


def test_live_data_moves_only_past_the_band_and_returns_to_the_profile():
    used = Decision(method="ngram", live_method="ngram", live_acceptance_per_position=[0.4, 0.3, 0.2, 0.1],
                    live_drafts_per_step=1.0)
    assert live_acceptance(_pool(used, True, 0.42), METHODS)["ngram"][0] == [0.4, 0.3, 0.2, 0.1]  # within 10%
    assert live_acceptance(_pool(used, True, 0.6), METHODS)["ngram"][0] == pytest.approx([0.6, 0.45, 0.3, 0.15])
    assert live_acceptance(_pool(used, True, 0.79), METHODS) is None  # back at the profile
    assert live_acceptance(_pool(used, True, 0.74), METHODS)["ngram"][0] == [0.4, 0.3, 0.2, 0.1]  # in between


def test_the_basis_changes_with_what_the_decision_rests_on():
    live = {"ngram": ([0.4, 0.3, 0.2, 0.1], 1.0)}
    one = basis(1, METHODS["ngram"], METHODS, None)
    assert basis(1, METHODS["ngram"], METHODS, None) == one
    assert len({one, basis(2, METHODS["ngram"], METHODS, None), basis(1, None, METHODS, None),
                basis(1, METHODS["ngram"], METHODS, live)}) == 4


# --- the whole plan ----------------------------------------------------------------------------------------

def _spec(**serving) -> SpeculativeDeploymentSpec:
    return SpeculativeDeploymentSpec.model_validate({
        "model": {"id": MODEL}, "methods": [{"method": "eagle3", "numSpeculativeTokens": 4,
                                             "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}],
        "gpuPools": [{"name": "h100", "sku": "H100-SXM"}],
        "serving": {"autoscaling": "internal", "minReplicas": 1, "maxReplicas": 8,
                    "scaleDownStabilizationSeconds": 300, **serving}})


@pytest.fixture(scope="module")
def profiles() -> PoolProfiles:
    baseline, profile = synthetic_profiles(Scenario("H100-SXM", MODEL, "eagle3", "sharegpt"), noise=0.0)
    return PoolProfiles(baseline=baseline, methods={"eagle3": profile}, ready=2, total=2,
                        names=("b", "e"))


def _observation(per_replica: float, replicas: int, at: datetime, first: float | None = None) -> PoolObservation:
    return PoolObservation(
        replicas_reporting=replicas, running_per_replica=per_replica, waiting_per_replica=0.0,
        total_running=per_replica * replicas, total_waiting=0.0, generation_tokens_per_second=None,
        tpot_p95_ms=None, acceptance_per_position=[first] if first is not None else [], drafts_per_step=None,
        mean_acceptance_length=None, kv_cache_usage=None, observed_at=at, window_s=60,
        concurrency_histogram=[(per_replica, 1.0)])


def _inputs(spec, profiles, previous, observation=None, replicas=None, now=NOW, rolling_out=False):
    return PoolInputs(spec=spec, generation=1, pool=spec.gpu_pools[0], sku="H100-SXM", gpu_products=("H100",),
                      nodes=2, previous=previous, profiles=profiles, observation=observation,
                      current_replicas=replicas, rolling_out=rolling_out, price_per_gpu_hour=2.5, now=now)


def _reread(status: PoolStatus) -> PoolStatus:
    """The status as a restarted operator reads it back from the API server."""
    return PoolStatus.model_validate(status.dump())


def test_without_a_gpu_type_nothing_is_served(profiles):
    spec = _spec()
    inputs = _inputs(spec, profiles, PoolStatus(name="h100"))
    outcome = plan_pool(PoolInputs(**{**inputs.__dict__, "sku": None}))
    assert outcome.serve is None and outcome.status.decision is None


def test_the_plan_serves_the_decision_and_sizes_replicas_from_its_capacity(profiles):
    spec = _spec()
    outcome = plan_pool(_inputs(spec, profiles, PoolStatus(name="h100"), _observation(30, 1, NOW), replicas=1))
    decision = outcome.status.decision
    assert decision.method == "eagle3" and decision.schedule
    assert outcome.serve.method.key == "eagle3" and outcome.serve.schedule == list(decision.schedule)
    capacity = outcome.status.capacity_concurrency_per_replica
    assert capacity and outcome.serve.replicas == min(8, -(-30 // (capacity * 0.8)))
    assert outcome.status.speculation_enabled and outcome.status.replicas == outcome.serve.replicas


def test_the_scale_down_window_survives_a_restart(profiles):
    spec = _spec()
    probe = plan_pool(_inputs(spec, profiles, PoolStatus(name="h100"), None, replicas=1))
    load = probe.status.capacity_concurrency_per_replica * 2.5
    high = plan_pool(_inputs(spec, profiles, PoolStatus(name="h100"), _observation(load, 1, NOW), replicas=1))
    up = high.serve.replicas
    assert up > 1
    # Load drops right away; a restarted operator (status read back) still holds the higher target.
    later = NOW + timedelta(seconds=60)
    low = plan_pool(_inputs(spec, profiles, _reread(high.status), _observation(1, up, later), replicas=up,
                            now=later))
    assert low.serve.replicas == up and low.status.desired_replicas == up
    # Once the window has passed, it scales down.
    done = NOW + timedelta(seconds=400)
    down = plan_pool(_inputs(spec, profiles, _reread(low.status), _observation(1.0 / up, up, done), replicas=up,
                             now=done))
    assert down.serve.replicas == 1


def test_missing_metrics_hold_the_replicas_and_the_decision(profiles):
    spec = _spec()
    first = plan_pool(_inputs(spec, profiles, PoolStatus(name="h100"), _observation(30, 1, NOW), replicas=1))
    held = plan_pool(_inputs(spec, profiles, _reread(first.status), None, replicas=first.serve.replicas,
                             now=NOW + timedelta(hours=1)))
    assert held.serve.replicas == first.serve.replicas
    assert held.status.decision == first.status.decision and not held.events


def test_a_negative_concurrency_is_never_stored(profiles):
    spec = _spec()
    outcome = plan_pool(_inputs(spec, profiles, PoolStatus(name="h100"), _observation(-5, 1, NOW), replicas=1))
    assert outcome.status.observed.concurrency == 0


def _drifted(profiles: PoolProfiles, shared: bool):
    spec = _spec()
    served = plan_pool(_inputs(spec, profiles, PoolStatus(name="h100"), _observation(1, 1, NOW), replicas=1))
    profiled = profiles.methods["eagle3"].status.runs[-1].acceptance.per_position[0]
    sharing = PoolProfiles(**{**profiles.__dict__, "shared": frozenset({"eagle3"} if shared else ())})
    later = NOW + timedelta(seconds=30)
    return spec, served, plan_pool(_inputs(spec, sharing, _reread(served.status),
                                           _observation(1, 1, later, first=profiled * 0.3), replicas=1, now=later))


def test_drift_on_the_deployments_own_profile_re_measures_it(profiles):
    _, _, outcome = _drifted(profiles, shared=False)
    assert outcome.reprofile is not None and outcome.reprofile.method == "eagle3"
    assert outcome.reprofile.drift == pytest.approx(0.7, rel=1e-3)
    assert [e.reason for e in outcome.events] == ["AcceptanceDrift"]
    # Measured again: the decision does without it meanwhile.
    assert outcome.status.decision.method is None and outcome.serve.method is None


def test_drift_seen_by_one_tenant_never_re_measures_a_shared_profile(profiles):
    spec, served, outcome = _drifted(profiles, shared=True)
    assert outcome.reprofile is None
    assert outcome.status.decision.live_method == "eagle3", "this deployment follows its own live acceptance"
    assert [e.reason for e in outcome.events] == ["AcceptanceDrift"]
    again = plan_pool(_inputs(spec, PoolProfiles(**{**profiles.__dict__, "shared": frozenset({"eagle3"})}),
                              _reread(outcome.status), None, replicas=1, now=NOW + timedelta(seconds=60)))
    assert again.reprofile is None and not again.events, "announced once"


def test_the_restart_toggle_keeps_its_clocks_in_status(profiles):
    spec = SpeculativeDeploymentSpec.model_validate({
        **_spec().model_dump(by_alias=True, exclude_none=True),
        "model": {"id": MODEL, "dataParallelSize": 2}})  # no schedules with data parallelism: restart strategy
    first = plan_pool(_inputs(spec, profiles, PoolStatus(name="h100"), _observation(1, 1, NOW), replicas=1))
    decision = first.status.decision
    assert decision.strategy == "restart" and decision.crossover_concurrency
    assert first.serve.method is not None
    high = decision.crossover_concurrency * 3
    status, toggled = first.status, []
    for minute in range(1, 12):
        at = NOW + timedelta(minutes=minute)
        outcome = plan_pool(_inputs(spec, profiles, _reread(status), _observation(high, 1, at), replicas=1, now=at))
        status = outcome.status
        toggled += [outcome.toggled] if outcome.toggled else []
    assert toggled == ["off"] and not status.speculation_enabled
    assert status.last_toggle_at is not None


# --- adaptive refinement -----------------------------------------------------------------------------------

def _noisy(seed: int = 1) -> PoolProfiles:
    baseline, profile = synthetic_profiles(Scenario("H100-SXM", MODEL, "eagle3", "sharegpt"), noise=0.05, seed=seed)
    baseline.metadata["name"], profile.metadata["name"] = "h100-baseline", "h100-eagle3"
    return PoolProfiles(baseline=baseline, methods={"eagle3": profile}, ready=2, total=2)


def _appended(profiles: PoolProfiles, jobs) -> PoolProfiles:
    """The profiles after a round's Jobs appended their points (the asked levels, the boundaries' batch sizes,
    measured `repeat` times each with fresh noise from the twin)."""
    by_name = {"h100-baseline": profiles.baseline, "h100-eagle3": profiles.methods["eagle3"]}
    updated = {name: p.model_copy(deep=True) for name, p in by_name.items()}
    for job in jobs:
        measured = [synthetic_profiles(Scenario("H100-SXM", MODEL, "eagle3", "sharegpt"), noise=0.05, seed=50 + i,
                                       levels=tuple(sorted(job.levels)))[job.profile == "h100-eagle3"]
                    for i in range(job.repeat)]
        for run in updated[job.profile].status.runs:
            if run.num_speculative_tokens in job.ks:
                run.points += [p for m in measured for p in m.status.run(run.num_speculative_tokens).points]
    return PoolProfiles(baseline=updated["h100-baseline"], methods={"eagle3": updated["h100-eagle3"]}, ready=2,
                        total=2)


def test_noise_near_a_change_of_k_starts_a_refinement_round():
    spec = _spec()
    outcome = plan_pool(_inputs(spec, _noisy(), PoolStatus(name="h100"), replicas=1))
    refinement = outcome.status.refinement
    assert refinement.state == "Measuring" and refinement.round == 1 and refinement.jobs
    assert outcome.refine == refinement.jobs
    assert {j.job_name for j in refinement.jobs} == {refine_job_name(j.profile, 1, j.part) for j in refinement.jobs}
    assert len({j.job_name for j in refinement.jobs}) == len(refinement.jobs)
    assert all(j.repeat >= 1 and j.levels and j.ks for j in refinement.jobs)
    assert "uncertain" in refinement.message and refinement.budget_levels > 0
    assert [e.reason for e in outcome.events] == ["Refining"]


def test_clean_profiles_need_no_refinement_and_it_can_be_turned_off():
    spec = _spec()
    baseline, profile = synthetic_profiles(Scenario("H100-SXM", MODEL, "eagle3", "sharegpt"), noise=0.0)
    clean = PoolProfiles(baseline=baseline, methods={"eagle3": profile}, ready=2, total=2)
    outcome = plan_pool(_inputs(spec, clean, PoolStatus(name="h100"), replicas=1))
    assert outcome.status.refinement.state == "Settled" and not outcome.refine
    off = SpeculativeDeploymentSpec.model_validate({**spec.model_dump(by_alias=True, exclude_none=True),
                                                   "profiling": {"refineBudgetPercent": 0}})
    assert plan_pool(_inputs(off, _noisy(), PoolStatus(name="h100"), replicas=1)).status.refinement is None


def test_a_round_waits_for_its_jobs_then_decides_again_with_their_points():
    spec, profiles = _spec(), _noisy()
    first = plan_pool(_inputs(spec, profiles, PoolStatus(name="h100"), replicas=1))
    jobs = first.status.refinement.jobs
    # Not created yet (e.g. the create failed): asked for again. Running: nothing new.
    again = plan_pool(_inputs(spec, profiles, _reread(first.status), replicas=1))
    assert again.refine == jobs and again.status.refinement.round == 1
    running = PoolInputs(**{**_inputs(spec, profiles, _reread(first.status), replicas=1).__dict__,
                            "refine_jobs": {j.job_name: "Active" for j in jobs}})
    assert plan_pool(running).refine == [] and plan_pool(running).status.refinement.state == "Measuring"
    # Complete, but their points have not reached the profiles yet: still waiting.
    done = {j.job_name: "Complete" for j in jobs}
    waiting = plan_pool(PoolInputs(**{**running.__dict__, "refine_jobs": done}))
    assert waiting.status.refinement.state == "Measuring" and not waiting.refine
    # The points arrived: decided again, and refinement stops (it is one round).
    refined = plan_pool(PoolInputs(**{**running.__dict__, "refine_jobs": done,
                                      "profiles": _appended(profiles, jobs)}))
    after = refined.status.refinement
    assert after.spent_levels > 0
    assert after.state in ("Settled", "BudgetSpent") and after.round == 1 and not refined.refine
    assert refined.status.decision.basis != first.status.decision.basis


def test_a_failed_refinement_job_keeps_the_decision_and_says_so():
    spec, profiles = _spec(), _noisy()
    first = plan_pool(_inputs(spec, profiles, PoolStatus(name="h100"), replicas=1))
    job = first.status.refinement.jobs[0]
    failed = plan_pool(PoolInputs(**{**_inputs(spec, profiles, _reread(first.status), replicas=1).__dict__,
                                     "refine_jobs": {job.job_name: "Failed"}}))
    assert failed.status.refinement.state == "Failed" and job.job_name in failed.status.refinement.message
    assert failed.status.decision == first.status.decision and failed.serve.method is not None
    assert [e.reason for e in failed.events] == ["RefinementFailed"]
    # Failed stays failed (no new rounds) until the profiles change.
    later = plan_pool(_inputs(spec, profiles, _reread(failed.status), replicas=1))
    assert later.status.refinement.state == "Failed" and not later.refine and not later.events


def test_a_budget_spent_with_a_crossover_still_uncertain_is_said_in_the_decision():
    spec = SpeculativeDeploymentSpec.model_validate({**_spec().model_dump(by_alias=True, exclude_none=True),
                                                    "profiling": {"refineBudgetPercent": 10}})
    profiles = _noisy()
    status, rounds = PoolStatus(name="h100"), 0
    for _ in range(6):
        outcome = plan_pool(PoolInputs(**{**_inputs(spec, profiles, _reread(status), replicas=1).__dict__,
                                          "refine_jobs": {j.job_name: "Complete" for j in
                                                          (status.refinement.jobs if status.refinement else [])}}))
        status = outcome.status
        if status.refinement.state != "Measuring":
            break
        rounds += 1
        profiles = _appended(profiles, status.refinement.jobs)
    assert status.refinement.state == "BudgetSpent" and rounds == 1
    assert "still uncertain after the refinement budget" in status.decision.reason


def test_profiles_as_stored_give_the_same_plan_and_are_validated_only_to_decide(profiles):
    spec = _spec()
    stored = PoolProfiles(bodies={"baseline": profiles.baseline.dump(), "eagle3": profiles.methods["eagle3"].dump()},
                          ready=2, total=2)
    typed = plan_pool(_inputs(spec, profiles, PoolStatus(name="h100"), _observation(30, 1, NOW), replicas=1))
    raw = plan_pool(_inputs(spec, stored, PoolStatus(name="h100"), _observation(30, 1, NOW), replicas=1))
    assert raw.status.decision == typed.status.decision and raw.serve == typed.serve
    # The next reconciliation keeps the decision: nothing is validated.
    again = PoolProfiles(bodies=stored.bodies, ready=2, total=2)
    kept = plan_pool(_inputs(spec, again, _reread(raw.status), None, replicas=1, now=NOW + timedelta(seconds=15)))
    assert kept.status.decision == raw.status.decision and "_validated" not in again.__dict__
