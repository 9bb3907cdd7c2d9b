"""serving.routing: inferencePool and auto on the real operator, in a sandbox cluster that serves the Gateway API's
HTTPRoute and the Inference Extension's InferencePool (their CRDs installed, their schemas enforced): one
InferencePool per GPU pool and one HTTPRoute whose weights are the planned shares, traffic through the sandbox's
gateway following them, the weights moving with demand, an operator restart that duplicates nothing, and deletion
taking everything the deployment owned. `auto`, the default, routes by weights only where the cluster serves the CRDs
and says why; hostile routing fields are refused before anything reaches the cluster."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from pathlib import Path

import pytest
import yaml

from specpilot.manifests import names
from specpilot_sandbox.apiserver import SandboxApiServer
from specpilot_sandbox.router import Router
from tests.operator.scenario import (
    H100,
    NAMESPACE,
    condition,
    deployment,
    events,
    node,
    play_deployment_controller,
    publish_results,
    sdep,
    status,
)
from tests.operator.test_gateway_routing import POOLS, fleet_sdep, serving_fleet, weights_follow_shares

pytestmark = pytest.mark.operator

PORT = 29000 + random.randint(0, 999)
GATEWAY = {"parentRefs": [{"name": "inference"}]}
PICKS = 4000


@pytest.fixture
def operator_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "benchmarkImage": "ghcr.io/specpilot/specpilot-bench:test",
        "gpuPricesPerHour": {"H100-SXM": 2.5},
        "reconcileIntervalSeconds": 0.5,
    }))
    return path


def route(api: SandboxApiServer) -> dict | None:
    return api.get("httproutes", NAMESPACE, names.http_route_name("llama"))


def route_split(api: SandboxApiServer) -> dict[str, int]:
    rules = ((route(api) or {}).get("spec") or {}).get("rules") or [{}]
    return {b["name"]: b["weight"] for b in rules[0].get("backendRefs", []) if b.get("kind") == "InferencePool"}


def inference_pools(api: SandboxApiServer) -> list[dict]:
    return api.objects("inferencepools", NAMESPACE)


def served_shares(api: SandboxApiServer) -> dict[str, float]:
    """Where PICKS requests through the sandbox's gateway go, by InferencePool."""
    router = Router(api, NAMESPACE, names.http_route_name("llama"), seed=7)
    counted = Counter(pick.backend.name for pick in (router.pick() for _ in range(PICKS)) if pick.endpoint)
    return {name: counted[name] / PICKS for name in counted}


async def test_inference_pools_carry_the_planned_shares_through_the_gateway(sandbox, operator):
    await sandbox.install_gateway_api()
    await sandbox.install_inference_extension()
    # routing left at its default, auto: the cluster serves both CRDs, a Gateway and a picker are named.
    body = fleet_sdep(port=PORT, gateway=GATEWAY, inferencePool={"endpointPickerRef": {"port": 9002}})
    async with serving_fleet(sandbox, body) as load:
        ips = {p["metadata"]["labels"][names.LABEL_POOL]: p["status"]["podIP"]
               for p in sandbox.objects("pods", NAMESPACE)}
        subnet = next(iter(ips.values())).split(".")[1]
        # A pod of another deployment in the namespace, with the same pool label: never a member.
        stranger = dict(deployment(sandbox, "a100"))
        stranger_labels = {**stranger["spec"]["template"]["metadata"]["labels"],
                           names.LABEL_DEPLOYMENT: "other", names.LABEL_INSTANCE: "other"}
        await sandbox.create({"apiVersion": "v1", "kind": "Pod",
                              "metadata": {"name": "other-a100-x", "namespace": NAMESPACE, "labels": stranger_labels},
                              "spec": {"containers": [{"name": "engine", "image": "vllm"}]},
                              "status": {"phase": "Running", "podIP": f"127.{subnet}.9.9",
                                         "conditions": [{"type": "Ready", "status": "True"}]}})

        # Light load: one InferencePool per GPU pool, the route's weights the planned shares.
        load(running=2, steps=40)
        light = await sandbox.wait_for(lambda: weights_follow_shares(sandbox, "inferencePool"), timeout_s=90,
                                       what="InferencePool weights that are the planned shares")
        assert sum(light.values()) == 1000
        by_pool = {p["metadata"]["labels"][names.LABEL_POOL]: p for p in inference_pools(sandbox)}
        assert set(by_pool) == set(POOLS)
        for name, pool_obj in by_pool.items():
            assert pool_obj["metadata"]["name"] == names.inference_pool_name("llama", name)
            assert pool_obj["spec"]["selector"]["matchLabels"] == names.serving_selector("llama", name)
            assert pool_obj["spec"]["targetPorts"] == [{"number": PORT}]
            assert pool_obj["spec"]["endpointPickerRef"]["name"] == f"llama-{name}-epp"
            assert pool_obj["metadata"]["ownerReferences"][0]["kind"] == "SpeculativeDeployment"
        created = route(sandbox)
        assert [p["name"] for p in created["spec"]["parentRefs"]] == ["inference"]
        routing = status(sandbox)["routing"]
        assert (routing["mode"], routing["requested"]) == ("inferencePool", "auto")
        assert routing["inferencePools"] == {n: names.inference_pool_name("llama", n) for n in POOLS}
        assert "InferencePools are served" in routing["reason"]
        ready = condition(sandbox, "RoutingReady")
        assert ready["status"] == "True" and ready["reason"] == "InferencePoolsApplied"
        # Through the gateway, requests follow the weights (within sampling error) and reach only this pool's pods.
        heavy_pool = names.inference_pool_name("llama", "h100")
        load(running=250, steps=3000)
        heavy = await sandbox.wait_for(
            lambda: (split := weights_follow_shares(sandbox, "inferencePool")) and 0 < split[heavy_pool] < 1000 and split,
            timeout_s=120, what="the H100s taking a weighted share")
        shares = served_shares(sandbox)
        for name, weight in heavy.items():
            expected = weight / 1000
            sigma = (expected * (1 - expected) / PICKS) ** 0.5
            assert abs(shares.get(name, 0.0) - expected) <= 4 * sigma + 1e-9, (shares, heavy)
        router = Router(sandbox, NAMESPACE, names.http_route_name("llama"), seed=3)
        reached = {router.pick().endpoint.ip for _ in range(200)}
        assert reached <= set(ips.values()) and f"127.{subnet}.9.9" not in reached
        assert status(sandbox)["routing"]["savingPercent"] is not None

        # A restart finds its InferencePools and route in place: no duplicate, the same names.
        before = sorted(p["metadata"]["name"] for p in inference_pools(sandbox))
        await operator.stop()
        operator.start()
        await operator.wait_periodic_runs(sandbox, runs=3, timeout_s=60)
        assert sorted(p["metadata"]["name"] for p in inference_pools(sandbox)) == before
        assert len(sandbox.objects("httproutes", NAMESPACE)) == 1

        # Deleted: the InferencePools and the route go with it.
        await sandbox.delete("speculativedeployments", NAMESPACE, "llama")
        await sandbox.wait_for(lambda: not inference_pools(sandbox) and route(sandbox) is None, timeout_s=60,
                               what="the InferencePools and the HTTPRoute garbage-collected")


async def test_auto_routes_by_one_service_until_the_cluster_serves_the_crds_then_by_inference_pools(sandbox, operator):
    stop = asyncio.Event()
    controller = asyncio.create_task(play_deployment_controller(sandbox, stop))
    try:
        await sandbox.create(node("gpu-h100", H100, "h100"))
        await sandbox.create(sdep(serving={"minReplicas": 1, "maxReplicas": 2, "gateway": GATEWAY}))
        await publish_results(sandbox, "H100-SXM")
        await sandbox.wait_for(lambda: deployment(sandbox, "h100"), timeout_s=60, what="the h100 Deployment")
        cond = await sandbox.wait_for(lambda: condition(sandbox, "RoutingReady"), timeout_s=60,
                                      what="the RoutingReady condition")
        # No CRDs: the one Service, said as a choice, not an error (auto never fails).
        assert (cond["status"], cond["reason"]) == ("True", "NoWeightedRouting")
        assert "install the Gateway API CRDs" in cond["message"]
        assert (status(sandbox)["routing"]["mode"], status(sandbox)["routing"]["requested"]) == ("service", "auto")
        assert route(sandbox) is None and not events(sandbox, "GatewayApiMissing")

        # The Gateway API is installed: the route over per-pool Services (no picker is named: not InferencePools).
        await sandbox.install_gateway_api()
        await sandbox.wait_for(lambda: (status(sandbox).get("routing") or {}).get("mode") == "gateway", timeout_s=90,
                               what="gateway routing once HTTPRoutes are served")
        assert route(sandbox)["spec"]["rules"][0]["backendRefs"][0]["kind"] == "Service"
        assert "not inferencePool" in status(sandbox)["routing"]["reason"]

        # The Inference Extension too, and a picker named: InferencePools, the per-pool route moved onto them.
        await sandbox.install_inference_extension()
        await sandbox.patch("speculativedeployments", NAMESPACE, "llama",
                            {"spec": {"serving": {"inferencePool": {"endpointPickerRef": {"name": "llm-d-epp"}}}}})
        await sandbox.wait_for(lambda: route_split(sandbox) == {names.inference_pool_name("llama", "h100"): 1000},
                               timeout_s=90, what="the route over the InferencePool")
        (pool_obj,) = inference_pools(sandbox)
        assert pool_obj["spec"]["endpointPickerRef"]["name"] == "llm-d-epp"

        # routing: service asked: the route and the InferencePool go.
        await sandbox.patch("speculativedeployments", NAMESPACE, "llama", {"spec": {"serving": {"routing": "service"}}})
        await sandbox.wait_for(lambda: route(sandbox) is None and not inference_pools(sandbox), timeout_s=60,
                               what="the route and the InferencePool deleted")
    finally:
        stop.set()
        await controller


@pytest.mark.parametrize("serving, field", [
    ({"routing": "inferencePool", "gateway": GATEWAY,
      "inferencePool": {"endpointPickerRef": {"name": "epp", "namespace": "elsewhere"}}},
     "spec.serving.inferencePool.endpointPickerRef.namespace is elsewhere"),
    ({"routing": "gateway"}, "spec.serving.routing is gateway but no Gateway is named"),
])
async def test_hostile_routing_fields_fail_the_resource_and_reach_nothing(sandbox, operator, serving, field):
    await sandbox.install_gateway_api()
    await sandbox.install_inference_extension()
    await sandbox.create(node("gpu-h100", H100, "h100"))
    await sandbox.create(sdep(serving={"minReplicas": 1, "maxReplicas": 2, **serving}))
    cond = await sandbox.wait_for(lambda: condition(sandbox, "Valid"), timeout_s=60, what="the Valid condition")
    assert cond["status"] == "False" and field in cond["message"]
    await sandbox.wait_for(lambda: any(field in e.get("message", "") for e in events(sandbox, "InvalidSpec")),
                           timeout_s=30, what="the InvalidSpec Event naming the field")
    assert not inference_pools(sandbox) and route(sandbox) is None
    assert not sandbox.objects("speculationprofiles", NAMESPACE)


@pytest.mark.parametrize("serving", [
    {"inferencePool": {"endpointPickerRef": {"port": 70000}}},
    {"inferencePool": {"endpointPickerRef": {"port": 0}}},
    {"port": 65536},
    {"inferencePool": {"selector": {"matchLabels": {"app": "someone-else"}}}},
    {"inferencePool": {"endpointPickerRef": {"name": "Not_A_Service"}}},
])
async def test_the_api_server_refuses_out_of_range_ports_and_fields_the_api_has_not(sandbox, serving):
    with pytest.raises(Exception, match="422|Invalid|Unprocessable"):
        await sandbox.create(sdep(serving={"gateway": GATEWAY, **serving}))
    assert sandbox.get("speculativedeployments", NAMESPACE, "llama") is None
