"""Observing a pool's load: from its own pods' /metrics or from the admin's Prometheus, bounded, every
spec.metrics.intervalSeconds. A missing source is a `MetricsUnavailable` the reconciliation reports (and the
planner then holds the last decision and replica count)."""

from __future__ import annotations

import time
from datetime import datetime

from ..api.deployment_spec import SpeculativeDeploymentSpec
from ..manifests import names
from ..observe import allowlist
from ..observe.bounded import ReadLimits
from ..observe.model import MetricsUnavailable, PoolObservation
from ..observe.pods import PodScrapeSource
from ..observe.prometheus import PrometheusSource, pool_pod_regex
from ..policy.fleet import HISTORY_SAMPLES, FleetSettings
from .context import Context
from .kube import NotFound


async def observe_pool(ctx: Context, uid: str, spec: SpeculativeDeploymentSpec, namespace: str, name: str,
                       pool: str, current: dict | None) -> tuple[PoolObservation | None, MetricsUnavailable | None]:
    """A fresh observation of the pool, or why there is none; (None, None) when one is not due yet or no
    replica is ready (nothing to observe before one is: that is no metrics outage). What the read bounds
    left out is kept for the reconciliation's MetricsTruncated condition (`ObjectCache.last_cut`)."""
    ready_replicas = int(((current or {}).get("status") or {}).get("readyReplicas") or 0)
    cache = ctx.cache(uid)
    now = time.monotonic()
    if not ready_replicas or now - cache.last_observed_at.get(pool, float("-inf")) < spec.metrics.interval_seconds:
        return None, None
    cache.last_observed_at[pool] = now
    try:
        observation = await _observe_pool(ctx, uid, spec, namespace, name, pool, current)
    except MetricsUnavailable as exc:
        cache.last_cut[pool] = exc.cut
        return None, exc
    cache.last_cut[pool] = observation.cut
    return observation, None


def prometheus_url_refusal(ctx: Context, spec: SpeculativeDeploymentSpec) -> str | None:
    """Why the deployment's own Prometheus URL is not used (neither on the admin's allow-list nor the operator's
    own prometheusUrl), or None; `specpilot validate` warns by the same function."""
    return allowlist.prometheus_url_refusal(spec, ctx.config)


def _max_k(spec: SpeculativeDeploymentSpec) -> int:
    """The most draft positions any candidate method can report: live per-position acceptance beyond it is
    not read (a position label is a number a pod chooses)."""
    return max((m.num_speculative_tokens for m in spec.methods), default=1)


async def demand_history(ctx: Context, spec: SpeculativeDeploymentSpec, namespace: str, name: str,
                         pools: list[str]) -> tuple[tuple[datetime, float], ...]:
    """The deployment's output tokens/s over the fleet planner's history window as its Prometheus holds it (the
    pods of all its pools), for a forecast that would otherwise start cold; empty without a Prometheus source
    or when it holds nothing (a deployment that never served) or cannot be read (the planner starts cold, as
    it would have)."""
    if spec.metrics.source != "prometheus":
        return ()
    span_s = FleetSettings().history_seconds
    try:
        source = _prometheus(ctx, spec)
        return tuple(await source.demand_history(namespace, [names.serving_deployment_name(name, p) for p in pools],
                                                 span_s, span_s / HISTORY_SAMPLES))
    except MetricsUnavailable:
        return ()


def _prometheus(ctx: Context, spec: SpeculativeDeploymentSpec) -> PrometheusSource:
    """The (shared) source for the deployment's Prometheus; MetricsUnavailable when it may not or cannot be used."""
    metrics = spec.metrics
    refused = prometheus_url_refusal(ctx, spec)
    if refused:
        raise MetricsUnavailable(refused, code="PrometheusUrlNotAllowed")
    url = metrics.prometheus_url or ctx.config.prometheus_url
    if not url:
        raise MetricsUnavailable("no Prometheus URL: the operator's prometheusUrl is not set (ask the cluster "
                                 "administrator), or use spec.metrics.source: pods")
    limits = ctx.config.metrics_read_limits
    return ctx.prometheus_source(url, metrics.window_seconds, metrics.stale_after_seconds, lambda: PrometheusSource(
        url, window_s=metrics.window_seconds, stale_after_s=metrics.stale_after_seconds,
        limits=ReadLimits.for_prometheus(limits)))


async def _observe_pool(ctx: Context, uid: str, spec: SpeculativeDeploymentSpec, namespace: str, name: str,
                        pool: str, current: dict | None) -> PoolObservation:
    deployment = names.serving_deployment_name(name, pool)
    metrics = spec.metrics
    limits = ctx.config.metrics_read_limits
    if metrics.source == "prometheus":
        source = _prometheus(ctx, spec)
        return await source.observe(namespace, pool_pod_regex(deployment), max_positions=_max_k(spec))
    sources = ctx.cache(uid).pod_sources
    source = sources.get(pool)
    if source is None:
        source = sources[pool] = PodScrapeSource(window_s=metrics.window_seconds,
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
        rs_owner = _controller(replicaset)
        ctx.replicaset_owners[rs_uid] = (rs_owner or {}).get("uid", "") if (rs_owner or {}).get("kind") == "Deployment" \
            else ""
    return ctx.replicaset_owners[rs_uid] == deployment_uid


def _controller(obj: dict) -> dict | None:
    return next((o for o in (obj.get("metadata") or {}).get("ownerReferences") or [] if o.get("controller")), None)


