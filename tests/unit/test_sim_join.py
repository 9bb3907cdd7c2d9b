"""A GPU type joining a simulated fleet (`specpilot simulate --fleet join`): the profiling planner runs its Jobs,
each timed as the benchmark sweeps on the twin, and the pool serves only once its profiles are Ready."""

from __future__ import annotations

import json
import math

import pytest

from specpilot.cli import main
from specpilot.sim.fleet import FleetConfig, FleetSetup
from specpilot.sim.joining import (
    BENCH_ENGINE_START_S,
    joining_spec,
    plan_joining,
    profile_seconds,
    run_profiling,
)
from specpilot.sim.mixed import SCENARIOS, compare
from specpilot.sim.policies import Candidate

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CANDIDATES = (Candidate("ngram", 4), Candidate("eagle3", 4))


@pytest.fixture(scope="module")
def fast_join():
    return compare(SCENARIOS["join"].fast(), FleetConfig(startup_s=15.0))


def test_the_joining_pool_serves_only_once_profiled(fast_join):
    [pool] = [p for p in fast_join.prepared if p.joining is not None]
    joining = pool.joining
    assert pool.spec.name == "h200" and joining.joined_at_s == pytest.approx(300.0)  # 1 h of 3, at a quarter-hour
    assert joining.serving_at_s > joining.joined_at_s
    profiled = [j for j in joining.jobs if j.kind == "profile"]
    assert [j.profile for j in profiled] == ["baseline", "ngram", "eagle3"]
    assert joining.profiling_s == pytest.approx(sum(j.seconds for j in profiled))  # one Job at a time
    for result in fast_join.results:
        timeline = result.timeline
        before = timeline.times_s < joining.serving_at_s
        assert not timeline.replicas["h200"][before].any()
        assert not timeline.shares["h200"][before].any()
    assert fast_join.result("specpilot").timeline.replicas["h200"].any()


def test_profiling_is_charged_to_every_placement(fast_join):
    [joining] = [p.joining for p in fast_join.prepared if p.joining is not None]
    assert joining.cost_usd > 0 and joining.gpu_hours > 0
    for result in fast_join.results:
        served = sum(r.cost_usd for r in result.pools.values() if r is not None)
        assert result.cost_usd == pytest.approx(served + joining.cost_usd)
        assert result.profiling_gpu_hours == pytest.approx(joining.gpu_hours)


def test_the_other_scenarios_have_no_joining_pool():
    for name, scenario in SCENARIOS.items():
        if name != "join":
            assert all(p.joins_at_s is None for p in scenario.pools) and scenario.profiling_time_scale == 1.0


def test_a_job_lasts_its_engine_starts_and_sweeps():
    setup = FleetSetup(MODEL, "H200")
    baseline = profile_seconds(setup, None, 0)
    eagle = profile_seconds(setup, "eagle3", 4)
    assert baseline > BENCH_ENGINE_START_S and eagle > 2 * BENCH_ENGINE_START_S  # a method runs k=1 and K
    assert profile_seconds(FleetSetup(MODEL, "A100-80GB-SXM"), None, 0) > baseline  # a slower GPU sweeps longer
    assert profile_seconds(setup, None, 0, engine_start_s=0.0) == pytest.approx(baseline - BENCH_ENGINE_START_S)


def test_parallel_jobs_finish_sooner_and_never_exceed_the_bound():
    seconds = {"baseline": 100.0, "ngram": 200.0, "eagle3": 300.0}
    one, jobs_one = run_profiling(joining_spec("p", "H200", MODEL, CANDIDATES, max_parallel_jobs=1), seconds,
                                  0.0, 10_000.0)
    two, jobs_two = run_profiling(joining_spec("p", "H200", MODEL, CANDIDATES, max_parallel_jobs=2), seconds,
                                  0.0, 10_000.0)
    assert one == pytest.approx(600.0)
    assert two == pytest.approx(400.0)  # baseline and a, then b when baseline's slot frees
    for jobs, bound in ((jobs_one, 1), (jobs_two, 2)):
        for job in jobs:
            overlapping = sum(1 for other in jobs if other.start_s <= job.start_s < other.end_s)
            assert overlapping <= bound


def test_a_pool_that_cannot_finish_before_the_trace_ends_never_serves():
    joining = plan_joining("h200", "H200", FleetSetup(MODEL, "H200"), CANDIDATES, 0.0, horizon_s=60.0)
    assert math.isinf(joining.serving_at_s)


def test_the_join_scenario_reports_when_it_joined_and_served(tmp_path, capsys):
    assert main(["simulate", "--fleet", "join", "--fast", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "joined: pool h200 (H200) joined at" in printed
    report = json.loads((tmp_path / "fleet-report.json").read_text())
    [joined] = report[0]["joins"]
    assert joined["pool"] == "h200" and joined["serving_at_s"] > joined["joined_at_s"]
    assert "Joined: pool h200" in (tmp_path / "fleet-report.md").read_text()
