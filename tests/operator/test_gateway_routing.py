"""serving.routing: gateway on the real operator: with the Gateway API's HTTPRoute resource in the cluster, one
Service per pool and an HTTPRoute whose weights follow the fleet's planned shares as demand moves; without it, a
RoutingReady=False condition naming the fix, one Event, and the one Service serving every pool; a parentRef the
admin's allow-list refuses fails the resource. Each pool's pod serves vLLM-named metrics (the observer's exporter)
on its own loopback address (metrics.source: pods)."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import yaml

from specpilot.manifests import names
from specpilot.policy.fleet import route_weights
from specpilot_sandbox.apiserver import SandboxApiServer
from specpilot_sandbox.exporter import VllmMetricsState, start_exporter
from tests.operator.scenario import (
    A100,
    H100,
    NAMESPACE,
    condition,
    create_serving_pod,
    deployment,
    events,
    node,
    play_deployment_controller,
    pools,
    publish_results,
    sdep,
    status,
)

pytestmark = pytest.mark.operator

POOLS = {"a100": (A100, "A100-80GB-SXM"), "h100": (H100, "H100-SXM")}
PORT = 29000 + random.randint(0, 999)
GATEWAY = {"parentRefs": [{"name": "inference"}, {"name": "public", "namespace": "gateway-system",
                                                  "sectionName": "http"}]}
ALL_VERBS = frozenset({"get", "list", "watch", "create", "update", "patch", "delete"})


@pytest.fixture
def operator_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "benchmarkImage": "ghcr.io/specpilot/specpilot-bench:test",
        "gpuPricesPerHour": {"H100-SXM": 2.5},
        "reconcileIntervalSeconds": 0.5,
        "allowedGatewayParents": ["gateway-system/public"],
    }))
    return path


def route(api: SandboxApiServer) -> dict | None:
    return api.get("httproutes", NAMESPACE, names.http_route_name("llama"))


def route_split(api: SandboxApiServer) -> dict[str, int]:
    rules = ((route(api) or {}).get("spec") or {}).get("rules") or [{}]
    return {b["name"]: b["weight"] for b in rules[0].get("backendRefs", [])}


def fleet_sdep(**serving) -> dict:
    return sdep(
        methods=[{"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 4}],
        gpuPools=[{"name": "a100", "nodeSelector": {"pool": "a100"}, "minReplicas": 1, "maxReplicas": 2,
                   "pricePerGpuHour": 1.8},
                  {"name": "h100", "nodeSelector": {"pool": "h100"}, "minReplicas": 0, "maxReplicas": 2}],
        policy={"tpotSloMs": 40, "minGainPercent": 5},
        serving={"minReplicas": 0, "maxReplicas": 8, "port": PORT, "scaleDownStabilizationSeconds": 0, **serving},
        metrics={"source": "pods", "intervalSeconds": 5, "windowSeconds": 30})


@contextlib.asynccontextmanager
async def serving_fleet(api: SandboxApiServer, body: dict) -> AsyncIterator[Callable[[float, float], None]]:
    """The two-GPU-type deployment `body` profiled and serving: a node per pool, every profile measured, one Ready
    pod per pool whose vLLM-named metrics its own exporter serves on a loopback address at the serving port, and
    the Deployment controller played. Yields `load(running, steps)`, which sets what every pod reports."""
    port = body["spec"]["serving"]["port"]
    stop = asyncio.Event()
    controller = asyncio.create_task(play_deployment_controller(api, stop))
    states = {name: VllmMetricsState(model_name="llama") for name in POOLS}
    subnet = random.randint(1, 250)
    ips = {name: f"127.{subnet}.{i + 1}.{random.randint(2, 250)}" for i, name in enumerate(POOLS)}
    runners = []

    def load(running: float, steps: float) -> None:
        for state in states.values():
            state.set_load(running=running, waiting=0)
            state.set_rates(request_steps_per_second=steps, finished_requests_per_second=steps / 300)

    try:
        for name, (product, _) in POOLS.items():
            await api.create(node(f"gpu-{name}", product, name))
        await api.create(body)
        await api.wait_for(lambda: len(api.objects("speculationprofiles", NAMESPACE)) == 4,
                           what="a baseline and an ngram profile per GPU type")
        for name in POOLS:
            await publish_results(api, POOLS[name][1])
        for i, name in enumerate(POOLS):
            await api.wait_for(lambda: deployment(api, name), timeout_s=60, what=f"the {name} Deployment")
            runners.append((await start_exporter(states[name], host=ips[name], port=port))[0])
            pod = f"llama-{name}-5c7d{i}-p{i}x2z"
            await create_serving_pod(api, deployment(api, name), pod, ips[name])
            await api.patch("pods", NAMESPACE, pod, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        yield load
    finally:
        stop.set()
        await controller
        for runner in runners:
            await runner.cleanup()


def weights_follow_shares(api: SandboxApiServer, mode: str = "gateway") -> dict[str, int] | None:
    """The route's weights when the fleet was planned under `mode` and they are its planned shares as route_weights
    makes them (None: not yet). A pool's Service and its InferencePool share the name `<sdep>-<pool>`."""
    placed = pools(api)
    shares = {name: placed[name].get("trafficShare") for name in POOLS if name in placed}
    if None in shares.values() or (status(api).get("fleet") or {}).get("routing") != mode:
        return None
    expected = {names.pool_service_name("llama", n): w for n, w in route_weights(shares).items()}
    return route_split(api) if route_split(api) == expected else None


async def test_route_weights_follow_the_planned_shares_as_demand_moves(sandbox, operator):
    await sandbox.install_gateway_api()
    async with serving_fleet(sandbox, fleet_sdep(routing="gateway", gateway=GATEWAY)) as load:
        # One Service per pool, selecting that pool's pods; the deployment's one Service stays beside them.
        for name in POOLS:
            svc = await sandbox.wait_for(lambda: sandbox.get("services", NAMESPACE, f"llama-{name}"),
                                         what=f"the {name} Service")
            assert svc["spec"]["selector"] == names.serving_selector("llama", name)
        assert sandbox.get("services", NAMESPACE, "llama") is not None

        # Light load: the route's weights are the planned shares (the kept A100 carries it all).
        load(running=2, steps=40)
        light = await sandbox.wait_for(lambda: weights_follow_shares(sandbox), timeout_s=90,
                                       what="route weights that are the planned shares")
        assert light == {"llama-a100": 1000, "llama-h100": 0}
        created = route(sandbox)
        assert created["metadata"]["namespace"] == NAMESPACE
        assert created["metadata"]["ownerReferences"][0]["kind"] == "SpeculativeDeployment"
        assert [p["name"] for p in created["spec"]["parentRefs"]] == ["inference", "public"]
        assert created["spec"]["parentRefs"][1]["namespace"] == "gateway-system"
        routing = status(sandbox)["routing"]
        assert routing["mode"] == "gateway" and routing["httpRoute"] == "llama"
        assert routing["weights"] == {"a100": 1000, "h100": 0}
        assert status(sandbox)["fleet"]["httpRoute"] == "llama"
        ready = condition(sandbox, "RoutingReady")
        assert ready["status"] == "True" and ready["reason"] == "HttpRouteApplied"

        # Heavy load: the H100s take a share, and the route's weights move with it.
        load(running=250, steps=3000)
        heavy = await sandbox.wait_for(
            lambda: (split := weights_follow_shares(sandbox)) and split["llama-h100"] > 0 and split,
            timeout_s=120, what="the H100 taking a weighted share")
        assert sum(heavy.values()) == 1000 and heavy["llama-a100"] < 1000

        # Back to routing: service: the HTTPRoute goes, the one Service serves every pod.
        await sandbox.patch("speculativedeployments", NAMESPACE, "llama", {"spec": {"serving": {"routing": "service"}}})
        await sandbox.wait_for(lambda: route(sandbox) is None, timeout_s=60, what="the HTTPRoute deleted")
        await sandbox.wait_for(lambda: (status(sandbox).get("routing") or {}).get("mode") == "service"
                               and condition(sandbox, "RoutingReady") is None, timeout_s=60,
                               what="service routing in effect")


async def test_without_the_gateway_api_it_falls_back_to_the_one_service_and_says_how_to_fix_it(sandbox, operator):
    missing = sandbox.refuse("httproutes", code=404, verbs=ALL_VERBS, message="the server could not find the "
                             "requested resource")
    stop = asyncio.Event()
    controller = asyncio.create_task(play_deployment_controller(sandbox, stop))
    try:
        await sandbox.create(node("gpu-h100", H100, "h100"))
        await sandbox.create(sdep(serving={"minReplicas": 1, "maxReplicas": 2, "routing": "gateway",
                                           "gateway": {"parentRefs": [{"name": "inference"}]}}))
        cond = await sandbox.wait_for(lambda: condition(sandbox, "RoutingReady"), timeout_s=60,
                                      what="the RoutingReady condition")
        assert cond["status"] == "False" and cond["reason"] == "GatewayApiMissing"
        assert "install the Gateway API CRDs" in cond["message"]
        assert "serving.routing: auto or service" in cond["message"]
        assert status(sandbox)["routing"]["mode"] == "service"
        assert sandbox.get("services", NAMESPACE, "llama") is not None  # the one Service keeps serving
        await publish_results(sandbox, "H100-SXM")
        await sandbox.wait_for(lambda: deployment(sandbox, "h100"), timeout_s=60, what="the h100 Deployment")
        # Several reconciliations later: still one Event, no crash loop, the operator keeps reconciling.
        reconciled = status(sandbox).get("observedGeneration")
        await sandbox.wait_for(lambda: (condition(sandbox, "Serving") or {}).get("status") == "True", timeout_s=60,
                               what="Serving")
        assert reconciled is not None
        assert len(events(sandbox, "GatewayApiMissing")) == 1
        assert missing.hits >= 1  # checked once per SERVED_CHECK_S for the whole operator, not per reconciliation
        assert sandbox.get("services", NAMESPACE, "llama-h100") is None

        # The Gateway API is installed: the route appears and the condition clears.
        sandbox.allow(missing)
        await sandbox.install_gateway_api()
        await sandbox.wait_for(lambda: route(sandbox), timeout_s=60, what="the HTTPRoute")
        assert route_split(sandbox) == {"llama-h100": 1000}
        ready = await sandbox.wait_for(lambda: (c := condition(sandbox, "RoutingReady")) and c["status"] == "True"
                                       and c, timeout_s=60, what="RoutingReady=True")
        assert "even split per replica" in ready["message"]  # one pool: no fleet placement
        assert status(sandbox)["routing"]["mode"] == "gateway"
        assert len(events(sandbox, "GatewayApiMissing")) == 1
    finally:
        stop.set()
        await controller


async def test_a_gateway_the_admin_does_not_allow_fails_the_resource(sandbox, operator):
    await sandbox.install_gateway_api()
    await sandbox.create(node("gpu-h100", H100, "h100"))
    await sandbox.create(sdep(serving={"routing": "gateway", "gateway": {"parentRefs": [
        {"name": "inference"}, {"name": "private", "namespace": "gateway-system"}]}}))
    cond = await sandbox.wait_for(lambda: (c := condition(sandbox, "Valid")) and c["status"] == "False" and c,
                                  timeout_s=60, what="Valid=False")
    assert "spec.serving.gateway.parentRefs[1] names Gateway gateway-system/private" in cond["message"]
    assert "allowedGatewayParents" in cond["message"]
    (event,) = await sandbox.wait_for(lambda: events(sandbox, "InvalidSpec"), what="an InvalidSpec Event")
    assert "parentRefs[1]" in event["message"]
    assert route(sandbox) is None and not sandbox.objects("jobs", NAMESPACE)
    # The allowed one is accepted.
    await sandbox.patch("speculativedeployments", NAMESPACE, "llama", {"spec": {"serving": {"gateway": {
        "parentRefs": [{"name": "inference"}, {"name": "public", "namespace": "gateway-system"}]}}}})
    await sandbox.wait_for(lambda: (condition(sandbox, "Valid") or {}).get("status") == "True", timeout_s=60,
                           what="Valid=True")
