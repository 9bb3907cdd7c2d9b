"""What a tenant (whoever may create a SpeculativeDeployment) may make the operator run, and what only the
cluster admin may allow.

The operator creates pods with its own rights: serving Deployments and benchmark Jobs (which carry a token
that may write profile results). Without limits, anyone allowed to create a SpeculativeDeployment could run
any pod through it (a confused deputy): a privileged container, a hostPath of `/`, the node's network, any
ServiceAccount, any Secret of the namespace in an environment variable, any image next to the bench token.

`TenancyPolicy` is the admin's part of the operator config (`tenancy:`). `spec_problems` checks a
SpeculativeDeployment against it and says, per field, what is not allowed and what to do instead; the
operator reports them as `Valid=False` and an `InvalidSpec` Event (and creates nothing), and the builders
refuse the same spec, so nothing reaches a pod. The defaults let a tenant set what tunes and places the
workload, never what widens its rights:

- pod overrides (serving.podOverrides, profiling.podOverrides): affinity, tolerations (with a key),
  nodeSelector additions, priorityClassName, topologySpreadConstraints, terminationGracePeriodSeconds,
  imagePullSecrets, volumes of the types in `allowedVolumeTypes`, a pod securityContext limited to
  runAsUser/runAsGroup (non-zero), fsGroup, fsGroupChangePolicy and supplementalGroups, and, on the
  containers specpilot runs (`engine`, `bench`), env, resources, volumeMounts and imagePullPolicy;
- Secrets: only those named in `allowedSecretNames` (hfTokenSecretRef, env secretKeyRef, secret volumes);
- images: the benchmark image is the operator's, or one of `allowedBenchmarkImages`; the engine image is
  any unless `allowedEngineImages` lists some.

Everything else (hostNetwork, hostPID, hostIPC, hostPath, privileged, serviceAccountName, nodeName, a
container securityContext, extra containers, ...) is refused unless named in `allowedPodOverrideFields`.
"""

from __future__ import annotations

import fnmatch
import json
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from .base import ApiModel, cap, echo, join_problems

if TYPE_CHECKING:
    from .deployment import SpeculativeDeploymentSpec

BENCH_CONTAINER = "bench"
ENGINE_CONTAINER = "engine"

SAFE_POD_FIELDS = frozenset({
    "affinity", "tolerations", "nodeSelector", "priorityClassName", "topologySpreadConstraints",
    "terminationGracePeriodSeconds", "imagePullSecrets", "volumes", "containers", "initContainers",
    "securityContext",
})
"""Pod-spec fields a tenant may override by default (containers, initContainers and securityContext only in
the limited ways `pod_override_problems` checks)."""
SAFE_POD_SECURITY_FIELDS = frozenset({"runAsUser", "runAsGroup", "fsGroup", "fsGroupChangePolicy",
                                      "supplementalGroups"})
"""Pod securityContext fields a tenant may set by default (runAsNonRoot and seccomp stay the operator's)."""
SAFE_CONTAINER_FIELDS = frozenset({"name", "env", "resources", "volumeMounts", "imagePullPolicy"})
"""Fields of specpilot's own containers a tenant may override by default."""
DEFAULT_VOLUME_TYPES = ("emptyDir", "configMap", "persistentVolumeClaim", "ephemeral", "downwardAPI",
                        "projected", "secret")
"""Volume types a tenant may add by default (all within the `restricted` Pod Security Standard). `secret`
volumes and projected secret sources must name an allowed Secret; projected ServiceAccount tokens are
never allowed."""
PROJECTED_SOURCES = frozenset({"configMap", "downwardAPI", "secret", "clusterTrustBundle"})
"""Sources a projected volume may have (serviceAccountToken is refused: it would hand out a token)."""
OWNED_MOUNT_PATHS = ("/dev/shm", "/var/run/secrets/kubernetes.io/serviceaccount", "/workload")
"""Mount paths of specpilot's own volumes; a tenant's volumeMount may not replace them."""
REFUSED_ENV_NAMES = frozenset({
    "LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE",
    "PYTHONINSPECT", "PYTHONEXECUTABLE", "BASH_ENV", "ENV",
    # vLLM switches that open the engine beyond what is measured and served: development endpoints (sleep,
    # reset caches, ...) on the serving port, pickle deserialization between its processes.
    "VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_INSECURE_SERIALIZATION",
})
"""Variables that load code into the process before it runs its own (the bench runs the engine in its
container, next to its token), or open the engine to more than it serves."""
REFUSED_ENV_PREFIXES = ("KUBERNETES_", "SPECPILOT_")
"""Variables that redirect a Kubernetes client (KUBERNETES_SERVICE_HOST would send the bench's token to
another host), and specpilot's own (the bench's result token, the sandbox's clock)."""
MAX_SPEC_BYTES = 131072
"""A SpeculativeDeployment's spec as JSON, at most (kopf keeps a copy in an annotation; annotations of an
object total at most 256 KiB)."""


class PodSecurityDefaults(ApiModel):
    """The identity every pod the operator creates runs as (the `restricted` Pod Security Standard)."""

    run_as_user: int = Field(default=1000, ge=1, le=2147483647)
    """Non-root uid of every container. vllm/vllm-openai (and the bench image built on it) runs as root by
    default but works as any uid: HOME is an emptyDir (caches, Hugging Face downloads) and USER is set."""
    run_as_group: int = Field(default=1000, ge=1, le=2147483647)
    """Primary gid of every container."""
    fs_group: int = Field(default=1000, ge=0, le=2147483647)
    """fsGroup: volumes (weights on a PVC, the emptyDirs) are made readable by this group."""
    home_dir: str = Field(default="/home/specpilot", pattern=r"^/[A-Za-z0-9_./-]*$", max_length=256)
    """Where HOME (an emptyDir) is mounted in specpilot's containers."""


class TenancyPolicy(ApiModel):
    """What a SpeculativeDeployment may make the operator run (operator config `tenancy:`, set by the
    cluster admin). The defaults keep every pod within the `restricted` Pod Security Standard."""

    allowed_pod_override_fields: list[str] = Field(default_factory=list, max_length=64)
    """Pod-spec fields tenants may set in podOverrides beyond the safe defaults, e.g. runtimeClassName,
    serviceAccountName, hostNetwork, dnsConfig, securityContext (the whole pod securityContext),
    containers.securityContext, containers.ports, containers.envFrom, extraContainers (containers other than
    specpilot's), tolerateAllTaints (a toleration without a key). Each one widens what a tenant can do."""
    allowed_volume_types: list[str] = Field(default_factory=lambda: list(DEFAULT_VOLUME_TYPES), max_length=32)
    """Volume types tenants may add in podOverrides (e.g. add csi, or drop persistentVolumeClaim)."""
    allowed_secret_names: list[str] = Field(default_factory=lambda: ["hf-token"], max_length=256)
    """Secrets (in the resource's namespace) a SpeculativeDeployment may reference: hfTokenSecretRef, env
    secretKeyRef, secret volumes. Glob patterns are allowed (`hf-*`). Empty: none."""
    allowed_benchmark_images: list[str] = Field(default_factory=list, max_length=64)
    """Images profiling.image may name besides the operator's benchmarkImage: exact references, or prefixes
    ending in `/*` or `:*` (e.g. `registry.example.com/specpilot/*`). The bench runs with a token that writes
    profile results, so only trusted images belong here."""
    allowed_engine_images: list[str] = Field(default_factory=list, max_length=64)
    """Images model.image may name (same form). Empty: any image (the engine runs hardened and without a
    token; list images to restrict it)."""
    pod_security: PodSecurityDefaults = Field(default_factory=PodSecurityDefaults)
    """The non-root identity of every pod the operator creates."""
    max_spec_bytes: int = Field(default=MAX_SPEC_BYTES, ge=1024, le=262144)
    """Largest spec (as JSON) the operator acts on."""
    max_parallel_jobs_per_pool: int = Field(default=4, ge=1, le=32)
    """Most benchmark Jobs at once per pool a SpeculativeDeployment may ask for (profiling.maxParallelJobsPerPool;
    each holds tensorParallelSize GPUs of a pool other tenants share)."""
    max_job_deadline_seconds: int = Field(default=21600, ge=60, le=604800)
    """Longest activeDeadlineSeconds a SpeculativeDeployment may give its benchmark Jobs
    (profiling.jobDeadlineSeconds): how long a Job that hangs can hold its GPUs."""

    @field_validator("allowed_benchmark_images", "allowed_engine_images")
    @classmethod
    def _patterns(cls, images: list[str]) -> list[str]:
        for image in images:
            if "*" in image and not (image.endswith(("/*", ":*", "@*")) and image.count("*") == 1):
                raise ValueError(f"{image!r}: a prefix must end in '/*', ':*' or '@*' (so "
                                 "'registry/team*' cannot match 'registry/team-evil')")
        return images

    def allows(self, field: str) -> bool:
        return field in self.allowed_pod_override_fields


def image_allowed(image: str, patterns: list[str]) -> bool:
    """Whether `image` is one of `patterns` (exact, or a prefix ending in `/*`, `:*`, `@*`)."""
    for pattern in patterns:
        if pattern.endswith("*") and image.startswith(pattern[:-1]) and len(image) > len(pattern) - 1:
            return True
        if image == pattern:
            return True
    return False


def secret_allowed(name: str, policy: TenancyPolicy) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in policy.allowed_secret_names)


def _secret_refusal(where: str, name: Any, policy: TenancyPolicy) -> str:
    allowed = ", ".join(policy.allowed_secret_names[:10]) or "none"
    return (f"{where} references Secret {echo(name, 80)}, which the operator's config does not allow "
            f"(tenancy.allowedSecretNames: {allowed}): ask the cluster admin to add it, or use an allowed one")


def env_problems(env: Any, where: str, policy: TenancyPolicy) -> list[str]:
    """What is not allowed in a list of Kubernetes EnvVar objects."""
    if not isinstance(env, list):
        return [f"{where} must be a list of {{name, value}} or {{name, valueFrom}} objects (got {echo(env, 80)})"]
    problems: list[str] = []
    for i, var in enumerate(env):
        at = f"{where}[{i}]"
        if not isinstance(var, dict):
            problems.append(f"{at} must be an object with a name (got {echo(var, 80)})")
            continue
        name = var.get("name")
        if isinstance(name, str) and (name in REFUSED_ENV_NAMES or name.startswith(REFUSED_ENV_PREFIXES)):
            problems.append(f"{at}.name {echo(name, 80)} is not allowed: it would load other code into the engine "
                            f"or the bench, open the engine beyond serving, redirect the bench's Kubernetes "
                            f"client, or set one of specpilot's own variables; remove it")
        source = var.get("valueFrom")
        if isinstance(source, dict):
            ref = source.get("secretKeyRef")
            if ref is not None and not (isinstance(ref, dict) and isinstance(ref.get("name"), str)
                                        and secret_allowed(ref["name"], policy)):
                name_ = ref.get("name") if isinstance(ref, dict) else ref
                problems.append(_secret_refusal(f"{at}.valueFrom.secretKeyRef", name_, policy))
    return problems


def _volume_problems(volumes: Any, where: str, policy: TenancyPolicy) -> list[str]:
    if not isinstance(volumes, list):
        return [f"{where} must be a list of volumes"]
    problems: list[str] = []
    for i, volume in enumerate(volumes):
        at = f"{where}[{i}]"
        if not isinstance(volume, dict):
            problems.append(f"{at} must be a volume object")
            continue
        kinds = [k for k in volume if k != "name"]
        for kind in kinds:
            if kind not in policy.allowed_volume_types:
                fix = ("mount model weights from a persistentVolumeClaim or download them to an emptyDir"
                       if kind == "hostPath" else "use one of the allowed types")
                problems.append(f"{at}.{cap(kind, 60)} is not allowed: volume types allowed by the operator's config "
                                f"are {', '.join(policy.allowed_volume_types)}; {fix}")
        secret = volume.get("secret")
        if "secret" in policy.allowed_volume_types and isinstance(secret, dict) and not secret_allowed(
                str(secret.get("secretName", "")), policy):
            problems.append(_secret_refusal(f"{at}.secret.secretName", secret.get("secretName"), policy))
        projected = volume.get("projected")
        if "projected" in policy.allowed_volume_types and isinstance(projected, dict):
            for j, source in enumerate(projected.get("sources") or []):
                for kind, value in (source.items() if isinstance(source, dict) else []):
                    if kind not in PROJECTED_SOURCES:
                        problems.append(f"{at}.projected.sources[{j}].{cap(kind, 60)} is not allowed (a "
                                        f"serviceAccountToken would hand the pod a token): remove it")
                    elif kind == "secret" and not (isinstance(value, dict)
                                                   and secret_allowed(str(value.get("name", "")), policy)):
                        problems.append(_secret_refusal(f"{at}.projected.sources[{j}].secret", (value or {}).get(
                            "name") if isinstance(value, dict) else value, policy))
    return problems


def _container_problems(containers: Any, where: str, owned: tuple[str, ...], policy: TenancyPolicy) -> list[str]:
    if not isinstance(containers, list):
        return [f"{where} must be a list of containers"]
    problems: list[str] = []
    for i, container in enumerate(containers):
        at = f"{where}[{i}]"
        if not isinstance(container, dict):
            problems.append(f"{at} must be a container object")
            continue
        name = container.get("name")
        if name not in owned:
            if not policy.allows("extraContainers"):
                known = " or ".join(repr(n) for n in owned) or "none"
                problems.append(f"{at} (name {echo(name, 60)}) is not one of specpilot's containers ({known}): extra "
                                f"containers are not allowed unless the operator's config lists extraContainers in "
                                f"tenancy.allowedPodOverrideFields; override fields of {known} by its name")
                continue
        for field in container:
            if field in SAFE_CONTAINER_FIELDS or policy.allows(f"containers.{field}"):
                continue
            if name not in owned and field not in ("securityContext", "ports", "envFrom"):
                continue  # an admin-allowed extra container brings its own image and command
            why = {"image": "the engine image is spec.model.image, the bench image spec.profiling.image",
                   "command": "specpilot runs its own command", "args": "use spec.model.extraArgs",
                   "securityContext": "every container runs non-root, without privilege escalation or capabilities",
                   "ports": "a hostPort would expose the node", "envFrom": "set variables one by one in env",
                   }.get(field, "it is not one of the fields a tenant may override")
            problems.append(f"{at}.{cap(field, 60)} is not allowed ({why}): remove it, or ask the cluster admin to "
                            f"list containers.{cap(field, 60)} in tenancy.allowedPodOverrideFields")
        if "env" in container:
            problems += env_problems(container["env"], f"{at}.env", policy)
        for j, mount in enumerate(container.get("volumeMounts") or []):
            path = mount.get("mountPath") if isinstance(mount, dict) else None
            if isinstance(path, str) and path.rstrip("/") in OWNED_MOUNT_PATHS + (policy.pod_security.home_dir,):
                problems.append(f"{at}.volumeMounts[{j}].mountPath {echo(path, 80)} is specpilot's own mount: "
                                f"mount your volume elsewhere")
    return problems


def pod_override_problems(overrides: dict[str, Any] | None, where: str, policy: TenancyPolicy,
                          containers: tuple[str, ...], init_containers: tuple[str, ...] = ()) -> list[str]:
    """Why a podOverrides object may not be merged into a pod spec the operator creates, per field
    (`where` is its path, e.g. spec.serving.podOverrides.spec)."""
    if not overrides:
        return []
    problems: list[str] = []
    for field, value in overrides.items():
        at = f"{where}.{cap(str(field), 60)}"
        if field not in SAFE_POD_FIELDS and not policy.allows(field):
            why = {
                "hostNetwork": "the pod would share the node's network", "hostPID": "the pod would see the node's "
                "processes", "hostIPC": "the pod would share the node's IPC", "nodeName": "it bypasses the "
                "scheduler and the pool's placement", "serviceAccountName": "the pod would run with another "
                "identity's rights", "serviceAccount": "the pod would run with another identity's rights",
                "automountServiceAccountToken": "the operator decides which pods get a token",
                "ephemeralContainers": "extra containers are not allowed",
                "hostUsers": "the pod would run in the node's user namespace",
            }.get(field, "it is not one of the fields a tenant may override")
            problems.append(f"{at} is not allowed ({why}): remove it, or ask the cluster admin to list {field} in "
                            f"the operator's tenancy.allowedPodOverrideFields")
            continue
        if field == "securityContext" and not policy.allows("securityContext"):
            if not isinstance(value, dict):
                problems.append(f"{at} must be an object")
                continue
            for key, sub in value.items():
                if key not in SAFE_POD_SECURITY_FIELDS:
                    problems.append(f"{at}.{cap(str(key), 60)} is not allowed (specpilot sets runAsNonRoot and the "
                                    f"seccomp profile): only {', '.join(sorted(SAFE_POD_SECURITY_FIELDS))} may be set")
                elif key in ("runAsUser", "runAsGroup") and sub == 0:
                    problems.append(f"{at}.{key} is 0 (root): pods run as non-root; use a non-zero id")
        elif field == "volumes":
            problems += _volume_problems(value, at, policy)
        elif field == "containers":
            problems += _container_problems(value, at, containers, policy)
        elif field == "initContainers":
            problems += _container_problems(value, at, init_containers, policy)
        elif field == "tolerations":
            problems += tolerations_problems(value, at, policy)
    return problems


def tolerations_problems(tolerations: Any, where: str, policy: TenancyPolicy) -> list[str]:
    if policy.allows("tolerateAllTaints") or not isinstance(tolerations, list):
        return []
    return [f"{where}[{i}] has no key, so it tolerates every taint (control-plane and cordoned nodes included): "
            f"name the taint's key, or ask the cluster admin to list tolerateAllTaints in "
            f"tenancy.allowedPodOverrideFields"
            for i, t in enumerate(tolerations) if isinstance(t, dict) and not t.get("key")]


def bench_image(spec: SpeculativeDeploymentSpec, default: str) -> str:
    """The benchmark image a deployment's Jobs run: profiling.image or the operator's."""
    return spec.profiling.image or default


class TenancyViolation(ValueError):
    """A spec asks for something the operator's tenancy policy does not allow. The controller reports it as
    an invalid spec before building anything; a builder given such a spec refuses it with this."""


def refuse(problems: list[str]) -> None:
    """Raise TenancyViolation naming `problems`, if any."""
    if problems:
        raise TenancyViolation(join_problems(problems))


def serving_problems(spec: SpeculativeDeploymentSpec, policy: TenancyPolicy, root: str = "spec") -> list[str]:
    """What in `spec` may not reach a serving pod: Secrets, env, the engine image, pool tolerations and
    serving.podOverrides."""
    problems: list[str] = []
    model = spec.model
    if model.hf_token_secret_ref is not None and not secret_allowed(model.hf_token_secret_ref.name, policy):
        problems.append(_secret_refusal(f"{root}.model.hfTokenSecretRef.name", model.hf_token_secret_ref.name, policy))
    problems += env_problems([v.dump() for v in model.env], f"{root}.model.env", policy)
    if policy.allowed_engine_images and not image_allowed(model.image, policy.allowed_engine_images):
        problems.append(f"{root}.model.image {echo(model.image, 120)} is not an engine image the operator's config "
                        f"allows (tenancy.allowedEngineImages: {', '.join(policy.allowed_engine_images[:10])})")
    for i, pool in enumerate(spec.gpu_pools):
        problems += tolerations_problems([t.dump() for t in pool.tolerations], f"{root}.gpuPools[{i}].tolerations",
                                         policy)
    problems += pod_override_problems(spec.serving.pod_overrides, f"{root}.serving.podOverrides", policy,
                                      containers=(ENGINE_CONTAINER,))
    return problems


def profiling_problems(spec: SpeculativeDeploymentSpec, policy: TenancyPolicy, *, benchmark_image: str,
                       root: str = "spec") -> list[str]:
    """What in `spec` may not reach a benchmark pod beyond `serving_problems`: profiling.image,
    profiling.podOverrides, and how many Jobs at once and for how long (the caps on a shared pool's GPUs)."""
    problems: list[str] = []
    image = spec.profiling.image
    if image is not None and image != benchmark_image and not image_allowed(image, policy.allowed_benchmark_images):
        problems.append(f"{root}.profiling.image {echo(image, 120)} is not a benchmark image the operator's config "
                        f"allows: the bench runs with a token that writes profile results; remove profiling.image to "
                        f"use the operator's ({cap(benchmark_image, 120)}), or ask the cluster admin to add it to "
                        f"tenancy.allowedBenchmarkImages")
    problems += pod_override_problems(spec.profiling.pod_overrides, f"{root}.profiling.podOverrides", policy,
                                      containers=(BENCH_CONTAINER,), init_containers=(ENGINE_CONTAINER,))
    parallel = spec.profiling.max_parallel_jobs_per_pool
    if parallel > policy.max_parallel_jobs_per_pool:
        problems.append(f"{root}.profiling.maxParallelJobsPerPool {parallel} is more benchmark Jobs at once than the "
                        f"operator's config allows per pool ({policy.max_parallel_jobs_per_pool}, "
                        f"tenancy.maxParallelJobsPerPool): set it to at most {policy.max_parallel_jobs_per_pool}")
    deadline = spec.profiling.job_deadline_seconds
    if deadline > policy.max_job_deadline_seconds:
        problems.append(f"{root}.profiling.jobDeadlineSeconds {deadline} is longer than the operator's config lets a "
                        f"benchmark Job hold its GPUs ({policy.max_job_deadline_seconds} s, "
                        f"tenancy.maxJobDeadlineSeconds): set it to at most {policy.max_job_deadline_seconds}")
    return problems


def spec_problems(spec: SpeculativeDeploymentSpec, policy: TenancyPolicy, *, benchmark_image: str,
                  root: str = "spec") -> list[str]:
    """Everything in `spec` the operator's tenancy policy does not allow, one message per field naming it and
    the fix (empty: the spec may run)."""
    problems: list[str] = []
    size = len(json.dumps(spec.dump(), separators=(",", ":")))
    if size > policy.max_spec_bytes:
        problems.append(f"{root} is {size} bytes as JSON, more than the {policy.max_spec_bytes} the operator "
                        f"acts on: shorten lists and free-form fields")
    problems += serving_problems(spec, policy, root)
    problems += profiling_problems(spec, policy, benchmark_image=benchmark_image, root=root)
    return problems
