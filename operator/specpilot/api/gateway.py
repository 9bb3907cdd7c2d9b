"""The admin's bound on weighted routing (`spec.serving.routing: gateway`, `inferencePool`, or `auto` resolving to
either): which Gateways a tenant's HTTPRoute may attach to, and where its InferencePools' endpoint picker may be.

An HTTPRoute attached to a Gateway takes traffic that Gateway receives: a tenant must not publish its model on a
Gateway of another team (or a public one) unless the cluster admin allows it. The operator config lists the
Gateways beyond the deployment's own namespace (`allowedGatewayParents`); a Gateway in the deployment's own
namespace is always allowed (the tenant could attach a route there itself). An InferencePool references its endpoint
picker in its own namespace only (InferencePool v1 has no namespace there): a picker named elsewhere is refused rather
than silently looked up in the deployment's namespace. Pure: no I/O.
"""

from __future__ import annotations

import re

from .deployment_spec import Routing, SpeculativeDeploymentSpec

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
                     root: str = "spec", default_gateway: bool = False) -> list[str]:
    """One message per problem of the spec's routing fields, naming the field and the fix (empty: the routing may
    run): a parentRef the allow-list refuses (checked whatever the routing mode, so a refused Gateway is never
    latent), gateway or inferencePool routing with no Gateway to attach to (`default_gateway`: the operator's config
    names one), an endpoint picker outside the deployment's namespace."""
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
    routing = Routing(spec.serving.routing)
    if routing.weighted and not spec.serving.gateway.parent_refs and not default_gateway:
        problems.append(
            f"{root}.serving.routing is {routing.value} but no Gateway is named for its HTTPRoute: set "
            f"{root}.serving.gateway.parentRefs (or ask the cluster admin for the operator's "
            f"defaultGatewayParentRefs), or set {root}.serving.routing: auto to route the cheapest way the cluster "
            f"allows")
    picker = spec.serving.inference_pool.endpoint_picker_ref if spec.serving.inference_pool else None
    if picker is not None and picker.namespace not in (None, own_namespace):
        problems.append(
            f"{root}.serving.inferencePool.endpointPickerRef.namespace is {picker.namespace}: an InferencePool "
            f"references an endpoint picker in its own namespace only (InferencePool v1); deploy the picker in "
            f"namespace {own_namespace} and remove the namespace field")
    return problems
