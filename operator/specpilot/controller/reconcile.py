"""One reconciliation of a SpeculativeDeployment: read the cluster, call the pure planners, write.

Level-triggered: the same function runs on create/update/resume and on a timer, and converges from
whatever it finds (all state lives in the resource's status and the objects it owns), so a restarted
operator resumes where it stopped without duplicating Jobs.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from ..api.base import format_validation_error
from ..api.deployment import (
    Autoscaling,
    Decision,
    HistoryEntry,
    ObservedLoad,
    Phase,
    PoolStatus,
    ProfileProgress,
    SpeculativeDeploymentSpec,
    SpeculativeDeploymentStatus,
    Strategy,
)
from ..api.profile import SpeculationProfile
from ..api.schedule import summary as schedule_summary
from ..api.tenancy import TenancyViolation, refuse, spec_problems
from ..config import OperatorConfig
from ..manifests import names
from ..manifests.benchmark import benchmark_job
from ..manifests.rbac import bench_rbac
from ..manifests.serving import pod_monitor, service, serving_deployment, serving_service_account
from ..observe import allowlist
from ..observe.bounded import ReadLimits
from ..observe.model import MetricsUnavailable, PoolObservation
from ..observe.pods import PodScrapeSource
from ..observe.prometheus import PrometheusSource, pool_pod_regex
from ..perf.catalog import DEFAULT_CATALOG, GpuCatalog
from ..perf.plausibility import checked_result_problems
from ..policy.choose import decide_pool, revisit_for_load
from ..policy.replicas import ReplicaState, plan_replicas
from ..policy.restart import Observation as RestartObservation
from ..policy.restart import RestartState
from ..policy.restart import step as restart_step
from . import desired
from .kube import Conflict, Connection, Kube, NotFound
from .metrics import OperatorMetrics

log = logging.getLogger("specpilot.reconcile")

REPROFILE_ANNOTATION = "specpilot.io/reprofile"
"""Set to any new value (e.g. a timestamp) to re-measure every profile of the deployment."""
JOB_UID_ANNOTATION = "specpilot.io/job-uid"
"""On a SpeculationProfile: the uid of the Job measuring it now."""


@dataclass
class Event:
    type: str
    reason: str
    message: str


@dataclass
class Context:
    """Process-wide state shared by the handlers (the kopf memo)."""

    kube: Kube
    config: OperatorConfig
    metrics: OperatorMetrics
    connection: Connection
    catalog: GpuCatalog = DEFAULT_CATALOG
    locks: dict[str, asyncio.Lock] = field(default_factory=dict)
    pod_sources: dict[str, PodScrapeSource] = field(default_factory=dict)
    prometheus_sources: dict[tuple[str, int, int], PrometheusSource] = field(default_factory=dict)
    last_observed_at: dict[str, float] = field(default_factory=dict)
    replica_states: dict[str, ReplicaState] = field(default_factory=dict)
    replicaset_owners: dict[str, str] = field(default_factory=dict)
    """ReplicaSet uid -> uid of the Deployment that controls it ("" for none): which pods are the operator's
    own to scrape (a pod that merely carries the labels is not)."""
    bench_identity_checked: dict[str, float] = field(default_factory=dict)
    """Namespace -> when its benchmark identity was last ensured (monotonic seconds)."""
    counted_jobs: set[str] = field(default_factory=set)
    """Uids of benchmark Jobs already counted as succeeded in the metrics."""
    profile_events: dict[str, int] = field(default_factory=dict)
    """"namespace/profile" -> watch events of the profile and its benchmark Jobs seen by the index handlers."""
    last_cut: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """"uid/pool" -> what the read bounds left out of that pool's last observation (read once per reconcile)."""
    written: dict[str, dict] = field(default_factory=dict)
    """Uid -> the status its last reconciliation computed. kopf writes it only after the handler returns, so
    the next reconciliation (a timer may already wait on the lock) starts from this, not from a body that
    predates it: otherwise it would re-announce the same decision change and append it to history again."""
    profiles_seen: tuple | None = None
    """Per object (kopf gives each object a shallow copy of this memo): the fingerprint of its profiles and
    benchmark Jobs its last reconciliation saw (handlers.profiles_fingerprint)."""

    def lock(self, uid: str) -> asyncio.Lock:
        return self.locks.setdefault(uid, asyncio.Lock())

    def latest(self, body: dict) -> dict:
        """The object as its next reconciliation must see it: its status as last computed here (when this
        process computed one), which the body may not show yet."""
        written = self.written.get((body.get("metadata") or {}).get("uid", ""))
        return body if written is None else {**body, "status": written}

    async def close(self) -> None:
        """Release what the context holds open: Prometheus HTTP sessions, the API client's pool."""
        for source in list(self.prometheus_sources.values()):
            await source.close()
        self.prometheus_sources.clear()
        self.kube.close()

    def forget(self, uid: str) -> None:
        """Drop what is kept per object once it is deleted."""
        self.locks.pop(uid, None)
        self.written.pop(uid, None)


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
                    jobs: dict[str, dict], observe: bool = True) -> Result:
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    generation = meta.get("generation")
    now = _now()
    old = _status_model(body)
    events: list[Event] = []

    try:
        spec = SpeculativeDeploymentSpec.model_validate(body.get("spec") or {})
        refuse(spec_problems(spec, ctx.config.tenancy, benchmark_image=ctx.config.benchmark_image))
    except (ValidationError, TenancyViolation) as exc:
        message = format_validation_error(exc) if isinstance(exc, ValidationError) else str(exc)
        status = old.model_copy()
        already = any(c.type == "Valid" and c.status == "False" and c.observed_generation == generation
                      and c.message == message for c in old.conditions)
        status.conditions = desired.set_condition(status.conditions, "Valid", False, "InvalidSpec", message,
                                                  generation, now)
        status.phase = Phase.FAILED
        status.observed_generation = generation
        if not already:
            events.append(Event("Warning", "InvalidSpec", message))
        return Result(status.dump(), events)

    status = old.model_copy(deep=True)
    status.conditions = desired.set_condition(status.conditions, "Valid", True, "SpecValid",
                                              "spec passed validation", generation, now)

    views = desired.pool_views(spec, [desired.node_info(n) for n in nodes], ctx.catalog)
    needed = desired.needed_profiles(spec, views, ctx.config)
    reprofile = (meta.get("annotations") or {}).get(REPROFILE_ANNOTATION)

    await _ensure_bench_identity(ctx, namespace)
    states = await _reconcile_profiles(ctx, spec, namespace, name, needed, profiles, jobs, reprofile, now, events)

    old_pools = {p.name: p for p in old.pools}
    pools: list[PoolStatus] = []
    metrics_problems: list[str] = []
    metrics_ok: list[str] = []
    metrics_reason = "MetricsUnavailable"
    metrics_cut: list[str] = []
    observed_now = False
    url_refused = _prometheus_url_refusal(ctx, spec)
    if url_refused:
        # Refused before any request: the URL a tenant names is never contacted.
        metrics_problems.append(url_refused)
        metrics_reason = "PrometheusUrlNotAllowed"
    for view in views:
        pool_old = old_pools.get(view.pool.name) or PoolStatus(name=view.pool.name)
        pool, problem = await _reconcile_pool(ctx, body, spec, view, needed, states, profiles, pool_old, now,
                                              events, observe and not url_refused)
        if problem:
            metrics_problems.append(f"pool {view.pool.name}: {problem.reason}")
        elif pool.observed is not None:
            metrics_ok.append(view.pool.name)
        cut = ctx.last_cut.pop(f"{uid}/{view.pool.name}", None)
        if cut is not None:
            observed_now = True
            metrics_cut += [f"pool {view.pool.name}: {what}" for what in cut]
        pools.append(pool)
        if (pool.decision and pool.decision.method) != (pool_old.decision and pool_old.decision.method) or (
                pool.decision and pool_old.decision
                and pool.decision.schedule_summary != pool_old.decision.schedule_summary):
            change = f"{desired.decision_text(pool_old)} -> {desired.decision_text(pool)}"
            reason = pool.decision.reason if pool.decision else ""
            status.history = desired.append_history(status.history, HistoryEntry(
                time=now, pool=pool.name, change=change, reason=reason))
            events.append(Event("Normal", "DecisionChanged", f"pool {pool.name}: {change}: {reason}"))
            ctx.metrics.decisions.labels(namespace, name, pool.name,
                                         (pool.decision.method if pool.decision else None) or "none").inc()

    await _reconcile_service(ctx, body, spec)

    total = len(needed)
    ready = sum(1 for n in needed if states.get(n.name) == "Succeeded")
    failed = sum(1 for n in needed if states.get(n.name) == "Failed")
    status.pools = pools
    status.phase = desired.overall_phase(ready, total, failed)
    status.progress = f"profiles {ready}/{total}" + (f", {failed} failed" if failed else "")
    status.observed_generation = generation
    status.decision_summary = desired.decision_summary(pools)
    observed = [p.observed.concurrency for p in pools if p.observed and p.observed.concurrency is not None]
    status.observed_concurrency = round(sum(observed) / len(observed), 2) if observed else None
    costs = [p.decision.cost_per_mtok_with_sd for p in pools if p.decision and p.decision.cost_per_mtok_with_sd]
    status.cost_per_mtok = round(min(costs), 4) if costs else None

    status.conditions = desired.set_condition(
        status.conditions, "Profiled", ready == total and total > 0,
        "AllProfilesReady" if ready == total and total else ("ProfilesFailed" if failed else "Profiling"),
        status.progress, generation, now)
    no_nodes = [v.pool.name for v in views if not v.nodes]
    status.conditions = desired.set_condition(
        status.conditions, "NodesAvailable", not no_nodes,
        "PoolsWithoutNodes" if no_nodes else "NodesFound",
        f"no nodes match the nodeSelector of pool(s) {', '.join(no_nodes)}: check spec.gpuPools[].nodeSelector"
        if no_nodes else "every pool has matching nodes", generation, now)
    serving = [p.name for p in pools if p.decision is not None]
    status.conditions = desired.set_condition(
        status.conditions, "Serving", bool(serving), "Deployed" if serving else "Waiting",
        f"serving pools: {', '.join(serving)}" if serving else "no pool has a GPU type yet", generation, now)
    rolled_out = desired.rolled_out_condition(pools, name)
    if rolled_out is not None:
        status.conditions = desired.set_condition(status.conditions, "RolledOut", *rolled_out, generation, now)
    if metrics_problems:
        status.conditions = desired.set_condition(
            status.conditions, "MetricsAvailable", False, metrics_reason,
            "; ".join(metrics_problems) + ": holding the last decision and replica count", generation, now)
        ctx.metrics.metrics_available.labels(namespace, name).set(0)
        if not any(c.type == "MetricsAvailable" and c.status == "False" and c.reason == metrics_reason
                   for c in old.conditions):
            events.append(Event("Warning", metrics_reason, "; ".join(metrics_problems)))
    elif metrics_ok:
        status.conditions = desired.set_condition(
            status.conditions, "MetricsAvailable", True, "MetricsFresh",
            f"load observed for pool(s) {', '.join(metrics_ok)}", generation, now)
        ctx.metrics.metrics_available.labels(namespace, name).set(1)
    truncated = desired.truncated_condition(metrics_cut, old.conditions) if observed_now else None
    if truncated is not None:
        status.conditions = desired.set_condition(status.conditions, "MetricsTruncated", *truncated, generation, now)
        if truncated[0] and not any(c.type == "MetricsTruncated" and c.status == "True" for c in old.conditions):
            events.append(Event("Warning", "MetricsTruncated", truncated[2]))
    if no_nodes and not any(c.type == "NodesAvailable" and c.status == "False" for c in old.conditions):
        events.append(Event("Warning", "NoNodes", f"no nodes match pool(s) {', '.join(no_nodes)}"))
    return Result(status.dump(), events)


BENCH_IDENTITY_RECHECK_S = 300
"""How often a namespace's benchmark ServiceAccount/Role/RoleBinding are checked again (someone may delete them)."""
RESULT_GRACE_S = 60
"""How long after a benchmark Job completes its result may take to reach the profile (watch order)."""
RETRY_HINT = f"set the annotation {REPROFILE_ANNOTATION} on the SpeculativeDeployment to retry"
"""How a profile that failed for good is measured again, as its message says."""


async def _ensure_bench_identity(ctx: Context, namespace: str) -> None:
    """The ServiceAccount and RoleBinding (to the chart's bench ClusterRole: get a profile, get and patch its
    status) benchmark pods use to publish results, one set per namespace; the operator creates no Roles."""
    if time.monotonic() - ctx.bench_identity_checked.get(namespace, -BENCH_IDENTITY_RECHECK_S) \
            < BENCH_IDENTITY_RECHECK_S:
        return
    identities = [*bench_rbac(namespace, cluster_role=ctx.config.bench_cluster_role),
                  serving_service_account(namespace)]  # the serving pods' own account: no Role, no token
    for obj in identities:
        await ctx.kube.ensure(obj)
    ctx.bench_identity_checked[namespace] = time.monotonic()


def _current_job(job: dict | None, profile: dict) -> dict | None:
    """The Job measuring the profile now; a previous measurement's Job (still in the cache while it is
    deleted) does not count."""
    if job is None:
        return None
    expected = (((profile.get("metadata") or {}).get("annotations")) or {}).get(JOB_UID_ANNOTATION)
    if expected is not None and expected != (job.get("metadata") or {}).get("uid"):
        return None
    return job


def _job_state(job: dict) -> str:
    status = job.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("status") == "True" and cond.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "Complete"
        if cond.get("status") == "True" and cond.get("type") in ("Failed", "FailureTarget"):
            return "Failed"
    return "Active"


def _job_failure(job: dict) -> tuple[str, str]:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("Failed", "FailureTarget") and cond.get("status") == "True":
            return cond.get("reason") or "JobFailed", cond.get("message") or "the benchmark Job failed"
    return "JobFailed", "the benchmark Job failed"


async def _reconcile_profiles(ctx: Context, spec: SpeculativeDeploymentSpec, namespace: str, sdep_name: str,
                              needed: list[desired.NeededProfile], profiles: dict[str, dict],
                              jobs: dict[str, dict], reprofile: str | None, now: datetime,
                              events: list[Event]) -> dict[str, str]:
    """Reuse fresh profiles, create missing ones and their Jobs (bounded per pool), mirror Job failures.

    Returns profile name -> phase.
    """
    max_age = spec.profiling.reprofile.max_age_hours if "max_age_hours" in spec.profiling.reprofile.model_fields_set \
        else ctx.config.profiling_defaults.max_age_hours
    max_parallel = spec.profiling.max_parallel_jobs_per_pool
    states: dict[str, str] = {}
    waiting: dict[str, list[desired.NeededProfile]] = {}
    running: dict[str, int] = {}
    seen: set[str] = set()
    for need in needed:
        if need.name in seen:
            continue
        seen.add(need.name)
        profile = profiles.get(need.name)
        annotations = ((profile or {}).get("metadata") or {}).get("annotations") or {}
        stale_request = reprofile is not None and annotations.get(REPROFILE_ANNOTATION) != reprofile
        if profile is None:
            profile = await _create_profile(ctx, namespace, need, reprofile)
            events.append(Event("Normal", "Profiling", f"measuring {need.key} on {need.sku} ({need.name})"))
        elif (profile.get("status") or {}).get("phase") == "Succeeded" and (
                stale_request or not desired.profile_is_fresh(profile, max_age, now)):
            why = "requested by annotation" if stale_request else f"older than {max_age:g} h"
            await _restart_profile(ctx, namespace, need.name, profile, reprofile)
            profile = _restarted(profile)
            events.append(Event("Normal", "Reprofiling", f"re-measuring {need.name}: {why}"))
        elif (profile.get("status") or {}).get("phase") == "Failed" and stale_request:
            await _restart_profile(ctx, namespace, need.name, profile, reprofile)
            events.append(Event("Normal", "Reprofiling", f"re-measuring {need.name}: requested by annotation"))
            profile = _restarted(profile)
        phase = (profile.get("status") or {}).get("phase") or "Pending"
        if phase in ("Pending", "Running"):
            job = _current_job(jobs.get(f"{namespace}/{names.bench_job_name(need.name)}"), profile)
            if job is None:
                waiting.setdefault(need.pool, []).append(need)
            else:
                state = _job_state(job)
                if state == "Failed":
                    reason, message = _job_failure(job)
                    attempts = int((job.get("status") or {}).get("failed") or 0)
                    phase = await _fail_profile(
                        ctx, namespace, need, events,
                        {"reason": reason, "attempts": attempts,
                         "message": f"{message} after {attempts} attempt(s); {RETRY_HINT}"},
                        f"{reason}: {message} ({attempts} attempts)")
                elif state == "Complete" and phase != "Succeeded":
                    # The bench exits 0 only after publishing, so the result is on its way (watch order);
                    # past the grace it never will come, and waiting longer would hang the pool at Profiling.
                    if desired.result_overdue(job, now, RESULT_GRACE_S):
                        job_name = job["metadata"]["name"]
                        message = (f"the benchmark Job {job_name} completed but no result reached the profile "
                                   f"within {RESULT_GRACE_S} s; see `kubectl logs job/{job_name}`, then {RETRY_HINT}")
                        phase = await _fail_profile(ctx, namespace, need, events,
                                                    {"reason": "NoResult", "message": message},
                                                    f"NoResult: {message}")
                    else:
                        phase = "Running"
                else:
                    running[need.pool] = running.get(need.pool, 0) + 1
                    failures = int((job.get("status") or {}).get("failed") or 0)
                    if failures and (profile.get("status") or {}).get("attempts", 0) != failures:
                        await ctx.kube.patch("speculationprofiles", namespace, need.name,
                                             {"status": {"attempts": failures, "reason": "Retrying",
                                                         "message": f"attempt {failures + 1} after a failure"}},
                                             subresource="status")
        elif phase == "Succeeded" and (implausible := checked_result_problems(profile, ctx.catalog)):
            # A result no GPU can produce never reaches a decision (it may have been written by anyone who can
            # patch profiles' status in the namespace, and every deployment needing it would act on it).
            shown = "; ".join(implausible)
            phase = await _fail_profile(ctx, namespace, need, events,
                                        {"reason": "ImplausibleResult",
                                         "message": f"result refused: {shown}; {RETRY_HINT}"},
                                        f"ImplausibleResult: {shown}")
        elif phase == "Succeeded":
            job = _current_job(jobs.get(f"{namespace}/{names.bench_job_name(need.name)}"), profile)
            uid = (job or {}).get("metadata", {}).get("uid")
            if uid and uid not in ctx.counted_jobs:
                ctx.counted_jobs.add(uid)
                ctx.metrics.profiling_jobs.labels(namespace, "succeeded").inc()
        states[need.name] = phase

    for pool, queue in waiting.items():
        view_pool = next(p for p in spec.gpu_pools if p.name == pool)
        for need in desired.jobs_allowed(queue, running.get(pool, 0), max_parallel):
            profile = profiles.get(need.name) or {}
            owner = {"apiVersion": "specpilot.io/v1alpha1", "kind": "SpeculationProfile", "name": need.name,
                     "uid": (profile.get("metadata") or {}).get("uid", "")}
            if not owner["uid"]:
                fetched = await ctx.kube.get("speculationprofiles", namespace, need.name)
                owner["uid"] = fetched["metadata"].get("uid", "")
            job = benchmark_job(profile_name=need.name, namespace=namespace, profile_spec=need.spec, spec=spec,
                                pool=view_pool, bench_image=ctx.config.benchmark_image,
                                owner=owner, sdep_name=sdep_name, tenancy=ctx.config.tenancy)
            try:
                created = await ctx.kube.create(job)
            except Conflict:
                continue  # the previous measurement's Job is still being deleted
            ctx.metrics.profiling_jobs.labels(namespace, "created").inc()
            await ctx.kube.patch("speculationprofiles", namespace, need.name, {"metadata": {"annotations": {
                JOB_UID_ANNOTATION: (created or {}).get("metadata", {}).get("uid", "")}}})
            # The phase is left as it is (Pending since the profile was created or restarted): the Job may
            # already have written Running or its result, and this patch must not undo that.
            await ctx.kube.patch("speculationprofiles", namespace, need.name,
                                 {"status": {"jobName": job["metadata"]["name"], "reason": "JobCreated"}},
                                 subresource="status")
    return states


async def _fail_profile(ctx: Context, namespace: str, need: desired.NeededProfile, events: list[Event],
                        status: dict, event_message: str) -> str:
    """Mark a profile Failed for good (with `status`'s reason and message), say so in a ProfilingFailed
    Warning Event and count it; returns the new phase."""
    await ctx.kube.patch("speculationprofiles", namespace, need.name, {"status": {"phase": "Failed", **status}},
                         subresource="status")
    events.append(Event("Warning", "ProfilingFailed", f"{need.key} on {need.sku}: {event_message}"))
    ctx.metrics.profiling_jobs.labels(namespace, "failed").inc()
    return "Failed"


async def _create_profile(ctx: Context, namespace: str, need: desired.NeededProfile,
                          reprofile: str | None) -> dict:
    annotations = {REPROFILE_ANNOTATION: reprofile} if reprofile else {}
    obj = SpeculationProfile(metadata={
        "name": need.name, "namespace": namespace,
        "labels": {"app.kubernetes.io/managed-by": "specpilot", "specpilot.io/sku": names.label_value(need.sku),
                   "specpilot.io/method": names.label_value(need.key)},
        "annotations": annotations,
    }, spec=need.spec).dump()
    created, _ = await ctx.kube.ensure(obj)
    if not (created.get("status") or {}).get("phase"):
        await ctx.kube.patch("speculationprofiles", namespace, need.name,
                             {"status": {"phase": "Pending", "reason": "Created"}}, subresource="status")
        created = {**created, "status": {"phase": "Pending"}}
    return created


def _restarted(profile: dict) -> dict:
    """How a profile looks right after `_restart_profile`: Pending, with no current Job."""
    meta = dict(profile.get("metadata") or {})
    meta["annotations"] = {**(meta.get("annotations") or {}), JOB_UID_ANNOTATION: ""}
    return {**profile, "metadata": meta, "status": {"phase": "Pending"}}


async def _restart_profile(ctx: Context, namespace: str, name: str, profile: dict, reprofile: str | None) -> None:
    """Measure again: drop the old Job and reset the status (the identity, hence the name, is unchanged)."""
    await ctx.kube.delete("jobs", namespace, names.bench_job_name(name))
    annotations: dict[str, str | None] = {JOB_UID_ANNOTATION: None}
    if reprofile:
        annotations[REPROFILE_ANNOTATION] = reprofile
    await ctx.kube.patch("speculationprofiles", namespace, name, {"metadata": {"annotations": annotations}})
    await ctx.kube.patch("speculationprofiles", namespace, name, {"status": {
        "phase": "Pending", "reason": "Reprofiling", "message": None, "attempts": 0, "runs": None,
        "completedAt": None}}, subresource="status")


def _pool_profiles(needed: list[desired.NeededProfile], pool: str, sku: str,
                   profiles: dict[str, dict], states: dict[str, str]) -> tuple[dict | None, dict[str, dict]]:
    baseline = None
    methods: dict[str, dict] = {}
    for need in needed:
        if need.pool != pool or need.sku != sku or states.get(need.name) != "Succeeded":
            continue
        body = profiles.get(need.name)
        if body is None:
            continue
        if need.candidate is None:
            baseline = body
        else:
            methods[need.key] = body
    return baseline, methods


async def _reconcile_pool(ctx: Context, body: dict, spec: SpeculativeDeploymentSpec, view: desired.PoolView,
                          needed: list[desired.NeededProfile], states: dict[str, str], profiles: dict[str, dict],
                          old: PoolStatus, now: datetime, events: list[Event],
                          observe: bool) -> tuple[PoolStatus, MetricsUnavailable | None]:
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    pool_needed = [n for n in needed if n.pool == view.pool.name]
    pool = PoolStatus(
        name=view.pool.name, sku=view.primary_sku, gpu_products=view.products, nodes=len(view.nodes),
        profiles=ProfileProgress(
            ready=sum(1 for n in pool_needed if states.get(n.name) == "Succeeded"),
            total=len(pool_needed),
            failed=sum(1 for n in pool_needed if states.get(n.name) == "Failed"),
            names=sorted({n.name for n in pool_needed})),
        speculation_enabled=old.speculation_enabled, last_toggle_at=old.last_toggle_at,
        above_threshold_since=old.above_threshold_since, below_threshold_since=old.below_threshold_since,
        observed=old.observed, replicas=old.replicas,
        desired_replicas=old.desired_replicas, decision=old.decision,
        capacity_concurrency_per_replica=old.capacity_concurrency_per_replica,
    )
    if view.primary_sku is None:
        return pool, None

    price = view.pool.price_per_gpu_hour or ctx.config.gpu_prices_per_hour.get(view.primary_sku) or \
        _catalog_price(ctx, view.primary_sku)
    gpus = spec.model.tensor_parallel_size * spec.model.data_parallel_size

    deployment_name = names.serving_deployment_name(name, view.pool.name)
    try:
        current = await ctx.kube.get("deployments", namespace, deployment_name)
    except NotFound:
        current = None
    observation: PoolObservation | None = None
    metrics_problem: MetricsUnavailable | None = None
    # Nothing to observe before a replica is ready; that is not a metrics outage.
    ready_replicas = int(((current or {}).get("status") or {}).get("readyReplicas") or 0)
    if observe and ready_replicas and _observation_due(ctx, meta["uid"], view.pool.name,
                                                         spec.metrics.interval_seconds):
        try:
            observation = await _observe_pool(ctx, spec, namespace, name, view.pool.name, current)
        except MetricsUnavailable as exc:
            metrics_problem = exc
        ctx.last_cut[f"{meta['uid']}/{view.pool.name}"] = observation.cut if observation else metrics_problem.cut
    if observation is not None:
        pool.observed = ObservedLoad(
            concurrency=round(observation.running_per_replica, 3),
            waiting=round(observation.waiting_per_replica, 3),
            generation_tokens_per_second=_round(observation.generation_tokens_per_second),
            tpot_p95_ms=_round(observation.tpot_p95_ms),
            acceptance_per_position=[round(p, 4) for p in observation.acceptance_per_position],
            mean_acceptance_length=_round(observation.mean_acceptance_length),
            drafts_per_step=_round(observation.drafts_per_step),
            observed_at=observation.observed_at)
        pool.observed = pool.observed.model_copy(update={"observed_at": observation.observed_at})
    drift_target = _drifted_profile(spec, view, needed, states, profiles, pool)
    if drift_target is not None:
        need, drift = drift_target
        await _restart_profile(ctx, namespace, need.name, profiles[need.name], None)
        states[need.name] = "Pending"
        events.append(Event("Warning", "AcceptanceDrift",
                            f"pool {view.pool.name}: live acceptance of {need.key} is {drift:.0%} off its profile: "
                            f"re-profiling {need.name}"))

    decision, capacity = _decide(spec, meta.get("generation"), view, needed, states, profiles, pool, observation,
                                 price, gpus, now)
    pool.decision = decision
    if capacity is not None or decision is not old.decision:
        pool.capacity_concurrency_per_replica = capacity

    # Toggling speculation during a rollout would start another; a stalled one holds the toggle too.
    rolling_out = current is not None and desired.rolling_out(current)
    enabled = _speculation_state(ctx, body, spec, pool, old, observation, rolling_out, now, events)
    replicas = _replicas(ctx, body, spec, view, pool, observation, current, metrics_problem, now)

    candidate = next((m for m in spec.methods if m.key == decision.method), None) if enabled else None
    dynamic = decision.strategy == Strategy.DYNAMIC.value and bool(decision.schedule)
    applied = await ctx.kube.apply(serving_deployment(
        sdep_name=name, namespace=namespace, uid=meta["uid"], spec=spec, pool=view.pool, method=candidate,
        num_speculative_tokens=decision.num_speculative_tokens if candidate else None,
        schedule=list(decision.schedule) if candidate and dynamic else None,
        replicas=replicas, tenancy=ctx.config.tenancy))
    # The rollout as of this apply: a template just changed is RollingOut now, not RolledOut as it was.
    pool.rollout, rollout_message = desired.rollout_state(applied or current)
    if pool.rollout == desired.ROLLOUT_STALLED and old.rollout != desired.ROLLOUT_STALLED:
        events.append(Event("Warning", "RolloutStalled", f"pool {view.pool.name}: {rollout_message}"))
    pool.speculation_enabled = candidate is not None
    pool.replicas = replicas if replicas is not None else int((current or {}).get("spec", {}).get("replicas") or 0)
    labels = (namespace, name, view.pool.name)
    ctx.metrics.speculation_enabled.labels(*labels).set(1 if pool.speculation_enabled else 0)
    if pool.desired_replicas is not None:
        ctx.metrics.desired_replicas.labels(*labels).set(pool.desired_replicas)
    if decision.cost_per_mtok_with_sd is not None:
        ctx.metrics.cost_per_mtok.labels(*labels).set(decision.cost_per_mtok_with_sd)
    if pool.observed and pool.observed.concurrency is not None:
        ctx.metrics.observed_concurrency.labels(*labels).set(pool.observed.concurrency)
    return pool, metrics_problem


def _decide(spec: SpeculativeDeploymentSpec, generation: int | None, view: desired.PoolView,
            needed: list[desired.NeededProfile], states: dict[str, str], profiles: dict[str, dict],
            old: PoolStatus, observation: PoolObservation | None, price: float, gpus: int,
            now: datetime) -> tuple[Decision, float | None]:
    """Recompute the pool's decision only when what it rests on changed: the spec, the profiles, live
    acceptance that drifted from the profile, or the observed load (first seen, or moved a factor of 2 after
    the cooldown). A change of method or schedule means a rollout."""
    baseline_body, method_bodies = _pool_profiles(needed, view.pool.name, view.primary_sku, profiles, states)
    live = _live_acceptance(old, method_bodies)
    basis = _basis(generation, baseline_body, method_bodies, live)
    histogram = observation.concurrency_histogram if observation else None
    if old.decision is not None and old.decision.basis == basis and not revisit_for_load(
            old.decision, histogram, now, spec.policy.hysteresis.cooldown_seconds):
        return old.decision, None
    pool_needed = [n for n in needed if n.pool == view.pool.name]
    ready = sum(1 for n in pool_needed if states.get(n.name) == "Succeeded")
    if baseline_body is None or not method_bodies:
        decision = _waiting_decision(spec, ready, len(pool_needed), now)
        decision.basis = basis
        return decision, None
    plan = decide_pool(
        policy=spec.policy, candidates=list(spec.methods),
        baseline=SpeculationProfile.model_validate(baseline_body),
        profiles={k: SpeculationProfile.model_validate(b) for k, b in method_bodies.items()},
        price_per_gpu_hour=price, gpus_per_replica=gpus,
        concurrency_histogram=histogram, live_acceptance=live,
        # A change of method rolls the pods: the one served now stays unless another beats it by the margin.
        incumbent=old.decision.method if old.decision is not None else None,
        engine_supports_dynamic=spec.model.data_parallel_size == 1, now=now)
    update: dict = {"basis": basis}
    for method, (per_position, drafts_per_step) in (live or {}).items():
        update.update(live_method=method, live_acceptance_per_position=per_position,
                      live_drafts_per_step=drafts_per_step)
    decision = plan.decision.model_copy(update=update)
    return decision, plan.capacity_concurrency_per_replica


def _waiting_decision(spec: SpeculativeDeploymentSpec, ready: int, total: int, now: datetime) -> Decision:
    reason = f"waiting for profiles ({ready}/{total} ready): serving without speculation"
    if spec.profiling.speculate_before_profiled:
        first = spec.methods[0]
        return Decision(method=first.key, num_speculative_tokens=first.num_speculative_tokens,
                        strategy=Strategy.RESTART, source="prior", decided_at=now,
                        reason=f"waiting for profiles ({ready}/{total} ready): speculating with {first.key} at "
                               f"K={first.num_speculative_tokens} (profiling.speculateBeforeProfiled)")
    return Decision(method=None, source="none", reason=reason, decided_at=now)


LIVE_RESCHEDULE_DRIFT = 0.10
"""Relative change of mean acceptance length, live against the profile, that recomputes the schedule."""


def _profiled_acceptance(pool: PoolStatus, method_bodies: dict[str, dict]) -> tuple[list[float], float] | None:
    """(per-position acceptance, drafts per step) of the served method's largest-K run."""
    decision = pool.decision
    if decision is None or not decision.method or decision.method not in method_bodies:
        return None
    runs = (method_bodies[decision.method].get("status") or {}).get("runs") or []
    top = max((r for r in runs if r.get("numSpeculativeTokens")), key=lambda r: r["numSpeculativeTokens"],
              default=None)
    acceptance = (top or {}).get("acceptance") or {}
    if not acceptance.get("perPosition"):
        return None
    return list(acceptance["perPosition"]), float(acceptance.get("draftsPerStep") or 1.0)


def _acceptance_drift(pool: PoolStatus, method_bodies: dict[str, dict]) -> float | None:
    """|live - profiled| / profiled acceptance at the first draft position of the served method, or None.

    Only position 0 compares like with like: under a schedule the engine drafts fewer tokens at higher
    batch sizes, so later positions and the mean acceptance length mix in steps that never drafted them."""
    observed, profiled = pool.observed, _profiled_acceptance(pool, method_bodies)
    if observed is None or not observed.acceptance_per_position or profiled is None or not pool.speculation_enabled:
        return None
    return abs(observed.acceptance_per_position[0] - profiled[0][0]) / max(profiled[0][0], 1e-9)


def _live_acceptance(pool: PoolStatus, method_bodies: dict[str, dict]) -> dict[str, tuple[list[float], float]] | None:
    """The acceptance the decision should use instead of the profile's, with hysteresis so that noise and
    the decision's own effect (speculation off: nothing observed) never flip it back and forth:
    - live first-position acceptance more than 10% off the profile, and more than 10% off what the current
      decision already used: the profile's per-position curve scaled to the live level;
    - back within 5% of the profile: none (the profile again);
    - otherwise (no fresh data, or in between): whatever the current decision used."""
    decision = pool.decision
    kept = None
    if decision is not None and decision.live_method and decision.live_acceptance_per_position:
        kept = {decision.live_method: (list(decision.live_acceptance_per_position),
                                       decision.live_drafts_per_step or 1.0)}
    drift = _acceptance_drift(pool, method_bodies)
    if drift is None:
        return kept
    if drift < LIVE_RESCHEDULE_DRIFT / 2:
        return None
    if drift < LIVE_RESCHEDULE_DRIFT:
        return kept
    live_first = pool.observed.acceptance_per_position[0]
    if kept and decision.method in kept:
        kept_first = kept[decision.method][0][0]
        if abs(live_first - kept_first) / max(kept_first, 1e-9) < LIVE_RESCHEDULE_DRIFT:
            return kept
    per_position, drafts_per_step = _profiled_acceptance(pool, method_bodies)
    scale = live_first / max(per_position[0], 1e-9)
    return {decision.method: ([min(1.0, p * scale) for p in per_position], drafts_per_step)}


def _drifted_profile(spec: SpeculativeDeploymentSpec, view: desired.PoolView, needed: list[desired.NeededProfile],
                     states: dict[str, str], profiles: dict[str, dict],
                     pool: PoolStatus) -> tuple[desired.NeededProfile, float] | None:
    """The served method's profile when live acceptance drifted past profiling.reprofile.acceptanceDrift."""
    if view.primary_sku is None:
        return None
    _, method_bodies = _pool_profiles(needed, view.pool.name, view.primary_sku, profiles, states)
    drift = _acceptance_drift(pool, method_bodies)
    if drift is None or drift <= spec.profiling.reprofile.acceptance_drift:
        return None
    need = next(n for n in needed if n.pool == view.pool.name and n.sku == view.primary_sku
                and n.key == pool.decision.method)
    return need, drift


def _basis(generation: int | None, baseline: dict | None, methods: dict[str, dict],
           live: dict[str, tuple[list[float], float]] | None) -> str:
    parts = [f"g{generation}"]
    for key, body in sorted([("baseline", baseline)] if baseline else []) + sorted(methods.items()):
        parts.append(f"{key}:{body['metadata']['name']}@{(body.get('status') or {}).get('completedAt', '')}")
    for key, (per_position, f) in sorted((live or {}).items()):
        length = 1 + f * sum(per_position)
        parts.append(f"live:{key}:{round(length * 10) / 10:.1f}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def _speculation_state(ctx: Context, body: dict, spec: SpeculativeDeploymentSpec, pool: PoolStatus,
                       old: PoolStatus, observation: PoolObservation | None, rolling_out: bool, now: datetime,
                       events: list[Event]) -> bool:
    """Whether the engine runs with speculation: always under a schedule (it switches K itself), by the
    hysteresis state machine under the restart strategy."""
    decision = pool.decision
    if decision is None or not decision.method:
        return False
    if decision.strategy != Strategy.RESTART.value or decision.crossover_concurrency is None:
        return True
    if old.decision is not None and old.decision.method == decision.method:
        enabled = old.speculation_enabled
    else:
        # A new method starts on unless the load already seen is past the crossover.
        seen_load = old.observed.concurrency if old.observed else None
        enabled = seen_load is None or seen_load < decision.crossover_concurrency
    state = RestartState(speculation_enabled=enabled,
                         last_toggle_at=old.last_toggle_at, above_since=old.above_threshold_since,
                         below_since=old.below_threshold_since)
    seen = RestartObservation(observation.running_per_replica + observation.waiting_per_replica,
                              observation.observed_at) if observation else None
    step = restart_step(state, seen, decision.crossover_concurrency, spec.policy.hysteresis, rolling_out)
    pool.last_toggle_at = step.state.last_toggle_at
    pool.above_threshold_since = step.state.above_since
    pool.below_threshold_since = step.state.below_since
    if step.state.speculation_enabled != state.speculation_enabled:
        meta = body["metadata"]
        word = "on" if step.state.speculation_enabled else "off"
        events.append(Event("Normal", "SpeculationToggled", f"pool {pool.name}: speculation {word}: {step.reason}"))
        ctx.metrics.toggles.labels(meta["namespace"], meta["name"], pool.name, word).inc()
    return step.state.speculation_enabled


def _replicas(ctx: Context, body: dict, spec: SpeculativeDeploymentSpec, view: desired.PoolView, pool: PoolStatus,
              observation: PoolObservation | None, current: dict | None, metrics_problem: MetricsUnavailable | None,
              now: datetime) -> int | None:
    """Replicas to write: None in external mode (HPA/KEDA owns spec.replicas; we only publish)."""
    lo = view.pool.min_replicas if view.pool.min_replicas is not None else spec.serving.min_replicas
    hi = view.pool.max_replicas if view.pool.max_replicas is not None else spec.serving.max_replicas
    existing = (current or {}).get("spec", {}).get("replicas")
    now_replicas = int(existing) if existing is not None else lo
    if spec.serving.autoscaling == Autoscaling.NONE.value or not pool.capacity_concurrency_per_replica:
        pool.desired_replicas = max(lo, min(hi, now_replicas)) if spec.serving.autoscaling != "none" else lo
        return None if spec.serving.autoscaling == Autoscaling.EXTERNAL.value else pool.desired_replicas
    key = f"{body['metadata']['uid']}/{view.pool.name}"
    demand = observation.total_running + observation.total_waiting if observation else None
    result = plan_replicas(
        ctx.replica_states.get(key) or ReplicaState(), demand_concurrency=demand, current_replicas=now_replicas,
        capacity_per_replica=pool.capacity_concurrency_per_replica,
        target_utilization_percent=spec.serving.target_utilization_percent, min_replicas=lo, max_replicas=hi,
        stabilization_seconds=spec.serving.scale_down_stabilization_seconds, now=now)
    ctx.replica_states[key] = result.state
    pool.desired_replicas = result.replicas
    return None if spec.serving.autoscaling == Autoscaling.EXTERNAL.value else result.replicas


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _catalog_price(ctx: Context, sku: str) -> float:
    try:
        return ctx.catalog.resolve(sku).default_price_per_gpu_hour
    except KeyError:
        return 0.0


def _observation_due(ctx: Context, uid: str, pool: str, interval_s: float) -> bool:
    key = f"{uid}/{pool}"
    now = time.monotonic()
    if now - ctx.last_observed_at.get(key, 0.0) < interval_s:
        return False
    ctx.last_observed_at[key] = now
    return True


def _prometheus_url_refusal(ctx: Context, spec: SpeculativeDeploymentSpec) -> str | None:
    """Why the deployment's own Prometheus URL is not used (not on the admin's allow-list), or None."""
    url = spec.metrics.prometheus_url
    if spec.metrics.source != "prometheus" or not url:
        return None
    return allowlist.refusal(url, ctx.config.allowed_prometheus_urls)


def _max_k(spec: SpeculativeDeploymentSpec) -> int:
    """The most draft positions any candidate method can report: live per-position acceptance beyond it is
    not read (a position label is a number a pod chooses)."""
    return max((m.num_speculative_tokens for m in spec.methods), default=1)


async def _observe_pool(ctx: Context, spec: SpeculativeDeploymentSpec, namespace: str, name: str,
                        pool: str, current: dict | None) -> PoolObservation:
    deployment = names.serving_deployment_name(name, pool)
    metrics = spec.metrics
    limits = ctx.config.metrics_read_limits
    if metrics.source == "prometheus":
        refused = _prometheus_url_refusal(ctx, spec)
        if refused:
            raise MetricsUnavailable(refused, code="PrometheusUrlNotAllowed")
        url = metrics.prometheus_url or ctx.config.prometheus_url
        if not url:
            raise MetricsUnavailable("no Prometheus URL: the operator's prometheusUrl is not set (ask the cluster "
                                     "administrator), or use spec.metrics.source: pods")
        key = (url, metrics.window_seconds, metrics.stale_after_seconds)
        source = ctx.prometheus_sources.get(key)
        if source is None:
            source = ctx.prometheus_sources[key] = PrometheusSource(
                url, window_s=metrics.window_seconds, stale_after_s=metrics.stale_after_seconds,
                limits=ReadLimits.for_prometheus(limits))
        return await source.observe(namespace, pool_pod_regex(deployment), max_positions=_max_k(spec))
    key = f"{namespace}/{deployment}"
    source = ctx.pod_sources.get(key)
    if source is None:
        source = ctx.pod_sources[key] = PodScrapeSource(window_s=metrics.window_seconds,
                                                        stale_after_s=metrics.stale_after_seconds,
                                                        limits=ReadLimits.for_pods(limits))
    selector = ",".join(f"{k}={v}" for k, v in names.serving_selector(name, pool).items())
    pods = await ctx.kube.list("pods", namespace, label_selector=selector)
    running = [p for p in pods if (p.get("status") or {}).get("podIP") and (p.get("status") or {}).get("phase") == "Running"]
    deployment_uid = ((current or {}).get("metadata") or {}).get("uid")
    own = [p for p in running if deployment_uid and await _pod_is_own(ctx, namespace, deployment, deployment_uid, p)]
    # The port is the one the operator set on the engine container; nothing in the pod chooses it.
    targets = [(p["metadata"]["name"], f"http://{p['status']['podIP']}:{spec.serving.port}") for p in own]
    if not targets:
        foreign = len(running) - len(own)
        raise MetricsUnavailable(f"no running pods of {deployment} to scrape" + (
            f" ({foreign} pod(s) with its labels are not its own and are not scraped)" if foreign else ""))
    return await source.observe(targets, max_positions=_max_k(spec))


MAX_REPLICASET_OWNERS = 10_000
"""Bound on the remembered ReplicaSet -> Deployment ownerships."""


async def _pod_is_own(ctx: Context, namespace: str, deployment: str, deployment_uid: str, pod: dict) -> bool:
    """Whether the pod was created for the operator's own Deployment: controlled by a ReplicaSet of that
    Deployment's name that the Deployment (by uid) controls, and not on the host's network. Labels alone
    prove nothing: anyone who may create pods in the namespace can copy them."""
    if (pod.get("spec") or {}).get("hostNetwork"):
        return False
    status = pod.get("status") or {}
    if status.get("hostIP") and status.get("hostIP") == status.get("podIP"):
        return False
    owner = _controller(pod)
    if owner is None or owner.get("kind") != "ReplicaSet" or not str(owner.get("name", "")).startswith(f"{deployment}-"):
        return False
    rs_uid = owner.get("uid") or ""
    if rs_uid not in ctx.replicaset_owners:
        try:
            replicaset = await ctx.kube.get("replicasets", namespace, owner["name"])
        except NotFound:
            return False
        if (replicaset.get("metadata") or {}).get("uid") != rs_uid:
            return False
        if len(ctx.replicaset_owners) >= MAX_REPLICASET_OWNERS:
            ctx.replicaset_owners.clear()
        rs_owner = _controller(replicaset)
        ctx.replicaset_owners[rs_uid] = (rs_owner or {}).get("uid", "") if (rs_owner or {}).get("kind") == "Deployment" \
            else ""
    return ctx.replicaset_owners[rs_uid] == deployment_uid


def _controller(obj: dict) -> dict | None:
    return next((o for o in (obj.get("metadata") or {}).get("ownerReferences") or [] if o.get("controller")), None)


async def _reconcile_service(ctx: Context, body: dict, spec: SpeculativeDeploymentSpec) -> None:
    meta = body["metadata"]
    ident = {"sdep_name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]}
    await ctx.kube.apply(service(**ident, spec=spec))
    if spec.serving.service_monitor:
        try:
            await ctx.kube.apply(pod_monitor(**ident))
        except NotFound:
            log.warning("PodMonitor CRD not installed; set spec.serving.serviceMonitor: false or install "
                        "the Prometheus operator")
