"""`SpeculationProfile` (short name `sprof`): one measurement of one method (or the no-SD baseline) of one
model on one GPU type, engine image and workload.

The spec is the measurement's identity; its name derives from a hash of that identity so any
SpeculativeDeployment asking for the same measurement reuses it. The status is written by the
benchmark Job: measured points per run (K=0 baseline, K=1, K=max), per-position acceptance, KV capacity,
hardware calibration.
"""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime
from enum import Enum
from typing import Annotated, Any

from pydantic import Field, model_validator

from .args import (
    EXTRA_ARG_PATTERN,
    MAX_ARG_LENGTH,
    MAX_EXTRA_ARGS,
    MODEL_ID_MAX_LENGTH,
    MODEL_ID_PATTERN,
    REVISION_MAX_LENGTH,
    REVISION_PATTERN,
)
from .base import ApiModel, FreeFormObject, ImageRef, StatusModel
from .deployment_spec import ConcurrencyLevel, EnvVar, Workload
from .methods import CandidateMethod


class ProfileTarget(ApiModel):
    """The model being measured."""

    id: str = Field(min_length=1, max_length=MODEL_ID_MAX_LENGTH, pattern=MODEL_ID_PATTERN)
    """Model id or path (as in SpeculativeDeployment spec.model.id)."""
    revision: str | None = Field(default=None, max_length=REVISION_MAX_LENGTH, pattern=REVISION_PATTERN)
    """Model revision."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    """GPUs per engine."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Context length the engine was started with."""


class EngineSettings(ApiModel):
    """The engine's settings beyond the model that change what a profile measures: two deployments that
    differ in any of them never share a profile."""

    extra_args: list[Annotated[str, Field(max_length=MAX_ARG_LENGTH, pattern=EXTRA_ARG_PATTERN)]] = Field(
        default_factory=list, max_length=MAX_EXTRA_ARGS)
    """spec.model.extraArgs."""
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    """spec.model.env (a Secret's value is not part of it, only its name and key)."""
    resources: FreeFormObject | None = None
    """spec.model.resources."""
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    """spec.model.gpuMemoryUtilization (it sets the KV cache capacity measured)."""
    container_overrides: list[FreeFormObject] = Field(default_factory=list, max_length=8)
    """The containers and initContainers entries of spec.profiling.podOverrides (env, resources, mounts of
    the bench and engine)."""
    volumes: list[FreeFormObject] = Field(default_factory=list, max_length=64)
    """The volumes of spec.profiling.podOverrides that those containers mount, whole: their source (a
    ConfigMap's or Secret's name, a PVC's claimName, an image volume's reference, a CSI driver and its
    attributes...) decides what the engine reads at the mount path (its weights, its code)."""

    def identity(self) -> dict[str, Any]:
        """The settings that are set (an empty or default one leaves the identity as it was without it); image
        volumes by digest where they give one."""
        out = {k: v for k, v in self.dump().items() if v not in ([], {}, None)}
        if "volumes" in out:
            out["volumes"] = [_volume_identity(v) for v in out["volumes"]]
        return out


def image_identity(ref: str) -> str:
    """An image as a profile's identity names it: by digest where the reference gives one (`repo:tag@sha256:x`
    runs what `repo@sha256:x` runs, whatever the tag says), else as written."""
    name, at, digest = ref.partition("@")
    if not at:
        return ref
    slash = name.rfind("/")
    colon = name.rfind(":")
    return f"{name[:colon] if colon > slash else name}@{digest}"


def _volume_identity(volume: dict[str, Any]) -> dict[str, Any]:
    image = volume.get("image")
    if isinstance(image, dict) and isinstance(image.get("reference"), str):
        return {**volume, "image": {**image, "reference": image_identity(image["reference"])}}
    return volume


class SpeculationProfileSpec(ApiModel):
    """The identity of a measurement. Immutable once created."""

    model: ProfileTarget
    """Target model."""
    method: CandidateMethod | None = None
    """Speculative method; absent for the no-speculation baseline."""
    sku: str = Field(min_length=1, max_length=63)
    """GPU type, e.g. H100-SXM."""
    gpu_product: str | None = Field(default=None, max_length=63)
    """`nvidia.com/gpu.product` label value of the node that ran it, when known."""
    engine_image: ImageRef
    """vLLM image (the engine build is part of the identity)."""
    engine: EngineSettings | None = None
    """Engine settings beyond the model (extra args, env, resources, memory share, the bench's container
    overrides); part of the identity."""
    benchmark_image: ImageRef | None = None
    """Image of the benchmark Job that measures it (the bench and, in launch mode, the engine it starts are
    part of what is measured); part of the identity."""
    workload: Workload = Field(default_factory=Workload)
    """Prompts used."""
    concurrency_levels: list[ConcurrencyLevel] = Field(min_length=1, max_length=32)
    """Concurrency levels to measure (measurement settings, not part of the identity hash)."""
    requests_per_level: int = Field(default=64, ge=1, le=100000)
    """Requests per level (measurement setting, not part of the identity hash)."""

    @model_validator(mode="after")
    def _levels(self) -> SpeculationProfileSpec:
        if self.concurrency_levels != sorted(set(self.concurrency_levels)) or self.concurrency_levels[0] < 1:
            raise ValueError(f"concurrencyLevels must be positive, ascending and unique (got {self.concurrency_levels})")
        return self

    @property
    def is_baseline(self) -> bool:
        return self.method is None

    def identity(self) -> dict[str, Any]:
        """What the profile measures; equal identities are interchangeable measurements. Everything that
        changes the numbers is in it: model, method config, GPU type, engine image, workload, the engine's
        settings (extra args, env, resources, memory share, the bench's container overrides and the volumes
        they mount) and the benchmark image; images by digest where the reference gives one. (Settings left
        unset leave the hash as it was before they were part of it.)"""
        identity: dict[str, Any] = {
            "model": self.model.dump(),
            "method": self.method.identity() if self.method else None,
            "sku": self.sku,
            "engineImage": image_identity(self.engine_image),
            "workload": self.workload.dump(),
        }
        engine = self.engine.identity() if self.engine else {}
        if engine:
            identity["engine"] = engine
        if self.benchmark_image:
            identity["benchmarkImage"] = image_identity(self.benchmark_image)
        return identity

    def identity_hash(self) -> str:
        canonical = json.dumps(self.identity(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:10]

    def object_name(self) -> str:
        """Deterministic DNS-1123 name: sku, method and the identity hash (e.g. `h100-sxm-eagle3-1a2b3c4d5e`)."""
        method = self.method.method.replace("_", "-") if self.method else "baseline"
        stem = re.sub(r"[^a-z0-9-]+", "-", f"{self.sku}-{method}".lower()).strip("-")[:50].rstrip("-")
        return f"{stem}-{self.identity_hash()}"


class ProfilePhase(str, Enum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class LatencyStats(StatusModel):
    """Distribution of one latency over a level's requests, in milliseconds."""

    mean: float | None = None
    """Mean."""
    p50: float | None = None
    """Median."""
    p90: float | None = None
    """90th percentile."""
    p99: float | None = None
    """99th percentile."""


class LevelPoint(StatusModel):
    """What one concurrency level measured."""

    concurrency: int = Field(ge=1)
    """Concurrent requests the client kept in flight."""
    completed: int = Field(default=0, ge=0)
    """Requests that finished."""
    failed: int = Field(default=0, ge=0)
    """Requests that failed."""
    duration_s: float = Field(default=0, ge=0)
    """Wall time of the level (after warm-up)."""
    request_throughput: float = Field(default=0, ge=0)
    """Completed requests per second."""
    output_throughput: float = Field(ge=0)
    """Output tokens per second (all requests)."""
    goodput: float | None = Field(default=None, ge=0)
    """Requests per second that met the SLO given to the benchmark."""
    ttft_ms: LatencyStats = Field(default_factory=LatencyStats)
    """Time to first token."""
    tpot_ms: LatencyStats = Field(default_factory=LatencyStats)
    """Time per output token (after the first)."""
    itl_ms: LatencyStats = Field(default_factory=LatencyStats)
    """Inter-token latency (one engine step; several tokens under SD)."""
    e2e_latency_ms: LatencyStats = Field(default_factory=LatencyStats)
    """End-to-end request latency."""
    output_throughput_cv: float | None = Field(default=None, ge=0)
    """Spread: coefficient of variation of per-request output rate."""
    generation_tokens: int | None = Field(default=None, ge=0)
    """Server-side delta of vllm:generation_tokens_total."""
    num_drafts: int | None = Field(default=None, ge=0)
    """Server-side delta of vllm:spec_decode_num_drafts_total."""
    num_draft_tokens: int | None = Field(default=None, ge=0)
    """Delta of vllm:spec_decode_num_draft_tokens_total."""
    num_accepted_tokens: int | None = Field(default=None, ge=0)
    """Delta of vllm:spec_decode_num_accepted_tokens_total."""
    accepted_per_position: list[int] = Field(default_factory=list, max_length=64)
    """Delta of vllm:spec_decode_num_accepted_tokens_per_pos_total by position."""
    mean_running: float | None = Field(default=None, ge=0)
    """Mean vllm:num_requests_running during the level."""
    mean_waiting: float | None = Field(default=None, ge=0)
    """Mean vllm:num_requests_waiting during the level."""
    kv_cache_usage: float | None = Field(default=None, ge=0, le=1)
    """Peak vllm:kv_cache_usage_perc (0..1)."""
    preemptions: int | None = Field(default=None, ge=0)
    """Delta of vllm:num_preemptions_total."""


class Acceptance(StatusModel):
    """Draft acceptance of a run, aggregated over its levels."""

    per_position: list[float] = Field(default_factory=list, max_length=64)
    """p_j = accepted at position j / drafts (non-increasing, 0..1)."""
    drafts_per_step: float = Field(default=1.0, ge=0, le=1)
    """Share of request-steps that carried a draft (1 for model drafters; < 1 for n-gram)."""
    mean_acceptance_length: float | None = Field(default=None, ge=1)
    """1 + accepted tokens / drafts."""


class Run(StatusModel):
    """One engine start: the baseline (K=0) or the method at one K, swept over the levels."""

    num_speculative_tokens: int = Field(ge=0)
    """K of this run (0 = baseline)."""
    points: list[LevelPoint] = Field(default_factory=list, max_length=64)
    """Measured levels, ascending."""
    acceptance: Acceptance | None = None
    """Aggregated acceptance (speculative runs)."""
    stopped_early: str | None = Field(default=None, max_length=1024)
    """Why the sweep stopped before the last level (saturated, SLO broken), if it did."""
    engine_start_s: float | None = None
    """Seconds from launch to a healthy engine."""
    wall_s: float | None = None
    """Seconds the whole run took."""


class Hardware(StatusModel):
    """What the benchmark measured about the device."""

    backend: str = Field(default="cuda", max_length=32)
    """cuda, rocm or cpu."""
    device_name: str | None = Field(default=None, max_length=256)
    """e.g. NVIDIA H100 80GB HBM3."""
    device_count: int = Field(default=1, ge=0)
    """Devices visible to the engine."""
    memory_gib: float | None = Field(default=None, ge=0)
    """Device memory."""
    copy_bandwidth_gb_s: float | None = Field(default=None, ge=0)
    """Measured device-to-device copy bandwidth."""
    bf16_matmul_tflops: float | None = Field(default=None, ge=0)
    """Measured dense BF16 matmul throughput."""


class Validation(StatusModel):
    """An optional run at a middle K to check the k=1..K interpolation."""

    num_speculative_tokens: int = Field(ge=1)
    """K of the check run."""
    max_relative_error: float = Field(ge=0)
    """Largest |predicted - measured| / measured output throughput over its levels."""


class BenchFailure(StatusModel):
    """Why the benchmark itself says it stopped, sealed with its result: the operator quotes it (when the seal
    holds) in the failure it decides from the Job's state; it never decides anything by it."""

    reason: str = Field(max_length=128)
    """EngineStartFailed, EngineDisagrees, Interrupted, Timeout or BenchmarkFailed."""
    message: str | None = Field(default=None, max_length=8192)
    """Details (e.g. the engine's last log lines)."""


class SpeculationProfileStatus(StatusModel):
    """Measured results, written by the benchmark Job."""

    phase: ProfilePhase = ProfilePhase.PENDING
    """Pending, Running, Succeeded or Failed."""
    reason: str | None = Field(default=None, max_length=1024)
    """Why it failed, or what it is waiting for."""
    message: str | None = Field(default=None, max_length=32768)
    """Details (e.g. the engine's last log lines)."""
    attempts: int = Field(default=0, ge=0)
    """Job attempts so far."""
    job_name: str | None = Field(default=None, max_length=253)
    """The benchmark Job measuring it."""
    engine_version: str | None = Field(default=None, max_length=256)
    """vLLM version reported by the engine."""
    started_at: datetime | None = None
    """When the benchmark started measuring."""
    completed_at: datetime | None = None
    """When it finished (or failed)."""
    runs: list[Run] = Field(default_factory=list, max_length=64)
    """Baseline and/or speculative runs."""
    kv_capacity_tokens: int | None = Field(default=None, ge=0)
    """KV cache capacity in tokens (vllm:cache_config_info)."""
    max_concurrency_measured: int | None = Field(default=None, ge=0)
    """Highest level measured."""
    hardware: Hardware | None = None
    """Device calibration."""
    validation: Validation | None = None
    """Interpolation check, when run."""
    engine_starts: int | None = Field(default=None, ge=0)
    """Engine starts the profile cost."""
    bench_failure: BenchFailure | None = None
    """The benchmark's own account of why it stopped (sealed with the result; the phase is the operator's)."""
    seal: str | None = Field(default=None, max_length=128, pattern="^[0-9a-f]*$")
    """HMAC of the result by the token of the profile's current benchmark Job (api.seal): the operator uses
    no result whose seal does not match."""

    def run(self, k: int) -> Run | None:
        return next((r for r in self.runs if r.num_speculative_tokens == k), None)


class SpeculationProfile(ApiModel):
    """Top-level object, as stored by the API server (or a file written by specpilot-bench)."""

    model_config = {"extra": "ignore"}

    api_version: str = "specpilot.io/v1alpha1"
    kind: str = "SpeculationProfile"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: SpeculationProfileSpec
    status: SpeculationProfileStatus | None = None
