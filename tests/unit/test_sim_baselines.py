"""The fleet report's baselines: the clairvoyant oracle (specpilot's planner told the peak demand within one
start-up) and the even split whose autoscaler target is tuned to specpilot's SLO attainment."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specpilot.policy.fleet import FleetSettings
from specpilot.sim.connector import EPOCH
from specpilot.sim.fleet import FleetConfig
from specpilot.sim.mixed import (
    ATTAINMENT_TOLERANCE_POINTS,
    SCENARIOS,
    MixedPool,
    MixedScenario,
    arrival_rate_rps,
    compare,
    place,
    prepare,
    prior_history,
    tune_even_split,
)
from specpilot.sim.requestlog import RequestLog
from specpilot.sim.traces import BurstTrace

BURSTS = BurstTrace(duration_s=1200.0, base_rps=5.0, burst_rps=150.0, every_s=600.0, burst_s=300.0)
"""A burst of 150 req/s for 5 minutes at 10 minutes, over 5 req/s."""


@pytest.fixture(scope="module")
def bursty():
    """Two pools (H100s and a few A100s) profiled and decided as the operator would, under BURSTS."""
    config = FleetConfig(startup_s=120.0)
    scenario = MixedScenario("t", "test", (MixedPool("h100", "H100-SXM", 8), MixedPool("a100", "A100-80GB-SXM", 2)),
                             "bursts:5:150:600:300", 15.0)
    return config, scenario, prepare(scenario, BURSTS, config)


def _total(timeline) -> np.ndarray:
    return sum(timeline.replicas.values())


def _first_scale_up(replicas: np.ndarray) -> int:
    """The tick the fleet first asked for half the replicas it ran at most: the burst's scale-up, not a replica
    added for the edge of one."""
    return int(np.flatnonzero(replicas >= replicas.max() / 2)[0])


def test_the_oracle_sees_the_demand_one_start_up_ahead(bursty):
    config, scenario, prepared = bursty
    # a cold start: the burst at 10 minutes is the first the planner sees
    cold = dataclasses.replace(scenario, warm=False)
    seen = _total(place("specpilot", prepared, BURSTS, 256.0, config, cold))
    oracle = _total(place("oracle", prepared, BURSTS, 256.0, config, cold))
    tick = config.control_interval_s
    lead_ticks = int(config.startup_s / tick)
    # the same decision told the peak within the lead time: it asks for the burst's replicas when a replica asked
    # for then serves as the burst arrives (within one control interval), while the observing planner can only
    # follow it (and sizes for the backlog the burst left as well)
    assert _first_scale_up(seen) * tick >= 600.0
    first = _first_scale_up(oracle) * tick
    assert 600.0 - config.startup_s - tick <= first <= 600.0 - config.startup_s
    assert first < _first_scale_up(seen) * tick - lead_ticks * tick + tick
    assert 1 < oracle.max() <= seen.max()


def test_a_warm_start_holds_the_bursts_the_history_before_the_trace_shows(bursty):
    config, scenario, prepared = bursty
    settings = FleetSettings(tpot_slo_ms=15.0)
    history = prior_history(BURSTS, 256.0, settings, config.observation_window_s, config.control_interval_s)
    # the trace continued backwards: the bursts of the half-hour before it, at 150 req/s over the base 5
    assert history[0][0] < EPOCH and history[-1][0] < EPOCH
    assert max(d for _, d in history) == pytest.approx(150.0 * 256.0)
    assert min(d for _, d in history) == pytest.approx(5.0 * 256.0)
    warm = _total(place("specpilot", prepared, BURSTS, 256.0, config, scenario))
    cold = _total(place("specpilot", prepared, BURSTS, 256.0, config, dataclasses.replace(scenario, warm=False)))
    # the warm planner holds the burst's replicas from the start; the cold one follows the burst when it comes
    assert warm[0] >= warm.max() - 1 and warm[0] > cold[0]
    assert _first_scale_up(cold) * config.control_interval_s >= 600.0
    assert warm[0] >= warm[int(600 / config.control_interval_s) + 1]


def test_the_observed_rate_of_a_log_counts_its_arrivals():
    log = RequestLog(duration_s=200.0, arrival_s=np.arange(0.0, 120.0, 0.5), input_tokens=np.ones(240, dtype=int),
                     output_tokens=np.ones(240, dtype=int))
    assert arrival_rate_rps(log, 60.0, 120.0) == pytest.approx(2.0)
    assert arrival_rate_rps(log, 120.0, 180.0) == 0.0
    assert arrival_rate_rps(log, 0.0, 0.0) == pytest.approx(2.0)  # nothing observed yet: the first bin's rate


@dataclasses.dataclass
class _Run:
    slo_attainment: float
    utilization_percent: float
    tuning: object = None


def test_tuning_finds_the_highest_target_that_reaches_the_attainment():
    def evaluate(percent: float) -> _Run:
        return _Run(1.0 - percent / 200.0, percent)  # fewer replicas, lower attainment, as the target rises

    result = tune_even_split(0.7, evaluate)
    assert result.tuning.reached and result.slo_attainment * 100 >= 70.0 - ATTAINMENT_TOLERANCE_POINTS
    assert 57.0 <= result.tuning.utilization_percent <= 60.2
    assert result.tuning.evaluations == 2 + 5
    assert tune_even_split(0.1, evaluate).tuning.utilization_percent == 100.0
    unreachable = tune_even_split(0.99, evaluate)
    assert not unreachable.tuning.reached and unreachable.tuning.utilization_percent == 10.0


def test_the_tuned_even_split_reaches_specpilots_attainment():
    comparison = compare(SCENARIOS["default"].fast(), FleetConfig(startup_s=15.0),
                         placements=("even-split", "specpilot", "even-split-hpa"))
    spec, plain, tuned = (comparison.result(p) for p in ("specpilot", "even-split", "even-split-hpa"))
    assert plain.slo_attainment < spec.slo_attainment  # the default target falls short
    if tuned.tuning.reached:
        assert tuned.slo_attainment * 100 >= spec.slo_attainment * 100 - ATTAINMENT_TOLERANCE_POINTS
    else:  # specpilot sized to its attainment target: even the lowest target of the search falls short, and says so
        assert tuned.tuning.utilization_percent == 10.0 and tuned.slo_attainment < spec.slo_attainment
        assert "no target utilisation reaches" in tuned.tuning.words()
    assert tuned.slo_attainment > plain.slo_attainment
    assert tuned.gpu_hours > plain.gpu_hours
    assert tuned.tuning.utilization_percent < 80.0
