"""The refinement planner (policy.refine, issue 14): what it is unsure of, what to measure, when it is done."""

from __future__ import annotations

import json

import pytest
from specpilot.api.deployment_spec import Policy
from specpilot.api.profile import SpeculationProfile
from specpilot.manifests.benchmark import RefineRun
from specpilot.policy import refine
from specpilot.policy.refine import (
    CONFIDENCE_Z,
    Boundary,
    RunRef,
    allocate,
    initial_levels,
    plan_refinement,
    refine_schedule,
    refinement_done,
    spent_levels,
)
from specpilot.policy.schedule import plan_from_runs
from specpilot.sim.synthetic import Scenario, synthetic_profiles

SCENARIO = Scenario("H100-SXM", "Qwen/Qwen3-8B", "eagle3")


def profiles(noise: float = 0.05, seed: int = 3) -> tuple[SpeculationProfile, SpeculationProfile]:
    return synthetic_profiles(SCENARIO, noise=noise, seed=seed)


def refine_plan(baseline, method, min_gain: float = 2.0, budget: int | None = None):
    candidate = SCENARIO.candidate()
    return plan_refinement(Policy(min_gain_percent=min_gain), [candidate], baseline, {candidate.key: method},
                           budget_levels=budget)


def test_noisy_profiles_ask_to_measure_their_uncertain_boundaries_where_they_lie():
    baseline, method = profiles()
    plan = refine_plan(baseline, method, budget=60)  # enough for every uncertain boundary
    assert not plan.done and not refinement_done(plan)
    assert plan.uncertain and plan.requests
    schedule = plan_from_runs(baseline.status.run(0), method.status.runs, min_gain_percent=2.0,
                              max_batch_size=256)
    changes = [c for c in range(1, 256) if schedule.k_by_batch_size[c - 1] != schedule.k_by_batch_size[c]]
    assert [b.batch_size for b in plan.boundaries] == changes
    for b in plan.uncertain:
        assert CONFIDENCE_Z * b.uncertainty > b.threshold
        assert b.levels == (b.batch_size,)  # measured at the batch size where k changes, not around it
    names = {"baseline": baseline.metadata["name"], "eagle3": method.metadata["name"]}
    for r in plan.requests:
        assert r.profile_name == names[r.profile_key]
        assert r.num_speculative_tokens in ((0,) if r.profile_key == "baseline" else (1, 4))
        assert 1 <= r.repeat <= refine.MAX_REPEAT and r.worth > 0 and r.reason
    crossover = next(b for b in plan.boundaries if b.crossover)
    asked = {(r.profile_key, r.num_speculative_tokens) for r in plan.requests
             if r.concurrency in crossover.levels}
    assert ("baseline", 0) in asked  # SD on/off is placed by the baseline against the method's k
    # ranked by worth; within the budget
    assert [r.worth for r in plan.requests] == sorted((r.worth for r in plan.requests), reverse=True)
    assert plan.requested_levels <= plan.budget_levels - plan.spent_levels


def test_jobs_group_requests_per_profile_and_turn_into_bench_flags():
    baseline, method = profiles()
    plan = refine_plan(baseline, method)
    jobs = plan.jobs()
    assert sum(j.measured_levels for j in jobs) == plan.requested_levels  # exactly what was asked
    by_run = {(r.profile_key, r.num_speculative_tokens, r.concurrency) for r in plan.requests}
    covered = {(j.profile_key, k, c) for j in jobs for k in j.ks for c in j.levels}
    assert by_run <= covered
    job = jobs[0]
    assert job.run(1) == RefineRun(round=1, levels=list(job.levels), ks=list(job.ks), repeat=job.repeat,
                                   append=True, part=job.part)
    # a profile with several Jobs in the round numbers them, so each gets a name of its own
    for key in {j.profile_key for j in jobs}:
        parts = [j.part for j in jobs if j.profile_key == key]
        assert parts == [None] or parts == list(range(1, len(parts) + 1))
    assert job.bench_args()[-1] == "--append"
    from specpilot_bench.cli import build_parser

    parsed = build_parser().parse_args(["--profile-name", "p", *job.bench_args()])
    assert (parsed.levels, parsed.ks, parsed.repeat, parsed.append) == (list(job.levels), list(job.ks),
                                                                        job.repeat, True)


def test_to_dict_is_camel_case_json():
    baseline, method = profiles()
    data = refine_plan(baseline, method).to_dict()
    json.dumps(data)
    assert set(data) == {"done", "reason", "budgetLevels", "spentLevels", "requestedLevels", "uncertain",
                         "unaddressed", "requests", "jobs"}
    assert set(data["requests"][0]) == {"profile", "profileName", "k", "concurrency", "repeat", "worth", "reason"}
    assert {"batchSize", "fromK", "toK", "crossover", "uncertaintyPercent", "thresholdPercent",
            "neededPercent", "levels"} <= set(data["uncertain"][0])


def test_done_on_noise_free_profiles_and_when_the_budget_is_spent():
    baseline, method = profiles(noise=0.0)
    plan = refine_plan(baseline, method)
    assert plan.done and not plan.requests and "no uncertain boundary" in plan.reason
    baseline, method = profiles()
    spent = refine_plan(baseline, method, budget=0)
    assert spent.done and spent.reason.startswith("budget spent (0 of 0 levels); still uncertain: eagle3")


def test_the_budget_counts_what_the_profiles_already_repeated():
    baseline, method = profiles()
    first = initial_levels([baseline, method])
    assert first == 36 and spent_levels([baseline, method]) == 0
    assert refine_plan(baseline, method).budget_levels == 72  # DEFAULT_BUDGET_SHARE of the first sweep
    run = method.status.run(1)
    run.points.extend(p.model_copy() for p in run.points[-3:])
    assert spent_levels([baseline, method]) == 3
    again = refine_plan(baseline, method)
    assert again.spent_levels == 3
    # refinement is one round: profiles that carry repeats are done, and say what is still uncertain
    assert again.done and not again.requests and again.uncertain
    assert again.reason.startswith("refined once (3 levels measured after the first sweep); refinement is one "
                                   "round, and still uncertain: eagle3")


def test_a_level_only_refinement_measured_counts_as_spent_not_as_first_sweep():
    baseline, method = profiles()
    sweep = set(method.spec.concurrency_levels)
    probe = next(c for c in range(100, 200) if c not in sweep)  # a boundary's batch size between levels
    run = baseline.status.run(0)
    run.points.append(run.points[-1].model_copy(update={"concurrency": probe}))
    assert initial_levels([baseline, method]) == 36  # the first sweep is the spec's levels
    assert spent_levels([baseline, method]) == 1  # measured once, and still a refinement's point
    assert refine_plan(baseline, method).done  # so the one round is over


def test_a_tight_budget_goes_to_the_best_worth_first():
    baseline, method = profiles()
    wide, tight = refine_plan(baseline, method, budget=60), refine_plan(baseline, method, budget=4)
    assert 0 < tight.requested_levels <= 4 < wide.requested_levels
    best = max(tight.uncertain, key=lambda b: b.worth(1) / b.cost(1))
    assert {r.concurrency for r in tight.requests} <= set(best.levels) | {c for b in tight.uncertain
                                                                          for c in b.levels}


def test_allocation_takes_the_best_worth_per_level_and_shares_levels():
    run_a, run_b = RunRef("m", "m-1", 1), RunRef("baseline", "b-1", 0)
    wide = Boundary("m", 150, 1, 0, 0.06, 0.02, (run_a, run_b), (128, 192), 1)
    narrow = Boundary("m", 100, 2, 1, 0.013, 0.02, (run_a,), (96, 128), 1)
    settled = Boundary("m", 20, 4, 3, 0.005, 0.02, (run_a,), (16, 32), 1)
    assert not settled.uncertain and settled.repeats_needed() == 0
    assert narrow.repeats_needed() == 1  # 2 x 1.3% > 2%; one more measurement each brings it to 2 x 0.92%
    assert wide.repeats_needed() == refine.MAX_REPEAT
    requests = allocate([settled, narrow, wide], budget_left=6)
    # narrow is worth more per level; wide gets what is left (one repeat of its four run-levels, 128 shared)
    by_key = {(r.profile_key, r.num_speculative_tokens, r.concurrency): r.repeat for r in requests}
    assert by_key == {("m", 1, 96): 1, ("m", 1, 128): 1, ("m", 1, 192): 1, ("baseline", 0, 128): 1,
                      ("baseline", 0, 192): 1}
    assert sum(by_key.values()) <= 6
    assert allocate([settled], 100) == []


def test_refine_schedule_without_a_pool_decision():
    baseline, method = profiles()
    schedule = plan_from_runs(baseline.status.run(0), method.status.runs, min_gain_percent=2.0,
                              max_batch_size=256)
    plan = refine_schedule(schedule, 2.0, "eagle3", budget_levels=18)
    assert not plan.done and {r.profile_name for r in plan.requests} == {None}
    assert refine_schedule(schedule, 50.0, "eagle3", budget_levels=18).done  # within a 50% minimum gain


@pytest.mark.parametrize("missing", ["baseline", "method"])
def test_without_profiles_the_plan_is_done_with_the_reason(missing):
    baseline, method = profiles()
    plan = refine_plan(None if missing == "baseline" else baseline, method if missing == "baseline" else None)
    assert plan.done and plan.reason.startswith("nothing to refine")


def test_measuring_time_ranks_where_the_points_say_it():
    run = RunRef("m", "m-1", 1)
    slow = Boundary("m", 3, 4, 3, 0.03, 0.02, (run,), (2, 4), 1, seconds=180.0)  # minutes per level at low load
    fast = Boundary("m", 150, 1, 0, 0.03, 0.02, (run,), (128, 192), 1, seconds=20.0)
    assert slow.price(2) == 360.0 and fast.price(2) == 40.0 and fast.cost(2) == 4
    requests = allocate([slow, fast], budget_left=8)
    assert {r.concurrency for r in requests} == {128, 192}  # same worth, the cheap levels first
    # the profiles' durations reach the boundaries
    baseline, method = profiles()
    plan = refine_plan(baseline, method)
    assert all(b.seconds and b.seconds > 0 for b in plan.boundaries)


def test_the_repeats_a_level_may_take_grow_with_the_budget():
    assert refine.max_repeat(72, 36) == refine.MAX_REPEAT == 8  # the default budget: twice the sweep
    assert refine.max_repeat(54, 36) == 6 and refine.max_repeat(108, 36) == 12
    assert refine.max_repeat(144, 36) == refine.MAX_REPEAT_CEILING  # a run keeps at most 64 points
    assert refine.max_repeat(1, 36) == 1 and refine.max_repeat(10, 0) == refine.MAX_REPEAT
    wide = Boundary("m", 150, 1, 0, 0.06, 0.02, (RunRef("m", "m-1", 1),), (150,), 1)
    assert wide.repeats_needed(12) == 12 and wide.repeats_needed() == 8
    baseline, method = profiles()
    small, large = refine_plan(baseline, method, budget=54), refine_plan(baseline, method, budget=108)
    assert max(r.repeat for r in small.requests) <= 6 < max(r.repeat for r in large.requests) <= 12
