"""spec.serving.routing made real (I/O): the deployment's Service (and PodMonitor), and with routing: gateway one
Service per serving pool behind the HTTPRoute whose weights `policy.routing.route_backends` decides; without the
Gateway API the one Service serves every pool (condition RoutingReady=False, one Event)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from ..api.deployment_spec import Routing, SpeculativeDeploymentSpec
from ..api.deployment_status import RoutingStatus, SpeculativeDeploymentStatus
from ..manifests import names
from ..manifests.serving import http_route, pod_monitor, pool_service, service
from ..policy.events import Event
from ..policy.conditions import set_condition
from .context import Context
from .kube import NotFound, Refused

__all__ = ["RouteReading", "read_route", "reconcile_routing", "reconcile_service"]

log = logging.getLogger("specpilot.reconcile")


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


@dataclass
class RouteReading:
    """What the cluster holds for the deployment's HTTPRoute (serving.routing: gateway)."""

    wanted: bool
    """spec.serving.routing is gateway."""
    available: bool = False
    """The Gateway API's HTTPRoute resource answers: gateway routing can be made real (the planner plans under it)."""
    current: dict | None = None
    """The live HTTPRoute (None: none yet)."""
    reason: str = ""
    problem: str = ""
    """Why gateway routing cannot run (with `reason`): the fix in words."""


async def read_route(ctx: Context, spec: SpeculativeDeploymentSpec, namespace: str, name: str) -> RouteReading:
    """With routing: gateway, list the namespace's HTTPRoutes of the deployment: the live route (for a no-op apply)
    and whether the cluster serves the resource at all (404 on the list: the Gateway API CRDs are missing)."""
    if spec.serving.routing != Routing.GATEWAY.value:
        return RouteReading(wanted=False)
    try:
        routes = await ctx.kube.list("httproutes", namespace,
                                     label_selector=",".join(f"{k}={v}" for k, v in
                                                             names.deployment_labels(name).items()))
    except NotFound:
        return _route_missing()
    except Refused as exc:
        return _route_refused(exc)
    route_name = names.http_route_name(name)
    current = next((r for r in routes if (r.get("metadata") or {}).get("name") == route_name), None)
    return RouteReading(wanted=True, available=True, current=current)


def _route_missing() -> RouteReading:
    return RouteReading(wanted=True, reason="GatewayApiMissing", problem=(
        "spec.serving.routing is gateway but the cluster has no Gateway API HTTPRoute resource "
        "(gateway.networking.k8s.io/v1): install the Gateway API CRDs (and a Gateway controller), or set "
        "spec.serving.routing: service; meanwhile the deployment's one Service serves every pool, an even split "
        "per pod, and the fleet is planned under it"))


def _route_refused(exc: Refused) -> RouteReading:
    return RouteReading(wanted=True, reason="HttpRouteRefused", problem=(
        f"the API server refused the deployment's HTTPRoute ({exc.detail}): check that the operator's ClusterRole "
        f"grants httproutes in gateway.networking.k8s.io (the chart's does) and that the route is valid, or set "
        f"spec.serving.routing: service; meanwhile the deployment's one Service serves every pool"))


async def reconcile_routing(ctx: Context, body: dict, spec: SpeculativeDeploymentSpec,
                             status: SpeculativeDeploymentStatus, old: SpeculativeDeploymentStatus,
                             route: RouteReading, weights: dict[str, int], generation: int | None, now: datetime,
                             events: list[Event]) -> None:
    """serving.routing made real: with gateway, one Service per serving pool and the HTTPRoute with the plan's
    `weights` (policy.plan: the planned shares (or, without the Gateway API, the fallback to the one Service: condition RoutingReady=False
    and one Event); with service, the HTTPRoute of an earlier gateway mode is deleted. status.routing says which."""
    meta = body["metadata"]
    namespace, name, uid = meta["namespace"], meta["name"], meta["uid"]
    was_route = old.routing.http_route if old.routing is not None else None
    if not route.wanted:
        status.routing = RoutingStatus(mode=Routing.SERVICE.value)
        status.conditions = [c for c in status.conditions if c.type != "RoutingReady"]
        if was_route:
            try:
                await ctx.kube.delete("httproutes", namespace, was_route)
            except Refused as exc:
                # Kept in status, so the next reconciliation tries again; the rest of the deployment runs.
                log.warning("%s/%s: cannot delete HTTPRoute %s: %s", namespace, name, was_route, exc.detail)
                status.routing.http_route = was_route
        return
    weighted = status.fleet is not None and status.fleet.routing == Routing.GATEWAY.value
    if weights:
        for pool in weights:
            await ctx.kube.apply(pool_service(sdep_name=name, namespace=namespace, uid=uid, spec=spec, pool_name=pool))
        try:
            await ctx.kube.apply(http_route(sdep_name=name, namespace=namespace, uid=uid, spec=spec, weights=weights),
                                 current=route.current)
        except NotFound:
            route = _route_missing()
        except Refused as exc:
            route = _route_refused(exc)
    if not route.available or route.problem:
        status.routing = RoutingStatus(mode=Routing.SERVICE.value)
        if status.fleet is not None:
            status.fleet.http_route = None
        already = any(c.type == "RoutingReady" and c.status == "False" and c.reason == route.reason
                      for c in old.conditions)
        status.conditions = set_condition(status.conditions, "RoutingReady", False, route.reason,
                                                  route.problem, generation, now)
        if not already:
            events.append(Event("Warning", route.reason, route.problem))
        return
    if not weights:
        status.routing = RoutingStatus(mode=Routing.SERVICE.value)
        status.conditions = set_condition(
            status.conditions, "RoutingReady", False, "NoPoolServing",
            "no pool serves yet: the HTTPRoute is created once a pool has a decision", generation, now)
        return
    route_name = names.http_route_name(name)
    status.routing = RoutingStatus(mode=Routing.GATEWAY.value, http_route=route_name, weights=weights)
    if status.fleet is not None:
        status.fleet.http_route = route_name
    split = ", ".join(f"{pool} {weight / 10:g}%" for pool, weight in weights.items())
    status.conditions = set_condition(
        status.conditions, "RoutingReady", True, "HttpRouteApplied",
        f"HTTPRoute {route_name} sends {split} of the requests to the pools' Services"
        + ("" if weighted else " (an even split per replica: no fleet placement yet)"), generation, now)
