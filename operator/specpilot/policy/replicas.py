"""Speculation-aware replica planning for one pool.

desired = ceil(total concurrency demand / (SLO-feasible concurrency per replica * target utilisation)),
bounded by min/max replicas. The capacity per replica comes from the pool's decision (policy.choose): under
speculation a replica meets the TPOT SLO at more concurrent requests, so fewer replicas are needed. Scale up
at once; scale down only to the highest target seen during the stabilisation window (the window's history
is passed in and returned, so the function stays pure). Missing metrics hold the current replicas.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from datetime import datetime, timedelta

from ..api.deployment_spec import GpuPool, SpeculativeDeploymentSpec

__all__ = ["ReplicaPlan", "ReplicaState", "demand_at_capacity", "plan_replicas", "replica_bounds"]


@dataclasses.dataclass(frozen=True)
class ReplicaState:
    """Recent (time, desired replicas) pairs within the stabilisation window, oldest first. Only pairs no
    later pair covers are kept (each is higher than every later one), so the maximum over any suffix of the
    window is unchanged and the state stays small (it is written to the pool's status)."""

    recent: tuple[tuple[datetime, int], ...] = ()


@dataclasses.dataclass(frozen=True)
class ReplicaPlan:
    replicas: int
    """Replicas to run now."""
    desired: int | None
    """What the load alone asks for (None without metrics)."""
    state: ReplicaState
    reason: str


def plan_replicas(state: ReplicaState, demand_concurrency: float | None, current_replicas: int,
                  capacity_per_replica: float | None, target_utilization_percent: float, min_replicas: int,
                  max_replicas: int, stabilization_seconds: float, now: datetime) -> ReplicaPlan:
    """Replicas for the pool. `demand_concurrency` = running + waiting requests summed over all replicas."""
    if min_replicas > max_replicas:
        raise ValueError(f"min_replicas must be <= max_replicas (got {min_replicas} > {max_replicas})")
    if demand_concurrency is None or not math.isfinite(demand_concurrency) or demand_concurrency < 0:
        held = min(max(current_replicas, min_replicas), max_replicas)
        return ReplicaPlan(held, None, state, f"metrics missing: holding {held} replicas")
    if not capacity_per_replica or capacity_per_replica <= 0:
        desired = max_replicas
        why = "no concurrency meets the TPOT SLO on one replica: running the maximum"
    else:
        per_replica = capacity_per_replica * target_utilization_percent / 100.0
        desired = min(max(math.ceil(demand_concurrency / per_replica - 1e-9), min_replicas), max_replicas)
        why = (f"{demand_concurrency:.1f} concurrent requests / ({capacity_per_replica:g} per replica x "
               f"{target_utilization_percent:g}%) -> {desired}")
    window_start = now - timedelta(seconds=stabilization_seconds)
    recent = tuple((t, d) for t, d in state.recent if t >= window_start) + ((now, desired),)
    new_state = ReplicaState(_compact(recent))
    if desired >= current_replicas:
        return ReplicaPlan(desired, desired, new_state, f"{why}; scale up at once" if desired > current_replicas
                           else why)
    stabilized = min(max(d for _, d in recent), current_replicas)
    if stabilized > desired:
        return ReplicaPlan(stabilized, desired, new_state,
                           f"{why}; holding {stabilized} until the lower target has held "
                           f"{stabilization_seconds:g}s")
    return ReplicaPlan(desired, desired, new_state, f"{why}; scale down")


MAX_TARGETS = 64
"""Bound on the kept pairs (the oldest go first; they are the first to leave the window anyway)."""


def _compact(recent: tuple[tuple[datetime, int], ...]) -> tuple[tuple[datetime, int], ...]:
    """Drop every pair that a later pair with at least as many replicas covers: while both are in the window
    the later one holds as much, and it leaves the window last."""
    kept: list[tuple[datetime, int]] = []
    for t, d in recent:
        while kept and kept[-1][1] <= d:
            kept.pop()
        kept.append((t, d))
    return tuple(kept[-MAX_TARGETS:])


def demand_at_capacity(demand: float, replicas: int, tpot_ms_at: Callable[[float], float] | None,
                       capacity_per_replica: float | None) -> float:
    """The concurrency today's request rate would reach if every replica ran at capacity (Little's law).

    Concurrency is request rate times latency, and latency grows with the batch: a lightly loaded replica
    finishes requests fast (under speculation about 3x faster than at capacity), so running + waiting seen
    there understates what the same traffic needs at the capacity the planner divides by, and a pool sized
    from it scales in, queues, and scales out again. Scaling by TPOT(capacity) / TPOT(current) puts both in
    the same units; an overloaded pool, or one without a TPOT curve, is taken as seen."""
    if tpot_ms_at is None or not capacity_per_replica or replicas < 1 or not demand > 0:
        return demand
    current = demand / replicas
    if current >= capacity_per_replica:
        return demand
    now_ms, at_capacity_ms = tpot_ms_at(max(current, 1.0)), tpot_ms_at(capacity_per_replica)
    if not (now_ms > 0 and math.isfinite(now_ms) and math.isfinite(at_capacity_ms)):
        return demand
    return demand * max(1.0, at_capacity_ms / now_ms)


def replica_bounds(spec: SpeculativeDeploymentSpec, pool: GpuPool) -> tuple[int, int]:
    """(min, max) replicas of a pool: its own minReplicas/maxReplicas where set, else the deployment's
    spec.serving ones; max is never below min."""
    lo = pool.min_replicas if pool.min_replicas is not None else spec.serving.min_replicas
    hi = pool.max_replicas if pool.max_replicas is not None else spec.serving.max_replicas
    return lo, max(lo, hi)
