"""policy.routing: which routing a deployment gets (auto takes the cheapest the cluster allows), the fallback of a mode
asked for that cannot run, and what the plan writes, deletes and says (status, RoutingReady, Events, the saving)."""

from __future__ import annotations

import dataclasses

import pytest

from specpilot.api.deployment_spec import EndpointPickerRef, ParentRef, Routing
from specpilot.api.deployment_status import RoutingStatus
from specpilot.policy.plan import ApplyRouting, DeleteRouting, plan_deployment
from specpilot.policy.routing import RoutingApis, RoutingDefaults, resolve_routing
from tests.unit.test_policy_plan import _condition, _nodes, _snapshot, _spec

GATEWAY = {"parentRefs": [{"name": "gw"}]}
NONE = RoutingApis()
HTTP = RoutingApis(http_routes=True)
BOTH = RoutingApis(http_routes=True, inference_pools=True)
DEFAULT_GATEWAY = RoutingDefaults(parent_refs=(ParentRef(name="shared", namespace="gateway-system"),))
DEFAULT_PICKER = dataclasses.replace(DEFAULT_GATEWAY, endpoint_picker=EndpointPickerRef())


@pytest.mark.parametrize("serving, apis, defaults, mode, reason", [
    ({}, BOTH, RoutingDefaults(), Routing.SERVICE, "NoWeightedRouting"),  # no Gateway named anywhere
    ({"gateway": GATEWAY}, NONE, RoutingDefaults(), Routing.SERVICE, "NoWeightedRouting"),  # no CRDs
    ({"gateway": GATEWAY}, HTTP, RoutingDefaults(), Routing.GATEWAY, "GatewayServed"),
    ({"gateway": GATEWAY}, BOTH, RoutingDefaults(), Routing.GATEWAY, "GatewayServed"),  # no picker named
    ({}, BOTH, DEFAULT_GATEWAY, Routing.GATEWAY, "GatewayServed"),  # the operator's Gateway
    ({}, BOTH, DEFAULT_PICKER, Routing.INFERENCE_POOL, "InferencePoolsServed"),  # and its picker
    ({"gateway": GATEWAY, "inferencePool": {}}, BOTH, RoutingDefaults(), Routing.INFERENCE_POOL,
     "InferencePoolsServed"),  # the spec's own picker block
    ({"inferencePool": {}}, HTTP, DEFAULT_GATEWAY, Routing.GATEWAY, "GatewayServed"),  # no InferencePool CRD
])
def test_auto_takes_the_cheapest_routing_the_cluster_allows_and_says_why(serving, apis, defaults, mode, reason):
    choice = resolve_routing(_spec(**serving), apis, defaults)
    assert (choice.mode, choice.reason, choice.requested) == (mode, reason, Routing.AUTO)
    assert choice.problem == ""  # auto never fails: it routes the cheapest way there is
    assert choice.why.startswith("auto: ")
    if mode is Routing.SERVICE:
        assert "install the Gateway API CRDs" in choice.why or "defaultGatewayParentRefs" in choice.why
    if mode is Routing.GATEWAY:
        assert choice.parent_refs and "not inferencePool" in choice.why
    if mode is Routing.INFERENCE_POOL:
        assert choice.picker is not None and choice.parent_refs


def test_a_mode_asked_for_that_cannot_run_falls_back_to_the_cheapest_that_can_and_names_the_fix():
    pools = resolve_routing(_spec(routing="inferencePool", gateway=GATEWAY), HTTP, RoutingDefaults())
    assert (pools.mode, pools.reason) == (Routing.GATEWAY, "InferencePoolApiMissing")
    assert "install the Gateway API Inference Extension's CRDs" in pools.problem
    assert "one Service per pool behind a weighted HTTPRoute" in pools.problem
    bare = resolve_routing(_spec(routing="inferencePool", gateway=GATEWAY), NONE, RoutingDefaults())
    assert (bare.mode, bare.reason) == (Routing.SERVICE, "InferencePoolApiMissing")
    assert "one Service serves every pool" in bare.problem
    gateway = resolve_routing(_spec(routing="gateway", gateway=GATEWAY), NONE, RoutingDefaults())
    assert (gateway.mode, gateway.reason) == (Routing.SERVICE, "GatewayApiMissing")
    assert "install the Gateway API CRDs" in gateway.problem and "routing: auto or service" in gateway.problem
    # Asked for by name, InferencePools name the Inference Extension's picker when the spec names none.
    named = resolve_routing(_spec(routing="inferencePool", gateway=GATEWAY), BOTH, RoutingDefaults())
    assert named.mode is Routing.INFERENCE_POOL and named.picker == EndpointPickerRef()
    service = resolve_routing(_spec(routing="service", gateway=GATEWAY), BOTH, DEFAULT_PICKER)
    assert service.mode is Routing.SERVICE and service.problem == ""


def test_a_fleet_on_inference_pools_weighs_them_by_the_planned_shares_and_states_the_saving():
    snapshot = dataclasses.replace(_snapshot(_spec(gateway=GATEWAY, inferencePool={}), _nodes("h100", "a100")),
                                   routing_apis=BOTH)
    plan = plan_deployment(snapshot)
    routing = plan.status.routing
    assert (routing.mode, routing.requested) == ("inferencePool", "auto")
    (apply,) = plan.of(ApplyRouting)
    assert apply.mode is Routing.INFERENCE_POOL and dict(apply.weights) == routing.weights
    assert sum(routing.weights.values()) == 1000
    shares = {p.name: p.traffic_share for p in plan.status.pools}
    assert all(abs(routing.weights[p] / 1000 - shares[p]) <= 0.001 for p in routing.weights)
    assert routing.inference_pools == {p: f"chat-{p}" for p in routing.weights}
    assert routing.http_route == "chat" and plan.status.fleet.http_route == "chat"
    assert plan.status.fleet.routing == "inferencePool"
    # What weighted routing saves against the one Service, from the fleet placed under each.
    assert routing.service_cost_per_mtok is not None and routing.weighted_cost_per_mtok is not None
    assert routing.weighted_cost_per_mtok == plan.status.fleet.cost_per_mtok
    assert routing.weighted_cost_per_mtok <= routing.service_cost_per_mtok
    assert routing.saving_percent == pytest.approx(
        100 * (1 - routing.weighted_cost_per_mtok / routing.service_cost_per_mtok), abs=0.1)
    ready = _condition(plan.status, "RoutingReady")
    assert (ready.status, ready.reason) == ("True", "InferencePoolsApplied")
    assert "InferencePools" in ready.message and "auto:" in ready.message
    assert not plan.of(DeleteRouting)


def test_a_change_of_mode_deletes_what_the_last_one_owned():
    spec = _spec(gateway=GATEWAY, inferencePool={})
    first = plan_deployment(dataclasses.replace(_snapshot(spec, _nodes("h100", "a100")), routing_apis=BOTH))
    owned = first.status.routing.inference_pools
    # The InferencePool CRD goes: per-pool Services behind the same route, the InferencePools deleted.
    second = plan_deployment(dataclasses.replace(_snapshot(spec, _nodes("h100", "a100"), old=first.status),
                                                 routing_apis=HTTP))
    assert second.status.routing.mode == "gateway" and second.status.routing.inference_pools == {}
    (delete,) = second.of(DeleteRouting)
    assert delete.http_route is None and dict(delete.inference_pools) == owned
    # Back to the one Service: the route goes too.
    third = plan_deployment(_snapshot(_spec(routing="service"), _nodes("h100", "a100"), old=second.status))
    (delete,) = third.of(DeleteRouting)
    assert delete.http_route == "chat" and delete.inference_pools == ()
    assert third.status.routing == RoutingStatus(mode="service", requested="service", reason=third.status.routing.reason,
                                                 service_cost_per_mtok=third.status.routing.service_cost_per_mtok,
                                                 weighted_cost_per_mtok=third.status.routing.weighted_cost_per_mtok,
                                                 saving_percent=third.status.routing.saving_percent)
    assert _condition(third.status, "RoutingReady") is None  # the one Service, as asked


def test_auto_on_one_service_says_what_weighted_routing_would_save():
    plan = plan_deployment(_snapshot(_spec(), _nodes("h100", "a100")))
    routing = plan.status.routing
    assert (routing.mode, routing.requested) == ("service", "auto")
    assert not plan.of(ApplyRouting) and routing.http_route is None
    ready = _condition(plan.status, "RoutingReady")
    assert (ready.status, ready.reason) == ("True", "NoWeightedRouting")
    assert "defaultGatewayParentRefs" in ready.message
    if routing.saving_percent and routing.saving_percent >= 0.5:
        assert "weighted routing would save" in ready.message


def test_a_fallback_is_announced_once():
    spec = _spec(routing="inferencePool", gateway=GATEWAY)
    first = plan_deployment(dataclasses.replace(_snapshot(spec, _nodes("h100", "a100")), routing_apis=HTTP))
    assert [e.reason for e in first.events].count("InferencePoolApiMissing") == 1
    cond = _condition(first.status, "RoutingReady")
    assert (cond.status, cond.reason) == ("False", "InferencePoolApiMissing")
    assert first.status.routing.mode == "gateway"
    again = plan_deployment(dataclasses.replace(_snapshot(spec, _nodes("h100", "a100"), old=first.status),
                                                routing_apis=HTTP))
    assert "InferencePoolApiMissing" not in [e.reason for e in again.events]
