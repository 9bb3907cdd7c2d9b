"""SD-aware replica planning: capacity, bounds, fast scale-up, stabilised scale-down, missing metrics."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from specpilot.policy.replicas import ReplicaState, plan_replicas

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _plan(state, demand, current, now_s, capacity=40.0):
    return plan_replicas(state, demand, current, capacity, 80, 1, 10, 300, T0 + timedelta(seconds=now_s))


def test_desired_from_capacity_and_utilisation_with_bounds():
    assert _plan(ReplicaState(), 100, 1, 0).replicas == 4  # 100 / (40 * 0.8) = 3.1
    assert _plan(ReplicaState(), 10_000, 1, 0).replicas == 10
    assert _plan(ReplicaState(), 0, 3, 0, capacity=40).desired == 1


def test_more_capacity_under_speculation_needs_fewer_replicas():
    assert _plan(ReplicaState(), 200, 1, 0, capacity=64).replicas < _plan(ReplicaState(), 200, 1, 0, capacity=32).replicas


def test_scale_up_at_once_scale_down_after_the_window():
    up = _plan(ReplicaState(), 250, 2, 0)
    assert up.replicas == 8 and "scale up" in up.reason
    held = _plan(up.state, 60, 8, 100)
    assert held.desired == 2 and held.replicas == 8 and "holding" in held.reason
    still = _plan(held.state, 60, 8, 299)
    assert still.replicas == 8
    down = _plan(still.state, 60, 8, 301)
    assert down.replicas == 2


def test_missing_metrics_hold_and_no_feasible_capacity_runs_the_maximum():
    held = _plan(ReplicaState(), None, 3, 0)
    assert held.replicas == 3 and held.desired is None and "metrics missing" in held.reason
    assert _plan(ReplicaState(), 5, 1, 0, capacity=0).replicas == 10
    with pytest.raises(ValueError, match="min_replicas"):
        plan_replicas(ReplicaState(), 1, 1, 1, 80, 5, 2, 0, T0)
