"""One model of what a benchmark Job does (perf.bench_model) serves the bench, the plausibility check, the
simulator's Jobs and the decision-quality benchmark; one refinement entry (policy.refine.pool_refinement) serves
the simulator as it serves the operator; one JSON cleaner serves both simulator reports."""

from __future__ import annotations

import dataclasses
import math

import pytest
from specpilot.api.deployment_spec import Policy, Profiling
from specpilot.api.profile import LevelPoint
from specpilot.perf import bench_model, plausibility
from specpilot.perf.bench_model import (
    ENGINE_START_S,
    SATURATION_GAIN,
    default_warmup,
    level_duration_s,
    level_requests,
    level_wall_s,
    saturated,
)
from specpilot.policy.choose import decide_pool
from specpilot.policy.refine import initial_levels, level_budget, pool_refinement, refine_pool_plan
from specpilot.sim import joining
from specpilot.sim.report import jsonable
from specpilot.sim.synthetic import Scenario, synthetic_profiles
from specpilot_bench import cli, sweep
from specpilot_bench.sweep import Slo, stop_reason

SCENARIO = Scenario("H100-SXM", "Qwen/Qwen3-8B", "eagle3")


def test_the_bench_the_check_and_the_simulator_read_one_set_of_numbers():
    assert cli.MIN_WAVES is bench_model.MIN_WAVES and plausibility.MIN_WAVES is bench_model.MIN_WAVES
    assert sweep.SATURATION_GAIN is bench_model.SATURATION_GAIN
    assert sweep.default_warmup is default_warmup
    assert joining.BENCH_ENGINE_START_S == ENGINE_START_S
    assert bench_model.DEFAULT_REQUESTS_PER_LEVEL == Profiling().requests_per_level


def test_a_level_sends_two_waves_at_least_and_its_wall_time_adds_the_warm_up():
    assert level_requests(8) == 64 and level_requests(64) == 128 and level_requests(4, 3) == 8
    assert default_warmup(2) == 2 and default_warmup(64) == 4
    assert level_duration_s(64, 16.0) == pytest.approx(128 / 16.0)
    assert level_wall_s(64, 16.0) == pytest.approx((64 + 128) / 16.0)  # + one request's latency at c


def _point(c: int, throughput: float) -> LevelPoint:
    return LevelPoint(concurrency=c, output_throughput=throughput)


@pytest.mark.parametrize("throughputs, stops", [
    ([100, 103, 105], True),  # under 5% at each of two steps
    ([100, 103, 110], False),
    ([100, 110, 112], False),
    ([100, 104], False),
    ([0, 1, 1], False),
])
def test_the_bench_stops_where_the_shared_rule_says_saturated(throughputs, stops):
    assert saturated(throughputs) is stops
    reason = stop_reason([_point(2 ** i, t) for i, t in enumerate(throughputs)], Slo())
    assert (reason is not None and reason.startswith("saturated")) is stops
    if stops:
        assert f"{SATURATION_GAIN:.0%}" in reason


def test_the_operator_asks_no_refinement_of_a_decision_without_profiles_or_with_refinement_off():
    baseline, method = synthetic_profiles(SCENARIO, noise=0.05, seed=3)
    candidate = SCENARIO.candidate()
    policy = Policy(min_gain_percent=2.0)
    profiles = {candidate.key: method}
    plan = decide_pool(policy, [candidate], baseline, profiles, 0.0, 1)
    found = pool_refinement(plan, policy, baseline, profiles)
    assert found is not None
    assert found.budget_levels == math.ceil(2.0 * initial_levels([baseline, method])) == level_budget([baseline, method])
    assert found == refine_pool_plan(plan, policy, baseline, profiles)  # the API's default budget
    assert pool_refinement(plan, policy, baseline, profiles, budget_percent=0) is None
    assert pool_refinement(plan, policy, baseline, profiles, budget_percent=150).budget_levels == \
        math.ceil(1.5 * initial_levels([baseline, method]))
    for source in ("none", "prior"):
        unprofiled = dataclasses.replace(plan, decision=plan.decision.model_copy(update={"source": source}))
        assert pool_refinement(unprofiled, policy, baseline, profiles) is None


def test_reports_write_no_infinity_at_any_depth():
    assert jsonable({"a": math.inf, "b": [1.0, -math.inf, (math.nan, 2)], "c": "x"}) == \
        {"a": None, "b": [1.0, None, [None, 2]], "c": "x"}
