"""The admin's bound on `spec.serving.routing: gateway`: which Gateways a tenant's HTTPRoute may attach to.

An HTTPRoute attached to a Gateway takes traffic that Gateway receives: a tenant must not publish its model on a
Gateway of another team (or a public one) unless the cluster admin allows it. The operator config lists the
Gateways beyond the deployment's own namespace (`allowedGatewayParents`); a Gateway in the deployment's own
namespace is always allowed (the tenant could attach a route there itself). Pure: no I/O.
"""

from __future__ import annotations

import re

from .deployment_spec import SpeculativeDeploymentSpec

GATEWAY_PARENT_PATTERN = r"^(\*|[a-z0-9]([-a-z0-9]*[a-z0-9])?)/(\*|[a-z0-9]([-a-z0-9.]*[a-z0-9])?)$"
"""An allowedGatewayParents entry: `namespace/name`, either part `*` (any)."""
_ENTRY = re.compile(GATEWAY_PARENT_PATTERN)
MAX_BACKENDS = 16
"""backendRefs of one HTTPRoute rule (gateway.networking.k8s.io/v1 maxItems): spec.gpuPools takes at most as many,
so one Service per pool always fits one rule."""

__all__ = ["GATEWAY_PARENT_PATTERN", "gateway_allowed", "gateway_problems"]


def gateway_allowed(namespace: str, name: str, own_namespace: str, allowed: list[str]) -> bool:
    """Whether a route in `own_namespace` may attach to Gateway `namespace/name` under the allow-list."""
    if namespace == own_namespace:
        return True
    for entry in allowed:
        if not _ENTRY.match(entry):
            continue
        ns, gw = entry.split("/", 1)
        if ns in ("*", namespace) and gw in ("*", name):
            return True
    return False


def gateway_problems(spec: SpeculativeDeploymentSpec, own_namespace: str, allowed: list[str],
                     root: str = "spec") -> list[str]:
    """One message per parentRef of `spec.serving.gateway` the allow-list refuses, naming the field and the fix
    (empty: the routing may run). Checked whatever the routing mode, so a refused Gateway is never latent."""
    problems = []
    for i, ref in enumerate(spec.serving.gateway.parent_refs):
        namespace = ref.namespace or own_namespace
        if gateway_allowed(namespace, ref.name, own_namespace, allowed):
            continue
        listed = ", ".join(allowed[:10]) or "none: only Gateways in the deployment's own namespace"
        problems.append(
            f"{root}.serving.gateway.parentRefs[{i}] names Gateway {namespace}/{ref.name}, which the operator's "
            f"config does not let a route in namespace {own_namespace} attach to (allowedGatewayParents: {listed})"
            f": name a Gateway in namespace {own_namespace} or an allowed one, or ask the cluster admin to add "
            f"{namespace}/{ref.name} to allowedGatewayParents")
    return problems
