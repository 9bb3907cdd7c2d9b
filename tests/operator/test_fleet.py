"""Three GPU pools share one load: the real operator places replicas and traffic shares across them by cost per
token (policy.fleet), and both move as demand moves. Each pool's pod serves vLLM-named metrics (the observer's
exporter) on its own loopback address; the operator scrapes them directly (metrics.source: pods)."""

from __future__ import annotations

import asyncio
import random

import pytest

from specpilot.observe.exporter import VllmMetricsState, start_exporter
from tests.operator.scenario import (
    H100,
    H200,
    NAMESPACE,
    create_serving_pod,
    deployment,
    events,
    node,
    play_deployment_controller,
    publish_results,
    sdep,
    status,
)

pytestmark = pytest.mark.operator

A100 = "NVIDIA-A100-SXM4-80GB"
POOLS = {"a100": (A100, "A100-80GB-SXM"), "h100": (H100, "H100-SXM"), "h200": (H200, "H200")}
PORT = 29000 + random.randint(0, 999)


def pools(api) -> dict[str, dict]:
    return {p["name"]: p for p in status(api).get("pools") or []}


def replicas(api) -> dict[str, int]:
    return {name: int((deployment(api, name) or {}).get("spec", {}).get("replicas") or 0) for name in POOLS}


async def test_shares_and_replicas_follow_demand_across_three_gpu_types(sandbox, operator):
    stop = asyncio.Event()
    controller = asyncio.create_task(play_deployment_controller(sandbox, stop))
    states = {name: VllmMetricsState(model_name="llama") for name in POOLS}
    subnet = random.randint(1, 250)
    ips = {name: f"127.{subnet}.{i + 1}.{random.randint(2, 250)}" for i, name in enumerate(POOLS)}
    runners = []
    try:
        for name, (product, _) in POOLS.items():
            runners.append((await start_exporter(states[name], host=ips[name], port=PORT))[0])
            await sandbox.create(node(f"gpu-{name}", product, name))
        await sandbox.create(sdep(
            methods=[{"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 4}],
            # The A100s are the cheapest replicas, and only two may run: heavier load goes to the other types.
            gpuPools=[{"name": "a100", "nodeSelector": {"pool": "a100"}, "minReplicas": 1, "maxReplicas": 2,
                       "pricePerGpuHour": 1.8},
                      {"name": "h100", "nodeSelector": {"pool": "h100"}, "minReplicas": 0},
                      {"name": "h200", "nodeSelector": {"pool": "h200"}, "minReplicas": 0}],
            policy={"tpotSloMs": 40, "minGainPercent": 5},
            serving={"minReplicas": 0, "maxReplicas": 8, "port": PORT, "scaleDownStabilizationSeconds": 0},
            metrics={"source": "pods", "intervalSeconds": 5, "windowSeconds": 30}))
        await sandbox.wait_for(lambda: len(sandbox.objects("speculationprofiles", NAMESPACE)) == 6,
                               what="a baseline and an ngram profile per GPU type")
        for _, sku in POOLS.values():
            await publish_results(sandbox, sku)
        await sandbox.wait_for(lambda: all((pools(sandbox).get(n, {}).get("decision") or {}).get("source") == "profile"
                                           for n in POOLS), timeout_s=60, what="a decision per pool")
        await sandbox.wait_for(lambda: all(deployment(sandbox, n) for n in POOLS), what="a Deployment per pool")
        for i, name in enumerate(POOLS):
            await create_serving_pod(sandbox, deployment(sandbox, name), f"llama-{name}-5c7d{i}-p{i}x2z", ips[name])

        # Light load: a few requests in flight per pod.
        for state in states.values():
            state.set_load(running=2, waiting=0)
            state.set_rates(request_steps_per_second=40, finished_requests_per_second=0.2)
        light = await sandbox.wait_for(lambda: (status(sandbox).get("fleet") or {}).get("costPerMtok") and
                                       status(sandbox)["fleet"], timeout_s=60, what="a fleet placement")
        assert light["routing"] == "service" and light["sloFeasible"] is True
        placed = pools(sandbox)
        assert abs(sum(p["trafficShare"] for p in placed.values()) - 1.0) < 0.01
        assert placed["a100"]["replicas"] >= 1  # minReplicas
        assert all(p["fleetReason"].startswith(n) for n, p in placed.items())
        assert status(sandbox)["costPerMtok"] == light["costPerMtok"]  # the $/Mtok printer column
        before = replicas(sandbox)

        # Heavy load: many requests in flight on every pod; the fleet needs more replicas and the split moves.
        for state in states.values():
            state.set_load(running=120, waiting=0)
            state.set_rates(request_steps_per_second=1500, finished_requests_per_second=5)
        await sandbox.wait_for(lambda: sum(replicas(sandbox).values()) > sum(before.values()), timeout_s=90,
                               what="the fleet scaled up")
        moved = await sandbox.wait_for(lambda: events(sandbox, "FleetSharesMoved"), timeout_s=60,
                                       what="a FleetSharesMoved Event")
        assert "->" in moved[0]["message"]
        heavy = pools(sandbox)
        assert heavy["a100"]["replicas"] == 2 and heavy["a100"]["full"] is True
        assert "full at maxReplicas (2)" in heavy["a100"]["fleetReason"]
        assert heavy["h100"]["replicas"] + heavy["h200"]["replicas"] > 0
        assert heavy["h100"]["trafficShare"] + heavy["h200"]["trafficShare"] > 0.3
        assert status(sandbox)["fleet"]["sloFeasible"] is True
        assert all(p["loadTokensPerSecond"] is not None for p in heavy.values())
        assert status(sandbox)["fleet"]["demandTokensPerSecond"] > light["demandTokensPerSecond"]

        # Load falls again: with no stabilisation window, the fleet scales back down.
        for state in states.values():
            state.set_load(running=1, waiting=0)
            state.set_rates(request_steps_per_second=20, finished_requests_per_second=0.1)
        peak = sum(replicas(sandbox).values())
        await sandbox.wait_for(lambda: sum(replicas(sandbox).values()) < peak, timeout_s=90,
                               what="the fleet scaled down")
    finally:
        stop.set()
        await controller
        for runner in runners:
            await runner.cleanup()
