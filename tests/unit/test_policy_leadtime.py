"""A pool's scale-up lead time, measured from its own Deployment (`policy.leadtime`), and the fleet planner
forecasting over it (`policy.plan`)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from specpilot.api.deployment_status import MAX_LEAD_TIMES, PoolStatus
from specpilot.policy.leadtime import measured_lead_time, track_scale_up
from specpilot.policy.plan import ApplyDeployment, plan_deployment
from tests.unit.test_policy_plan import _nodes, _snapshot, _spec

T0 = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)


def step(previous: PoolStatus, asked: int | None, ready: int, seconds: float) -> PoolStatus:
    pool = previous.model_copy(deep=True)
    track_scale_up(pool, previous, asked, ready, T0 + timedelta(seconds=seconds))
    return pool


def test_a_scale_up_is_measured_from_the_ask_until_every_replica_asked_for_is_ready():
    pool = step(PoolStatus(name="a100"), asked=3, ready=1, seconds=0)
    assert pool.scale_up_started_at == T0 and pool.scale_up_to == 3 and measured_lead_time(pool) is None
    pool = step(pool, asked=3, ready=2, seconds=40)
    assert pool.scale_up_started_at == T0 and pool.scale_up_lead_times == []
    pool = step(pool, asked=3, ready=3, seconds=95)
    assert pool.scale_up_started_at is None and pool.scale_up_lead_times == [95.0]
    assert measured_lead_time(pool) == 95.0


def test_asking_for_more_while_one_is_pending_measures_the_first_ask_not_the_whole_ramp():
    # a ramp: 2 asked at 0 s, 4 at 30 s, 6 at 60 s; every replica takes 120 s to start
    pool = step(PoolStatus(name="a100"), asked=2, ready=1, seconds=0)
    pool = step(pool, asked=4, ready=1, seconds=30)
    assert pool.scale_up_started_at == T0 and pool.scale_up_to == 2  # the first ask's replicas
    pool = step(pool, asked=6, ready=1, seconds=60)
    pool = step(pool, asked=6, ready=2, seconds=120)
    assert pool.scale_up_lead_times == [120.0]  # one replica's start, not the ramp's 240 s
    assert pool.scale_up_started_at == T0 + timedelta(seconds=120) and pool.scale_up_to == 6
    pool = step(pool, asked=6, ready=4, seconds=150)
    pool = step(pool, asked=6, ready=6, seconds=180)
    assert pool.scale_up_lead_times == [120.0, 60.0]  # the later asks read short: the longest counts
    assert measured_lead_time(pool) == 120.0


def test_a_pending_scale_up_asked_down_waits_only_for_what_is_still_asked():
    pool = step(PoolStatus(name="a100"), asked=5, ready=1, seconds=0)
    pool = step(pool, asked=3, ready=2, seconds=30)
    assert pool.scale_up_to == 3
    pool = step(pool, asked=3, ready=3, seconds=100)
    assert pool.scale_up_lead_times == [100.0]


def test_a_scale_up_called_off_is_not_measured_and_the_longest_recent_one_counts():
    pool = step(PoolStatus(name="a100"), asked=3, ready=1, seconds=0)
    pool = step(pool, asked=1, ready=1, seconds=20)
    assert pool.scale_up_started_at is None and pool.scale_up_lead_times == []
    for i, took in enumerate([100, 300, 80, 90, 70, 60, 50]):
        start = 1000.0 * (i + 1)
        pool = step(pool, asked=2, ready=1, seconds=start)
        pool = step(pool, asked=2, ready=2, seconds=start + took)
    assert len(pool.scale_up_lead_times) == MAX_LEAD_TIMES
    assert pool.scale_up_lead_times == [80.0, 90.0, 70.0, 60.0, 50.0]  # the 300 s one has aged out
    assert measured_lead_time(pool) == 90.0


def test_the_plan_measures_each_pools_scale_up_and_the_fleet_forecasts_over_the_longest():
    spec = _spec()
    first = _snapshot(spec, _nodes("h100", "a100"))
    # the pools' Deployments do not exist yet: every replica the plan asks for is a scale-up
    first = dataclasses.replace(first, pools=[dataclasses.replace(p, current=None) for p in first.pools])
    plan = plan_deployment(first)
    asked = {a.pool: a.serve.replicas for a in plan.of(ApplyDeployment)}
    assert all(p.scale_up_started_at == first.now and p.scale_up_to == asked[p.name] for p in plan.status.pools)

    # h100's replicas are all ready 4 minutes later, a100's after 7
    took = {"h100": 240, "a100": 420}
    status = plan.status
    for pool_name, seconds in sorted(took.items(), key=lambda item: item[1]):
        later = _snapshot(spec, _nodes("h100", "a100"), old=status)
        ready = {p.view.pool.name: (asked[p.view.pool.name] if p.view.pool.name == pool_name or
                                    p.view.pool.name in [n for n, s in took.items() if s < seconds] else 0)
                 for p in later.pools}
        pools = [dataclasses.replace(p, current={
            "metadata": {"name": f"chat-{p.view.pool.name}", "generation": 1},
            "spec": {"replicas": asked[p.view.pool.name]},
            "status": {"observedGeneration": 1, "replicas": asked[p.view.pool.name], "updatedReplicas":
                       asked[p.view.pool.name], "readyReplicas": ready[p.view.pool.name]}}) for p in later.pools]
        later = dataclasses.replace(later, pools=pools, now=first.now + timedelta(seconds=seconds))
        status = plan_deployment(later).status
    assert {p.name: p.scale_up_lead_times for p in status.pools} == {"h100": [240.0], "a100": [420.0]}
    again = plan_deployment(dataclasses.replace(_snapshot(spec, _nodes("h100", "a100"), old=status),
                                                now=first.now + timedelta(seconds=600)))
    assert again.status.fleet is not None and again.status.fleet.lead_time_seconds == 420.0


def test_samples_that_are_no_measurement_never_reach_the_planner():
    """The samples come back from a status anyone who may patch it can write: a negative, infinite, NaN or
    absurd one is left out (the fleet planner refuses such a lead time, and the reconciliation would fail)."""
    forged = PoolStatus.model_validate({"name": "a100", "scaleUpLeadTimes": [-5, "inf", "nan", 1e300, 90.0]})
    assert measured_lead_time(forged) == 90.0
    assert measured_lead_time(PoolStatus.model_validate({"name": "a100", "scaleUpLeadTimes": ["-inf"]})) is None
