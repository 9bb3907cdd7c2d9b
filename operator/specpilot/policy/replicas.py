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
from datetime import datetime, timedelta

__all__ = ["ReplicaPlan", "ReplicaState", "plan_replicas"]


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
