"""One reconciliation's decision, pure: `plan_deployment(snapshot) -> plan`.

The snapshot is everything a reconciliation of a SpeculativeDeployment read: its spec and last status, the pools'
nodes and GPU types, the profiles it needs (each as the operator reads it, with its benchmark Job), every pool's
Deployment, fresh observation, price and allocatable GPUs, which routing resources the cluster serves and what the
operator's config names for routing, and the time.
The plan is the next status and the typed actions that make it real: the profiling planner's (`policy.profiling`:
create or restart a profile, record, accept or fail a result, start Jobs within each pool's slots), restart a
profile whose live acceptance drifted, start refinement Jobs, apply each serving pool's Deployment, apply the
routing (per-pool Services or InferencePools and the weighted HTTPRoute) or delete what a change of mode left, and
the Events to announce. It runs the profiling planner, every pool's planner
(`policy.planner.plan_pool`) on the profiles as the profiling plan leaves them, fleet placement across the pools
(`policy.placement`), the route weights (`policy.routing`), the roll-up, the conditions and the cost.

The controller builds the snapshot, calls `plan_deployment`, executes the actions, then `settle`s what only an
executed write can tell (each pool's rollout as of its apply). The simulator runs the same planners on simulated
snapshots. No I/O, no clock, no process memory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime

from ..api.deployment_spec import Autoscaling, Routing, SpeculativeDeploymentSpec
from ..api.deployment_status import PoolStatus, RefinementJob, RoutingStatus, SpeculativeDeploymentStatus
from ..observe.model import PoolObservation
from .conditions import set_condition, truncated_condition
from .deployment import decision_changed, fleet_capacity, summarize
from .events import Event
from .leadtime import measured_lead_time, track_scale_up
from .placement import FleetMember, FleetOutcome, clear_plan, place_fleet, write_plan
from .planner import PoolInputs, PoolOutcome, PoolProfiles, Serve, plan_pool
from .pools import PoolView
from .profiling import Need, ProfilingInputs, ProfilingPlan, Rollup, plan_profiling, rollup
from .rollout import ROLLOUT_STALLED, rolled_out_condition, rolling_out, rollout_state
from .routing import (
    ApplyRouting,
    DeleteRouting,
    RoutingApis,
    RoutingCosts,
    RoutingDefaults,
    RoutingPlan,
    plan_routing,
    resolve_routing,
)
from .slo import deployment_attainment, missed_event, slo_condition

__all__ = ["ApplyDeployment", "ApplyRouting", "DeleteRouting", "DeploymentPlan", "DeploymentSnapshot", "PoolReadings",
           "PoolSnapshot", "RestartProfile", "RoutingApis", "RoutingDefaults", "StartRefinement", "plan_deployment",
           "settle"]


# --- the snapshot ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class PoolReadings:
    """How the pools' observations went, for the MetricsAvailable and MetricsTruncated conditions."""

    problems: list[str]
    fresh: list[str]
    reason: str = "MetricsUnavailable"
    cut: list[str] | None = None
    """What the read bounds left out, when this reconciliation observed (None: it did not)."""


@dataclasses.dataclass(frozen=True)
class PoolSnapshot:
    """One pool as the reconciliation read it."""

    view: PoolView
    current: dict | None = None
    """The pool's Deployment as read (None: none yet)."""
    observation: PoolObservation | None = None
    """A fresh observation of its pods (None: not due, no pod ready, or metrics missing)."""
    price_per_gpu_hour: float = 0.0
    """The pool's own price, else the operator's table, else the catalog's (0: unknown)."""
    gpus_available: int | None = None
    """GPUs its ready nodes can allocate (None: no node says)."""
    refine_jobs: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The state of each Job of its current refinement round that exists."""


@dataclasses.dataclass(frozen=True)
class DeploymentSnapshot:
    spec: SpeculativeDeploymentSpec
    """Valid and within the operator's tenancy bounds (an invalid spec is refused before any plan)."""
    name: str
    uid: str
    generation: int | None
    old: SpeculativeDeploymentStatus
    now: datetime
    pools: Sequence[PoolSnapshot]
    profiling: ProfilingInputs
    """The needed profiles (every pool's, on each of its GPU types), each as the operator reads it, and its Job."""
    profiles: Mapping[str, dict]
    """The namespace's profiles by name, as stored."""
    profile_users: Mapping[str, set[str]] = dataclasses.field(default_factory=dict)
    """Profile name -> uids of the deployments whose status lists it."""
    readings: PoolReadings = dataclasses.field(default_factory=lambda: PoolReadings([], []))
    routing_apis: RoutingApis = RoutingApis()
    """Which routing resources the cluster serves (HTTPRoute, InferencePool)."""
    routing_defaults: RoutingDefaults = RoutingDefaults()
    """The Gateway and endpoint picker the operator's config names for deployments that name none."""
    demand_history: Sequence[tuple[datetime, float]] = ()
    """The deployment's demand (output tokens/s) over the last half hour as its metrics hold it, read only while
    the status keeps no history of its own (a new or adopted deployment, a status lost): the fleet planner's
    forecast starts from it instead of cold."""
    forecast_tokens_per_second: float | None = None
    """A demand forecast the fleet planner is told instead of making its own (the simulator's clairvoyant
    reference; the operator tells it none)."""


# --- the plan -------------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class RestartProfile:
    """Measure a profile again: the live acceptance of the method it measured drifted past the spec's bound."""

    pool: str
    name: str


@dataclasses.dataclass(frozen=True)
class StartRefinement:
    """Create one Job of the pool's current refinement round."""

    pool: str
    need: Need
    job: RefinementJob
    round: int


@dataclasses.dataclass(frozen=True)
class ApplyDeployment:
    """Apply the pool's serving Deployment as planned (`serve.replicas` None: an external autoscaler owns them)."""

    pool: str
    serve: Serve


Action = RestartProfile | StartRefinement | ApplyDeployment | ApplyRouting | DeleteRouting


@dataclasses.dataclass
class DeploymentPlan:
    status: SpeculativeDeploymentStatus
    """The next status; `settle` adds each pool's rollout once its Deployment was applied."""
    actions: list[Action]
    """In the order to execute."""
    events: list[Event]
    routing: RoutingPlan | None
    """The routing status, condition, Event and writes (`policy.routing`)."""
    served: set[str]
    """Pools with a serving Deployment."""
    toggled: dict[str, str] = dataclasses.field(default_factory=dict)
    """Pool -> "on"/"off" where the restart toggle switched speculation."""
    decided: dict[str, str] = dataclasses.field(default_factory=dict)
    """Pool -> its new method ("none": off) where the decision changed."""
    previous: dict[str, PoolStatus] = dataclasses.field(default_factory=dict)
    """Each pool's status before this reconciliation (what `settle` compares the rollout with)."""
    profiling: ProfilingPlan | None = None
    """The profiling planner's actions (create, restart, follow and start Jobs), executed first."""
    states: dict[str, str] = dataclasses.field(default_factory=dict)
    """Profile name -> phase once the plan's actions ran."""
    pool_profiles: dict[str, PoolProfiles] = dataclasses.field(default_factory=dict)
    """Each pool's profiles as its planner decided from them."""

    def of(self, kind: type) -> list:
        return [a for a in self.actions if isinstance(a, kind)]


def plan_deployment(snapshot: DeploymentSnapshot) -> DeploymentPlan:
    """The next status and the actions that make it real (see the module's docstring)."""
    s = snapshot
    # A shallow copy: the plan assigns the status's fields and builds every pool's status anew; it mutates nothing
    # the old status holds (a deep copy of a status with its histories took 4 ms, most of a reconciliation's CPU).
    status = s.old.model_copy(update={"conditions": list(s.old.conditions), "pools": list(s.old.pools)})
    status.conditions = set_condition(status.conditions, "Valid", True, "SpecValid", "spec passed validation",
                                      s.generation, s.now)
    plan = DeploymentPlan(status, [], [], None, set())
    plan.profiling = plan_profiling(s.profiling)
    states = plan.states = dict(plan.profiling.states)
    old_pools = {p.name: p for p in s.old.pools}
    steps: list[tuple[PoolSnapshot, PoolStatus, PoolOutcome]] = []
    for pool in s.pools:
        previous = old_pools.get(pool.view.pool.name) or PoolStatus(name=pool.view.pool.name)
        plan.previous[previous.name] = previous
        steps.append((pool, previous, _plan_pool(s, pool, previous, states, plan)))
    choice = resolve_routing(s.spec, s.routing_apis, s.routing_defaults)
    fleet, costs = _place_fleet(s, steps, choice.mode) if len(s.pools) >= 2 else (None, RoutingCosts())
    status.fleet = fleet.fleet if fleet is not None else None
    if fleet is not None:
        plan.events.extend(fleet.events)
    status.pools = []
    for pool, previous, outcome in steps:
        status.pools.append(outcome.status)
        _track_scale_up(pool, previous, outcome, s.now)
        if outcome.serve is not None:
            plan.served.add(pool.view.pool.name)
            plan.actions.append(ApplyDeployment(pool.view.pool.name, outcome.serve))
        changed = decision_changed(status, previous, outcome.status, s.now)
        if changed is not None:
            plan.events.append(changed)
            decision = outcome.status.decision
            plan.decided[outcome.status.name] = (decision.method if decision else None) or "none"
    planned_weighted = status.fleet is not None and status.fleet.routing == choice.mode.value
    owned = s.old.routing or RoutingStatus()
    plan.routing = plan_routing(choice, s.name, status.pools, plan.served, planned_weighted, owned.http_route,
                                owned.inference_pools, costs, status.conditions, s.old.conditions, s.generation,
                                s.now)
    status.routing, status.conditions = plan.routing.status, plan.routing.conditions
    if status.fleet is not None:
        status.fleet.http_route = status.routing.http_route
    plan.actions.extend(plan.routing.actions)
    plan.events.extend(plan.routing.events)
    counted = rollup(s.profiling.needed, states)
    summarize(status, counted, s.generation)
    _conditions(s, status, counted, plan.events)
    _slo_attained(s, status, plan.events)
    _fleet_capacity(s, status, plan.events)
    return plan


def settle(plan: DeploymentPlan, applied: Mapping[str, dict | None], name: str, generation: int | None,
           now: datetime) -> None:
    """What only an executed write tells: each applied pool's rollout as of its apply (a template just changed
    is RollingOut now, not RolledOut as it was), one RolloutStalled Event when a rollout stalls, and the
    RolledOut condition. `applied`: pool -> its Deployment as the apply returned it (or as read, on a no-op)."""
    for pool in plan.status.pools:
        if pool.name not in applied:
            continue
        pool.rollout, message = rollout_state(applied[pool.name])
        before = plan.previous.get(pool.name)
        if pool.rollout == ROLLOUT_STALLED and (before is None or before.rollout != ROLLOUT_STALLED):
            plan.events.append(Event("Warning", "RolloutStalled", f"pool {pool.name}: {message}"))
    rolled_out = rolled_out_condition(plan.status.pools, name)
    if rolled_out is not None:
        plan.status.conditions = set_condition(plan.status.conditions, "RolledOut", *rolled_out, generation, now)


# --- one pool -------------------------------------------------------------------------------------------------

def _plan_pool(s: DeploymentSnapshot, pool: PoolSnapshot, previous: PoolStatus, states: dict[str, str],
               plan: DeploymentPlan) -> PoolOutcome:
    """The pool's own planner, and its profile restart and refinement Jobs as actions; a restarted profile is
    Pending for the pools planned after it and for the roll-up."""
    view = pool.view
    existing = (pool.current or {}).get("spec", {}).get("replicas")
    profiles = plan.pool_profiles[view.pool.name] = pool_profiles(s.profiling.needed, view, states, s.profiles,
                                                                  s.profile_users, s.uid)
    outcome = plan_pool(PoolInputs(
        spec=s.spec, generation=s.generation, pool=view.pool, sku=view.primary_sku,
        gpu_products=tuple(view.products), nodes=len(view.nodes), previous=previous, profiles=profiles,
        observation=pool.observation, current_replicas=int(existing) if existing is not None else None,
        rolling_out=pool.current is not None and rolling_out(pool.current),
        price_per_gpu_hour=pool.price_per_gpu_hour, now=s.now, refine_jobs=dict(pool.refine_jobs)))
    if outcome.reprofile is not None:
        need = next(n for n in s.profiling.needed if n.pool == view.pool.name and n.sku == view.primary_sku
                    and n.key == outcome.reprofile.method)
        plan.actions.append(RestartProfile(view.pool.name, need.name))
        states[need.name] = "Pending"
    for job in outcome.refine:
        need = next((n for n in s.profiling.needed if n.name == job.profile), None)
        if need is not None and job.profile in s.profiles:
            plan.actions.append(StartRefinement(view.pool.name, need, job, outcome.status.refinement.round))
    plan.events.extend(outcome.events)
    if outcome.toggled:
        plan.toggled[view.pool.name] = outcome.toggled
    return outcome


def pool_profiles(needed: Sequence[Need], view: PoolView, states: Mapping[str, str], profiles: Mapping[str, dict],
                  users: Mapping[str, set[str]], uid: str) -> PoolProfiles:
    """The planner's view of the pool's profiles: the Succeeded ones on its GPU type, as stored (the planner
    validates them only when it decides from them)."""
    pool_needed = [n for n in needed if n.pool == view.pool.name]
    bodies, shared = {}, set()
    for need in pool_needed:
        body = profiles.get(need.name)
        if need.sku != view.primary_sku or states.get(need.name) != "Succeeded" or body is None:
            continue
        # the phase the operator decided (states), not the stored one: its own write may not have reached the
        # index yet, and status.phase is writable by the benchmark identity
        bodies[need.key] = {**body, "status": {**(body.get("status") or {}), "phase": "Succeeded"}}
        if need.candidate is not None and users.get(need.name, set()) - {uid}:
            shared.add(need.key)
    counted = rollup(pool_needed, states)
    return PoolProfiles(
        bodies=bodies, shared=frozenset(shared), ready=counted.ready, total=counted.total, failed=counted.failed,
        names=tuple(sorted({n.name for n in pool_needed})))


def _track_scale_up(pool: PoolSnapshot, previous: PoolStatus, outcome: PoolOutcome, now: datetime) -> None:
    """The pool's scale-up lead time (`policy.leadtime`): the replicas this plan asks for (an external autoscaler's,
    as its Deployment says) against those ready."""
    current = pool.current or {}
    asked = outcome.serve.replicas if outcome.serve is not None else None
    if asked is None and outcome.serve is not None:
        asked = (current.get("spec") or {}).get("replicas")
    ready = int((current.get("status") or {}).get("readyReplicas") or 0)
    track_scale_up(outcome.status, previous, int(asked) if asked is not None else None, ready, now)


# --- the fleet ------------------------------------------------------------------------------------------------

def _place_fleet(s: DeploymentSnapshot, steps: list[tuple[PoolSnapshot, PoolStatus, PoolOutcome]],
                 routing: Routing) -> tuple[FleetOutcome | None, RoutingCosts]:
    """Fleet placement across the pools (`policy.placement`) under `routing`: the plan's replicas replace each placed
    pool's own (internal autoscaling writes them; external publishes them in desiredReplicas). With a placement, the
    same fleet is placed under the other kind of routing too (weighted or the one Service), for what weighted routing
    saves (status.routing); nothing of that second placement is written."""
    members = []
    for pool, previous, outcome in steps:
        current = pool.current or {}
        replicas = (current.get("spec") or {}).get("replicas")
        # A pool whose Deployment does not exist yet (a GPU type that just joined) serves nothing: 0 ready, not
        # unknown, or its replicas would take a share of the Service's traffic before any pod of it is ready.
        ready = (current.get("status") or {}).get("readyReplicas")
        serve = outcome.serve
        members.append(FleetMember(
            spec=pool.view.pool, status=outcome.status, previous=previous,
            price_per_gpu_hour=pool.price_per_gpu_hour, gpus_available=pool.gpus_available,
            lead_time_seconds=measured_lead_time(previous),
            current_replicas=int(replicas) if replicas is not None else None, ready_replicas=int(ready or 0),
            per_pool_replicas=serve.replicas if serve is not None and serve.replicas is not None
            else outcome.status.desired_replicas))
    outcome_ = place_fleet(s.spec, members, s.old.fleet, s.now, routing, s.demand_history,
                           s.forecast_tokens_per_second)
    costs = RoutingCosts()
    if outcome_ is not None and outcome_.plan is not None:
        other = place_fleet(s.spec, members, s.old.fleet, s.now,
                            Routing.SERVICE if routing.weighted else Routing.GATEWAY, s.demand_history,
                            s.forecast_tokens_per_second)
        other_cost = other.plan.cost_per_mtok if other is not None and other.plan is not None else None
        mine = outcome_.plan.cost_per_mtok
        costs = RoutingCosts(service=other_cost, weighted=mine) if routing.weighted \
            else RoutingCosts(service=mine, weighted=other_cost)
    external = s.spec.serving.autoscaling == Autoscaling.EXTERNAL.value
    for _, _, outcome in steps:
        if outcome_ is None or outcome_.plan is None or outcome.serve is None:
            clear_plan(outcome.status)
            floor = outcome_.replicas.get(outcome.status.name) if outcome_ is not None else None
            if floor and outcome.serve is not None:  # a fleet at zero serves from one replica
                outcome.status.desired_replicas = max(outcome.status.desired_replicas or 0, floor)
                if not external:
                    outcome.serve = dataclasses.replace(outcome.serve, replicas=outcome.status.desired_replicas)
                    outcome.status.replicas = outcome.status.desired_replicas
            continue
        replicas = write_plan(outcome.status, outcome_.plan, external)
        outcome.serve = dataclasses.replace(outcome.serve, replicas=None if external else replicas)
    return outcome_, costs


# --- conditions -----------------------------------------------------------------------------------------------

def _was(old: SpeculativeDeploymentStatus, type_: str, value: str, reason: str | None = None) -> bool:
    return any(c.type == type_ and c.status == value and (reason is None or c.reason == reason)
               for c in old.conditions)


def _conditions(s: DeploymentSnapshot, status: SpeculativeDeploymentStatus, counted: Rollup,
                events: list[Event]) -> None:
    """Profiled, NodesAvailable, Serving, MetricsAvailable and MetricsTruncated, with their Events."""
    def set_(type_: str, ok: bool, reason: str, message: str) -> None:
        status.conditions = set_condition(status.conditions, type_, ok, reason, message, s.generation, s.now)

    set_("Profiled", *counted.profiled, status.progress)
    no_nodes = [p.view.pool.name for p in s.pools if not p.view.nodes]
    set_("NodesAvailable", not no_nodes, "PoolsWithoutNodes" if no_nodes else "NodesFound",
         f"no nodes match the nodeSelector of pool(s) {', '.join(no_nodes)}: check spec.gpuPools[].nodeSelector"
         if no_nodes else "every pool has matching nodes")
    if no_nodes and not _was(s.old, "NodesAvailable", "False"):
        events.append(Event("Warning", "NoNodes", f"no nodes match pool(s) {', '.join(no_nodes)}"))
    serving = [p.name for p in status.pools if p.decision is not None]
    set_("Serving", bool(serving), "Deployed" if serving else "Waiting",
         f"serving pools: {', '.join(serving)}" if serving else "no pool has a GPU type yet")
    metrics = s.readings
    if metrics.problems:
        set_("MetricsAvailable", False, metrics.reason,
             "; ".join(metrics.problems) + ": holding the last decision and replica count")
        if not _was(s.old, "MetricsAvailable", "False", metrics.reason):
            events.append(Event("Warning", metrics.reason, "; ".join(metrics.problems)))
    elif metrics.fresh:
        set_("MetricsAvailable", True, "MetricsFresh", f"load observed for pool(s) {', '.join(metrics.fresh)}")
    truncated = truncated_condition(metrics.cut, s.old.conditions) if metrics.cut is not None else None
    if truncated is not None:
        set_("MetricsTruncated", *truncated)
        if truncated[0] and not _was(s.old, "MetricsTruncated", "True"):
            events.append(Event("Warning", "MetricsTruncated", truncated[2]))


def _slo_attained(s: DeploymentSnapshot, status: SpeculativeDeploymentStatus, events: list[Event]) -> None:
    """The deployment's measured SLO attainment (policy.slo): status, condition SloAttained, and one Warning Event
    when it starts missing its target."""
    status.slo_attainment = deployment_attainment(status.pools, s.spec.policy)
    ok, reason, message = slo_condition(status.slo_attainment, s.spec.policy.slo_attainment_percent,
                                        s.spec.metrics.window_seconds)
    status.conditions = set_condition(status.conditions, "SloAttained", ok, reason, message, s.generation, s.now)
    event = missed_event(_was(s.old, "SloAttained", "False"), ok is False, message)
    if event is not None:
        events.append(event)


def _fleet_capacity(s: DeploymentSnapshot, status: SpeculativeDeploymentStatus, events: list[Event]) -> None:
    """Condition FleetCapacity and its Event (policy.deployment.fleet_capacity); dropped without a placement."""
    condition, event = fleet_capacity(status, _was(s.old, "FleetCapacity", "False"))
    if condition is None:
        status.conditions = [c for c in status.conditions if c.type != "FleetCapacity"]
        return
    status.conditions = set_condition(status.conditions, "FleetCapacity", *condition, s.generation, s.now)
    if event is not None:
        events.append(event)
