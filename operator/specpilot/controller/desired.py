"""Pure pieces of reconciliation: which pools exist on which GPUs, which profiles each pool needs,
which benchmark Jobs may start, conditions, phase and the status summary.

No kopf, no client: the handlers read the cluster, call these, then write what they return.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property

from ..api.base import Condition
from ..api.deployment_spec import GpuPool, SpeculativeDeploymentSpec
from ..api.deployment_status import PoolStatus
from ..api.methods import CandidateMethod
from ..api.profile import EngineSettings, ProfileTarget, SpeculationProfileSpec
from ..config import OperatorConfig
from ..manifests import names
from ..perf.catalog import DEFAULT_CATALOG, GpuCatalog, UnknownGpuError

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
AMD_PRODUCT_LABEL = "amd.com/gpu.product-name"


@dataclass(frozen=True)
class NodeInfo:
    """What the operator needs of a Node."""

    name: str
    labels: dict[str, str]
    ready: bool = True


@dataclass
class PoolView:
    """A pool as seen on the cluster: its nodes and the GPU types (SKUs) they carry."""

    pool: GpuPool
    nodes: list[NodeInfo] = field(default_factory=list)
    products: list[str] = field(default_factory=list)
    skus: list[str] = field(default_factory=list)
    """SKUs to profile: the spec's sku, or one per GPU product found on the nodes (most common first)."""
    unknown_products: list[str] = field(default_factory=list)

    @property
    def primary_sku(self) -> str | None:
        return self.skus[0] if self.skus else None


def node_info(body: dict) -> NodeInfo:
    meta = body.get("metadata", {})
    conditions = body.get("status", {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions) or not conditions
    return NodeInfo(name=meta.get("name", ""), labels=dict(meta.get("labels") or {}), ready=ready)


def pool_views(spec: SpeculativeDeploymentSpec, nodes: list[NodeInfo],
               catalog: GpuCatalog = DEFAULT_CATALOG) -> list[PoolView]:
    """Match nodes to pools by node selector and work out each pool's SKUs."""
    views = []
    for pool in spec.gpu_pools:
        matching = [n for n in nodes if all(n.labels.get(k) == v for k, v in pool.node_selector.items())]
        products = Counter(n.labels.get(GPU_PRODUCT_LABEL) or n.labels.get(AMD_PRODUCT_LABEL) for n in matching)
        products.pop(None, None)
        view = PoolView(pool=pool, nodes=matching, products=[p for p, _ in products.most_common()])
        if pool.sku:
            view.skus = [catalog.resolve(pool.sku).sku] if pool.sku in catalog else [pool.sku]
        else:
            for product in view.products:
                try:
                    sku = catalog.resolve(product).sku
                except UnknownGpuError:
                    view.unknown_products.append(product)
                    sku = product
                if sku not in view.skus:
                    view.skus.append(sku)
        views.append(view)
    return views


def engine_image(spec: SpeculativeDeploymentSpec, config: OperatorConfig) -> str:
    return spec.model.image if "image" in spec.model.model_fields_set else config.default_engine_image


def engine_settings(spec: SpeculativeDeploymentSpec) -> EngineSettings:
    """What of the deployment's engine settings a profile measures (part of its identity)."""
    overrides = spec.profiling.pod_overrides or {}
    containers = [c for field in ("containers", "initContainers") for c in overrides.get(field) or []
                  if isinstance(c, dict)]
    # a mounted volume's source decides what is read at its path (two PVCs at /models: two models' weights)
    mounted = {m.get("name") for c in containers for m in c.get("volumeMounts") or [] if isinstance(m, dict)}
    volumes = sorted((v for v in overrides.get("volumes") or [] if isinstance(v, dict) and v.get("name") in mounted),
                     key=lambda v: str(v.get("name")))
    return EngineSettings(extra_args=list(spec.model.extra_args), env=list(spec.model.env),
                          resources=spec.model.resources,
                          gpu_memory_utilization=spec.model.gpu_memory_utilization
                          if "gpu_memory_utilization" in spec.model.model_fields_set else None,
                          container_overrides=containers, volumes=volumes)


def profile_spec(spec: SpeculativeDeploymentSpec, sku: str, candidate: CandidateMethod | None,
                 config: OperatorConfig, gpu_product: str | None = None) -> SpeculationProfileSpec:
    """The identity of the measurement of `candidate` (None = baseline) on `sku` for this deployment."""
    profiling = spec.profiling
    levels = profiling.concurrency_levels if "concurrency_levels" in profiling.model_fields_set \
        else config.profiling_defaults.concurrency_levels
    requests = profiling.requests_per_level if "requests_per_level" in profiling.model_fields_set \
        else config.profiling_defaults.requests_per_level
    return SpeculationProfileSpec(
        model=ProfileTarget(id=spec.model.id, revision=spec.model.revision,
                            tensor_parallel_size=spec.model.tensor_parallel_size,
                            max_model_len=spec.model.max_model_len),
        method=candidate,
        sku=sku,
        gpu_product=gpu_product,
        engine_image=engine_image(spec, config),
        engine=engine_settings(spec),
        benchmark_image=spec.profiling.image or config.benchmark_image,
        workload=profiling.workload,
        concurrency_levels=levels,
        requests_per_level=requests,
    )


@dataclass(frozen=True)
class NeededProfile:
    pool: str
    sku: str
    candidate: CandidateMethod | None
    spec: SpeculationProfileSpec

    @cached_property
    def name(self) -> str:
        """The profile's object name (a hash of its identity: computed once, read many times a reconciliation)."""
        return self.spec.object_name()

    @property
    def key(self) -> str:
        """Candidate key, or "baseline"."""
        return self.candidate.key if self.candidate else "baseline"


def needed_profiles(spec: SpeculativeDeploymentSpec, views: list[PoolView],
                    config: OperatorConfig) -> list[NeededProfile]:
    """Baseline plus every candidate, for every SKU of every pool (deduplicated by identity)."""
    out: list[NeededProfile] = []
    for view in views:
        for sku in view.skus:
            product = next((p for p in view.products if p == sku or _sku_of(p) == sku), None)
            for candidate in [None, *spec.methods]:
                out.append(NeededProfile(view.pool.name, sku, candidate,
                                         profile_spec(spec, sku, candidate, config, product)))
    return out


def _sku_of(product: str) -> str | None:
    try:
        return DEFAULT_CATALOG.resolve(product).sku
    except UnknownGpuError:
        return None


VERDICT_ANNOTATION = "specpilot.io/verdict"
"""On a SpeculationProfile: the operator's own record of the phase it decided (Succeeded or Failed) with its reason
and message, as JSON. Metadata, which the benchmark identity cannot write (it may patch status only): status.phase,
reason and message mirror it, and a status that disagrees was written by someone else."""
VERDICT_MESSAGE_CHARS = 2048
TERMINAL_PHASES = ("Succeeded", "Failed")


def verdict_of(profile: dict) -> dict | None:
    """The operator's verdict on a profile ({"phase", "reason", "message"}), or None while it has given none."""
    text = (((profile.get("metadata") or {}).get("annotations")) or {}).get(VERDICT_ANNOTATION)
    if not text:
        return None
    try:
        verdict = json.loads(text)
    except ValueError:
        return None
    if not isinstance(verdict, dict) or verdict.get("phase") not in TERMINAL_PHASES:
        return None
    return {"phase": verdict["phase"], "reason": verdict.get("reason"), "message": verdict.get("message")}


def verdict_message(message: str | None) -> str | None:
    """A verdict's message as the annotation keeps it, and as the status carries it beside the verdict."""
    return (message or "")[:VERDICT_MESSAGE_CHARS] or None


def verdict_annotation(phase: str, reason: str | None, message: str | None) -> str:
    """The annotation value recording the operator's verdict."""
    return json.dumps({"phase": phase, "reason": reason, "message": verdict_message(message)}, sort_keys=True)


OPERATOR_NOTE_REASONS = frozenset({"Measuring", "PodNotStarting"})
"""Reasons the operator writes beside a verdict while a later Job (a refinement round) measures the profile: text
of these is its own, not a rewrite of the verdict's."""


def result_complete(profile: dict) -> bool:
    """Whether the profile's status holds every run its measurement needs (k=0 for a baseline, 1 and K for a
    method), each with points: a result the operator may check and, when sealed and plausible, accept."""
    spec = profile.get("spec") or {}
    method = spec.get("method")
    try:
        expected = {0} if not method else {1, int(method.get("numSpeculativeTokens") or 0)}
    except (TypeError, ValueError, AttributeError):
        return False
    runs = (profile.get("status") or {}).get("runs") or []
    measured = {r.get("numSpeculativeTokens") for r in runs if isinstance(r, dict) and r.get("points")}
    return expected <= measured


@dataclass(frozen=True)
class OwnedView:
    """A profile as the operator reads it: its phase from the operator's verdict, or (before one) from the
    sealed result and the Job; never from a status.phase someone else wrote."""

    profile: dict
    """The profile with status.phase, reason and message replaced by what the operator stands by."""
    phase: str
    """Pending, Running, Succeeded (a verdict, or a complete result to check) or Failed (a verdict)."""
    written: str | None
    """status.phase as stored, when it differs from `phase` (None: they agree)."""
    forged: bool
    """The stored phase is a decision (Succeeded or Failed) the operator did not make: reported, then restored."""
    text_forged: bool = False
    """status.reason or status.message differ from the operator's verdict while status.phase agrees: someone
    rewrote the text alone (reported, then restored)."""


def owned_view(profile: dict) -> OwnedView:
    """The operator's view of a profile (pure): a verdict wins over status; before a verdict a complete result is
    a Succeeded candidate (its seal and plausibility are checked next), anything else is Pending or Running
    whatever status.phase says."""
    status = profile.get("status") or {}
    stored = status.get("phase") or "Pending"
    verdict = verdict_of(profile)
    if verdict is not None:
        phase, reason, message = verdict["phase"], verdict["reason"], verdict["message"]
        view_status = {**status, "phase": phase, "reason": reason, "message": message}
        forged = stored in TERMINAL_PHASES and stored != phase
        text_forged = stored == phase and status.get("reason") not in OPERATOR_NOTE_REASONS and (
            status.get("reason"), status.get("message")) != (reason, message)
        return OwnedView({**profile, "status": view_status}, phase, stored if stored != phase else None, forged,
                         text_forged)
    else:
        phase = "Succeeded" if result_complete(profile) else ("Pending" if stored == "Pending" else "Running")
        view_status = {**status, "phase": phase}
        forged = stored in TERMINAL_PHASES and stored != phase
    return OwnedView({**profile, "status": view_status}, phase, stored if stored != phase else None, forged)


def job_completed_at(job: dict) -> datetime | None:
    """When a Job completed (status.completionTime, else its Complete condition's transition), or None."""
    status = job.get("status") or {}
    stamp = status.get("completionTime") or next(
        (c.get("lastTransitionTime") for c in status.get("conditions") or []
         if c.get("type") in ("Complete", "SuccessCriteriaMet") and c.get("status") == "True"), None)
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None


ROLLOUT_DONE = "RolledOut"
ROLLOUT_IN_PROGRESS = "RollingOut"
ROLLOUT_STALLED = "Stalled"
STALLED_ADVICE = ("the previous pods keep serving and speculation toggles wait. If the new pods are Pending for want "
                  "of a GPU, the pool has no room for a surge pod: set maxSurge: 0 and maxUnavailable: 1 in "
                  "spec.serving.rollout (or spec.gpuPools[].rollout for this pool). Otherwise see")


def rolling_out(deployment: dict) -> bool:
    """Whether the Deployment controller has not yet finished the latest template (a Deployment with no
    status yet has not been looked at by one, and counts as not rolling)."""
    status = deployment.get("status")
    if not status:
        return False
    spec_replicas = int(deployment.get("spec", {}).get("replicas") or 0)
    generation = int(deployment.get("metadata", {}).get("generation") or 0)
    return (int(status.get("observedGeneration") or generation) < generation
            or int(status.get("updatedReplicas") or 0) < spec_replicas
            or int(status.get("unavailableReplicas") or 0) > 0)


def rollout_state(deployment: dict | None) -> tuple[str | None, str]:
    """(state, message) of a pool Deployment's rollout: RolledOut, RollingOut, Stalled (the Deployment
    controller gave up waiting: Progressing=False, ProgressDeadlineExceeded), or None with no Deployment."""
    if deployment is None:
        return None, ""
    name = (deployment.get("metadata") or {}).get("name", "")
    status = deployment.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("status") == "False" \
                and cond.get("reason") == "ProgressDeadlineExceeded":
            deadline = (deployment.get("spec") or {}).get("progressDeadlineSeconds")
            within = f" within {deadline} s (progressDeadlineSeconds)" if deadline else ""
            return ROLLOUT_STALLED, (f"the rollout of Deployment {name} made no progress{within}: {STALLED_ADVICE} "
                                     f"`kubectl describe deployment/{name}` and the new pods' events")
    if not status or rolling_out(deployment):
        replicas = int((deployment.get("spec") or {}).get("replicas") or 0)
        return ROLLOUT_IN_PROGRESS, (f"Deployment {name}: {int(status.get('updatedReplicas') or 0)}/{replicas} "
                                     f"pods updated, {int(status.get('availableReplicas') or 0)} available")
    return ROLLOUT_DONE, f"Deployment {name} is up to date"


def rolled_out_condition(pools: list[PoolStatus], sdep_name: str) -> tuple[bool, str, str] | None:
    """The RolledOut condition (status, reason, message) over the pools' rollouts; None before any pool has
    a Deployment. A stalled rollout outranks one in progress: it needs a person."""
    stalled = [p.name for p in pools if p.rollout == ROLLOUT_STALLED]
    moving = [p.name for p in pools if p.rollout == ROLLOUT_IN_PROGRESS]
    if stalled:
        deployments = ", ".join(f"deployment/{names.serving_deployment_name(sdep_name, p)}" for p in stalled)
        return False, "ProgressDeadlineExceeded", (
            f"the rollout of pool(s) {', '.join(stalled)} made no progress within its progressDeadlineSeconds "
            f"(spec.serving.rollout, or the pool's own rollout): {STALLED_ADVICE} `kubectl describe {deployments}`")
    if moving:
        return False, "RollingOut", f"rolling out pool(s) {', '.join(moving)}"
    if any(p.rollout for p in pools):
        return True, "RolledOut", "every pool's Deployment runs its latest configuration"
    return None


TRUNCATED_SHOWN = 3
"""Cut reads named in the MetricsTruncated message; the rest are counted."""


def truncated_condition(cut: list[str], old: list[Condition]) -> tuple[bool, str, str] | None:
    """The MetricsTruncated condition (status, reason, message) after an observation: True when a read bound
    (size, time, series, draft positions) left something out, saying what; False once a later observation
    read everything; None while it never was True (the condition appears only once a bound was hit)."""
    if cut:
        shown = "; ".join(cut[:TRUNCATED_SHOWN]) + (f"; and {len(cut) - TRUNCATED_SHOWN} more" if
                                                     len(cut) > TRUNCATED_SHOWN else "")
        return True, "ReadLimitExceeded", (f"{shown}. The operator bounds what it reads from metrics endpoints "
                                           "(its metricsReadLimits config); decisions use what was read within them")
    if any(c.type == "MetricsTruncated" for c in old):
        return False, "WithinLimits", "the last observation was read within the operator's metricsReadLimits"
    return None


def max_parallel_jobs(spec: SpeculativeDeploymentSpec, config: OperatorConfig) -> int:
    """Benchmark Jobs at once per pool: spec.profiling.maxParallelJobsPerPool when the deployment sets it, else
    the operator config's profilingDefaults.maxParallelJobsPerPool (as for the other profiling defaults)."""
    profiling = spec.profiling
    if "max_parallel_jobs_per_pool" in profiling.model_fields_set:
        return profiling.max_parallel_jobs_per_pool
    return config.profiling_defaults.max_parallel_jobs_per_pool


def set_condition(conditions: list[Condition], type_: str, status: bool | None, reason: str, message: str,
                  generation: int | None, now: datetime) -> list[Condition]:
    """Upsert a condition; lastTransitionTime moves only when the status changes."""
    value = "Unknown" if status is None else ("True" if status else "False")
    out = []
    found = False
    for c in conditions:
        if c.type == type_:
            found = True
            changed = c.status != value
            out.append(Condition(type=type_, status=value, reason=reason, message=message,
                                 last_transition_time=now if changed else (c.last_transition_time or now),
                                 observed_generation=generation))
        else:
            out.append(c)
    if not found:
        out.append(Condition(type=type_, status=value, reason=reason, message=message,
                             last_transition_time=now, observed_generation=generation))
    return out
