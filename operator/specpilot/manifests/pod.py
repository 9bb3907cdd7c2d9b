"""Pieces shared by the serving pods and the benchmark pods: owner references, the pool's placement,
GPU resources, /dev/shm, health probes, and putting back the fields specpilot owns after a user's
pod overrides were merged in.

What a user's podOverrides may and may not change (the same for serving and benchmark pods):
- they win for everything they set (volumes, affinity, priorityClassName, extra env, resources other
  than the GPU count, ...), except
- the containers specpilot runs keep their image, command and args (a change there would serve or
  measure something other than what the status says), and their GPU request/limit stays
  tensorParallelSize * dataParallelSize of the pool's GPU resource;
- the pool's nodeSelector entries and tolerations stay (they define the pool, so the SKU in the
  profile is the GPU the pod ran on); the overrides can add entries to both;
- labels live in the pod template's metadata, outside the pod spec the overrides apply to.
"""

from __future__ import annotations

import copy
from typing import Any

from ..api.deployment import GpuPool

DSHM_VOLUME = "dshm"
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
