"""One reconciliation of a SpeculativeDeployment: read the cluster into a snapshot, plan, execute.

Level-triggered: the same function runs on create/update/resume and on a timer, and converges from whatever it
finds (all decision state lives in the resource's status and the objects it owns), so a restarted operator resumes
where it stopped without duplicating Jobs. `read_profiles` and `read_snapshot` gather what it decides from,
`policy.plan.plan_deployment` decides everything (profiling, pools, fleet, routing weights, conditions, cost),
`execute_profiling` and `execute` make its actions real.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from ..api.base import format_validation_error
from ..api.deployment_spec import Autoscaling, SpeculativeDeploymentSpec
from ..api.deployment_status import Phase, PoolStatus, SpeculativeDeploymentStatus
from ..api.tenancy import TenancyViolation, refuse
from ..manifests import names
from ..manifests.serving import serving_deployment
from ..observe.model import MetricsUnavailable
from ..policy.admission import operator_refusals
from ..policy.conditions import set_condition
from ..policy.events import Event
from ..policy.needs import engine_image, needed_profiles
from ..policy.plan import (
    ApplyDeployment,
    ApplyRouting,
    DeleteRouting,
    DeploymentPlan,
    DeploymentSnapshot,
    PoolReadings,
    PoolSnapshot,
    RestartProfile,
    StartRefinement,
    plan_deployment,
    settle,
)
from ..policy.planner import profiled_acceptance
from ..policy.pools import (
    PoolView,
    allocatable_gpus,
    node_allocatable,
    node_info,
    pool_views,
    price_per_gpu_hour,
)
from ..policy.profiling import ProfilingInputs
from ..policy.slo import judged
from .context import Context
from .kube import NotFound
from .observation import demand_history, observe_pool, prometheus_url_refusal
from .profile_index import NOT_INDEXED
from .profiles import (
    JOB_UID_ANNOTATION,
    REPROFILE_ANNOTATION,
    ensure_bench_identity,
    execute_profiling,
    job_state,
    read_profiles,
    restart_profile,
    start_refinement,
)
from .routing import apply_routing, delete_routing, reconcile_service, routing_apis, routing_defaults

__all__ = ["JOB_UID_ANNOTATION", "REPROFILE_ANNOTATION", "Context", "Event", "Result", "execute", "read_snapshot",
           "reconcile"]


@dataclass
class Result:
    status: dict[str, Any]
    events: list[Event]


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
    try:
        spec = _valid_spec(ctx, body.get("spec") or {}, namespace)
    except (ValidationError, TenancyViolation) as exc:
        return _invalid(old, exc, generation, now)
    views = pool_views(spec, [node_info(n) for n in nodes], ctx.catalog)
    needed = needed_profiles(spec, views, ctx.config)
    reprofile = (meta.get("annotations") or {}).get(REPROFILE_ANNOTATION)
    await ensure_bench_identity(ctx, namespace)
    events: list[Event] = []
    profiling, reads = await read_profiles(ctx, spec, namespace, needed, profiles, jobs, reprofile, now, events,
                                           spec_changed=old.observed_generation not in (None, generation))
    snapshot = await read_snapshot(ctx, body, spec, views, profiling, profiles, jobs, nodes, observe,
                                   profile_users or {}, deployments, old, now)
    plan = plan_deployment(snapshot)
    await execute_profiling(ctx, spec, namespace, name, plan.profiling, reads, events)
    plan.events[:0] = events
    await execute(ctx, body, spec, snapshot, plan, jobs)
    return Result(plan.status.dump(), plan.events)


async def read_snapshot(ctx: Context, body: dict, spec: SpeculativeDeploymentSpec, views: list[PoolView],
                        profiling: ProfilingInputs, profiles: dict[str, dict],
                        jobs: dict[str, dict], nodes: list[dict], observe: bool, users: dict[str, set[str]],
                        deployments: Mapping[str, dict] | None, old: SpeculativeDeploymentStatus,
                        now: datetime) -> DeploymentSnapshot:
    """What `plan_deployment` decides from: every pool's Deployment, a due observation (metrics are read only
    when one is due), price, allocatable GPUs and refinement Jobs, and the routing resources the cluster serves."""
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    url_refused = prometheus_url_refusal(ctx, spec)
    readings = PoolReadings([url_refused] if url_refused else [], [],
                            "PrometheusUrlNotAllowed" if url_refused else "MetricsUnavailable")
    by_name = {(n.get("metadata") or {}).get("name"): n for n in nodes}
    old_pools = {p.name: p for p in old.pools}
    pools = []
    for view in views:
        current = observation = None
        if view.primary_sku is not None:
            current = await _current_deployment(ctx, deployments, namespace,
                                                names.serving_deployment_name(name, view.pool.name))
            if observe and not url_refused:
                observation, problem = await observe_pool(ctx, uid, spec, namespace, name, view.pool.name, current)
                _count_observation(ctx, uid, view.pool.name, observation, problem, readings)
        pools.append(PoolSnapshot(
            view=view, current=current, observation=observation,
            price_per_gpu_hour=price_per_gpu_hour(view, ctx.config.gpu_prices_per_hour, ctx.catalog),
            gpus_available=allocatable_gpus(view, {info.name: node_allocatable(by_name.get(info.name) or {},
                                                                               view.pool.gpu_resource_name)
                                                   for info in view.nodes}),
            refine_jobs=_refine_job_states(old_pools.get(view.pool.name), namespace, jobs)))
    history = ()
    if _starts_cold(spec, old, pools):
        history = await demand_history(ctx, spec, namespace, name, [p.view.pool.name for p in pools])
    return DeploymentSnapshot(
        spec=spec, name=name, uid=uid, generation=meta.get("generation"), old=old, now=now, pools=pools,
        profiling=profiling, profiles=profiles, profile_users=users, readings=readings,
        routing_apis=await routing_apis(ctx, spec, namespace), routing_defaults=routing_defaults(ctx),
        demand_history=history)


def _starts_cold(spec: SpeculativeDeploymentSpec, old: SpeculativeDeploymentStatus, pools: list[PoolSnapshot]
                 ) -> bool:
    """Whether the fleet planner would forecast without a history of its own: a fleet of two or more pools that
    places its replicas, no history in the status, and a fresh observation (so the read runs at the metrics
    interval, not at every reconciliation)."""
    return (sum(p.view.primary_sku is not None for p in pools) >= 2
            and spec.serving.autoscaling != Autoscaling.NONE.value
            and not (old.fleet and old.fleet.demand_history)
            and any(p.observation is not None for p in pools))


async def execute(ctx: Context, body: dict, spec: SpeculativeDeploymentSpec, snapshot: DeploymentSnapshot,
                  plan: DeploymentPlan, jobs: dict[str, dict]) -> None:
    """Make the plan real: restart drifted profiles, start refinement Jobs, apply the pools' Deployments
    (then `settle` their rollouts), the Service and the routing; and count what it decided."""
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    views = {p.view.pool.name: p for p in snapshot.pools}
    applied: dict[str, dict | None] = {}
    for action in plan.actions:
        if isinstance(action, RestartProfile):
            await restart_profile(ctx, namespace, action.name, snapshot.profiles[action.name], None)
        elif isinstance(action, StartRefinement):
            await start_refinement(ctx, spec, namespace, name, views[action.pool].view.pool, action.need,
                                   snapshot.profiles[action.job.profile], action.job, action.round, jobs)
        elif isinstance(action, ApplyDeployment):
            pool = views[action.pool]
            serve = action.serve
            applied[action.pool] = await ctx.kube.apply(serving_deployment(
                sdep_name=name, namespace=namespace, uid=uid, spec=spec, pool=pool.view.pool, method=serve.method,
                num_speculative_tokens=serve.num_speculative_tokens, schedule=serve.schedule,
                replicas=serve.replicas, tenancy=ctx.config.tenancy, engine_image=engine_image(spec, ctx.config)),
                current=pool.current) or pool.current
    settle(plan, applied, name, meta.get("generation"), snapshot.now)
    await reconcile_service(ctx, body, spec)
    for action in plan.actions:
        if isinstance(action, DeleteRouting):
            await delete_routing(ctx, namespace, name, action, plan.status.routing)
        elif isinstance(action, ApplyRouting):
            await apply_routing(ctx, body, spec, action, plan, snapshot.old, snapshot.now)
    _record(ctx, spec, snapshot, plan, namespace, name)


def _record(ctx: Context, spec: SpeculativeDeploymentSpec, snapshot: DeploymentSnapshot, plan: DeploymentPlan,
            namespace: str, name: str) -> None:
    """The operator's metrics for what was decided and applied."""
    status = plan.status
    for pool, method in plan.decided.items():
        ctx.metrics.decisions.labels(namespace, name, pool, method).inc()
    for pool, state in plan.toggled.items():
        ctx.metrics.toggles.labels(namespace, name, pool, state).inc()
    for pool in status.pools:
        if pool.name not in plan.served:
            continue
        methods = plan.pool_profiles[pool.name].unvalidated()[1]
        profiled = profiled_acceptance(methods.get(pool.decision.method)) \
            if pool.decision and pool.decision.method else None
        ctx.metrics.record_pool(namespace, name, pool, profiled[0][0] if profiled and profiled[0] else None,
                                spec.policy.tpot_slo_ms)
    fleet = status.fleet
    ctx.metrics.record_fleet(namespace, name, status.pools, fleet.cost_per_mtok if fleet else None,
                             fleet.demand_tokens_per_second if fleet else None,
                             fleet.forecast_tokens_per_second if fleet else None)
    if snapshot.readings.problems:
        ctx.metrics.metrics_available.labels(namespace, name).set(0)
    elif snapshot.readings.fresh:
        ctx.metrics.metrics_available.labels(namespace, name).set(1)
    # The gauges carry only a judged figure: a window of a few requests would fire the alert on noise.
    ctx.metrics.record_slo(namespace, name, judged(status.slo_attainment), spec.policy.slo_attainment_percent)


def _valid_spec(ctx: Context, raw: dict, namespace: str) -> SpeculativeDeploymentSpec:
    """The spec, typed and within the admin's tenancy bounds and Gateway allow-list (raises what it breaks)."""
    spec = SpeculativeDeploymentSpec.model_validate(raw)
    refuse(operator_refusals(spec, namespace, ctx.config))
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


def _refine_job_states(old: PoolStatus | None, namespace: str, jobs: dict[str, dict]) -> dict[str, str]:
    """The state of each Job of the pool's current refinement round that exists."""
    states = {}
    for job in (old.refinement.jobs if old is not None and old.refinement else []):
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
