"""The deployment's roll-up of its pools (policy.deployment): a decision change goes to the bounded history with one
Event, and the deployment's cost is the fleet's when it is placed across pools, else the cheapest decided pool's."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from specpilot.api.deployment_status import (
    HISTORY_LIMIT,
    Decision,
    FleetStatus,
    Phase,
    PoolStatus,
    SpeculativeDeploymentStatus,
)
from specpilot.policy.deployment import decision_changed, decision_summary, fleet_capacity, summarize
from specpilot.policy.profiling import Rollup

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def pool(name: str, method: str | None, schedule: str = "", cost: float | None = None) -> PoolStatus:
    return PoolStatus(name=name, decision=Decision(method=method, schedule_summary=schedule, reason="why",
                                                   cost_per_mtok_with_sd=cost))


def test_a_new_method_or_schedule_is_one_event_and_one_history_entry():
    status = SpeculativeDeploymentStatus()
    event = decision_changed(status, PoolStatus(name="h100"), pool("h100", "eagle3", "1-8:3"), NOW)
    assert event is not None and event.reason == "DecisionChanged" and "pending -> eagle3" in event.message
    assert [h.change for h in status.history] == [event.message.split(": ")[1]]
    assert decision_changed(status, pool("h100", "eagle3", "1-8:3"), pool("h100", "eagle3", "1-8:3"), NOW) is None
    again = decision_changed(status, pool("h100", "eagle3", "1-8:3"), pool("h100", "eagle3", "1-16:2"), NOW)
    assert again is not None and len(status.history) == 2


def test_the_history_is_bounded():
    status = SpeculativeDeploymentStatus()
    for i in range(HISTORY_LIMIT + 5):
        decision_changed(status, pool("h100", "a" if i % 2 else "b"), pool("h100", "b" if i % 2 else "a"),
                         NOW + timedelta(minutes=i))
    assert len(status.history) == HISTORY_LIMIT
    assert status.history[-1].time == NOW + timedelta(minutes=HISTORY_LIMIT + 4)


def test_the_deployments_cost_is_the_fleets_else_the_cheapest_pools():
    status = SpeculativeDeploymentStatus(pools=[pool("a100", "ngram", cost=0.31), pool("h100", "eagle3", cost=0.2),
                                                pool("l40s", None)])
    summarize(status, Rollup(6, 6, 0), generation=3)
    assert status.cost_per_mtok == 0.2 and status.phase == Phase.SERVING and status.observed_generation == 3
    assert status.decision_summary == decision_summary(status.pools) == "a100=ngram[k=0,off] h100=eagle3[k=0,off] l40s=off"
    status.fleet = FleetStatus(cost_per_mtok=0.27)
    summarize(status, Rollup(5, 6, 1), generation=4)
    assert status.cost_per_mtok == 0.27 and status.phase == Phase.DEGRADED


def test_fleet_capacity_says_when_no_placement_holds_the_slo_once():
    status = SpeculativeDeploymentStatus()
    assert fleet_capacity(status, was_short=False) == (None, None)  # one pool, or no placement yet
    status.fleet = FleetStatus(slo_feasible=True, reason="fleet $0.2/Mtok")
    assert fleet_capacity(status, was_short=True)[0][:2] == (True, "WithinCapacity")
    status.fleet = FleetStatus(slo_feasible=False, reason="the demand exceeds what every allowed replica holds")
    (ok, reason, message), event = fleet_capacity(status, was_short=False)
    assert (ok, reason) == (False, "DemandBeyondCapacity") and "Raise spec.serving.maxReplicas" in message
    assert event.reason == "FleetCapacityShort" and event.type == "Warning"
    assert fleet_capacity(status, was_short=True)[1] is None  # announced once
