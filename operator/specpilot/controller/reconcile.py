"""One reconciliation of a SpeculativeDeployment: read the cluster, call the pure planners, execute.

Level-triggered: the same function runs on create/update/resume and on a timer, and converges from
whatever it finds (all decision state lives in the resource's status and the objects it owns), so a
restarted operator resumes where it stopped without duplicating Jobs. The rules live in `policy.planner`
(one pool's next status, what to serve, what to announce); this module gathers its inputs, applies what it
returns, and assembles the deployment's conditions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from ..api.base import format_validation_error
from ..api.gateway import gateway_problems
from ..api.deployment_spec import Autoscaling, Routing, SpeculativeDeploymentSpec
from ..api.deployment_status import Phase, PoolStatus, SpeculativeDeploymentStatus
from ..api.tenancy import TenancyViolation, refuse, spec_problems
from ..manifests import names
from ..manifests.serving import serving_deployment
from ..observe.model import MetricsUnavailable
from ..perf.catalog import GpuCatalog
from ..policy.placement import FleetMember, FleetOutcome, clear_plan, place_fleet, write_plan
from ..policy.events import Event
from ..policy.deployment import decision_changed, fleet_capacity, summarize
from ..policy.profiling import Rollup, rollup
from ..policy.slo import deployment_attainment, judged, missed_event, slo_condition
from ..policy.planner import PoolInputs, PoolOutcome, PoolProfiles, plan_pool, profiled_acceptance
from ..policy.conditions import set_condition, truncated_condition
from ..policy.needs import engine_image, needed_profiles
from ..policy.pools import PoolView, node_info, pool_views
from ..policy.profiling import Need
from ..policy.rollout import ROLLOUT_STALLED, rolled_out_condition, rolling_out, rollout_state
from .context import Context
from .kube import NotFound
from .observation import observe_pool, prometheus_url_refusal
from .profile_index import NOT_INDEXED
from .routing import read_route, reconcile_routing, reconcile_service
from .profiles import (
    JOB_UID_ANNOTATION,
    REPROFILE_ANNOTATION,
    ensure_bench_identity,
    job_state,
    reconcile_profiles,
    restart_profile,
    start_refinement,
)

__all__ = ["JOB_UID_ANNOTATION", "REPROFILE_ANNOTATION", "Context", "Event", "PoolReadings", "PoolStep", "Result",
           "apply_pool_step", "plan_pool_step", "reconcile", "reconcile_pool"]


@dataclass
class Result:
    status: dict[str, Any]
    events: list[Event]


@dataclass
class PoolReadings:
    """How the pools' observations went, for the MetricsAvailable and MetricsTruncated conditions."""

    problems: list[str]
    fresh: list[str]
    reason: str = "MetricsUnavailable"
    cut: list[str] | None = None
    """What the read bounds left out, when this reconciliation observed (None: it did not)."""


def _now() -> datetime:
    return datetime.now(tz=UTC).replace(microsecond=0)


def _status_model(body: dict) -> SpeculativeDeploymentStatus:
    try:
        return SpeculativeDeploymentStatus.model_validate(body.get("status") or {})
    except ValidationError:
        return SpeculativeDeploymentStatus()


async def reconcile(ctx: Context, body: dict, nodes: list[dict], profiles: dict[str, dict],
                    jobs: dict[str, dict], observe: bool = True,
                    profile_users: dict[str, set[str]] | None = None,
                    deployments: Mapping[str, dict] | None = None) -> Result:
    """`profiles`: the namespace's profiles by name; `jobs`: specpilot's Jobs by "namespace/name";
    `profile_users`: profile name -> uids of the deployments whose status lists it; `deployments`: the serving
    Deployments by "namespace/name" as the watch shows them (None: each is read from the API server)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    generation = meta.get("generation")
    now = _now()
    old = _status_model(body)
    events: list[Event] = []
    try:
        spec = _valid_spec(ctx, body.get("spec") or {}, namespace)
    except (ValidationError, TenancyViolation) as exc:
        return _invalid(old, exc, generation, now)

    status = old.model_copy(deep=True)
    status.conditions = set_condition(status.conditions, "Valid", True, "SpecValid",
                                              "spec passed validation", generation, now)
    views = pool_views(spec, [node_info(n) for n in nodes], ctx.catalog)
    needed = needed_profiles(spec, views, ctx.config)
    reprofile = (meta.get("annotations") or {}).get(REPROFILE_ANNOTATION)
    await ensure_bench_identity(ctx, namespace)
    states = await reconcile_profiles(ctx, spec, namespace, name, needed, profiles, jobs, reprofile, now, events)

    url_refused = prometheus_url_refusal(ctx, spec)
    metrics = PoolReadings([url_refused] if url_refused else [], [],
                       "PrometheusUrlNotAllowed" if url_refused else "MetricsUnavailable")
    old_pools = {p.name: p for p in old.pools}
    status.pools = []
    steps = []
    for view in views:
        pool_old = old_pools.get(view.pool.name) or PoolStatus(name=view.pool.name)
        steps.append((view, pool_old, await plan_pool_step(
            ctx, body, spec, view, needed, states, profiles, jobs, {} if profile_users is None else profile_users,
            pool_old, now, events, observe and not url_refused, metrics, deployments)))
    route = await read_route(ctx, spec, namespace, name)
    fleet = _place_fleet(ctx, spec, steps, nodes, old, now, events,
                         Routing.GATEWAY if route.available else Routing.SERVICE) if len(views) >= 2 else None
    status.fleet = fleet.fleet if fleet is not None else None
    for view, pool_old, step in steps:
        pool = await apply_pool_step(ctx, body, spec, view, pool_old, step, events)
        status.pools.append(pool)
        _decision_changed(ctx, status, pool_old, pool, namespace, name, now, events)
    ctx.metrics.record_fleet(namespace, name, status.pools, status.fleet.cost_per_mtok if status.fleet else None)
    await reconcile_service(ctx, body, spec)
    served = {view.pool.name for view, _, step in steps if step.outcome.serve is not None}
    await reconcile_routing(ctx, body, spec, status, old, route, served, generation, now, events)

    counted = rollup(needed, states)
    summarize(status, counted, generation)
    _conditions(ctx, status, old, views, counted.ready, len(needed), counted.failed, metrics, namespace, name,
                generation, now, events)
    _slo_attained(ctx, spec, status, old, namespace, name, generation, now, events)
    _fleet_capacity(status, old, generation, now, events)
    return Result(status.dump(), events)


def _decision_changed(ctx: Context, status: SpeculativeDeploymentStatus, old: PoolStatus, pool: PoolStatus,
                      namespace: str, name: str, now: datetime, events: list[Event]) -> None:
    """A new method or schedule: the history and the Event (policy.deployment), and the decisions counter."""
    changed = decision_changed(status, old, pool, now)
    if changed is not None:
        events.append(changed)
        method = pool.decision.method if pool.decision else None
        ctx.metrics.decisions.labels(namespace, name, pool.name, method or "none").inc()


def _fleet_capacity(status: SpeculativeDeploymentStatus, old: SpeculativeDeploymentStatus, generation: int | None,
                    now: datetime, events: list[Event]) -> None:
    """Condition FleetCapacity and its Event (policy.deployment.fleet_capacity); dropped without a placement."""
    was_short = any(c.type == "FleetCapacity" and c.status == "False" for c in old.conditions)
    condition, event = fleet_capacity(status, was_short)
    if condition is None:
        status.conditions = [c for c in status.conditions if c.type != "FleetCapacity"]
        return
    status.conditions = set_condition(status.conditions, "FleetCapacity", *condition, generation, now)
    if event is not None:
        events.append(event)


def _slo_attained(ctx: Context, spec: SpeculativeDeploymentSpec, status: SpeculativeDeploymentStatus,
                  old: SpeculativeDeploymentStatus, namespace: str, name: str, generation: int | None,
                  now: datetime, events: list[Event]) -> None:
    """The deployment's measured SLO attainment (policy.slo): status, condition SloAttained, one Warning Event
    when it starts missing its target, and the gauges the alert reads."""
    status.slo_attainment = deployment_attainment(status.pools, spec.policy)
    ok, reason, message = slo_condition(status.slo_attainment, spec.policy.slo_attainment_percent,
                                        spec.metrics.window_seconds)
    was_missed = any(c.type == "SloAttained" and c.status == "False" for c in old.conditions)
    status.conditions = set_condition(status.conditions, "SloAttained", ok, reason, message, generation, now)
    event = missed_event(was_missed, ok is False, message)
    if event is not None:
        events.append(event)
    # The gauges carry only a judged figure: a window of a few requests would fire the alert on noise.
    ctx.metrics.record_slo(namespace, name, judged(status.slo_attainment), spec.policy.slo_attainment_percent)


def _valid_spec(ctx: Context, raw: dict, namespace: str) -> SpeculativeDeploymentSpec:
    """The spec, typed and within the admin's tenancy bounds and Gateway allow-list (raises what it breaks)."""
    spec = SpeculativeDeploymentSpec.model_validate(raw)
    refuse(spec_problems(spec, ctx.config.tenancy, benchmark_image=ctx.config.benchmark_image)
           + gateway_problems(spec, namespace, ctx.config.allowed_gateway_parents))
    return spec


def _invalid(old: SpeculativeDeploymentStatus, exc: Exception, generation: int | None, now: datetime) -> Result:
    """An invalid spec: a Valid=False condition naming the field and the fix, phase Failed, one Event per
    new message; nothing it owns is touched."""
    message = format_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
    status = old.model_copy()
    already = any(c.type == "Valid" and c.status == "False" and c.observed_generation == generation
                  and c.message == message for c in old.conditions)
    status.conditions = set_condition(status.conditions, "Valid", False, "InvalidSpec", message,
                                              generation, now)
    status.phase = Phase.FAILED
    status.observed_generation = generation
    return Result(status.dump(), [] if already else [Event("Warning", "InvalidSpec", message)])


def _conditions(ctx: Context, status: SpeculativeDeploymentStatus, old: SpeculativeDeploymentStatus,
                views: list[PoolView], ready: int, total: int, failed: int, metrics: PoolReadings,
                namespace: str, name: str, generation: int | None, now: datetime, events: list[Event]) -> None:
    def set_(type_: str, ok: bool, reason: str, message: str) -> None:
        status.conditions = set_condition(status.conditions, type_, ok, reason, message, generation, now)

    def was(type_: str, value: str, reason: str | None = None) -> bool:
        return any(c.type == type_ and c.status == value and (reason is None or c.reason == reason)
                   for c in old.conditions)

    set_("Profiled", *Rollup(ready, total, failed).profiled, status.progress)
    no_nodes = [v.pool.name for v in views if not v.nodes]
    set_("NodesAvailable", not no_nodes, "PoolsWithoutNodes" if no_nodes else "NodesFound",
         f"no nodes match the nodeSelector of pool(s) {', '.join(no_nodes)}: check spec.gpuPools[].nodeSelector"
         if no_nodes else "every pool has matching nodes")
    if no_nodes and not was("NodesAvailable", "False"):
        events.append(Event("Warning", "NoNodes", f"no nodes match pool(s) {', '.join(no_nodes)}"))
    serving = [p.name for p in status.pools if p.decision is not None]
    set_("Serving", bool(serving), "Deployed" if serving else "Waiting",
         f"serving pools: {', '.join(serving)}" if serving else "no pool has a GPU type yet")
    rolled_out = rolled_out_condition(status.pools, name)
    if rolled_out is not None:
        set_("RolledOut", *rolled_out)
    if metrics.problems:
        set_("MetricsAvailable", False, metrics.reason,
             "; ".join(metrics.problems) + ": holding the last decision and replica count")
        ctx.metrics.metrics_available.labels(namespace, name).set(0)
        if not was("MetricsAvailable", "False", metrics.reason):
            events.append(Event("Warning", metrics.reason, "; ".join(metrics.problems)))
    elif metrics.fresh:
        set_("MetricsAvailable", True, "MetricsFresh", f"load observed for pool(s) {', '.join(metrics.fresh)}")
        ctx.metrics.metrics_available.labels(namespace, name).set(1)
    truncated = truncated_condition(metrics.cut, old.conditions) if metrics.cut is not None else None
    if truncated is not None:
        set_("MetricsTruncated", *truncated)
        if truncated[0] and not was("MetricsTruncated", "True"):
            events.append(Event("Warning", "MetricsTruncated", truncated[2]))


def _pool_profiles(needed: list[Need], view: PoolView, states: dict[str, str],
                   profiles: Mapping[str, dict], users: dict[str, set[str]], uid: str) -> PoolProfiles:
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


async def reconcile_pool(ctx: Context, body: dict, spec: SpeculativeDeploymentSpec, view: PoolView,
                          needed: list[Need], states: dict[str, str], profiles: dict[str, dict],
                          jobs: dict[str, dict], users: dict[str, set[str]], old: PoolStatus, now: datetime,
                          events: list[Event], observe: bool, metrics: PoolReadings) -> PoolStatus:
    """One pool: gather its inputs (its Deployment, a due observation, its validated profiles, its refinement
    Jobs), plan (`policy.planner.plan_pool`), and execute the plan: re-measure a drifted profile, start
    refinement Jobs, apply the Deployment, count. The executor the simulator's agreement test drives."""
    step = await plan_pool_step(ctx, body, spec, view, needed, states, profiles, jobs, users, old, now, events,
                                observe, metrics)
    return await apply_pool_step(ctx, body, spec, view, old, step, events)


@dataclass
class PoolStep:
    """A pool planned and not yet applied: the fleet placement may still change its replicas."""

    pool: PoolStatus
    outcome: PoolOutcome
    current: dict | None
    """The pool's Deployment as read (None: none yet)."""
    profiles: PoolProfiles


async def plan_pool_step(ctx: Context, body: dict, spec: SpeculativeDeploymentSpec, view: PoolView,
                         needed: list[Need], states: dict[str, str], profiles: dict[str, dict],
                         jobs: dict[str, dict], users: dict[str, set[str]], old: PoolStatus, now: datetime,
                         events: list[Event], observe: bool, metrics: PoolReadings,
                         deployments: Mapping[str, dict] | None = None) -> PoolStep:
    """The first half of `reconcile_pool`: read, plan, re-measure and refine; the Deployment is not applied.
    `deployments`: the serving Deployments as the watch shows them (None: read from the API server)."""
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    current = None
    observation = None
    if view.primary_sku is not None:
        current = await _current_deployment(ctx, deployments, namespace,
                                            names.serving_deployment_name(name, view.pool.name))
        if observe:
            observation, problem = await observe_pool(ctx, uid, spec, namespace, name, view.pool.name, current)
            _count_observation(ctx, uid, view.pool.name, observation, problem, metrics)
    existing = (current or {}).get("spec", {}).get("replicas")
    pool_profiles = _pool_profiles(needed, view, states, profiles, users, uid)
    outcome = plan_pool(PoolInputs(
        spec=spec, generation=meta.get("generation"), pool=view.pool, sku=view.primary_sku,
        gpu_products=tuple(view.products), nodes=len(view.nodes), previous=old,
        profiles=pool_profiles, observation=observation,
        current_replicas=int(existing) if existing is not None else None,
        rolling_out=current is not None and rolling_out(current),
        price_per_gpu_hour=_price(ctx, spec, view), now=now,
        refine_jobs=_refine_job_states(old, namespace, jobs)))
    pool = outcome.status
    if outcome.reprofile is not None:
        need = next(n for n in needed if n.pool == view.pool.name and n.sku == view.primary_sku
                    and n.key == outcome.reprofile.method)
        await restart_profile(ctx, namespace, need.name, profiles[need.name], None)
        states[need.name] = "Pending"
    for job in outcome.refine:
        need = next((n for n in needed if n.name == job.profile), None)
        if need is not None and job.profile in profiles:
            await start_refinement(ctx, spec, namespace, name, view.pool, need, profiles[job.profile], job,
                                   pool.refinement.round, jobs)
    events.extend(outcome.events)
    if outcome.toggled:
        ctx.metrics.toggles.labels(namespace, name, view.pool.name, outcome.toggled).inc()
    return PoolStep(pool, outcome, current, pool_profiles)


async def _current_deployment(ctx: Context, deployments: Mapping[str, dict] | None, namespace: str,
                              name: str) -> dict | None:
    """A pool's Deployment as the watch index shows it, or from the API server without an index or where the
    index keeps no copy (NOT_INDEXED: too large); None when there is none."""
    if deployments is not None:
        current = deployments.get(f"{namespace}/{name}")
        if current is None or not current.get(NOT_INDEXED):
            return current
    try:
        return await ctx.kube.get("deployments", namespace, name)
    except NotFound:
        return None


async def apply_pool_step(ctx: Context, body: dict, spec: SpeculativeDeploymentSpec, view: PoolView,
                          old: PoolStatus, step: PoolStep, events: list[Event]) -> PoolStatus:
    """The second half of `reconcile_pool`: apply the pool's Deployment as planned, record its rollout, count."""
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    pool, outcome, current, pool_profiles = step.pool, step.outcome, step.current, step.profiles
    if outcome.serve is None:
        return pool
    serve = outcome.serve
    applied = await ctx.kube.apply(serving_deployment(
        sdep_name=name, namespace=namespace, uid=uid, spec=spec, pool=view.pool, method=serve.method,
        num_speculative_tokens=serve.num_speculative_tokens, schedule=serve.schedule, replicas=serve.replicas,
        tenancy=ctx.config.tenancy, engine_image=engine_image(spec, ctx.config)), current=current)
    # The rollout as of this apply: a template just changed is RollingOut now, not RolledOut as it was.
    pool.rollout, rollout_message = rollout_state(applied or current)
    if pool.rollout == ROLLOUT_STALLED and old.rollout != ROLLOUT_STALLED:
        events.append(Event("Warning", "RolloutStalled", f"pool {view.pool.name}: {rollout_message}"))
    profiled = profiled_acceptance(pool_profiles.unvalidated()[1].get(pool.decision.method)) \
        if pool.decision and pool.decision.method else None
    ctx.metrics.record_pool(namespace, name, pool, profiled[0][0] if profiled and profiled[0] else None,
                            spec.policy.tpot_slo_ms)
    return pool


def _place_fleet(ctx: Context, spec: SpeculativeDeploymentSpec,
                 steps: list[tuple[PoolView, PoolStatus, PoolStep]], nodes: list[dict],
                 old: SpeculativeDeploymentStatus, now: datetime, events: list[Event],
                 routing: Routing = Routing.SERVICE) -> FleetOutcome | None:
    """Fleet placement across the pools (`policy.placement`): the plan's replicas replace each placed pool's own
    (internal autoscaling writes them; external publishes them in desiredReplicas)."""
    by_name = {(n.get("metadata") or {}).get("name"): n for n in nodes}
    members = []
    for view, previous, step in steps:
        current = step.current or {}
        replicas = (current.get("spec") or {}).get("replicas")
        # A pool whose Deployment does not exist yet (a GPU type that just joined) serves nothing: 0 ready, not
        # unknown, or its replicas would take a share of the Service's traffic before any pod of it is ready.
        ready = (current.get("status") or {}).get("readyReplicas")
        serve = step.outcome.serve
        members.append(FleetMember(
            spec=view.pool, status=step.pool, previous=previous, price_per_gpu_hour=_price(ctx, spec, view),
            gpus_available=_allocatable_gpus(view, by_name), current_replicas=int(replicas) if replicas is not None
            else None, ready_replicas=int(ready or 0),
            per_pool_replicas=serve.replicas if serve is not None and serve.replicas is not None
            else step.pool.desired_replicas))
    outcome = place_fleet(spec, members, old.fleet, now, routing)
    external = spec.serving.autoscaling == Autoscaling.EXTERNAL.value
    for _, _, step in steps:
        if outcome is None or outcome.plan is None or step.outcome.serve is None:
            clear_plan(step.pool)
            continue
        replicas = write_plan(step.pool, outcome.plan, external)
        step.outcome.serve = dataclasses.replace(step.outcome.serve, replicas=None if external else replicas)
    if outcome is not None:
        events.extend(outcome.events)
    return outcome


def _allocatable_gpus(view: PoolView, nodes: dict[str, dict]) -> int | None:
    """GPUs the pool's ready nodes can allocate (status.allocatable[gpuResourceName]); None when no node says."""
    total, known = 0, False
    for info in view.nodes:
        if not info.ready:
            continue
        value = ((nodes.get(info.name) or {}).get("status") or {}).get("allocatable", {}).get(
            view.pool.gpu_resource_name)
        try:
            total += int(str(value))
            known = True
        except (TypeError, ValueError):
            continue
    return total if known else None


def _refine_job_states(old: PoolStatus, namespace: str, jobs: dict[str, dict]) -> dict[str, str]:
    """The state of each Job of the pool's current refinement round that exists."""
    states = {}
    for job in (old.refinement.jobs if old.refinement else []):
        body = jobs.get(f"{namespace}/{job.job_name}")
        if body is not None:
            states[job.job_name] = job_state(body)
    return states


def _count_observation(ctx: Context, uid: str, pool: str, observation, problem: MetricsUnavailable | None,
                       metrics: PoolReadings) -> None:
    if problem is not None:
        metrics.problems.append(f"pool {pool}: {problem.reason}")
    elif observation is not None:
        metrics.fresh.append(pool)
    cut = ctx.cache(uid).last_cut.pop(pool, None)
    if cut is not None:
        metrics.cut = (metrics.cut or []) + [f"pool {pool}: {what}" for what in cut]


def _price(ctx: Context, spec: SpeculativeDeploymentSpec, view: PoolView) -> float:
    """Price of one GPU of the pool per hour: the pool's own, the operator's table, the catalog's, or 0."""
    if view.primary_sku is None:
        return 0.0
    return view.pool.price_per_gpu_hour or ctx.config.gpu_prices_per_hour.get(view.primary_sku) or \
        _catalog_price(ctx.catalog, view.primary_sku)


def _catalog_price(catalog: GpuCatalog, sku: str) -> float:
    try:
        return catalog.resolve(sku).default_price_per_gpu_hour
    except KeyError:
        return 0.0
