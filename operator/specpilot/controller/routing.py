"""spec.serving.routing made real (I/O): which routing resources the cluster serves (read for the snapshot), the
deployment's Service (and PodMonitor), and the writes `policy.routing.plan_routing` decides: one Service or
InferencePool per serving pool behind the weighted HTTPRoute, and deleting what a change of mode leaves behind. A
write the API server refuses falls back to the one Service (`policy.routing.routing_refused`)."""

from __future__ import annotations

import logging
import time
from datetime import datetime

from ..api.deployment_spec import Routing, SpeculativeDeploymentSpec
from ..manifests.serving import http_route, inference_pool, pod_monitor, pool_service, service
from ..api.deployment_status import RoutingStatus, SpeculativeDeploymentStatus
from ..policy.plan import DeploymentPlan
from ..policy.routing import ApplyRouting, DeleteRouting, RoutingApis, RoutingDefaults, routing_refused
from .context import Context
from .kube import NotFound, Refused

__all__ = ["SERVED_CHECK_S", "apply_routing", "delete_routing", "reconcile_service", "routing_apis",
           "routing_defaults"]

log = logging.getLogger("specpilot.reconcile")

SERVED_CHECK_S = 20.0
"""How long a finding that the cluster does (or does not) serve an optional resource holds before it is read again:
a CRD installed after the operator started is used within this, without a list per deployment and reconciliation."""


async def reconcile_service(ctx: Context, body: dict, spec: SpeculativeDeploymentSpec) -> None:
    meta = body["metadata"]
    ident = {"sdep_name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]}
    await ctx.kube.apply(service(**ident, spec=spec))
    if spec.serving.service_monitor:
        try:
            await ctx.kube.apply(pod_monitor(**ident))
        except NotFound:
            log.warning("PodMonitor CRD not installed; set spec.serving.serviceMonitor: false or install "
                        "the Prometheus operator")


def routing_defaults(ctx: Context) -> RoutingDefaults:
    return RoutingDefaults(tuple(ctx.config.default_gateway_parent_refs), ctx.config.default_endpoint_picker_ref)


async def routing_apis(ctx: Context, spec: SpeculativeDeploymentSpec, namespace: str) -> RoutingApis:
    """Whether the cluster serves HTTPRoutes and InferencePools (a 404 on a list: the CRD is missing), checked at
    most every SERVED_CHECK_S; not read for a deployment that asks for the one Service, nor for `auto` where no
    Gateway is named (it resolves to the one Service whatever the cluster serves)."""
    requested = Routing(spec.serving.routing)
    if requested is Routing.SERVICE or (requested is Routing.AUTO and not spec.serving.gateway.parent_refs
                                        and not ctx.config.default_gateway_parent_refs):
        return RoutingApis()
    return RoutingApis(http_routes=await _served(ctx, "httproutes", namespace),
                       inference_pools=await _served(ctx, "inferencepools", namespace))


async def _served(ctx: Context, plural: str, namespace: str) -> bool:
    checked = ctx.served_resources.get(plural)
    if checked is not None and time.monotonic() - checked[0] < SERVED_CHECK_S:
        return checked[1]
    try:
        # A selector that matches nothing: the answer says whether the resource exists, not what it holds.
        await ctx.kube.list(plural, namespace, label_selector="specpilot.io/served-check=none")
        served = True
    except NotFound:
        served = False
    except Refused as exc:
        log.warning("cannot list %s in %s (%s): weighted routing over them is not used", plural, namespace,
                    exc.detail)
        served = False
    ctx.served_resources[plural] = (time.monotonic(), served)
    return served


async def apply_routing(ctx: Context, body: dict, spec: SpeculativeDeploymentSpec, action: ApplyRouting,
                        plan: DeploymentPlan, old: SpeculativeDeploymentStatus, now: datetime) -> None:
    """One Service (gateway) or InferencePool (inferencePool) per pool of the route, then the HTTPRoute. A refusal
    leaves the one Service serving every pool and says so."""
    meta = body["metadata"]
    ident = {"sdep_name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"], "spec": spec}

    def refused(reason: str, problem: str) -> None:
        routing_refused(plan.status, plan.events, reason, problem, old.conditions, meta.get("generation"), now)

    try:
        for pool in action.weights:
            if action.mode is Routing.INFERENCE_POOL:
                await ctx.kube.apply(inference_pool(**ident, pool_name=pool, picker=action.picker))
            else:
                await ctx.kube.apply(pool_service(**ident, pool_name=pool))
        await ctx.kube.apply(http_route(**ident, weights=dict(action.weights), parent_refs=list(action.parent_refs),
                                        backends=action.mode))
    except NotFound as exc:
        missing = "inferencepools" if action.mode is Routing.INFERENCE_POOL and "inferencepools" in str(exc) \
            else "httproutes"
        ctx.served_resources.pop(missing, None)
        refused("InferencePoolApiMissing" if missing == "inferencepools" else "GatewayApiMissing",
                f"the cluster no longer serves {missing} ({exc}): install its CRDs, or set "
                f"spec.serving.routing: service; meanwhile the deployment's one Service serves every pool")
    except Refused as exc:
        kind = "InferencePools" if action.mode is Routing.INFERENCE_POOL else "HTTPRoute"
        refused("HttpRouteRefused", (
            f"the API server refused the deployment's {kind} ({exc.detail}): check that the operator's ClusterRole "
            f"grants httproutes in gateway.networking.k8s.io and inferencepools in inference.networking.k8s.io (the "
            f"chart's does) and that the objects are valid, or set spec.serving.routing: service; meanwhile the "
            f"deployment's one Service serves every pool"))


async def delete_routing(ctx: Context, namespace: str, name: str, action: DeleteRouting,
                         status: RoutingStatus) -> None:
    """Delete what a change of mode left: the HTTPRoute, InferencePools no longer routed to. What a refused delete
    leaves stays in status (status.routing.httpRoute, inferencePools), so the next reconciliation tries again; the
    rest of the deployment runs."""
    if action.http_route:
        try:
            await ctx.kube.delete("httproutes", namespace, action.http_route)
        except (Refused, NotFound) as exc:
            log.warning("%s/%s: cannot delete HTTPRoute %s: %s", namespace, name, action.http_route, exc)
            status.http_route = status.http_route or action.http_route
    for pool, inference_pool_name in action.inference_pools:
        try:
            await ctx.kube.delete("inferencepools", namespace, inference_pool_name)
        except (Refused, NotFound) as exc:
            log.warning("%s/%s: cannot delete InferencePool %s: %s", namespace, name, inference_pool_name, exc)
            status.inference_pools.setdefault(pool, inference_pool_name)
