"""Pieces shared by the serving pods and the benchmark pods: owner references, the pool's placement,
GPU resources, /dev/shm, health probes, and putting back the fields specpilot owns after a user's
pod overrides were merged in.

What a user's podOverrides may and may not change (the same for serving and benchmark pods):
- only the fields the operator's tenancy policy allows reach the merge at all (api/tenancy.py: placement,
  volumes of safe types, env/resources/mounts of specpilot's containers, ...); a spec with anything else
  is refused before a pod is built, and the builders refuse it again;
- they win for what they may set (volumes, affinity, priorityClassName, extra env, resources other
  than the GPU count, ...), except
- the containers specpilot runs keep their image, command and args (a change there would serve or
  measure something other than what the status says), and their GPU request/limit stays
  tensorParallelSize * dataParallelSize of the pool's GPU resource;
- the pool's nodeSelector entries and tolerations stay (they define the pool, so the SKU in the
  profile is the GPU the pod ran on); the overrides can add entries to both;
- every pod is hardened last (`harden`): non-root, seccomp RuntimeDefault, no privilege escalation, all
  capabilities dropped, within the `restricted` Pod Security Standard, except where the cluster admin
  allowed a tenant to set those fields;
- labels live in the pod template's metadata, outside the pod spec the overrides apply to.
"""

from __future__ import annotations

import copy
from typing import Any

from ..api.deployment_spec import GpuPool
from ..api.tenancy import SAFE_POD_SECURITY_FIELDS, PodSecurityDefaults, TenancyPolicy

DSHM_VOLUME = "dshm"
HOME_VOLUME = "home"
TOKEN_VOLUME = "kube-api-access"
TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
TOKEN_EXPIRATION_SECONDS = 3607
"""As in the volume Kubernetes injects itself: the kubelet refreshes the file, and the client re-reads it."""
USER_NAME = "specpilot"
HARDENED_CONTAINER = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                      "runAsNonRoot": True, "privileged": False}
"""Every container's securityContext (the `restricted` Pod Security Standard)."""
HEALTH_PATH = "/health"
HTTP_PORT_NAME = "http"


def owner_reference(*, api_version: str, kind: str, name: str, uid: str, controller: bool = True) -> dict[str, Any]:
    """An ownerReference so the garbage collector deletes the object with its owner."""
    return {"apiVersion": api_version, "kind": kind, "name": name, "uid": uid,
            "controller": controller, "blockOwnerDeletion": True}


def gpu_resources(resources: dict[str, Any] | None, gpu_resource_name: str, gpu_count: int) -> dict[str, Any]:
    """The user's ResourceRequirements with the GPU count set in both requests and limits
    (extended resources must have them equal)."""
    merged = copy.deepcopy(resources or {})
    for section in ("requests", "limits"):
        merged.setdefault(section, {})[gpu_resource_name] = str(gpu_count)
    return merged


def dshm_volume() -> dict[str, Any]:
    """A memory-backed /dev/shm: the 64 MiB container default is too small for NCCL and vLLM's workers."""
    return {"name": DSHM_VOLUME, "emptyDir": {"medium": "Memory"}}


def dshm_mount() -> dict[str, Any]:
    return {"name": DSHM_VOLUME, "mountPath": "/dev/shm"}


def http_port(port: int) -> dict[str, Any]:
    return {"name": HTTP_PORT_NAME, "containerPort": port, "protocol": "TCP"}


def health_probe(*, period_seconds: int, failure_threshold: int, timeout_seconds: int = 5) -> dict[str, Any]:
    return {"httpGet": {"path": HEALTH_PATH, "port": HTTP_PORT_NAME}, "periodSeconds": period_seconds,
            "failureThreshold": failure_threshold, "timeoutSeconds": timeout_seconds}


STARTUP_BUDGET_SECONDS = 3600
"""Time an engine may take to download and load its weights (a 70B model from the hub takes a while)."""


def startup_probe() -> dict[str, Any]:
    """/health within the startup budget, after which readiness and liveness take over."""
    period_seconds = 10
    return health_probe(period_seconds=period_seconds, failure_threshold=STARTUP_BUDGET_SECONDS // period_seconds)


def pool_placement(pool: GpuPool) -> dict[str, Any]:
    """nodeSelector and tolerations that put a pod on the pool's nodes (absent keys when the pool has none)."""
    placement: dict[str, Any] = {}
    if pool.node_selector:
        placement["nodeSelector"] = dict(pool.node_selector)
    if pool.tolerations:
        placement["tolerations"] = [t.dump() for t in pool.tolerations]
    return placement


def restore_placement(pod_spec: dict[str, Any], pool: GpuPool) -> None:
    """Put the pool's nodeSelector entries and tolerations back after overrides; keep what the user added."""
    if pool.node_selector:
        pod_spec["nodeSelector"] = {**(pod_spec.get("nodeSelector") or {}), **pool.node_selector}
    if pool.tolerations:
        own = [t.dump() for t in pool.tolerations]
        pod_spec["tolerations"] = own + [t for t in pod_spec.get("tolerations") or [] if t not in own]


def restore_container(pod_spec: dict[str, Any], owned: dict[str, Any], *, field: str = "containers",
                      gpu_resource_name: str | None = None, gpu_count: int = 0) -> None:
    """Put back the owned fields (`owned`: image, command, args, ...) of the container named owned["name"],
    and its GPU count when it has one."""
    container = next(c for c in pod_spec[field] if c.get("name") == owned["name"])
    container.update(copy.deepcopy(owned))
    if gpu_resource_name is not None:
        container["resources"] = gpu_resources(container.get("resources"), gpu_resource_name, gpu_count)


def pod_security_context(security: PodSecurityDefaults) -> dict[str, Any]:
    """The pod securityContext of every pod the operator creates: a non-root uid and gid, fsGroup so volumes
    are readable, the runtime's default seccomp profile."""
    return {"runAsNonRoot": True, "runAsUser": security.run_as_user, "runAsGroup": security.run_as_group,
            "fsGroup": security.fs_group, "fsGroupChangePolicy": "OnRootMismatch",
            "seccompProfile": {"type": "RuntimeDefault"}}


def home_volume() -> dict[str, Any]:
    """HOME on an emptyDir: the vLLM image runs as root by default with HOME=/root; as a non-root uid its
    caches (Hugging Face downloads, vLLM, Triton, torch compile) go here."""
    return {"name": HOME_VOLUME, "emptyDir": {}}


def home_mount(security: PodSecurityDefaults) -> dict[str, Any]:
    return {"name": HOME_VOLUME, "mountPath": security.home_dir}


def identity_env(security: PodSecurityDefaults) -> list[dict[str, Any]]:
    """HOME and USER for a uid the image has no passwd entry for (torch asks getpass.getuser(), which reads
    USER first); a user's env of the same name wins."""
    return [{"name": "HOME", "value": security.home_dir}, {"name": "USER", "value": USER_NAME}]


def with_identity_env(env: list[dict[str, Any]], security: PodSecurityDefaults) -> list[dict[str, Any]]:
    names = {e.get("name") for e in env}
    return [e for e in identity_env(security) if e["name"] not in names] + env


def token_volume() -> dict[str, Any]:
    """The ServiceAccount token as a projected volume, mounted only into the container that needs it (the
    bench), instead of automounting it into every container of the pod (the engine sidecar runs a tenant's
    image and needs none)."""
    return {"name": TOKEN_VOLUME, "projected": {"defaultMode": 0o444, "sources": [
        {"serviceAccountToken": {"path": "token", "expirationSeconds": TOKEN_EXPIRATION_SECONDS}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1",
                                                                       "fieldPath": "metadata.namespace"}}]}},
    ]}}


def token_mount() -> dict[str, Any]:
    return {"name": TOKEN_VOLUME, "mountPath": TOKEN_PATH, "readOnly": True}


def harden(pod_spec: dict[str, Any], policy: TenancyPolicy) -> None:
    """Make the merged pod spec run within the `restricted` Pod Security Standard, whatever got into it:
    the pod securityContext keeps only the fields a tenant may set (all of it when the admin allowed
    securityContext) over the operator's non-root, seccomp RuntimeDefault defaults; every container
    (init containers included) runs without privilege escalation and with all capabilities dropped (a
    tenant's container securityContext only where the admin allowed containers.securityContext); fields the
    policy does not allow a tenant are removed."""
    security = policy.pod_security
    base = pod_security_context(security)
    tenant = pod_spec.get("securityContext") or {}
    if policy.allows("securityContext"):
        pod_spec["securityContext"] = {**base, **tenant}
    else:
        kept = {k: v for k, v in tenant.items() if k in SAFE_POD_SECURITY_FIELDS and v not in (0, None)}
        pod_spec["securityContext"] = {**base, **kept}
    for field in ("hostNetwork", "hostPID", "hostIPC", "hostUsers", "nodeName", "shareProcessNamespace",
                  "ephemeralContainers"):
        if not policy.allows(field):
            pod_spec.pop(field, None)
    for field in ("containers", "initContainers"):
        for container in pod_spec.get(field) or []:
            own = copy.deepcopy(HARDENED_CONTAINER)
            if policy.allows("containers.securityContext"):
                container["securityContext"] = {**own, **(container.get("securityContext") or {})}
            else:
                container["securityContext"] = own
            if not policy.allows("containers.ports"):
                for port in container.get("ports") or []:
                    port.pop("hostPort", None)
                    port.pop("hostIP", None)
    volumes = pod_spec.get("volumes") or []
    allowed = set(policy.allowed_volume_types) | {"emptyDir", "projected", "configMap"}
    pod_spec["volumes"] = [v for v in volumes if all(k == "name" or k in allowed for k in v)]
