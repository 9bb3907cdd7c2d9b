"""The operator's own configuration file (the Helm chart renders it into a ConfigMap).

Per-resource settings live in each SpeculativeDeployment; this file holds cluster-wide defaults:
where Prometheus is, which benchmark image to run, what a GPU hour costs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import Field, ValidationError, model_validator

from .api.base import ApiModel, format_validation_error
from .api.deployment_spec import (
    DEFAULT_CONCURRENCY_LEVELS,
    DEFAULT_ENGINE_IMAGE,
    ConcurrencyLevel,
    EndpointPickerRef,
    ParentRef,
)
from .api.gateway import GATEWAY_PARENT_PATTERN
from .api.tenancy import TenancyPolicy


class ProfilingDefaults(ApiModel):
    """Defaults for profiling settings a SpeculativeDeployment leaves out."""

    concurrency_levels: list[ConcurrencyLevel] = Field(default_factory=lambda: list(DEFAULT_CONCURRENCY_LEVELS),
                                                      min_length=1, max_length=32)
    """Concurrency levels to measure (each 1..4096, as in a SpeculativeDeployment)."""
    requests_per_level: int = Field(default=64, ge=1)
    """Requests per level."""
    max_parallel_jobs_per_pool: int = Field(default=1, ge=1)
    """Benchmark Jobs at once per pool."""
    max_age_hours: float = Field(default=168, ge=0)
    """Profiles older than this are measured again; 0 = never by age."""


class MetricsReadLimits(ApiModel):
    """Bounds on what the operator reads from metrics endpoints it does not control (the serving pods'
    /metrics, Prometheus): one tenant's endpoint must not exhaust the operator that serves every namespace."""

    max_response_bytes: int = Field(default=4 * 2**20, ge=64 * 2**10, le=256 * 2**20)
    """Most bytes read from one /metrics page or one Prometheus answer; a larger body is not read further
    and that source counts as failed (the MetricsTruncated condition says so)."""
    scrape_timeout_seconds: float = Field(default=5, gt=0, le=60)
    """Whole-request time limit of one pod /metrics scrape: connect, headers and body."""
    prometheus_timeout_seconds: float = Field(default=10, gt=0, le=120)
    """Whole-request time limit of one Prometheus query."""
    max_series: int = Field(default=10_000, ge=100, le=1_000_000)
    """Most samples read from one /metrics page, or series from one Prometheus answer; a page or answer
    with more is refused (vLLM serves a few hundred)."""


class OperatorConfig(ApiModel):
    """Cluster-wide settings of the specpilot operator."""

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        # `benchmarkMode` was never read: every benchmark Job starts vLLM inside its bench container. `launch`
        # (what always happened) is dropped; `sidecar` is refused, since it promised an isolation it never gave.
        if isinstance(data, dict) and "benchmarkMode" in data:
            data = dict(data)
            if data.pop("benchmarkMode") != "launch":
                raise ValueError("benchmarkMode is removed: every benchmark Job starts vLLM in its bench container "
                                 "(the former `launch` mode); the sidecar mode was never used. Remove benchmarkMode")
        return data

    prometheus_url: str = ""
    """Default Prometheus base URL for resources that do not name one; empty = none."""
    allowed_prometheus_urls: list[str] = Field(default_factory=list, max_length=256)
    """Prometheus URLs a SpeculativeDeployment may name in spec.metrics.prometheusUrl: exact base URLs, or
    prefixes ending in `/*` (same scheme, host and port; the path continues below the prefix). prometheusUrl is
    always allowed (what the operator reads anyway); any other URL is refused (the operator would otherwise GET
    any URL a tenant names, from its own network position)."""
    allowed_gateway_parents: list[Annotated[str, Field(max_length=317, pattern=GATEWAY_PARENT_PATTERN)]] = Field(
        default_factory=list, max_length=256)
    """Gateways (Gateway API) outside a deployment's own namespace that its HTTPRoute (spec.serving.routing:
    gateway) may attach to, as `namespace/name`, either part `*` for any (e.g. `gateway-system/public`,
    `shared-gw/*`). A Gateway in the deployment's own namespace is always allowed; empty: only those. A
    parentRef outside the list fails the resource (Valid=False) and nothing is created."""
    default_gateway_parent_refs: list[ParentRef] = Field(default_factory=list, max_length=32)
    """The Gateway(s) a deployment's HTTPRoute attaches to when its spec.serving.gateway.parentRefs is empty (e.g.
    `[{name: inference-gateway, namespace: gateway-system}]`). With one, `routing: auto` (the default) routes by
    weights wherever the cluster serves the Gateway API: the cheapest routing for a mixed fleet. Empty: auto
    weighs only for deployments that name a Gateway themselves. The admin's own choice: allowedGatewayParents
    does not apply to it."""
    default_endpoint_picker_ref: EndpointPickerRef | None = None
    """The endpoint picker of the InferencePools when a deployment's spec.serving.inferencePool is absent
    (`{port: 9002, failureMode: FailClose}` for one picker per pool named `<InferencePool>-epp`). With one,
    `routing: auto` chooses inferencePool wherever the cluster serves InferencePools and a Gateway is named.
    Unset: auto chooses inferencePool only for deployments that name a picker themselves."""
    benchmark_image: str = "ghcr.io/specpilot/specpilot-bench:0.1.0"
    """Image of the benchmark Job (specpilot-bench on the vLLM image)."""
    default_engine_image: str = DEFAULT_ENGINE_IMAGE
    """vLLM image when a resource leaves model.image at its default."""
    gpu_prices_per_hour: dict[str, float] = Field(default_factory=dict)
    """Dollars per GPU-hour by SKU (e.g. {"H100-SXM": 2.49}); a pool's pricePerGpuHour wins."""
    profiling_defaults: ProfilingDefaults = Field(default_factory=ProfilingDefaults)
    """Profiling defaults."""
    reconcile_interval_seconds: float = Field(default=15, gt=0)
    """How often each SpeculativeDeployment is reconciled even without changes."""
    metrics_read_limits: MetricsReadLimits = Field(default_factory=MetricsReadLimits)
    """Size, time and series bounds on reading pod /metrics pages and Prometheus answers."""
    bench_cluster_role: str = Field(default="specpilot-bench", min_length=1, max_length=253)
    """The ClusterRole (shipped by the chart) that the benchmark Jobs' ServiceAccount is bound to in each
    namespace, by a RoleBinding the operator creates: get a SpeculationProfile, get and patch its status."""
    profile_watch_seconds: float = Field(default=2, gt=0)
    """How often each SpeculativeDeployment checks, in memory, whether its profiles or their benchmark Jobs
    changed (a profile finished, failed or took a run); it is reconciled at once when they did, instead of
    at the next reconcileIntervalSeconds. Only while it waits on them (not Serving yet, profiles pending, a
    refinement round measuring)."""
    tenancy: TenancyPolicy = Field(default_factory=TenancyPolicy)
    """What a SpeculativeDeployment may make the operator run: pod-override fields beyond the safe ones, volume
    types, Secrets it may reference, benchmark and engine images, the pods' non-root identity, the largest
    spec (see docs/security.md). The defaults keep every pod within the `restricted` Pod Security Standard."""




def load_config(path: str | Path | None) -> OperatorConfig:
    """Read the config file; a missing path gives the defaults, a bad file a clear error."""
    if not path:
        return OperatorConfig()
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except OSError as exc:
        raise SystemExit(f"cannot read operator config {path}: {exc.strerror}") from exc
    try:
        return OperatorConfig.model_validate(data)
    except ValidationError as exc:
        raise SystemExit(f"invalid operator config {path}: {format_validation_error(exc, root='config')}") from exc
