"""The `SpeculativeDeployment` spec: one model served by vLLM on one or more GPU pools, with the speculative-decoding
candidates specpilot profiles and chooses from. What the platform team wants; `deployment_status` holds what
specpilot measured, decided and observed."""

from __future__ import annotations

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
    ConfigMapKeyRef,
    FreeFormObject,
    ImageRef,
    SecretKeyRef,
    join_problems,
)
from .methods import CandidateMethod

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
    SloAttained, alert SpecpilotSloAttainmentLow). With two or more pools the fleet planner sizes for it: the
    demand it forecasts over the scale-up lead time is this quantile of the demand's swings seen, and each replica
    runs at the mean concurrency whose requests in flight stay within its admission limit at this quantile
    (status.fleet.forecastTokensPerSecond and headroomPercent show it). A single pool's replica planner still
    sizes by serving.targetUtilizationPercent."""
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

    AUTO = "auto"
    """The cheapest routing the cluster allows (`policy.routing.resolve_routing`): inferencePool where the cluster
    serves the Inference Extension's InferencePool and an endpoint picker is named, else gateway where it serves
    the Gateway API's HTTPRoute and a Gateway is named (in the spec or the operator's config), else service."""
    SERVICE = "service"
    """One Service over every pool's pods: an even split per pod."""
    GATEWAY = "gateway"
    """One Service per pool behind a Gateway API HTTPRoute whose backendRefs weights are the shares."""
    INFERENCE_POOL = "inferencePool"
    """One InferencePool (Gateway API Inference Extension, v1) per pool behind a Gateway API HTTPRoute whose
    backendRefs weights are the shares; an endpoint picker chooses the pod inside each pool."""

    @property
    def weighted(self) -> bool:
        """Whether the shares can be any split (an HTTPRoute's weights), not an even split per pod."""
        return self in (Routing.GATEWAY, Routing.INFERENCE_POOL)


GATEWAY_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
"""A Gateway API ObjectName / SectionName: a DNS-1123 subdomain."""
NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
"""A namespace name: a DNS-1123 label."""


class ParentRef(ApiModel):
    """A Gateway the HTTPRoute attaches to (Gateway API ParentReference, kind Gateway). Only Gateways the
    operator's config allows (allowedGatewayParents; by default those in the deployment's own namespace)."""

    name: str = Field(min_length=1, max_length=253, pattern=GATEWAY_NAME_PATTERN)
    """Name of the Gateway."""
    namespace: str | None = Field(default=None, min_length=1, max_length=63, pattern=NAMESPACE_PATTERN)
    """Namespace of the Gateway; defaults to the deployment's own."""
    section_name: str | None = Field(default=None, min_length=1, max_length=253, pattern=GATEWAY_NAME_PATTERN)
    """Listener of the Gateway to attach to (its name); all listeners that allow the route when unset."""
    port: int | None = Field(default=None, ge=1, le=65535)
    """Port of the Gateway's listener to attach to; any when unset."""


class GatewayRouting(ApiModel):
    """Where the HTTPRoute of `routing: gateway` or `inferencePool` attaches."""

    parent_refs: list[ParentRef] = Field(default_factory=list, max_length=32)
    """Gateways the route attaches to; the operator's defaultGatewayParentRefs when empty. gateway and
    inferencePool routing need one or the other."""


class EndpointPickerFailureMode(str, Enum):
    """What the Gateway does when the endpoint picker does not answer (InferencePool v1's failureMode)."""

    FAIL_OPEN = "FailOpen"
    """Forward the request to a pod of the pool the Gateway picks itself."""
    FAIL_CLOSE = "FailClose"
    """Refuse the request."""


ENDPOINT_PICKER_PORT = 9002
"""The endpoint picker's gRPC (ext-proc) port in the Inference Extension's and llm-d's charts."""
ENDPOINT_PICKER_SUFFIX = "-epp"
"""An unnamed endpoint picker is the Service `<InferencePool name>-epp`, as the Inference Extension's chart names
the picker it deploys beside a pool."""


class EndpointPickerRef(ApiModel):
    """The endpoint picker (EPP) of each InferencePool the operator creates: a Service in the deployment's own
    namespace (InferencePool v1 references no other namespace), e.g. llm-d's router or the Inference Extension's
    reference picker, deployed one per pool."""

    name: str | None = Field(default=None, min_length=1, max_length=63, pattern=r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    """Name of the picker's Service. Unset: each pool's own, `<InferencePool name>-epp` (one picker per pool, as
    llm-d and the Inference Extension's chart deploy it; the InferencePools are `status.routing.inferencePools`).
    Set: every pool's InferencePool names this one picker, which must then serve all of them."""
    namespace: str | None = Field(default=None, min_length=1, max_length=63, pattern=NAMESPACE_PATTERN)
    """Only the deployment's own namespace (or unset): InferencePool v1 cannot reference a picker elsewhere, and
    the operator refuses any other."""
    port: int = Field(default=ENDPOINT_PICKER_PORT, ge=1, le=65535)
    """Port of the picker's Service (its gRPC ext-proc port)."""
    failure_mode: EndpointPickerFailureMode = EndpointPickerFailureMode.FAIL_CLOSE
    """FailClose: the Gateway refuses requests while the picker does not answer; FailOpen: it forwards them to a
    pod it picks itself."""


class InferencePoolRouting(ApiModel):
    """The InferencePools of `routing: inferencePool`."""

    endpoint_picker_ref: EndpointPickerRef = Field(default_factory=EndpointPickerRef)
    """The endpoint picker of each pool (naming it makes `routing: auto` choose inferencePool where the cluster
    serves InferencePools); the operator's defaultEndpointPickerRef when this block is absent."""


class Serving(ApiModel):
    """Replicas and how they are exposed."""

    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas",
         "message": "minReplicas must be <= maxReplicas"},
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
    """Share of a replica's SLO-feasible concurrency to plan for (headroom for bursts). With two or more pools it
    is an upper bound: the fleet planner derives each replica's load from policy.sloAttainmentPercent (requests in
    flight within the admission limit at that quantile, on the curve calibrated by the pool's observed p95 TPOT)
    and sizes for the demand forecast over the scale-up lead time, and takes this share only where it is lower."""
    port: int = Field(default=8000, ge=1, le=65535)
    """Port of the OpenAI-compatible API."""
    service_monitor: bool = False
    """Create a Prometheus-operator PodMonitor for the serving pods."""
    routing: Routing = Routing.AUTO
    """How requests reach the pools. auto (the default): the cheapest the cluster allows, inferencePool, else
    gateway, else service (status.routing says which and why, and what weighted routing saves); service: one
    Service over every pool's pods (an even split per pod; the fleet planner plans under it, the costliest for
    a mixed fleet); gateway: one Service per pool behind a Gateway API HTTPRoute (gateway.networking.k8s.io/v1)
    whose backendRefs weights follow the fleet's planned shares; inferencePool: one InferencePool
    (inference.networking.k8s.io/v1) per pool behind that weighted HTTPRoute, an endpoint picker choosing the pod
    in each. gateway and inferencePool need their CRDs and a Gateway; without the CRDs they fall back to the
    cheapest routing there is (condition RoutingReady=False)."""
    gateway: GatewayRouting = Field(default_factory=GatewayRouting)
    """The HTTPRoute's parentRefs for routing: gateway and inferencePool."""
    inference_pool: InferencePoolRouting | None = None
    """The InferencePools' endpoint picker for routing: inferencePool (and auto)."""
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
