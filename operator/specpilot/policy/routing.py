"""Fleet routing (pure): which routing a deployment gets, the HTTPRoute's weights, the objects it owns, and what
status, condition and Event say about it.

`resolve_routing` picks the mode from what the spec asks (spec.serving.routing), what the cluster serves (the Gateway
API's HTTPRoute, the Inference Extension's InferencePool) and what the spec or the operator's config names (a
Gateway, an endpoint picker). `auto`, the default, takes the cheapest the cluster allows: weighted routing (any
split of the traffic across GPU types) over the one Service (an even split per pod, which the weakest GPU type in
use bounds), and InferencePools (an endpoint picker choosing the pod in each pool) over per-pool Services. A mode
asked for explicitly that cannot run falls back to the cheapest that can, and says why and the fix.

`plan_routing` turns the choice and the fleet's planned shares into the routing status, the RoutingReady condition,
its Event and the writes (`ApplyRouting`, `DeleteRouting`); `routing_refused` is what a refused write changes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime

from ..api.deployment_spec import EndpointPickerRef, ParentRef, Routing, SpeculativeDeploymentSpec
from ..api.deployment_status import Condition, PoolStatus, RoutingStatus, SpeculativeDeploymentStatus
from ..manifests import names
from .conditions import set_condition
from .events import Event
from .fleet import route_weights

__all__ = ["ApplyRouting", "DeleteRouting", "RoutingApis", "RoutingChoice", "RoutingCosts", "RoutingDefaults",
           "RoutingPlan", "plan_routing", "resolve_routing", "route_backends", "routing_refused"]

CONDITION = "RoutingReady"


@dataclasses.dataclass(frozen=True)
class RoutingApis:
    """Which routing resources the cluster serves (a 404 on listing one: its CRD is not installed)."""

    http_routes: bool = False
    """gateway.networking.k8s.io/v1 HTTPRoute (the Gateway API)."""
    inference_pools: bool = False
    """inference.networking.k8s.io/v1 InferencePool (the Gateway API Inference Extension)."""


@dataclasses.dataclass(frozen=True)
class RoutingDefaults:
    """What the operator's config names for deployments that name nothing themselves."""

    parent_refs: tuple[ParentRef, ...] = ()
    """defaultGatewayParentRefs."""
    endpoint_picker: EndpointPickerRef | None = None
    """defaultEndpointPickerRef."""


@dataclasses.dataclass(frozen=True)
class RoutingChoice:
    """The routing a deployment gets now, and why."""

    mode: Routing
    """service, gateway or inferencePool: what is made real."""
    requested: Routing
    parent_refs: tuple[ParentRef, ...] = ()
    """The Gateways the HTTPRoute attaches to (weighted modes)."""
    picker: EndpointPickerRef | None = None
    """The InferencePools' endpoint picker (inferencePool)."""
    reason: str = ""
    """CamelCase, for the RoutingReady condition."""
    why: str = ""
    """The choice in words: what the cluster serves and what is named."""
    problem: str = ""
    """Set when the routing asked for cannot run: what is missing and the fix (RoutingReady=False, one Event)."""


def resolve_routing(spec: SpeculativeDeploymentSpec, apis: RoutingApis, defaults: RoutingDefaults) -> RoutingChoice:
    """The routing for `spec` in a cluster that serves `apis` (see the module's docstring)."""
    requested = Routing(spec.serving.routing)
    parents = tuple(spec.serving.gateway.parent_refs) or defaults.parent_refs
    named_picker = spec.serving.inference_pool.endpoint_picker_ref if spec.serving.inference_pool is not None \
        else defaults.endpoint_picker
    # Asked for by name, InferencePools get the Inference Extension's own picker naming; auto takes them only where
    # a picker is named, since a pool whose picker does not exist refuses every request.
    picker = named_picker if named_picker is not None or requested is not Routing.INFERENCE_POOL \
        else EndpointPickerRef()
    can_gateway = apis.http_routes and bool(parents)
    can_pools = can_gateway and apis.inference_pools and picker is not None
    gateway_words = _gateway_words(apis, parents)
    pool_words = _pool_words(apis, picker)
    if requested is Routing.SERVICE:
        return RoutingChoice(Routing.SERVICE, requested, reason="ServiceRequested",
                             why="spec.serving.routing is service: one Service, an even split per pod")
    if requested is Routing.AUTO:
        if can_pools:
            return RoutingChoice(Routing.INFERENCE_POOL, requested, parents, picker, "InferencePoolsServed",
                                 f"auto: {gateway_words}, {pool_words}")
        if can_gateway:
            return RoutingChoice(Routing.GATEWAY, requested, parents, None, "GatewayServed",
                                 f"auto: {gateway_words}; not inferencePool: {pool_words}")
        return RoutingChoice(Routing.SERVICE, requested, reason="NoWeightedRouting",
                             why=f"auto: one Service, since {gateway_words}")
    fallback = _fallback(can_gateway, parents)
    if requested is Routing.GATEWAY:
        if can_gateway:
            return RoutingChoice(Routing.GATEWAY, requested, parents, None, "GatewayRequested", gateway_words)
        return dataclasses.replace(fallback, requested=requested, reason="GatewayApiMissing", problem=(
            "spec.serving.routing is gateway but the cluster has no Gateway API HTTPRoute resource "
            "(gateway.networking.k8s.io/v1): install the Gateway API CRDs (and a Gateway controller), or set "
            "spec.serving.routing: auto or service; meanwhile the deployment's one Service serves every pool, an "
            "even split per pod, and the fleet is planned under it"))
    if can_pools:
        return RoutingChoice(Routing.INFERENCE_POOL, requested, parents, picker, "InferencePoolRequested",
                             f"{gateway_words}, {pool_words}")
    if not apis.inference_pools:
        problem = ("spec.serving.routing is inferencePool but the cluster has no InferencePool resource "
                   "(inference.networking.k8s.io/v1): install the Gateway API Inference Extension's CRDs (v1.0 or "
                   "later), or set spec.serving.routing: auto")
        reason = "InferencePoolApiMissing"
    else:
        problem = ("spec.serving.routing is inferencePool but the cluster has no Gateway API HTTPRoute resource "
                   "(gateway.networking.k8s.io/v1) to weigh the pools: install the Gateway API CRDs, or set "
                   "spec.serving.routing: auto")
        reason = "GatewayApiMissing"
    meanwhile = ("; meanwhile one Service per pool behind a weighted HTTPRoute serves them" if can_gateway else
                 "; meanwhile the deployment's one Service serves every pool, an even split per pod")
    return dataclasses.replace(fallback, requested=requested, reason=reason, problem=problem + meanwhile)


def _fallback(can_gateway: bool, parents: tuple[ParentRef, ...]) -> RoutingChoice:
    if can_gateway:
        return RoutingChoice(Routing.GATEWAY, Routing.GATEWAY, parents, why="the fallback: per-pool Services")
    return RoutingChoice(Routing.SERVICE, Routing.SERVICE, why="the fallback: one Service")


def _gateway_words(apis: RoutingApis, parents: Sequence[ParentRef]) -> str:
    if not parents:
        return ("no Gateway is named (set spec.serving.gateway.parentRefs, or the operator's "
                "defaultGatewayParentRefs, to route by weights)")
    if not apis.http_routes:
        return "the cluster serves no Gateway API HTTPRoute (install the Gateway API CRDs to route by weights)"
    gateways = ", ".join(f"{p.namespace + '/' if p.namespace else ''}{p.name}" for p in parents[:4])
    return f"the cluster serves HTTPRoutes and Gateway {gateways} is named"


def _pool_words(apis: RoutingApis, picker: EndpointPickerRef | None) -> str:
    if not apis.inference_pools:
        return "the cluster serves no InferencePool (install the Gateway API Inference Extension's CRDs)"
    if picker is None:
        return ("no endpoint picker is named (set spec.serving.inferencePool, or the operator's "
                "defaultEndpointPickerRef)")
    who = f"Service {picker.name}" if picker.name else "each pool's <InferencePool>-epp Service"
    return f"InferencePools are served and their endpoint picker is {who} port {picker.port}"


# --- the weights and the writes ---------------------------------------------------------------------------------

def route_backends(pools: list[PoolStatus], weighted: bool, served: set[str]) -> dict[str, int]:
    """backendRefs weight per pool that has a serving Deployment (`served`): the planned shares (`weighted`: the
    fleet was planned under weighted routing), else an even split per replica, as the one Service would give;
    equal weights when no replica runs (an HTTPRoute whose weights are all 0 answers every request with an
    error)."""
    serving = [p for p in pools if p.name in served]
    if not serving:
        return {}
    weights = route_weights({p.name: p.traffic_share or 0.0 for p in serving}) if weighted else {}
    if not any(weights.values()):
        weights = route_weights({p.name: float(p.replicas or p.desired_replicas or 0) for p in serving})
    if not any(weights.values()):
        weights = route_weights({p.name: 1.0 for p in serving})
    return weights


@dataclasses.dataclass(frozen=True)
class ApplyRouting:
    """Apply the weighted routing: one Service (gateway) or InferencePool (inferencePool) per pool in `weights`,
    then the HTTPRoute over them."""

    mode: Routing
    weights: Mapping[str, int]
    parent_refs: tuple[ParentRef, ...]
    picker: EndpointPickerRef | None = None


@dataclasses.dataclass(frozen=True)
class DeleteRouting:
    """Delete routing objects the deployment owns and no longer uses."""

    http_route: str | None = None
    inference_pools: tuple[tuple[str, str], ...] = ()
    """(pool, InferencePool name) of each to delete."""


@dataclasses.dataclass
class RoutingPlan:
    status: RoutingStatus
    conditions: list[Condition]
    events: list[Event]
    actions: list[ApplyRouting | DeleteRouting]


@dataclasses.dataclass(frozen=True)
class RoutingCosts:
    """The fleet's planned $/Mtok under the one Service and under weighted routing (None: no placement)."""

    service: float | None = None
    weighted: float | None = None


def plan_routing(choice: RoutingChoice, sdep_name: str, pools: list[PoolStatus], served: set[str],
                 planned_weighted: bool, live_route: str | None, live_pools: Mapping[str, str], costs: RoutingCosts,
                 conditions: list[Condition], old_conditions: Sequence[Condition], generation: int | None,
                 now: datetime) -> RoutingPlan:
    """The routing status, condition, Event and writes for `choice`. `planned_weighted`: the fleet was placed
    under the weighted mode (else the weights are an even split per replica); `live_route`, `live_pools` (pool ->
    InferencePool name): the deployment's HTTPRoute and InferencePools as its last status recorded them (what a
    change of mode deletes)."""
    status = RoutingStatus(mode=choice.mode.value, requested=choice.requested.value, reason=choice.why,
                           **_cost_fields(costs))
    events: list[Event] = []
    actions: list[ApplyRouting | DeleteRouting] = []
    weights = route_backends(pools, planned_weighted, served) if choice.mode.weighted else {}
    route = names.http_route_name(sdep_name)
    wanted_pools = {p: names.inference_pool_name(sdep_name, p) for p in weights} \
        if choice.mode is Routing.INFERENCE_POOL else {}
    stale_pools = tuple(sorted((p, n) for p, n in live_pools.items() if wanted_pools.get(p) != n))
    stale_route = live_route if live_route is not None and not weights else None
    if stale_route or stale_pools:
        actions.append(DeleteRouting(stale_route, stale_pools))

    def condition(ok: bool, reason: str, message: str) -> None:
        nonlocal conditions
        conditions = set_condition(conditions, CONDITION, ok, reason, message, generation, now)

    if choice.problem:
        condition(False, choice.reason, choice.problem)
        if not _was(old_conditions, False, choice.reason):
            events.append(Event("Warning", choice.reason, choice.problem))
    if weights:
        actions.append(ApplyRouting(choice.mode, weights, choice.parent_refs, choice.picker))
        status.http_route = route
        status.weights = weights
        status.inference_pools = dict(wanted_pools)
        if not choice.problem:
            split = ", ".join(f"{pool} {weight / 10:g}%" for pool, weight in weights.items())
            backends = "InferencePools" if choice.mode is Routing.INFERENCE_POOL else "Services"
            condition(True, "InferencePoolsApplied" if choice.mode is Routing.INFERENCE_POOL else "HttpRouteApplied",
                      f"HTTPRoute {route} sends {split} of the requests to the pools' {backends}"
                      + ("" if planned_weighted else " (an even split per replica: no fleet placement yet)")
                      + f" ({choice.why}){_saving_words(costs, 'saves')}")
    elif choice.mode.weighted:
        if not choice.problem:
            condition(False, "NoPoolServing", "no pool serves yet: the HTTPRoute is created once a pool has a "
                                              "decision")
    elif not choice.problem:
        if choice.requested is Routing.SERVICE:
            conditions = [c for c in conditions if c.type != CONDITION]
        else:
            condition(True, choice.reason, choice.why + _saving_words(costs))
    return RoutingPlan(status, conditions, events, actions)


def _cost_fields(costs: RoutingCosts) -> dict:
    fields: dict = {"service_cost_per_mtok": _rounded(costs.service),
                    "weighted_cost_per_mtok": _rounded(costs.weighted)}
    if costs.service and costs.weighted is not None:
        fields["saving_percent"] = round(100 * (1 - costs.weighted / costs.service), 1)
    return fields


def _rounded(value: float | None) -> float | None:
    return round(value, 4) if value is not None else None


def _saving_words(costs: RoutingCosts, verb: str = "would save") -> str:
    if not costs.service or costs.weighted is None or costs.weighted >= costs.service:
        return ""
    return (f"; weighted routing {verb} {100 * (1 - costs.weighted / costs.service):.0f}%: this fleet is planned at "
            f"${costs.weighted:.3f}/Mtok weighted against ${costs.service:.3f} with one Service")


def routing_refused(status: SpeculativeDeploymentStatus, events: list[Event], reason: str, problem: str,
                    old_conditions: Sequence[Condition], generation: int | None, now: datetime) -> None:
    """What a refused routing write changes in the deployment's next status (only a write tells): the one Service
    serves every pool, status.routing says so, RoutingReady=False names the cause and the fix, one Event."""
    was = status.routing or RoutingStatus()
    status.routing = RoutingStatus(mode=Routing.SERVICE.value, requested=was.requested, reason=problem,
                                   service_cost_per_mtok=was.service_cost_per_mtok,
                                   weighted_cost_per_mtok=was.weighted_cost_per_mtok,
                                   saving_percent=was.saving_percent, inference_pools=was.inference_pools)
    if status.fleet is not None:
        status.fleet.http_route = None
    status.conditions = set_condition(status.conditions, CONDITION, False, reason, problem, generation, now)
    if not _was(old_conditions, False, reason) and not any(e.reason == reason for e in events):
        events.append(Event("Warning", reason, problem))


def _was(conditions: Sequence[Condition], ok: bool, reason: str) -> bool:
    value = "True" if ok else "False"
    return any(c.type == CONDITION and c.status == value and c.reason == reason for c in conditions)
