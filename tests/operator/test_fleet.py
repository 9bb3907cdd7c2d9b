"""Three GPU pools share one load: the real operator places replicas and traffic shares across them by cost per
token (policy.fleet), and both move as demand moves and as a GPU type joins. Each pool's pod serves vLLM-named
metrics (the observer's exporter) on its own loopback address; the operator scrapes them directly
(metrics.source: pods)."""

from __future__ import annotations

import asyncio
import random

import pytest

from specpilot_sandbox.exporter import VllmMetricsState, start_exporter
from tests.operator.scenario import (
    A100,
    H100,
    H200,
    NAMESPACE,
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

POOLS = {"a100": (A100, "A100-80GB-SXM"), "h100": (H100, "H100-SXM"), "h200": (H200, "H200")}
PORT = 29000 + random.randint(0, 999)


def replicas(api) -> dict[str, int]:
    return {name: int((deployment(api, name) or {}).get("spec", {}).get("replicas") or 0) for name in POOLS}


async def test_shares_and_replicas_follow_demand_and_a_joining_gpu_type(sandbox, operator):
    stop = asyncio.Event()
    controller = asyncio.create_task(play_deployment_controller(sandbox, stop))
    states = {name: VllmMetricsState(model_name="llama") for name in POOLS}
    subnet = random.randint(1, 250)
    ips = {name: f"127.{subnet}.{i + 1}.{random.randint(2, 250)}" for i, name in enumerate(POOLS)}
    runners = []

    async def serve(name: str, index: int) -> None:
        runners.append((await start_exporter(states[name], host=ips[name], port=PORT))[0])
        await sandbox.wait_for(lambda: deployment(sandbox, name), what=f"the {name} Deployment")
        await create_serving_pod(sandbox, deployment(sandbox, name), f"llama-{name}-5c7d{index}-p{index}x2z",
                                 ips[name])

    def load(running: float, steps: float, tpot_s: float = 0.02) -> None:
        for state in states.values():
            state.set_load(running=running, waiting=0)
            state.set_rates(request_steps_per_second=steps, finished_requests_per_second=steps / 300, tpot_s=tpot_s)

    try:
        for name in ("a100", "h100"):  # the H200 node joins later
            await sandbox.create(node(f"gpu-{name}", POOLS[name][0], name))
        await sandbox.create(sdep(
            methods=[{"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 4}],
            # The A100s are the cheapest replicas but only two may run, and one H100: more load needs the H200s.
            gpuPools=[{"name": "a100", "nodeSelector": {"pool": "a100"}, "minReplicas": 1, "maxReplicas": 2,
                       "pricePerGpuHour": 1.8},
                      {"name": "h100", "nodeSelector": {"pool": "h100"}, "minReplicas": 0, "maxReplicas": 1},
                      {"name": "h200", "nodeSelector": {"pool": "h200"}, "minReplicas": 0}],
            policy={"tpotSloMs": 40, "minGainPercent": 5},
            serving={"minReplicas": 0, "maxReplicas": 8, "port": PORT, "scaleDownStabilizationSeconds": 0},
            metrics={"source": "pods", "intervalSeconds": 5, "windowSeconds": 30}))
        await sandbox.wait_for(lambda: len(sandbox.objects("speculationprofiles", NAMESPACE)) == 4,
                               what="a baseline and an ngram profile per GPU type present")
        for name in ("a100", "h100"):
            await publish_results(sandbox, POOLS[name][1])
        await sandbox.wait_for(lambda: all((pools(sandbox).get(n, {}).get("decision") or {}).get("source") == "profile"
                                           for n in ("a100", "h100")), timeout_s=60, what="a decision per pool")
        for i, name in enumerate(("a100", "h100")):
            await serve(name, i)

        # Light load: a few requests in flight per pod; the kept A100 carries it.
        load(running=2, steps=40)
        light = await sandbox.wait_for(lambda: (status(sandbox).get("fleet") or {}).get("costPerMtok") and
                                       status(sandbox)["fleet"], timeout_s=60, what="a fleet placement")
        assert light["routing"] == "service" and light["sloFeasible"] is True
        placed = pools(sandbox)
        assert placed["a100"]["replicas"] == 1 and placed["a100"]["trafficShare"] == 1.0
        assert placed["h100"]["replicas"] == 0 and "h200" not in {n for n, p in placed.items() if p.get("sku")}
        assert placed["a100"]["fleetReason"].startswith("a100 held at minReplicas (1)")
        assert status(sandbox)["costPerMtok"] == light["costPerMtok"]  # the $/Mtok printer column
        before = replicas(sandbox)

        # Heavy load: the A100s and the H100 fill up, and still the demand exceeds them: their pods' p95 TPOT is past
        # the 40 ms SLO (the planner calibrates each pool's curve by what its pods report).
        load(running=250, steps=3000, tpot_s=0.06)
        await sandbox.wait_for(lambda: sum(replicas(sandbox).values()) > sum(before.values()), timeout_s=90,
                               what="the fleet scaled up")
        moved = await sandbox.wait_for(lambda: events(sandbox, "FleetSharesMoved"), timeout_s=60,
                                       what="a FleetSharesMoved Event")
        assert "->" in moved[0]["message"]
        full = await sandbox.wait_for(lambda: status(sandbox)["fleet"].get("sloFeasible") is False and pools(sandbox),
                                      timeout_s=60, what="a fleet that cannot hold the demand")
        assert full["a100"]["replicas"] == 2 and full["a100"]["full"] is True
        assert "full at maxReplicas (2)" in full["a100"]["fleetReason"]
        assert full["h100"]["replicas"] == 1 and full["h100"]["trafficShare"] > 0.3
        assert all(p["loadTokensPerSecond"] is not None for n, p in full.items() if n != "h200")

        # The H200 node joins: its pool is profiled, then placed, and takes a share of the load.
        await sandbox.create(node("gpu-h200", POOLS["h200"][0], "h200"))
        await sandbox.wait_for(lambda: len(sandbox.objects("speculationprofiles", NAMESPACE)) == 6,
                               what="the H200's profiles")
        await publish_results(sandbox, POOLS["h200"][1])
        await serve("h200", 2)
        load(running=250, steps=3000, tpot_s=0.03)  # with the H200s serving, the pods are back within the SLO
        joined = await sandbox.wait_for(
            lambda: (pools(sandbox).get("h200", {}).get("trafficShare") or 0) > 0.1 and pools(sandbox),
            timeout_s=90, what="the H200 pool taking a share")
        assert joined["h200"]["replicas"] >= 1 and joined["h200"]["fleetReason"].startswith("h200 takes")
        # the pools' calibration is smoothed: it takes a few observations within the SLO to hold the demand again
        await sandbox.wait_for(lambda: status(sandbox)["fleet"]["sloFeasible"] is True, timeout_s=90,
                               what="a fleet that holds the demand with the H200s")
        assert status(sandbox)["fleet"]["demandTokensPerSecond"] > light["demandTokensPerSecond"]

        # Load falls again: with no stabilisation window, the fleet scales back down.
        load(running=1, steps=20)
        peak = sum(replicas(sandbox).values())
        await sandbox.wait_for(lambda: sum(replicas(sandbox).values()) < peak, timeout_s=90,
                               what="the fleet scaled down")
    finally:
        stop.set()
        await controller
        for runner in runners:
            await runner.cleanup()
