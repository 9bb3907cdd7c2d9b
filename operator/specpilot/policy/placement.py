"""Fleet placement of one SpeculativeDeployment: its pools' statuses in, the fleet planner's plan back into them.

The operator's reconciliation plans every pool first (`policy.planner.plan_pool`: decision, schedule, today's
per-pool replicas), then, for a deployment with two or more pools, calls `place_fleet`, which builds the fleet
planner's inputs (`policy.fleet`) from what the pools' statuses hold: the TPOT curve of each decision under its
schedule (`decision.tpotCurve`) and its SLO-feasible concurrency, the price, the GPUs the pool's nodes have,
the replicas running and ready, and the deployment's demand (the pools' observed output tokens/s and requests
in flight), its demand history (status.fleet.demandHistory) and each pool's recent replica changes and
scale-up lead time. The plan's replicas replace the per-pool ones (internal autoscaling writes them, external only
publishes them in desiredReplicas), and each pool's status shows its share, load, $/Mtok and why.

A pool without a curve yet (not profiled) keeps today's per-pool replicas. Without any observed load, or with a
pool whose price is unknown, nothing is placed and the fleet's reason says why. Pure: no I/O, no clock.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime

from ..api.deployment_spec import Autoscaling, GpuPool, SpeculativeDeploymentSpec
from ..api.deployment_status import MAX_FLEET_CHANGES, DemandSample, FleetStatus, PoolStatus, ReplicaTarget
from .events import Event
from .replicas import ReplicaState, replica_bounds
from .fleet import (
    SHARE_MOVE,
    CurvePoint,
    FleetDemand,
    FleetPlan,
    FleetPool,
    FleetSettings,
    FleetState,
    Routing,
    history_from,
    plan_fleet,
)

__all__ = ["FleetMember", "FleetOutcome", "clear_plan", "fleet_demand", "place_fleet", "pool_curve", "write_plan"]


@dataclasses.dataclass(frozen=True)
class FleetMember:
    """One pool of the deployment as the reconciliation found it, after its own planner ran."""

    spec: GpuPool
    status: PoolStatus
    """The pool's status after its own planner (decision, capacity, observed load)."""
    previous: PoolStatus | None
    """The pool's status before this reconciliation: the fleet's share, target and window it remembers."""
    price_per_gpu_hour: float
    gpus_available: int | None
    """Allocatable GPUs on the pool's nodes (None: unknown)."""
    current_replicas: int | None
    ready_replicas: int | None
    per_pool_replicas: int | None
    """What the pool's own planner would run (today's behaviour): kept for a pool without a curve."""
    lead_time_seconds: float | None = None
    """The pool's scale-up lead time, pod created -> ready, as measured from its pods (None: the planner's
    default, policy.fleet.DEFAULT_LEAD_TIME_S)."""


@dataclasses.dataclass
class FleetOutcome:
    fleet: FleetStatus
    replicas: dict[str, int]
    """Replicas per placed pool (empty: nothing placed, every pool keeps its own planner's). Without a plan: the
    replicas a pool runs at least while a fleet at zero waits for load metrics (`_serving_floor`)."""
    events: list[Event] = dataclasses.field(default_factory=list)
    """(type, reason, message) to announce."""
    plan: FleetPlan | None = None


def fleet_demand(statuses: Sequence[PoolStatus]) -> FleetDemand | None:
    """The deployment's demand from its pools' last observations: output tokens/s summed, requests in flight
    (running + waiting over the pods reporting) summed; None when no pool has been observed."""
    tokens, in_flight, seen = 0.0, 0.0, False
    for pool in statuses:
        observed = pool.observed
        if observed is None:
            continue
        if observed.generation_tokens_per_second is not None:
            tokens += max(observed.generation_tokens_per_second, 0.0)
            seen = True
        if observed.requests_in_flight is not None:
            in_flight += max(observed.requests_in_flight, 0.0)
            seen = True
    return FleetDemand(tokens, in_flight) if seen else None


def _observed(status: PoolStatus) -> dict:
    """What the pool's metrics show the fleet planner: requests in flight (a backlog takes less new traffic),
    running requests per replica and p95 TPOT (the curve's calibration)."""
    observed = status.observed
    if observed is None:
        return {}
    return {"requests_in_flight": observed.requests_in_flight, "observed_concurrency": observed.concurrency,
            "observed_tpot_p95_ms": observed.tpot_p95_ms}


def pool_curve(status: PoolStatus) -> tuple[CurvePoint, ...]:
    """The TPOT curve the pool's decision holds under its schedule (empty: no decision from profiles yet)."""
    decision = status.decision
    if decision is None or decision.source in ("none", "prior") or not status.capacity_concurrency_per_replica:
        return ()
    points, last = [], 0.0
    for point in decision.tpot_curve:
        if point.concurrency > last and point.ms > 0:
            points.append(CurvePoint(float(point.concurrency), float(point.ms)))
            last = point.concurrency
    return tuple(points)


def place_fleet(spec: SpeculativeDeploymentSpec, members: Sequence[FleetMember], previous: FleetStatus | None,
                now: datetime, routing: Routing = Routing.SERVICE,
                seed: Sequence[tuple[datetime, float]] = (), forecast: float | None = None) -> FleetOutcome | None:
    """The fleet's placement, or None when the deployment has fewer than two pools with a GPU type or its
    replicas are fixed (serving.autoscaling: none). `routing`: how the shares can be made real (gateway: the
    operator's HTTPRoute applies any split; service: one Service, an even split per pod). `seed`: the demand
    the metrics held before (time, tokens/s), the history to forecast from while the status keeps none.
    `forecast`: the demand (tokens/s) to plan for, told instead of forecast (None: forecast from the history)."""
    members = [m for m in members if m.status.sku is not None]
    if len(members) < 2 or spec.serving.autoscaling == Autoscaling.NONE.value:
        return None
    unpriced = [m.spec.name for m in members if not m.price_per_gpu_hour > 0]
    if unpriced:
        return FleetOutcome(_stamped(FleetStatus(
            reason=f"no price for pool(s) {', '.join(unpriced)}: set spec.gpuPools[].pricePerGpuHour (or the "
                   f"operator's gpuPricesPerHour); each pool scales on its own meanwhile",
            demand_history=_kept_history(previous)), previous, now), {})
    # A pool with no replica ready serves nothing now: the load its status last showed is not demand any more.
    demand = fleet_demand([m.status for m in members if m.ready_replicas != 0])
    if demand is None:
        floor = _serving_floor(spec, members)
        reason = "waiting for load metrics: each pool scales on its own meanwhile"
        if floor:
            reason = (f"waiting for load metrics: no pool runs a replica, so one runs on {next(iter(floor))} (the "
                      f"cheapest profiled) to serve and be observed; the others scale on their own meanwhile")
        return FleetOutcome(_stamped(FleetStatus(reason=reason, demand_history=_kept_history(previous)),
                                     previous, now), floor)
    if forecast is not None:
        demand = dataclasses.replace(demand, forecast_tokens_per_second=max(float(forecast), 0.0))
    gpus_per_replica = spec.model.tensor_parallel_size * spec.model.data_parallel_size
    pools, state_targets, incumbent, shares, changes, scales = [], {}, {}, {}, {}, {}
    for m in members:
        lo, hi = replica_bounds(spec, m.spec)
        current = m.current_replicas if m.current_replicas is not None else lo
        pools.append(FleetPool(
            m.spec.name, m.price_per_gpu_hour, gpus_per_replica, lo, hi, pool_curve(m.status),
            m.status.capacity_concurrency_per_replica, gpus_available=m.gpus_available,
            current_replicas=current, ready_replicas=m.ready_replicas,
            held_replicas=m.per_pool_replicas if m.per_pool_replicas is not None else current,
            lead_time_seconds=m.lead_time_seconds, **_observed(m.status)))
        before = m.previous or PoolStatus(name=m.spec.name)
        state_targets[m.spec.name] = ReplicaState(tuple((t.time, t.replicas) for t in before.fleet_targets))
        if before.fleet_target_replicas is not None:
            incumbent[m.spec.name] = before.fleet_target_replicas
        if before.traffic_share is not None:
            shares[m.spec.name] = before.traffic_share
        if before.fleet_changes:
            changes[m.spec.name] = tuple(before.fleet_changes)
        if before.fleet_tpot_scale is not None:
            scales[m.spec.name] = before.fleet_tpot_scale
    settings = FleetSettings(
        routing=routing, tpot_slo_ms=spec.policy.tpot_slo_ms, ttft_slo_ms=spec.policy.ttft_slo_ms,
        target_utilization_percent=spec.serving.target_utilization_percent,
        min_gain_percent=spec.policy.min_gain_percent,
        scale_down_stabilization_seconds=spec.serving.scale_down_stabilization_seconds,
        slo_attainment_percent=spec.policy.slo_attainment_percent)
    # The incumbent is kept only when every placed pool has one (a new pool re-plans the whole fleet).
    planned_names = {p.name for p in pools if p.curve}
    history = tuple((h.time, h.tokens_per_second) for h in previous.demand_history) if previous else ()
    if not history and seed:
        history = history_from([(t, d) for t, d in seed if t < now], settings)
    state = FleetState(targets=state_targets,
                       replicas=incumbent if planned_names <= set(incumbent) else {}, shares=shares,
                       history=history, changes=changes, tpot_scale=scales)
    plan = plan_fleet(pools, demand, settings, state, now)
    events = []
    moved_at = previous.shares_moved_at if previous else None
    if plan.shares_moved:
        moved_at = now
        words = ", ".join(f"{p.name} {shares.get(p.name, 0.0):.0%} -> {p.share:.0%}" for p in plan.pools
                          if abs(p.share - shares.get(p.name, 0.0)) >= SHARE_MOVE)
        events.append(Event("Normal", "FleetSharesMoved", f"{words}: {plan.reason}"))
    fleet = FleetStatus(routing=plan.routing.value, demand_tokens_per_second=round(plan.demand_tokens_per_second, 3),
                        cost_per_mtok=round(plan.cost_per_mtok, 4) if plan.cost_per_mtok is not None else None,
                        slo_feasible=plan.slo_feasible, reason=plan.reason, shares_moved_at=moved_at,
                        **_forecast_fields(plan))
    return FleetOutcome(_stamped(fleet, previous, now), {p.name: p.replicas for p in plan.pools}, events, plan)


def _serving_floor(spec: SpeculativeDeploymentSpec, members: Sequence[FleetMember]) -> dict[str, int]:
    """With no load observed and no pool running a replica (every pool may scale to zero), one replica on the
    profiled pool of the lowest price per replica, so the deployment serves and its load can be observed: the
    fleet is placed on metrics, and a fleet at zero has none. Empty while any pool runs, or none is profiled."""
    if any(m.current_replicas or m.ready_replicas for m in members):
        return {}
    profiled = [m for m in members if pool_curve(m.status) and replica_bounds(spec, m.spec)[1] >= 1
                and m.gpus_available != 0]
    if not profiled:
        return {}
    cheapest = min(profiled, key=lambda m: m.price_per_gpu_hour)
    return {cheapest.spec.name: 1}


def _forecast_fields(plan: FleetPlan) -> dict:
    forecast = plan.forecast
    if forecast is None:
        return {}
    return {"forecast_tokens_per_second": round(forecast.tokens_per_second, 3),
            "headroom_percent": round(forecast.headroom * 100, 1), "lead_time_seconds": forecast.lead_s,
            "demand_history": [DemandSample(time=t, tokens_per_second=round(d, 3)) for t, d in plan.state.history]}


def _kept_history(previous: FleetStatus | None) -> list:
    """The demand history through a placement that cannot run (no load metrics, a pool without a price): kept, so
    a metrics outage does not make the next forecast start cold."""
    return list(previous.demand_history) if previous is not None else []


def _stamped(fleet: FleetStatus, previous: FleetStatus | None, now: datetime) -> FleetStatus:
    """`fleet` with `plannedAt`: when the placement last changed. An unchanged placement keeps the previous time,
    so a reconciliation that changes nothing writes no status (and sends no watch event to every watcher)."""
    if previous is not None and previous.planned_at is not None and \
            all(getattr(previous, name) == getattr(fleet, name) for name in _PLANNED_FIELDS):
        return fleet.model_copy(update={"planned_at": previous.planned_at})
    return fleet.model_copy(update={"planned_at": now})


_PLANNED_FIELDS = ("routing", "demand_tokens_per_second", "forecast_tokens_per_second", "headroom_percent",
                   "cost_per_mtok", "slo_feasible", "reason", "shares_moved_at")
"""The fields of FleetStatus that place_fleet decides (the rest is written by the operator around it)."""


def write_plan(status: PoolStatus, plan: FleetPlan, external: bool) -> int:
    """The pool's placement into its status; returns the replicas to run (`desiredReplicas` when external)."""
    placed = plan.pool(status.name)
    status.traffic_share = round(placed.share, 4)
    status.fleet_target_replicas = placed.target if placed.planned else None
    status.load_tokens_per_second = round(placed.load_tokens_per_second, 3)
    status.cost_per_mtok = round(placed.cost_per_mtok, 4) if placed.cost_per_mtok is not None else None
    status.full = placed.full
    status.fleet_reason = placed.reason
    targets = plan.state.targets.get(status.name)
    status.fleet_targets = [ReplicaTarget(time=t, replicas=n) for t, n in targets.recent] if targets else []
    status.fleet_changes = list(plan.state.changes.get(status.name, ()))[-MAX_FLEET_CHANGES:]
    scale = plan.state.tpot_scale.get(status.name)
    status.fleet_tpot_scale = round(scale, 4) if scale is not None else None
    status.desired_replicas = placed.replicas
    if not external:
        status.replicas = placed.replicas
    return placed.replicas


def clear_plan(status: PoolStatus) -> None:
    """A pool no longer placed (one pool left, or nothing to place on): today's per-pool fields only."""
    status.traffic_share = status.fleet_target_replicas = status.load_tokens_per_second = None
    status.cost_per_mtok = status.full = None
    status.fleet_reason = ""
    status.fleet_targets = []
    status.fleet_changes = []
    status.fleet_tpot_scale = None
