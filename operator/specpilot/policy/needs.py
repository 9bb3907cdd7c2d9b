"""What a deployment needs measured: one profile per pool, GPU type and candidate (baseline first), each named by
the identity of its measurement (model, method, GPU, engine image and settings, workload, levels), and the
profiling settings that come from the spec or the operator's defaults. Pure."""

from __future__ import annotations

from ..api.deployment_spec import SpeculativeDeploymentSpec
from ..api.methods import CandidateMethod
from ..api.profile import EngineSettings, ProfileTarget, SpeculationProfileSpec
from ..config import OperatorConfig
from .pools import PoolView, sku_of
from .profiling import Need

__all__ = ["engine_image", "engine_settings", "max_parallel_jobs", "needed_profiles", "profile_spec"]


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


def needed_profiles(spec: SpeculativeDeploymentSpec, views: list[PoolView],
                    config: OperatorConfig) -> list[Need]:
    """Baseline plus every candidate, for every SKU of every pool (deduplicated by identity)."""
    out: list[Need] = []
    for view in views:
        for sku in view.skus:
            product = next((p for p in view.products if p == sku or sku_of(p) == sku), None)
            for candidate in [None, *spec.methods]:
                out.append(Need.of(view.pool.name, sku, candidate,
                                  profile_spec(spec, sku, candidate, config, product)))
    return out


def max_parallel_jobs(spec: SpeculativeDeploymentSpec, config: OperatorConfig) -> int:
    """Benchmark Jobs at once per pool: spec.profiling.maxParallelJobsPerPool when the deployment sets it, else
    the operator config's profilingDefaults.maxParallelJobsPerPool (as for the other profiling defaults)."""
    profiling = spec.profiling
    if "max_parallel_jobs_per_pool" in profiling.model_fields_set:
        return profiling.max_parallel_jobs_per_pool
    return config.profiling_defaults.max_parallel_jobs_per_pool
