"""`SpeculativeDeployment` (short name `sdep`): one model served by vLLM on one or more GPU pools,
with the speculative-decoding candidates specpilot profiles and chooses from.

Spec fields say what the platform team wants; status says what specpilot measured, decided and observed.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from .args import (
    EXTRA_ARG_PATTERN,
    MAX_ARG_LENGTH,
    MAX_EXTRA_ARGS,
    MODEL_ID_MAX_LENGTH,
    MODEL_ID_PATTERN,
    REVISION_MAX_LENGTH,
    REVISION_PATTERN,
    SERVED_NAME_MAX_LENGTH,
    SERVED_NAME_PATTERN,
    extra_args_problems,
    owned_flags_cel_rule,
)
from .base import (
    CONFIG_KEY,
    DNS_SUBDOMAIN,
    ApiModel,
    Condition,
    ConfigMapKeyRef,
    FreeFormObject,
    ImageRef,
    Name,
    SecretKeyRef,
    ShortText,
    StatusModel,
    Text,
    join_problems,
)
from .methods import CandidateMethod
from .schedule import ScheduleRange

DEFAULT_ENGINE_IMAGE = "vllm/vllm-openai:v0.32.0"
DEFAULT_CONCURRENCY_LEVELS = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256]
"""Profiled levels: dense around where speculation usually stops paying (32-128) and up to 256, so the
planner interpolates rather than extrapolates (benchmarks/decision_quality.py, 5% noise, 12 draws: against
powers of two to 128, misses of the mean-goodput target fall from 81 to 10 of 648 draws, and in expectation
the worst-case target is met in all 54 scenarios instead of 49)."""
MAX_CONCURRENCY_LEVEL = 4096
"""Highest concurrency a profile may measure at. vLLM runs at most max-num-seqs requests at once (256 by
default, 1024-2048 on the largest GPUs); the benchmark Job sends at least twice a level's concurrency in
requests, so an unbounded level would have it build and send billions of prompts."""
ConcurrencyLevel = Annotated[int, Field(ge=1, le=MAX_CONCURRENCY_LEVEL)]
"""One concurrency level (concurrent requests), 1..MAX_CONCURRENCY_LEVEL."""


class KeySelector(ApiModel):
    """A key of a Secret or ConfigMap in the resource's namespace (Kubernetes SecretKeySelector shape)."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    """Object name."""
    key: str = Field(min_length=1, max_length=253, pattern=CONFIG_KEY)
    """Key within it."""
    optional: bool | None = None
    """Whether the object or key may be missing."""


class FieldSelector(ApiModel):
    """A field of the pod (Kubernetes ObjectFieldSelector)."""

    field_path: str = Field(min_length=1, max_length=256)
    """e.g. metadata.name, status.podIP."""
    api_version: str | None = Field(default=None, max_length=64)
    """Schema version of fieldPath (v1)."""


class ResourceSelector(ApiModel):
    """A resource limit or request of a container (Kubernetes ResourceFieldSelector)."""

    resource: str = Field(min_length=1, max_length=253)
    """e.g. limits.memory."""
    container_name: str | None = Field(default=None, max_length=63)
    """The container (defaults to the engine)."""
    divisor: str | None = Field(default=None, max_length=64)
    """Unit as a quantity string, e.g. "1Mi"."""


class EnvVarSource(ApiModel):
    """Where an environment variable's value comes from. Secrets only as the operator's config allows
    (tenancy.allowedSecretNames)."""

    secret_key_ref: KeySelector | None = None
    """A key of a Secret the operator's config allows."""
    config_map_key_ref: KeySelector | None = None
    """A key of a ConfigMap."""
    field_ref: FieldSelector | None = None
    """A field of the pod."""
    resource_field_ref: ResourceSelector | None = None
    """A resource limit or request of a container."""


class EnvVar(ApiModel):
    """An environment variable of the engine container (Kubernetes EnvVar shape)."""

    name: str = Field(min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    """Variable name."""
    value: str | None = Field(default=None, max_length=4096)
    """Literal value."""
    value_from: EnvVarSource | None = None
    """Value from a Secret key, ConfigMap key or pod field."""


class ModelSpec(ApiModel):
    """The target model and how vLLM serves it."""

    id: str = Field(min_length=1, max_length=MODEL_ID_MAX_LENGTH, pattern=MODEL_ID_PATTERN)
    """Hugging Face model id or a path inside the image/volume, e.g. meta-llama/Llama-3.1-8B-Instruct
    (no leading '-', no whitespace; letters, digits and `_ . / : @ + -`)."""
    revision: str | None = Field(default=None, max_length=REVISION_MAX_LENGTH, pattern=REVISION_PATTERN)
    """Model revision (branch, tag or commit)."""
    served_name: str | None = Field(default=None, max_length=SERVED_NAME_MAX_LENGTH, pattern=SERVED_NAME_PATTERN)
    """Name clients use in the OpenAI API (`--served-model-name`). Defaults to `id`."""
    image: ImageRef = DEFAULT_ENGINE_IMAGE
    """vLLM engine image. Changing it re-profiles (the engine's speed is part of a profile's identity)."""
    tensor_parallel_size: int = Field(default=1, ge=1, le=64)
    """GPUs per replica for tensor parallelism (`--tensor-parallel-size`)."""
    data_parallel_size: int = Field(default=1, ge=1, le=64)
    """Data-parallel ranks per replica. vLLM ignores a per-batch-size schedule when > 1, so specpilot
    then toggles speculation by rollout (restart strategy)."""
    max_model_len: int | None = Field(default=None, ge=16)
    """Maximum context length in tokens (`--max-model-len`); the engine default when unset."""
    gpu_memory_utilization: float = Field(default=0.9, gt=0, le=1)
    """Share of GPU memory vLLM may use (`--gpu-memory-utilization`)."""
    extra_args: list[Annotated[str, Field(max_length=MAX_ARG_LENGTH, pattern=EXTRA_ARG_PATTERN,
                                          json_schema_extra={"x-kubernetes-validations": [owned_flags_cel_rule()]})]
                     ] = Field(default_factory=list, max_length=MAX_EXTRA_ARGS)
    """More vLLM command-line arguments, one per item (e.g. ["--enable-prefix-caching", "--max-num-seqs=256"]).
    Flags specpilot owns are refused in every spelling vLLM accepts (`_` or `-`, `=value` or a separate value,
    dotted sub-keys, short aliases, abbreviations): --model, --served-model-name, --revision,
    --tensor-parallel-size, --pipeline-parallel-size, --data-parallel-*, --max-model-len,
    --gpu-memory-utilization, --port, --host, --uds, --config, --speculative-*, --spec-*, --headless,
    --nnodes, --node-rank, --hf-token. Part of a profile's identity."""
    env: list[EnvVar] = Field(default_factory=list, max_length=64)
    """Extra environment variables for the engine container (Kubernetes EnvVar objects; secretKeyRef only to
    Secrets the operator's config allows). Part of a profile's identity."""
    hf_token_secret_ref: SecretKeyRef | None = None
    """Secret holding a Hugging Face token, exposed to the engine as HF_TOKEN (a Secret the operator's config
    allows: tenancy.allowedSecretNames, by default hf-token)."""
    resources: FreeFormObject | None = None
    """Engine container resources (Kubernetes ResourceRequirements). GPU requests default to
    tensorParallelSize * dataParallelSize `nvidia.com/gpu`."""

    @field_validator("extra_args")
    @classmethod
    def _owned_args(cls, args: list[str]) -> list[str]:
        problems = extra_args_problems(args, where="")
        if problems:
            raise ValueError(join_problems(problems))
        return args


class Toleration(ApiModel):
    """A Kubernetes toleration for the pool's taints."""

    key: str | None = Field(default=None, max_length=316)
    """Taint key (empty with operator Exists matches all: the operator's config must allow that)."""
    operator: str | None = Field(default=None, max_length=8, pattern="^(Exists|Equal)$")
    """Exists or Equal."""
    value: str | None = Field(default=None, max_length=63)
    """Taint value for Equal."""
    effect: str | None = Field(default=None, max_length=16, pattern="^(NoSchedule|PreferNoSchedule|NoExecute)$")
    """Taint effect to tolerate; all when empty."""
    toleration_seconds: int | None = None
    """For NoExecute: how long the pod stays bound after the taint appears."""


class Rollout(ApiModel):
    """How a pool's pods are replaced when the decision changes (the Deployment's rolling update)."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "(has(self.maxSurge) ? self.maxSurge : 1) + (has(self.maxUnavailable) ? self.maxUnavailable : 0) > 0",
         "message": "maxSurge and maxUnavailable cannot both be 0: set maxSurge: 1 where the pool has a spare GPU, "
                    "else maxUnavailable: 1"},
    ]})

    max_surge: int = Field(default=1, ge=0)
    """Pods of the new configuration started beyond the replica count while old ones still serve. Each needs
    free GPUs on the pool: on a pool with none spare the surge pod stays Pending and the rollout stalls
    (condition RolledOut=False, reason ProgressDeadlineExceeded); set 0 there, with maxUnavailable: 1."""
    max_unavailable: int = Field(default=0, ge=0)
    """Serving pods that may be stopped before their replacement is ready. 0 keeps capacity whole during a
    rollout; 1 frees a pod's GPUs for its replacement, at the cost of one replica's capacity while it loads."""
    progress_deadline_seconds: int = Field(default=5400, ge=60)
    """How long a rollout may make no progress before the Deployment (and specpilot) report it stalled.
    Longer than the engine's startup allowance (1 h), so loading weights is never taken for a stall."""

    @model_validator(mode="after")
    def _some_room(self) -> Rollout:
        if self.max_surge == 0 and self.max_unavailable == 0:
            raise ValueError("maxSurge and maxUnavailable cannot both be 0 (no pod could ever be replaced): set "
                             "maxSurge: 1 where the pool has a spare GPU, else maxUnavailable: 1")
        return self


class GpuPool(ApiModel):
    """A set of GPU nodes of one type that may serve this model."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
         "message": "minReplicas must be <= maxReplicas"},
    ]})

    name: str = Field(max_length=24, pattern=r"^[a-z0-9]([a-z0-9-]{0,22}[a-z0-9])?$")
    """Pool name (DNS label, <= 24 chars); part of the names of the pool's Deployment and Jobs."""
    node_selector: dict[str, Annotated[str, Field(max_length=63)]] = Field(default_factory=dict, max_length=32)
    """Labels a node must have to belong to the pool (e.g. {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})."""
    tolerations: list[Toleration] = Field(default_factory=list, max_length=32)
    """Tolerations for the pool's taints, used by benchmark Jobs and serving pods."""
    sku: str | None = Field(default=None, max_length=63, pattern=r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")
    """GPU type (e.g. H100-SXM). When unset it is read from the `nvidia.com/gpu.product` label of the
    pool's nodes, and a new product appearing there is profiled automatically."""
    price_per_gpu_hour: float | None = Field(default=None, gt=0)
    """Cost of one GPU of this pool per hour, in dollars; defaults to the operator's price table."""
    gpu_resource_name: str = Field(default="nvidia.com/gpu", max_length=253,
                                   pattern=r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
    """Extended resource that requests GPUs (amd.com/gpu for AMD)."""
    min_replicas: int | None = Field(default=None, ge=0)
    """Per-pool lower bound on replicas; defaults to serving.minReplicas."""
    max_replicas: int | None = Field(default=None, ge=0)
    """Per-pool upper bound on replicas; defaults to serving.maxReplicas."""
    rollout: Rollout | None = None
    """Per-pool rolling update (e.g. maxSurge 0 on a pool that runs full); defaults to serving.rollout."""

    @model_validator(mode="after")
    def _bounds(self) -> GpuPool:
        if self.min_replicas is not None and self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError(f"minReplicas must be <= maxReplicas (got {self.min_replicas} > {self.max_replicas})")
        return self


class WorkloadName(str, Enum):
    SHAREGPT = "sharegpt"
    HUMANEVAL = "humaneval"
    JSON_EXTRACTION = "json-extraction"
    RANDOM = "random"
    CUSTOM = "custom"


class Workload(ApiModel):
    """The prompts a profiling run sends; pick the one closest to production traffic."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "(has(self.name) && self.name == 'custom') == has(self.file)",
         "message": "a custom workload needs `file` (a ConfigMap key), and only custom takes one"},
    ]})

    name: WorkloadName = WorkloadName.SHAREGPT
    """sharegpt (chat), humaneval (code), json-extraction (answers copy spans of the prompt: n-gram
    friendly), random, or custom (JSONL prompts from `file`)."""
    file: ConfigMapKeyRef | None = None
    """For custom: a ConfigMap key holding JSONL lines {"prompt": ..., "max_tokens": N}."""
    input_len: int | None = Field(default=None, ge=1)
    """random only: prompt length in tokens."""
    output_len: int = Field(default=256, ge=1, le=32768)
    """Output tokens per request (the cap when the dataset gives its own)."""
    temperature: float = Field(default=0.0, ge=0, le=2)
    """Sampling temperature; acceptance drops with temperature, so match production."""
    seed: int = Field(default=0, ge=0, le=2**31 - 1)
    """Seed for sampling prompts and tokens."""

    @model_validator(mode="after")
    def _file(self) -> Workload:
        if (self.name == WorkloadName.CUSTOM.value) != (self.file is not None):
            raise ValueError("a custom workload needs `file` (a ConfigMap key), and only custom takes one")
        return self


class ReprofileTriggers(ApiModel):
    """When specpilot re-profiles on its own. A GPU type that joins a pool, and a changed engine image, are
    always profiled: both are part of a profile's identity, and a pool is decided only on profiles of its
    own GPU type and image. (`newSku` and `engineImageChange`, which promised switches for these and were
    never read, are removed; the API server drops them from stored objects.)"""

    acceptance_drift: float = Field(default=0.25, gt=0, le=1)
    """Relative change of the served method's live acceptance at the first draft position against its
    profile's (|live - profiled| / profiled) beyond which that profile is measured again; a change beyond
    10% but within this only recomputes the schedule from the live acceptance."""
    max_age_hours: float = Field(default=168, ge=0)
    """Profiles older than this many hours are measured again; 0 = never by age."""

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        # Written before the fields were removed: `true` is what always happens, so it is dropped; `false`
        # asked for something the operator never did, so it is refused with the fix.
        if isinstance(data, dict):
            data = dict(data)
            for key, what in REMOVED_REPROFILE_FIELDS.items():
                if key in data and data.pop(key) is False:
                    raise ValueError(f"reprofile.{key}: false is not supported: {what} is always profiled (it is "
                                     f"part of a profile's identity); remove reprofile.{key}")
        return data


REMOVED_REPROFILE_FIELDS = {"newSku": "a GPU type that joins a pool", "engineImageChange": "a changed engine image"}
"""Spec fields removed in 0.1.x, accepted (and dropped) when `true` so that older objects still validate."""


class Profiling(ApiModel):
    """How candidate methods are measured on each pool."""

    workload: Workload = Field(default_factory=Workload)
    """Prompts for the benchmark."""
    concurrency_levels: list[ConcurrencyLevel] = Field(
        default_factory=lambda: list(DEFAULT_CONCURRENCY_LEVELS), min_length=1, max_length=32,
        json_schema_extra={"x-kubernetes-list-type": "set"})
    """Concurrent requests to measure at, ascending, each 1..4096 (e.g. 1,2,4,...,128)."""
    requests_per_level: int = Field(default=64, ge=1, le=100000)
    """Requests completed per concurrency level (after warm-up); at least twice the level's concurrency, so
    the engine really runs at that concurrency."""
    reprofile: ReprofileTriggers = Field(default_factory=ReprofileTriggers)
    """Automatic re-profiling triggers."""
    max_parallel_jobs_per_pool: int = Field(default=1, ge=1, le=32)
    """Benchmark Jobs running at once per pool (each takes tensorParallelSize GPUs)."""
    refine_budget_percent: int = Field(default=200, ge=0, le=400)
    """Adaptive refinement: after the first sweep, each uncertain change of k (where the crossover's
    uncertainty exceeds policy.minGainPercent) is measured at its batch size by refinement Jobs, in one
    round, and the pool is decided again. This bounds what the round may measure, in measured levels, as a
    percent of the levels the first sweep measured, and with it how often one level is measured (8 times at
    200, in proportion, at most 12). On the twin with 5% noise, a pool of three methods: 200 costs about +45%
    profiling time on average, engine starts counted, and leaves 97.5% of schedules within 3% of the best k
    at every batch size; 150: +38% for 96%; 260: +52% for 98%; 300 and above: +59% for 98%; 300 with
    concurrencyLevels without 1: +31% over the default sweep for 97.5%. 0 turns refinement off."""
    job_deadline_seconds: int = Field(default=3600, ge=60, le=604800)
    """activeDeadlineSeconds of each benchmark Job (at most a week; the operator's tenancy.maxJobDeadlineSeconds,
    6 h by default, may hold it lower)."""
    backoff_limit: int = Field(default=2, ge=0, le=10)
    """Retries of a failed benchmark Job before the profile is reported Failed."""
    image: ImageRef | None = None
    """Benchmark-job image; the operator's default when unset. Another image only when the operator's config
    allows it (tenancy.allowedBenchmarkImages): the bench runs with a token that writes profile results.
    Part of a profile's identity."""
    pod_overrides: FreeFormObject | None = None
    """Merged into the benchmark pod spec (e.g. volumes with model weights, priorityClassName). Only what the
    operator's config allows: placement (affinity, tolerations with a key, nodeSelector additions,
    priorityClassName, topologySpreadConstraints), volumes of allowed types, non-root fsGroup/runAsUser, and
    env, resources and volumeMounts of the `bench` container (which starts the engine); see
    docs/security.md. The bench container's env and resources are part of a profile's identity."""
    speculate_before_profiled: bool = False
    """Serve with the method's maximum K (no schedule) while its profile is not ready. Off: serve without SD."""

    @model_validator(mode="after")
    def _levels(self) -> Profiling:
        levels = self.concurrency_levels
        if any(c < 1 for c in levels) or levels != sorted(set(levels)):
            raise ValueError(f"concurrencyLevels must be positive, ascending and unique (got {levels})")
        return self


class Objective(str, Enum):
    GOODPUT = "goodput"
    COST = "cost"


class Strategy(str, Enum):
    DYNAMIC = "dynamic"
    RESTART = "restart"
    AUTO = "auto"


class Hysteresis(ApiModel):
    """Guards of the restart strategy, which toggles speculation by rolling the pods."""

    band_percent: float = Field(default=20, ge=0, le=100)
    """Turn SD off above crossover*(1+band) and on again below crossover*(1-band)."""
    min_dwell_seconds: int = Field(default=300, ge=0)
    """Load must stay past a threshold this long before a toggle."""
    cooldown_seconds: int = Field(default=600, ge=0)
    """Minimum time between two toggles of a pool."""


class ConcurrencyWeight(ApiModel):
    """A point of an expected concurrency distribution."""

    concurrency: int = Field(ge=1)
    """Concurrent requests per replica."""
    weight: float = Field(gt=0)
    """Relative share of time at this concurrency."""


class Policy(ApiModel):
    """How the method and schedule are chosen."""

    objective: Objective = Objective.GOODPUT
    """goodput (tokens/s within the SLO) or cost (dollars per million tokens)."""
    tpot_slo_ms: float | None = Field(default=None, gt=0)
    """Per-output-token latency SLO (p95 TPOT) in milliseconds; none when unset."""
    ttft_slo_ms: float | None = Field(default=None, gt=0)
    """Time-to-first-token SLO (p95) in milliseconds; none when unset."""
    slo_attainment_percent: float = Field(default=99.0, ge=50, le=99.99)
    """The share of requests, in percent, that must meet the TPOT and TTFT SLOs. The operator measures it per
    request from the serving pods' vLLM histograms over the metrics window (status.sloAttainment, condition
    SloAttained, alert SpecpilotSloAttainmentLow); the replica planner does not size for it yet (it sizes by
    serving.targetUtilizationPercent)."""
    min_gain_percent: float = Field(default=2, ge=0, le=100)
    """Noise guard, in percent. Per batch size, the schedule speculates only where k > 0 beats k = 0 on the
    method's own engine (drafter still loaded) by this much; the method is deployed at all only when its gain
    over no speculation where its schedule speculates, less what keeping it loaded costs where the schedule is
    off (drafter prefill, KV cache), beats this much times the share of the load it speculates on."""
    strategy: Strategy = Strategy.AUTO
    """dynamic: one rollout, vLLM switches K per step by the schedule; restart: toggle SD by rollout
    around the crossover; auto: dynamic unless the engine cannot (data parallel > 1, suffix)."""
    hysteresis: Hysteresis = Field(default_factory=Hysteresis)
    """Restart-strategy guards."""
    expected_concurrency: list[ConcurrencyWeight] = Field(default_factory=list, max_length=256)
    """Expected per-replica concurrency before there is observed history (e.g. [{concurrency: 8, weight: 1}]);
    when empty, each level of the profile's first sweep (profiling.concurrencyLevels) weighs alike, on the
    relative gain over no speculation."""


class Autoscaling(str, Enum):
    INTERNAL = "internal"
    EXTERNAL = "external"
    NONE = "none"


class Routing(str, Enum):
    """How a deployment's traffic reaches its pools (spec.serving.routing; the fleet planner plans under it)."""

    SERVICE = "service"
    """One Service over every pool's pods: an even split per pod."""
    GATEWAY = "gateway"
    """One Service per pool behind a Gateway API HTTPRoute whose backendRefs weights are the shares."""


GATEWAY_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A Gateway API ObjectName / SectionName: a DNS-1123 subdomain."""


class ParentRef(ApiModel):
    """A Gateway the HTTPRoute attaches to (Gateway API ParentReference, kind Gateway). Only Gateways the
    operator's config allows (allowedGatewayParents; by default those in the deployment's own namespace)."""

    name: str = Field(min_length=1, max_length=253, pattern=GATEWAY_NAME_PATTERN)
    """Name of the Gateway."""
    namespace: str | None = Field(default=None, min_length=1, max_length=63,
                                  pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    """Namespace of the Gateway; defaults to the deployment's own."""
    section_name: str | None = Field(default=None, min_length=1, max_length=253, pattern=GATEWAY_NAME_PATTERN)
    """Listener of the Gateway to attach to (its name); all listeners that allow the route when unset."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """Port of the Gateway's listener to attach to; any when unset."""


class GatewayRouting(ApiModel):
    """Where the HTTPRoute of `routing: gateway` attaches."""

    parent_refs: list[ParentRef] = Field(default_factory=list, max_length=32)
    """Gateways the route attaches to (at least one with routing: gateway)."""


class Serving(ApiModel):
    """Replicas and how they are exposed."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
         "message": "minReplicas must be <= maxReplicas"},
        {"rule": "!has(self.routing) || self.routing != 'gateway' || "
                 "(has(self.gateway) && has(self.gateway.parentRefs) && size(self.gateway.parentRefs) > 0)",
         "message": "routing: gateway needs gateway.parentRefs: name the Gateway the HTTPRoute attaches to"},
    ]})

    min_replicas: int = Field(default=1, ge=0)
    """Fewest replicas per pool."""
    max_replicas: int = Field(default=4, ge=1)
    """Most replicas per pool."""
    autoscaling: Autoscaling = Autoscaling.INTERNAL
    """internal: specpilot writes replicas (SD-aware capacity); external: it only publishes
    status.pools[].desiredReplicas and the specpilot_desired_replicas metric for HPA/KEDA; none: fixed at minReplicas."""
    scale_down_stabilization_seconds: int = Field(default=300, ge=0)
    """Scale down only after the lower target held this long (scale up is immediate)."""
    target_utilization_percent: float = Field(default=80, gt=0, le=100)
    """Share of a replica's SLO-feasible concurrency to plan for (headroom for bursts)."""
    port: int = Field(default=8000, ge=1, le=65535)
    """Port of the OpenAI-compatible API."""
    service_monitor: bool = False
    """Create a Prometheus-operator PodMonitor for the serving pods."""
    routing: Routing = Routing.SERVICE
    """service: one Service over every pool's pods (an even split per pod; the fleet planner plans under it);
    gateway: also one Service per pool and a Gateway API HTTPRoute (gateway.networking.k8s.io/v1) whose
    backendRefs weights follow the fleet's planned shares (needs the Gateway API CRDs; without them it falls
    back to service, condition RoutingReady=False)."""
    gateway: GatewayRouting = Field(default_factory=GatewayRouting)
    """The HTTPRoute's parentRefs for routing: gateway."""
    rollout: Rollout = Field(default_factory=Rollout)
    """How pods are replaced on a change of decision (maxSurge, maxUnavailable, progressDeadlineSeconds)."""
    pod_overrides: FreeFormObject | None = None
    """Merged into the serving pod spec. Only what the operator's config allows: placement (affinity,
    tolerations with a key, nodeSelector additions, priorityClassName, topologySpreadConstraints,
    terminationGracePeriodSeconds), imagePullSecrets, volumes of allowed types, non-root fsGroup/runAsUser,
    and env, resources, volumeMounts and imagePullPolicy of the `engine` container; host namespaces, hostPath,
    privileged or other security settings, serviceAccountName, nodeName and extra containers are refused
    unless the cluster admin allows them (tenancy.allowedPodOverrideFields)."""

    @model_validator(mode="after")
    def _bounds(self) -> Serving:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"minReplicas must be <= maxReplicas (got {self.min_replicas} > {self.max_replicas})")
        if self.routing == Routing.GATEWAY.value and not self.gateway.parent_refs:
            raise ValueError("routing: gateway needs gateway.parentRefs: name the Gateway the HTTPRoute attaches to")
        return self


class MetricsSource(str, Enum):
    PROMETHEUS = "prometheus"
    PODS = "pods"


class Metrics(ApiModel):
    """Where observed load and live acceptance come from."""

    source: MetricsSource = MetricsSource.PROMETHEUS
    """prometheus (query the server at prometheusUrl) or pods (scrape the serving pods' /metrics)."""
    prometheus_url: str | None = Field(default=None, pattern=r"^https?://", max_length=2048)
    """Prometheus base URL; the operator's default when unset."""
    window_seconds: int = Field(default=300, ge=30, le=86400)
    """Look-back window for rates and quantiles."""
    interval_seconds: int = Field(default=30, ge=5, le=3600)
    """How often the observer runs."""
    stale_after_seconds: int = Field(default=180, ge=30)
    """Data older than this is missing: the last decision is held and MetricsAvailable=False."""


class SpeculativeDeploymentSpec(ApiModel):
    """Desired state of a SpeculativeDeployment."""

    model: ModelSpec
    """Target model and engine."""
    methods: list[CandidateMethod] = Field(min_length=1, max_length=16, json_schema_extra={
        "x-kubernetes-validations": [{
            "rule": "self.all(m, self.filter(n, (has(n.name) ? n.name : n.method) == "
                    "(has(m.name) ? m.name : m.method)).size() == 1)",
            "message": "candidate names must be unique: give repeated methods a distinct `name`"}]})
    """Candidate speculative methods to profile; specpilot picks one per pool (or none)."""
    gpu_pools: list[GpuPool] = Field(min_length=1, max_length=16, json_schema_extra={
        "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]})
    """GPU node pools the model may run on; each gets its own profile, decision and Deployment."""
    profiling: Profiling = Field(default_factory=Profiling)
    """How methods are measured."""
    policy: Policy = Field(default_factory=Policy)
    """How decisions are made."""
    serving: Serving = Field(default_factory=Serving)
    """Replicas and exposure."""
    metrics: Metrics = Field(default_factory=Metrics)
    """Observed load source."""

    @model_validator(mode="after")
    def _unique(self) -> SpeculativeDeploymentSpec:
        seen: dict[str, int] = {}
        for i, m in enumerate(self.methods):
            if m.key in seen:
                raise ValueError(
                    f"methods[{i}] has the same name {m.key!r} as methods[{seen[m.key]}]: give one a distinct `name`"
                )
            seen[m.key] = i
        pools: dict[str, int] = {}
        for i, p in enumerate(self.gpu_pools):
            if p.name in pools:
                raise ValueError(f"gpuPools[{i}].name {p.name!r} repeats gpuPools[{pools[p.name]}].name: pool names must be unique")
            pools[p.name] = i
        return self


# ----- status -----

class Phase(str, Enum):
    PENDING = "Pending"
    PROFILING = "Profiling"
    SERVING = "Serving"
    DEGRADED = "Degraded"
    FAILED = "Failed"


class ProfileProgress(StatusModel):
    """Profiles of one pool."""

    ready: int = 0
    """Succeeded profiles (baseline and methods)."""
    total: int = 0
    """Profiles needed."""
    failed: int = 0
    """Profiles that failed after retries."""
    names: list[Name] = Field(default_factory=list, max_length=1024)
    """SpeculationProfile names used by this pool."""


class TpotPoint(StatusModel):
    """TPOT of the decided option at one concurrency per replica (from the profiles)."""

    concurrency: float = Field(ge=0)
    """Concurrent requests per replica."""
    ms: float = Field(ge=0)
    """Time per output token, milliseconds."""


MAX_TPOT_POINTS = 16
"""Points of a decision's TPOT curve (powers of two from 1)."""


class Decision(StatusModel):
    """What a pool serves and why."""

    method: str | None = Field(default=None, max_length=64)
    """Chosen candidate's name, or none for no speculation."""
    num_speculative_tokens: int = 0
    """K the engine is started with (the schedule's maximum)."""
    schedule: list[ScheduleRange] = Field(default_factory=list, max_length=4096)
    """Per-batch-size K (empty: none; SD off or the restart strategy)."""
    schedule_summary: Text = ""
    """The schedule in short form, e.g. 1-16:5,17-64:3,65+:0."""
    strategy: Strategy = Strategy.DYNAMIC
    """dynamic (schedule in the engine) or restart (toggle by rollout)."""
    crossover_concurrency: float | None = None
    """Concurrency above which speculation stops paying for this method on this pool."""
    crossover_uncertainty_percent: float | None = None
    """One standard error of the predicted gain of speculation at the crossover, in percent: how precisely
    the profile places the crossover. Above policy.minGainPercent the crossover may be a profiled level or
    more off; more profiling.requestsPerLevel narrows it (four times the requests halve it)."""
    cost_per_mtok_with_sd: float | None = None
    """Predicted dollars per million output tokens with the decision, at the expected load."""
    cost_per_mtok_without_sd: float | None = None
    """Predicted dollars per million output tokens without speculation, at the expected load."""
    expected_speedup: float | None = None
    """Predicted goodput gain over no speculation at the expected load (1.0 = none)."""
    source: str = Field(default="profile", max_length=64)
    """What the decision rests on: profile, live-acceptance, prior, none."""
    reason: Text = ""
    """Why, in words."""
    decided_at: datetime | None = None
    """When it was made."""
    basis: ShortText = ""
    """Fingerprint of what the decision rests on (spec generation, profiles, live acceptance); the decision
    is recomputed, and the pods rolled, only when it changes."""
    live_method: str | None = Field(default=None, max_length=64)
    """When the decision used live acceptance instead of the profile's: for which candidate."""
    live_acceptance_per_position: list[float] = Field(default_factory=list, max_length=64)
    """The live per-position acceptance it used; kept so that turning speculation off (and so observing
    no acceptance) does not flip the decision back to the profile's numbers."""
    live_drafts_per_step: float | None = None
    """The live drafts per step it used."""
    tpot_curve: list[TpotPoint] = Field(default_factory=list, max_length=MAX_TPOT_POINTS)
    """TPOT of the decided option at 1, 2, 4, ... concurrent requests per replica, up to its capacity: the
    replica planner scales observed demand by TPOT(capacity) / TPOT(load now), since requests take longer
    on a fuller replica (Little's law)."""
    load_concurrency: float | None = None
    """Per-replica concurrency (weighted median) of the observed load the decision weighed; none when it
    weighed the expected load or the profiled levels. The method is revisited when the observed load moves
    a factor of 2 from it (at most once per policy.hysteresis.cooldownSeconds), and changed only when
    another option beats the served one by policy.minGainPercent."""


class SloAttainment(StatusModel):
    """The share of requests that met the SLOs over the metrics window, from vLLM's per-request TPOT and TTFT
    histograms. Each figure is exact when the SLO is a bucket bound of vLLM's histogram and interpolated within
    the bucket that holds it otherwise (the `*Bucket` fields name that bucket). The histograms are separate, so
    the share meeting both is known only within bounds: at least tpot + ttft - 100, at most the lower of the two."""

    requests: float | None = None
    """Requests finished in the window (the TPOT histogram's count)."""
    tpot_percent: float | None = None
    """Requests whose time per output token was within policy.tpotSloMs (None: no TPOT SLO)."""
    tpot_bucket: ShortText = ""
    """vLLM's TPOT bucket the figure rests on, e.g. `0.01-0.025 s`."""
    ttft_percent: float | None = None
    """Requests whose time to first token was within policy.ttftSloMs (None: no TTFT SLO)."""
    ttft_bucket: ShortText = ""
    """vLLM's TTFT bucket the figure rests on."""
    both_at_least_percent: float | None = None
    """Requests within both SLOs, at least (the lower bound)."""
    both_at_most_percent: float | None = None
    """Requests within both SLOs, at most (the upper bound)."""
    target_percent: float | None = None
    """policy.sloAttainmentPercent, for the deployment-level figure."""


class ObservedLoad(StatusModel):
    """Load of a pool over the metrics window."""

    concurrency: float | None = None
    """Mean running requests per replica."""
    waiting: float | None = None
    """Mean waiting requests per replica."""
    generation_tokens_per_second: float | None = None
    """Output tokens per second over all replicas."""
    requests_in_flight: float | None = None
    """Running plus waiting requests summed over the replicas reporting (what the fleet placement counts)."""
    tpot_p95_ms: float | None = None
    """p95 time per output token."""
    acceptance_per_position: list[float] = Field(default_factory=list, max_length=64)
    """Live accepted-per-position rates (accepted at j / drafts)."""
    mean_acceptance_length: float | None = None
    """1 + accepted tokens per draft."""
    drafts_per_step: float | None = None
    """Share of request-steps that carried a draft (below 1 for n-gram)."""
    slo: SloAttainment | None = None
    """The pool's share of requests within the SLOs over the window (None: no SLO stated, or no request
    finished)."""
    observed_at: datetime | None = None
    """When the data was read."""


class ReplicaTarget(StatusModel):
    """One replica target the planner computed, kept while it can still hold a scale-down."""

    time: datetime
    """When it was computed."""
    replicas: int = Field(ge=0)
    """The replicas the load asked for then."""


MAX_REPLICA_TARGETS = 64
"""Bound on the remembered replica targets (the window keeps only targets no later one covers)."""


class RefinementJob(StatusModel):
    """One refinement Job of a round: a profile's runs at some k, measured at some levels (the batch sizes of
    uncertain changes of k, between the sweep's levels or on them) `repeat` times each."""

    profile: str = Field(max_length=253)
    """The SpeculationProfile it appends to."""
    job_name: str = Field(max_length=253)
    """The Job's name."""
    part: int | None = Field(default=None, ge=1)
    """Which of the profile's Jobs in this round (when it has several)."""
    ks: list[int] = Field(default_factory=list, max_length=17)
    """The k values (runs) it measures."""
    levels: list[int] = Field(default_factory=list, max_length=32)
    """The concurrency levels it measures (appended to the runs; a level the profile's spec does not list counts
    as refinement's, not the sweep's)."""
    repeat: int = Field(default=1, ge=1)
    """Times each level is measured."""


class RefinementState(str, Enum):
    MEASURING = "Measuring"
    SETTLED = "Settled"
    BUDGET_SPENT = "BudgetSpent"
    FAILED = "Failed"


class Refinement(StatusModel):
    """Adaptive refinement of the pool's profiles near the decision's uncertain changes of k."""

    round: int = Field(default=0, ge=0)
    """Rounds started so far: one per first sweep of the profiles (refinement is one round)."""
    state: RefinementState = RefinementState.SETTLED
    """Measuring (a round's Jobs run), Settled (no change of k is uncertain beyond policy.minGainPercent),
    BudgetSpent (some still are, and profiling.refineBudgetPercent is spent), or Failed (a Job failed; the
    decision stands on what was measured)."""
    message: Text = ""
    """What is uncertain and what the round measures, or why refinement stopped."""
    budget_levels: int = Field(default=0, ge=0)
    """Measured levels refinement may spend."""
    spent_levels: int = Field(default=0, ge=0)
    """Measured levels spent so far (repeats beyond the first measurement of a level)."""
    jobs: list[RefinementJob] = Field(default_factory=list, max_length=16)
    """The current round's Jobs."""


class PoolStatus(StatusModel):
    """Everything specpilot knows about one pool."""

    name: str = Field(max_length=253)
    """Pool name."""
    sku: str | None = Field(default=None, max_length=253)
    """GPU type in use (from the spec or the nodes)."""
    gpu_products: list[Name] = Field(default_factory=list, max_length=64)
    """`nvidia.com/gpu.product` values of the pool's nodes."""
    nodes: int = 0
    """Matching nodes."""
    profiles: ProfileProgress = Field(default_factory=ProfileProgress)
    """Profiling progress."""
    decision: Decision | None = None
    """Current decision."""
    speculation_enabled: bool = False
    """Whether the running engine speculates (restart strategy: the toggle state)."""
    replicas: int = 0
    """Replicas of the pool's Deployment."""
    rollout: str | None = Field(default=None, max_length=64)
    """The pool Deployment's rollout: RolledOut, RollingOut, or Stalled (no progress within
    spec.serving.rollout.progressDeadlineSeconds)."""
    desired_replicas: int | None = None
    """Replicas the SD-aware planner wants."""
    capacity_concurrency_per_replica: float | None = None
    """Concurrency a replica can take within the SLO under the decision."""
    observed: ObservedLoad | None = None
    """Observed load."""
    last_toggle_at: datetime | None = None
    """Restart strategy: the last time speculation was switched."""
    above_threshold_since: datetime | None = None
    """Restart strategy: since when load has stayed above crossover*(1+band) (the dwell clock)."""
    below_threshold_since: datetime | None = None
    """Restart strategy: since when load has stayed below crossover*(1-band) (the dwell clock)."""
    refinement: Refinement | None = None
    """Adaptive refinement of the pool's profiles (profiling.refineBudgetPercent)."""
    replica_targets: list[ReplicaTarget] = Field(default_factory=list, max_length=MAX_REPLICA_TARGETS)
    """The replica targets of the scale-down stabilisation window that can still hold a scale-down
    (oldest first, each higher than every later one): kept in status so a restarted operator holds them."""
    traffic_share: float | None = Field(default=None, ge=0, le=1)
    """Fleet placement (two or more pools): the fraction of the deployment's traffic planned for this pool."""
    fleet_target_replicas: int | None = Field(default=None, ge=0)
    """Fleet placement: the replicas the fleet's cheapest placement asks of this pool (`replicas` follows it up
    at once and down after the stabilisation window)."""
    load_tokens_per_second: float | None = None
    """Fleet placement: output tokens per second this pool's share of the demand comes to."""
    cost_per_mtok: float | None = None
    """Fleet placement: dollars per million output tokens of this pool at the load it gets."""
    full: bool | None = None
    """Fleet placement: every replica the pool's GPUs (allocatable on its nodes) or maxReplicas allow runs."""
    fleet_reason: Text = ""
    """Fleet placement: why this pool got its replicas and share, in words."""
    fleet_targets: list[ReplicaTarget] = Field(default_factory=list, max_length=MAX_REPLICA_TARGETS)
    """Fleet placement: the scale-down stabilisation window of the fleet's targets for this pool."""


class FleetStatus(StatusModel):
    """Fleet placement of a deployment with two or more pools (policy.fleet)."""

    routing: str = Field(default="service", max_length=16)
    """How traffic is split as planned: service (one Service, an even split per pod) or gateway (an HTTPRoute
    whose weights are the shares)."""
    http_route: str | None = Field(default=None, max_length=253)
    """The HTTPRoute whose backendRefs weights carry the shares (routing: gateway in effect)."""
    demand_tokens_per_second: float | None = None
    """The deployment's observed demand in output tokens per second (served plus backlog)."""
    cost_per_mtok: float | None = None
    """The fleet's dollars per million output tokens at that demand (every replica of every pool paid)."""
    slo_feasible: bool | None = None
    """False: the demand exceeds what every allowed replica holds within the SLO."""
    reason: Text = ""
    """The placement in words."""
    planned_at: datetime | None = None
    """When the placement was computed."""
    shares_moved_at: datetime | None = None
    """When a pool's share last moved by two percentage points or more (a FleetSharesMoved Event)."""


class RoutingStatus(StatusModel):
    """How the deployment's traffic is routed now (spec.serving.routing, as it could be made real)."""

    mode: str = Field(default="service", max_length=16)
    """The routing in effect: service (the one Service) or gateway (the HTTPRoute); service when gateway was
    asked for and the cluster lacks the Gateway API (condition RoutingReady=False)."""
    http_route: str | None = Field(default=None, max_length=253)
    """The HTTPRoute the operator applied (routing: gateway in effect)."""
    weights: dict[str, int] = Field(default_factory=dict, max_length=64)
    """The HTTPRoute's backendRefs weight per pool (out of 1000)."""


class HistoryEntry(StatusModel):
    """A change of decision."""

    time: datetime
    """When."""
    pool: str = Field(max_length=253)
    """Which pool."""
    change: Text
    """What changed, e.g. `eagle3 1-16:4,17+:0 -> ngram 1-8:3,9+:0`."""
    reason: Text = ""
    """Why."""


class SpeculativeDeploymentStatus(StatusModel):
    """Observed state of a SpeculativeDeployment."""

    phase: Phase = Phase.PENDING
    """Pending, Profiling, Serving, Degraded or Failed."""
    progress: ShortText = ""
    """Short progress, e.g. `profiles 5/8`."""
    observed_generation: int | None = None
    """The .metadata.generation last acted on."""
    conditions: list[Condition] = Field(default_factory=list, max_length=32)
    """Valid, Profiled, Serving, RolledOut, MetricsAvailable, MetricsTruncated, NodesAvailable, SloAttained (the
    share of requests within the SLOs against policy.sloAttainmentPercent), RoutingReady (with
    serving.routing: gateway: the HTTPRoute applied, or why not and the fix), and Reconciled (the
    last reconciliation ran to its end and its status was written; False names the cause and the fix while the
    operator retries with back-off)."""
    pools: list[PoolStatus] = Field(default_factory=list, max_length=64)
    """Per pool: profiles, decision, replicas, load."""
    decision_summary: Text = ""
    """All pools in one line, e.g. `h100=eagle3[1-16:4,17+:0] h200=ngram[1-32:3,33+:0]`."""
    observed_concurrency: float | None = None
    """Mean concurrency per replica over all pools."""
    cost_per_mtok: float | None = None
    """With two or more pools: the fleet's dollars per million output tokens under its placement (fleet.costPerMtok)
    once the pools are profiled and load is observed; otherwise the lowest of the pools'
    decision.costPerMtokWithSd: predicted dollars per million output tokens of the cheapest pool under its
    decision, at its expected load."""
    fleet: FleetStatus | None = None
    """Fleet placement across the pools (two or more pools)."""
    slo_attainment: SloAttainment | None = None
    """The deployment's share of requests within the SLOs over the metrics window, its pools' requests together,
    against policy.sloAttainmentPercent (condition SloAttained)."""
    routing: RoutingStatus | None = None
    """The routing in effect (spec.serving.routing), the HTTPRoute and its weights."""
    history: list[HistoryEntry] = Field(default_factory=list, max_length=64)
    """The last decision changes (bounded)."""


class SpeculativeDeployment(ApiModel):
    """Top-level object, as stored by the API server."""

    model_config = {"extra": "ignore"}

    api_version: str = "specpilot.io/v1alpha1"
    kind: str = "SpeculativeDeployment"
    metadata: dict[str, Any] = Field(default_factory=dict)
    spec: SpeculativeDeploymentSpec
    status: SpeculativeDeploymentStatus | None = None


HISTORY_LIMIT = 20
