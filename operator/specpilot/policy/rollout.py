"""A pool Deployment's rollout as its status shows it (RolledOut, RollingOut, Stalled) and the deployment's RolledOut
condition over its pools. Pure."""

from __future__ import annotations

from ..api.deployment_status import PoolStatus
from ..manifests import names

__all__ = ["ROLLOUT_DONE", "ROLLOUT_IN_PROGRESS", "ROLLOUT_STALLED", "STALLED_ADVICE", "rolled_out_condition",
           "rolling_out", "rollout_state"]


ROLLOUT_DONE = "RolledOut"


ROLLOUT_IN_PROGRESS = "RollingOut"


ROLLOUT_STALLED = "Stalled"


STALLED_ADVICE = ("the previous pods keep serving and speculation toggles wait. If the new pods are Pending for want "
                  "of a GPU, the pool has no room for a surge pod: set maxSurge: 0 and maxUnavailable: 1 in "
                  "spec.serving.rollout (or spec.gpuPools[].rollout for this pool). Otherwise see")


def rolling_out(deployment: dict) -> bool:
    """Whether the Deployment controller has not yet finished the latest template (a Deployment with no
    status yet has not been looked at by one, and counts as not rolling)."""
    status = deployment.get("status")
    if not status:
        return False
    spec_replicas = int(deployment.get("spec", {}).get("replicas") or 0)
    generation = int(deployment.get("metadata", {}).get("generation") or 0)
    return (int(status.get("observedGeneration") or generation) < generation
            or int(status.get("updatedReplicas") or 0) < spec_replicas
            or int(status.get("unavailableReplicas") or 0) > 0)


def rollout_state(deployment: dict | None) -> tuple[str | None, str]:
    """(state, message) of a pool Deployment's rollout: RolledOut, RollingOut, Stalled (the Deployment
    controller gave up waiting: Progressing=False, ProgressDeadlineExceeded), or None with no Deployment."""
    if deployment is None:
        return None, ""
    name = (deployment.get("metadata") or {}).get("name", "")
    status = deployment.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("status") == "False" \
                and cond.get("reason") == "ProgressDeadlineExceeded":
            deadline = (deployment.get("spec") or {}).get("progressDeadlineSeconds")
            within = f" within {deadline} s (progressDeadlineSeconds)" if deadline else ""
            return ROLLOUT_STALLED, (f"the rollout of Deployment {name} made no progress{within}: {STALLED_ADVICE} "
                                     f"`kubectl describe deployment/{name}` and the new pods' events")
    if not status or rolling_out(deployment):
        replicas = int((deployment.get("spec") or {}).get("replicas") or 0)
        return ROLLOUT_IN_PROGRESS, (f"Deployment {name}: {int(status.get('updatedReplicas') or 0)}/{replicas} "
                                     f"pods updated, {int(status.get('availableReplicas') or 0)} available")
    return ROLLOUT_DONE, f"Deployment {name} is up to date"


def rolled_out_condition(pools: list[PoolStatus], sdep_name: str) -> tuple[bool, str, str] | None:
    """The RolledOut condition (status, reason, message) over the pools' rollouts; None before any pool has
    a Deployment. A stalled rollout outranks one in progress: it needs a person."""
    stalled = [p.name for p in pools if p.rollout == ROLLOUT_STALLED]
    moving = [p.name for p in pools if p.rollout == ROLLOUT_IN_PROGRESS]
    if stalled:
        deployments = ", ".join(f"deployment/{names.serving_deployment_name(sdep_name, p)}" for p in stalled)
        return False, "ProgressDeadlineExceeded", (
            f"the rollout of pool(s) {', '.join(stalled)} made no progress within its progressDeadlineSeconds "
            f"(spec.serving.rollout, or the pool's own rollout): {STALLED_ADVICE} `kubectl describe {deployments}`")
    if moving:
        return False, "RollingOut", f"rolling out pool(s) {', '.join(moving)}"
    if any(p.rollout for p in pools):
        return True, "RolledOut", "every pool's Deployment runs its latest configuration"
    return None
