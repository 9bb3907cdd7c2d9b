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
  imagePullSecrets, volumes of the types in `allowedVolumeTypes` (not named like specpilot's own), a pod
  securityContext limited to runAsUser, runAsGroup, fsGroup and supplementalGroups (integers, never 0) and
  fsGroupChangePolicy; on the `engine` container env (no variable that loads code), resources, volumeMounts
  (not over specpilot's mounts, the system's or Python's files, nor of the token volume) and
  imagePullPolicy; on the `bench` container, which holds the result token, resources only;
- engine flags: none that makes vLLM import code named on its command line (api/args.py);
- Secrets: only those named in `allowedSecretNames` (hfTokenSecretRef, env secretKeyRef, secret volumes);
- images: the benchmark image is the operator's, or one of `allowedBenchmarkImages`; the engine image is
  any unless `allowedEngineImages` lists some.

Everything else (hostNetwork, hostPID, hostIPC, hostPath, privileged, serviceAccountName, nodeName, a
container securityContext, extra containers, ...) is refused unless named in `allowedPodOverrideFields`; a
container or init container named like one of specpilot's where that pod has none, and a mount of the
ServiceAccount token volume outside the bench container, are refused whatever the admin allows.
"""

from __future__ import annotations

import fnmatch
import json
import posixpath
import re
from typing import TYPE_CHECKING, Any

from pydantic import Field, field_validator

from .args import code_loading_problems
from .base import ApiModel, cap, echo, join_problems

if TYPE_CHECKING:
    from .deployment_spec import SpeculativeDeploymentSpec

BENCH_CONTAINER = "bench"
"""The benchmark pod's container that holds the result token and measures the engine."""
ENGINE_CONTAINER = "engine"
"""The container that runs vLLM, in serving and benchmark pods."""
SUPERVISOR_INSTALL_CONTAINER = "supervisor-install"
"""The benchmark pod's init container that installs the engine supervisor."""
RESERVED_CONTAINER_NAMES = frozenset({BENCH_CONTAINER, ENGINE_CONTAINER, SUPERVISOR_INSTALL_CONTAINER})
"""Names of the containers specpilot runs (manifests/names.py names them too: api/ cannot import manifests/, and
a test checks that the two agree and that every pod the builders make uses no other). A tenant may override the
fields `SERVING_POD_CONTAINERS` and `BENCHMARK_POD_CONTAINERS` allow in them, never add a container or init
container of such a name."""
TOKEN_VOLUME_PREFIX = "kube-api-access"
"""The ServiceAccount token volume (specpilot's projected one, and the name the kubelet gives its own): mounted
into the bench container by specpilot and nowhere else."""
RESERVED_VOLUME_NAMES = frozenset({"dshm", "home", "bench-home", "engine-supervisor", "workload"})
"""Names of specpilot's other volumes (/dev/shm, the engine's and the bench's HOME, the engine supervisor, the
workload file): a tenant's volume of that name would be merged into specpilot's, and a tenant's mount of one
would reach into another container's files (the bench's HOME is on its Python path)."""

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
"""Fields of the engine container a tenant may override by default."""
BENCH_CONTAINER_FIELDS = frozenset({"name", "resources"})
"""Fields of the bench container a tenant may override: its resources only. It holds the result token, so it
takes no tenant environment, volumes or mounts (nothing that could load code beside the token)."""
SERVING_POD_CONTAINERS: dict[str, dict[str, frozenset[str]]] = {
    "containers": {ENGINE_CONTAINER: SAFE_CONTAINER_FIELDS}, "initContainers": {}}
"""The serving pod's containers by pod-spec list, with the fields a tenant may override in each."""
BENCHMARK_POD_CONTAINERS: dict[str, dict[str, frozenset[str]]] = {
    "containers": {BENCH_CONTAINER: BENCH_CONTAINER_FIELDS, ENGINE_CONTAINER: SAFE_CONTAINER_FIELDS},
    "initContainers": {}}
"""The benchmark pod's containers a tenant may override, the bench and the engine (manifests/benchmark.py builds
them; a test checks that the two agree)."""
DEFAULT_VOLUME_TYPES = ("emptyDir", "configMap", "persistentVolumeClaim", "ephemeral", "downwardAPI",
                        "projected", "secret")
"""Volume types a tenant may add by default (all within the `restricted` Pod Security Standard). `secret`
volumes and projected secret sources must name an allowed Secret; projected ServiceAccount tokens are
never allowed."""
PROJECTED_SOURCES = frozenset({"configMap", "downwardAPI", "secret", "clusterTrustBundle"})
"""Sources a projected volume may have (serviceAccountToken is refused: it would hand out a token)."""
SUPERVISOR_DIR = "/specpilot-supervisor"
"""Where the benchmark pod's engine container finds the supervisor that starts vLLM (manifests/benchmark.py mounts
it there; a test checks that the two agree): a tenant's volume there would replace the supervisor."""
OWNED_MOUNT_PATHS = ("/dev/shm", "/var/run/secrets/kubernetes.io/serviceaccount", "/workload", SUPERVISOR_DIR)
"""Mount paths of specpilot's own volumes; a tenant's volumeMount may not replace them."""
REFUSED_MOUNT_TREES = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/usr", "/etc", "/boot", "/root",
                       "/proc", "/sys", "/dev", "/opt/venv", "/opt/conda", "/var/run/secrets", "/run/secrets",
                       "/vllm-workspace")
"""Paths a tenant's volume may not be mounted at or below: the system's programs, libraries and configuration
(a ConfigMap over /etc/ld.so.preload or an OpenSSL config loads code into every process), the Python
installation, the Kubernetes secrets (/var/run is /run in most images), and /vllm-workspace, the vLLM image's
working directory: `python -m` puts the working directory first on the module path, so a module there would be
imported in place of vLLM's own."""
REFUSED_MOUNT_COMPONENTS = frozenset({"site-packages", "dist-packages", "__pycache__"})
"""Path components a tenant's mount may not contain: Python imports from these (a ConfigMap of .py or .pth files
there runs at start-up)."""
REFUSED_MOUNT_NAMES = re.compile(r"^(sitecustomize|usercustomize)\.py$|\.pth$")
"""File names Python runs at start-up wherever they sit on its path."""
REFUSED_HOME_TREES = (".local", ".config", ".cache/vllm", ".triton", ".cache/torch", ".cache/torch_extensions",
                      ".cache/flashinfer", ".cache/huggingface/modules", ".nv")
"""Below HOME: the Python user site (~/.local/lib/pythonX/site-packages), the caches of compiled code vLLM,
Triton, torch, torch's C++ extensions, FlashInfer and CUDA's JIT load (a ConfigMap there would be run as kernels
or graphs), and the Hugging Face modules cache (remote code imported from there)."""
REFUSED_ENV_NAMES = frozenset({
    "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONINSPECT", "PYTHONEXECUTABLE",
    "BASH_ENV", "ENV", "PROMPT_COMMAND", "OPENSSL_CONF", "OPENSSL_ENGINES", "OPENSSL_MODULES", "GCONV_PATH",
    "GLIBC_TUNABLES", "NODE_OPTIONS", "PERL5OPT", "PERL5LIB", "RUBYOPT", "JAVA_TOOL_OPTIONS", "CUDA_INJECTION64_PATH",
    "NCCL_NET_PLUGIN", "NCCL_TUNER_PLUGIN", "NCCL_PROFILER_PLUGIN", "NCCL_ENV_PLUGIN", "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR", "HF_MODULES_CACHE", "VLLM_CACHE_ROOT", "VLLM_LOGGING_CONFIG_PATH",
    # Cache and plugin locations that load code from wherever they point: Triton's cache manager (a class path)
    # and home, NCCL's config file (which names plugins), torch's extensions and hub, FlashInfer's JIT workspace,
    # CUDA's compute cache, and the homes the refused folders under HOME hang from (HOME and XDG_* move ~/.local,
    # ~/.config and ~/.cache away from the folders the mount rule guards). HF_HOME stays allowed: teams put the
    # weights cache on a volume with it (docs/security.md says what it reaches).
    "TRITON_CACHE_MANAGER", "TRITON_HOME", "NCCL_CONF_FILE", "TORCH_EXTENSIONS_DIR", "TORCH_HOME",
    "FLASHINFER_WORKSPACE_BASE", "CUDA_CACHE_PATH", "HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
    # vLLM switches that open the engine beyond what is measured and served: development endpoints (sleep,
    # reset caches, ...) on the serving port, pickle deserialization between its processes, an endpoint that
    # loads LoRA adapters from any path at run time.
    "VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_INSECURE_SERIALIZATION", "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
})
"""Variables that make a process load code other than its own before or while it runs (a shared library, a
Python module, an OpenSSL engine, a gconv module, a CUDA injection or NCCL plugin, compiled kernels from a
redirected cache, a logging dictConfig), or open the engine to more than it serves."""
ALLOWED_PYTHON_ENV = frozenset({
    "PYTHONUNBUFFERED", "PYTHONHASHSEED", "PYTHONDONTWRITEBYTECODE", "PYTHONIOENCODING", "PYTHONUTF8",
    "PYTHONFAULTHANDLER", "PYTHONOPTIMIZE", "PYTHONNOUSERSITE", "PYTHONTRACEMALLOC", "PYTHONMALLOC",
    "PYTHONDEVMODE", "PYTHONSAFEPATH", "PYTHONWARNDEFAULTENCODING", "PYTHONNODEBUGRANGES",
})
"""The PYTHON* variables a tenant may set (an allow-list: PYTHONWARNINGS imports warning categories by module,
PYTHONBREAKPOINT a callable, PYTHONPLATLIBDIR moves the library path, and CPython adds new ones)."""
REFUSED_ENV_PREFIXES = ("KUBERNETES_", "SPECPILOT_", "LD_")
"""Variables that redirect a Kubernetes client (KUBERNETES_SERVICE_HOST would send a token to another host),
specpilot's own (the bench's result token, the sandbox's clock), and the dynamic linker's (LD_PRELOAD, LD_AUDIT,
LD_LIBRARY_PATH load other libraries)."""
SAFE_FIELD_PATHS = frozenset({"metadata.name", "metadata.namespace", "spec.nodeName", "status.podIP", "status.podIPs",
                              "status.hostIP", "status.hostIPs"})
"""The pod fields an env fieldRef may read: where the pod runs, not what the operator wrote on it (labels and
annotations carry the Job's identities and the benchmark's profile name)."""
CONTROL_PLANE_TAINTS = frozenset({"node-role.kubernetes.io/control-plane", "node-role.kubernetes.io/master",
                                  "node.kubernetes.io/unschedulable", "node.cloudprovider.kubernetes.io/uninitialized"})
"""Taints that keep workloads off control-plane, cordoned and uninitialised nodes: a tenant's pod tolerating one
would run beside the API server's etcd or on a node being drained."""
SYSTEM_PRIORITY_PREFIX = "system-"
"""Kubernetes' own priority classes (system-node-critical, system-cluster-critical) preempt every workload; the
prefix is reserved for them."""
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
    specpilot's), tolerateAllTaints (a toleration without a key), tolerateControlPlaneTaints (control-plane,
    cordon and uninitialised-node taints), systemPriorityClasses (system-node-critical, system-cluster-critical),
    crossNamespaceDataSources (an ephemeral claim cloning another namespace's volume). Each one widens what a
    tenant can do."""
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


def env_name_refused(name: str) -> bool:
    """Whether a tenant may not set the environment variable `name` in any container."""
    return (name in REFUSED_ENV_NAMES or name.startswith(REFUSED_ENV_PREFIXES)
            or (name.startswith("PYTHON") and name not in ALLOWED_PYTHON_ENV))


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
        if isinstance(name, str) and env_name_refused(name):
            problems.append(f"{at}.name {echo(name, 80)} is not allowed: it would load other code into the engine "
                            f"or the bench, open the engine beyond serving, redirect the bench's Kubernetes "
                            f"client, or set one of specpilot's own variables; remove it")
        source = var.get("valueFrom")
        if isinstance(source, dict):
            field_ref = source.get("fieldRef")
            path = field_ref.get("fieldPath") if isinstance(field_ref, dict) else field_ref
            if field_ref is not None and path not in SAFE_FIELD_PATHS:
                problems.append(f"{at}.valueFrom.fieldRef.fieldPath {echo(path, 80)} is not allowed (a pod's labels "
                                f"and annotations carry the operator's identities of its Job): use one of "
                                f"{', '.join(sorted(SAFE_FIELD_PATHS))}")
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
        name = volume.get("name")
        if isinstance(name, str) and (name in RESERVED_VOLUME_NAMES or name.startswith(TOKEN_VOLUME_PREFIX)):
            problems.append(f"{at}.name {echo(name, 80)} is the name of one of specpilot's volumes (its own would "
                            f"be merged with yours): name your volume differently")
        kinds = [k for k in volume if k != "name"]
        for kind in kinds:
            if kind not in policy.allowed_volume_types:
                fix = ("mount model weights from a persistentVolumeClaim or download them to an emptyDir"
                       if kind == "hostPath" else "use one of the allowed types")
                problems.append(f"{at}.{cap(kind, 60)} is not allowed: volume types allowed by the operator's config "
                                f"are {', '.join(policy.allowed_volume_types)}; {fix}")
        template = (volume.get("ephemeral") or {}).get("volumeClaimTemplate") \
            if isinstance(volume.get("ephemeral"), dict) else None
        claim = template.get("spec") if isinstance(template, dict) else None
        for source_field in ("dataSource", "dataSourceRef"):
            source = claim.get(source_field) if isinstance(claim, dict) else None
            if isinstance(source, dict) and source.get("namespace") and not policy.allows("crossNamespaceDataSources"):
                problems.append(f"{at}.ephemeral.volumeClaimTemplate.spec.{source_field}.namespace "
                                f"{echo(source.get('namespace'), 80)} clones a volume of another namespace (another "
                                f"team's data): clone one of this namespace's, or ask the cluster admin to list "
                                f"crossNamespaceDataSources in tenancy.allowedPodOverrideFields")
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


def _mount_path_problem(path: Any, at: str, policy: TenancyPolicy) -> str | None:
    """Why a tenant's volume may not be mounted at `path`, judged on the path the kubelet will use: `//` and
    `/./` collapsed, a trailing `/` dropped (`..` is refused outright)."""
    if not isinstance(path, str) or not path.startswith("/"):
        return f"{at} must be an absolute path (got {echo(path, 80)})"
    if ".." in path.split("/"):
        return f"{at} {echo(path, 80)} contains '..': give the path without it"
    normal = posixpath.normpath(re.sub(r"/+", "/", path))
    home = posixpath.normpath(policy.pod_security.home_dir)
    shown = echo(path, 80) + (f" (that is {echo(normal, 80)})" if normal != path else "")
    if normal in OWNED_MOUNT_PATHS or normal == home or any(normal.startswith(t + "/") for t in OWNED_MOUNT_PATHS):
        return f"{at} {shown} is specpilot's own mount: mount your volume elsewhere"
    if normal == "/" or any(normal == t or normal.startswith(t + "/") for t in REFUSED_MOUNT_TREES):
        return (f"{at} {shown} is in the system's or Python's own files (a volume there would load code into "
                f"the container): mount your volume elsewhere, e.g. under /models or /data")
    parts = normal.split("/")
    if REFUSED_MOUNT_COMPONENTS & set(parts) or REFUSED_MOUNT_NAMES.search(parts[-1]):
        return (f"{at} {shown} is where Python imports from or what it runs at start-up: mount your volume "
                f"elsewhere, e.g. under /models or /data")
    if any(normal == f"{home}/{t}" or normal.startswith(f"{home}/{t}/") for t in REFUSED_HOME_TREES):
        return (f"{at} {shown} is the Python user site or a cache of compiled code under HOME, which the engine "
                f"loads: mount your volume elsewhere (model weights may go under {home}/.cache/huggingface)")
    return None


def _container_problems(containers: Any, where: str, field_name: str, layout: dict[str, dict[str, frozenset[str]]],
                        policy: TenancyPolicy) -> list[str]:
    """What is not allowed in a tenant's `containers` or `initContainers` (`field_name`) for a pod whose specpilot
    containers are `layout` (list -> name -> the fields a tenant may override)."""
    owned = layout[field_name]
    if not isinstance(containers, list):
        return [f"{where} must be a list of containers"]
    problems: list[str] = []
    for i, container in enumerate(containers):
        at = f"{where}[{i}]"
        if not isinstance(container, dict):
            problems.append(f"{at} must be a container object")
            continue
        name = container.get("name")
        if not isinstance(name, str):
            problems.append(f"{at}.name must be a container's name (got {echo(name, 60)})")
            continue
        known = " or ".join(repr(n) for n in owned) or "none in this list"
        refused = False  # refused as a whole: its fields are not judged one by one (its mounts and env still are)
        if name not in owned:
            if name in RESERVED_CONTAINER_NAMES:
                home = next((f for f, names in layout.items() if name in names), None)
                fix = (f"override it in {where.rsplit('.', 1)[0]}.{home}, where specpilot runs it" if home else
                       "name your container differently")
                problems.append(f"{at} (name {echo(name, 60)}) takes the name of a container specpilot runs, and "
                                f"this pod's {field_name} hold no such container of specpilot's: {fix}")
                refused = True
            elif not policy.allows("extraContainers"):
                problems.append(f"{at} (name {echo(name, 60)}) is not one of specpilot's containers ({known}): extra "
                                f"containers are not allowed unless the operator's config lists extraContainers in "
                                f"tenancy.allowedPodOverrideFields; override fields of {known} by its name")
                refused = True
        allowed = owned.get(name)  # None: an extra container the admin allowed
        for field in container if not refused else ():
            if allowed is None:
                if field not in ("securityContext", "ports", "envFrom") or policy.allows(f"containers.{field}"):
                    continue  # an admin-allowed extra container brings its own image and command
            elif field in allowed or (name != BENCH_CONTAINER and policy.allows(f"containers.{field}")):
                continue
            elif name == BENCH_CONTAINER:
                problems.append(f"{at}.{cap(field, 60)} is not allowed: the bench container holds the result token, "
                                f"so a spec may set its resources only (no environment, volumes, mounts or "
                                f"securityContext); set engine settings on the {ENGINE_CONTAINER!r} container, or in "
                                f"spec.model")
                continue
            why = {"image": "the engine image is spec.model.image, the bench image spec.profiling.image",
                   "command": "specpilot runs its own command", "args": "use spec.model.extraArgs",
                   "securityContext": "every container runs non-root, without privilege escalation or capabilities",
                   "ports": "a hostPort would expose the node", "envFrom": "set variables one by one in env",
                   }.get(field, "it is not one of the fields a tenant may override")
            problems.append(f"{at}.{cap(field, 60)} is not allowed ({why}): remove it, or ask the cluster admin to "
                            f"list containers.{cap(field, 60)} in tenancy.allowedPodOverrideFields")
        bench = name == BENCH_CONTAINER and name in owned  # its env and mounts are refused whole, above
        if "env" in container and not bench:
            problems += env_problems(container["env"], f"{at}.env", policy)
        mounts = container.get("volumeMounts") if not bench else None
        if mounts is not None and not isinstance(mounts, list):
            problems.append(f"{at}.volumeMounts must be a list of volume mounts")
            mounts = None
        for j, mount in enumerate(mounts or []):
            if not isinstance(mount, dict):
                problems.append(f"{at}.volumeMounts[{j}] must be a volume mount object")
                continue
            volume = mount.get("name")
            if isinstance(volume, str) and volume.startswith(TOKEN_VOLUME_PREFIX):
                problems.append(f"{at}.volumeMounts[{j}].name {echo(volume, 80)} is the ServiceAccount token volume, "
                                f"which only the bench container mounts: remove the mount")
            elif volume in RESERVED_VOLUME_NAMES:
                problems.append(f"{at}.volumeMounts[{j}].name {echo(volume, 80)} is one of specpilot's volumes, which "
                                f"it mounts where they belong: remove the mount, or mount a volume of your own")
            problem = _mount_path_problem(mount.get("mountPath"), f"{at}.volumeMounts[{j}].mountPath", policy)
            if problem:
                problems.append(problem)
    return problems


_ID_FIELDS = {"runAsUser": "a uid", "runAsGroup": "a gid", "fsGroup": "a gid"}
MAX_ID = 2147483647


def _id_problem(at: str, value: Any, what: str) -> str | None:
    """A uid or gid as the API server types it (an integer; a string or a float is refused there, or worse,
    read differently by a tool on the way), and never 0 (root)."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{at} must be {what} written as an integer (got {echo(value, 40)}): write it without quotes"
    if value == 0:
        return f"{at} is 0 (root): pods run as non-root; use a non-zero id"
    if not 0 < value <= MAX_ID:
        return f"{at} must be {what} from 1 to {MAX_ID} (got {value})"
    return None


def _pod_security_problems(value: Any, at: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{at} must be an object"]
    problems: list[str] = []
    for key, sub in value.items():
        where = f"{at}.{cap(str(key), 60)}"
        if key not in SAFE_POD_SECURITY_FIELDS:
            problems.append(f"{where} is not allowed (specpilot sets runAsNonRoot and the seccomp profile): only "
                            f"{', '.join(sorted(SAFE_POD_SECURITY_FIELDS))} may be set")
        elif key in _ID_FIELDS:
            problem = _id_problem(where, sub, _ID_FIELDS[key])
            problems += [problem] if problem else []
        elif key == "supplementalGroups":
            if not isinstance(sub, list):
                problems.append(f"{where} must be a list of gids (got {echo(sub, 40)})")
                continue
            for i, gid in enumerate(sub):
                problem = _id_problem(f"{where}[{i}]", gid, "a gid")
                problems += [problem] if problem else []
        elif key == "fsGroupChangePolicy" and sub not in ("OnRootMismatch", "Always"):
            problems.append(f"{where} must be OnRootMismatch or Always (got {echo(sub, 40)})")
    return problems


def pod_override_problems(overrides: dict[str, Any] | None, where: str, policy: TenancyPolicy,
                          layout: dict[str, dict[str, frozenset[str]]]) -> list[str]:
    """Why a podOverrides object may not be merged into a pod spec the operator creates, per field
    (`where` is its path, e.g. spec.serving.podOverrides; `layout`: specpilot's containers in that pod, by
    list, with the fields a tenant may override in each, as `SERVING_POD_CONTAINERS`)."""
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
            problems += _pod_security_problems(value, at)
        elif field == "volumes":
            problems += _volume_problems(value, at, policy)
        elif field in ("containers", "initContainers"):
            problems += _container_problems(value, at, field, layout, policy)
        elif field == "tolerations":
            problems += tolerations_problems(value, at, policy)
        elif field == "imagePullSecrets":
            problems += _pull_secret_problems(value, at, policy)
        elif field == "priorityClassName" and isinstance(value, str) and value.startswith(SYSTEM_PRIORITY_PREFIX) \
                and not policy.allows("systemPriorityClasses"):
            problems.append(f"{at} {echo(value, 80)} is one of Kubernetes' own priority classes, which preempt every "
                            f"workload: use a priority class of your cluster's, or ask the cluster admin to list "
                            f"systemPriorityClasses in tenancy.allowedPodOverrideFields")
    return problems


def _pull_secret_problems(value: Any, where: str, policy: TenancyPolicy) -> list[str]:
    """imagePullSecrets name Secrets the kubelet reads for the pod: the same allow-list as every Secret a spec
    names (a registry credential of another team would pull its private images)."""
    if not isinstance(value, list):
        return [f"{where} must be a list of {{name: SECRET}} objects (got {echo(value, 80)})"]
    problems: list[str] = []
    for i, ref in enumerate(value):
        name = ref.get("name") if isinstance(ref, dict) else ref
        if not (isinstance(name, str) and secret_allowed(name, policy)):
            problems.append(_secret_refusal(f"{where}[{i}].name", name, policy))
    return problems


def tolerations_problems(tolerations: Any, where: str, policy: TenancyPolicy) -> list[str]:
    if policy.allows("tolerateAllTaints") or not isinstance(tolerations, list):
        return []
    problems: list[str] = []
    for i, toleration in enumerate(tolerations):
        if not isinstance(toleration, dict):
            continue
        key = toleration.get("key")
        if not key:
            problems.append(f"{where}[{i}] has no key, so it tolerates every taint (control-plane and cordoned nodes "
                            f"included): name the taint's key, or ask the cluster admin to list tolerateAllTaints in "
                            f"tenancy.allowedPodOverrideFields")
        elif key in CONTROL_PLANE_TAINTS and not policy.allows("tolerateControlPlaneTaints"):
            problems.append(f"{where}[{i}].key {echo(key, 80)} tolerates the taint that keeps workloads off "
                            f"control-plane, cordoned or uninitialised nodes: remove it (GPU pools are worker nodes), "
                            f"or ask the cluster admin to list tolerateControlPlaneTaints in "
                            f"tenancy.allowedPodOverrideFields")
    return problems


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
    problems += code_loading_problems(list(model.extra_args), f"{root}.model.extraArgs")
    problems += pod_override_problems(spec.serving.pod_overrides, f"{root}.serving.podOverrides", policy,
                                      SERVING_POD_CONTAINERS)
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
                                      BENCHMARK_POD_CONTAINERS)
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
