"""Fleet routing as traffic weights (pure): what the deployment's HTTPRoute sends to each serving pool."""

from __future__ import annotations

from ..api.deployment_status import PoolStatus
from .fleet import route_weights

__all__ = ["route_backends"]


def route_backends(pools: list[PoolStatus], weighted: bool, served: set[str]) -> dict[str, int]:
    """backendRefs weight per pool that has a serving Deployment (`served`): the planned shares (`weighted`: the
    fleet was planned under gateway routing), else an even split per replica, as the one Service would give;
    equal weights when no replica runs (an HTTPRoute whose weights are all 0 answers every request with an
    error)."""
    serving = [p for p in pools if p.name in served]
    if not serving:
        return {}
    weights = route_weights({p.name: p.traffic_share or 0.0 for p in serving}) if weighted else {}
    if not any(weights.values()):
        weights = route_weights({p.name: float(p.replicas or p.desired_replicas or 0) for p in serving})
    if not any(weights.values()):
        weights = route_weights({p.name: 1.0 for p in serving})
    return weights
