"""The real operator on the sandbox API server and the simulator (`sim.cluster.VirtualCluster`) get the same nodes,
profile results and load over time, for a two-pool deployment with a GPU type joining; after each step both must
hold the same decisions: the profiles and their benchmark Jobs, each pool's method and speculation schedule (the
engine arguments its Deployment carries), its replicas and its traffic share. Both decide through
`policy.plan.plan_deployment`; what this checks is everything around it: the controller's reads and writes
against the simulator's snapshot and actions."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest

from specpilot.api.deployment_spec import SpeculativeDeploymentSpec
from specpilot.config import load_config
from specpilot.sim.cluster import VirtualCluster
from tests.operator.scenario import (
    A100,
    H200,
    NAMESPACE,
    deployment,
    jobs,
    measured_status,
    node,
    play_deployment_controller,
    profiles,
    publish_results,
    sdep,
    speculative_config,
    status,
)

pytestmark = pytest.mark.operator

POOLS = {"a100": (A100, "A100-80GB-SXM"), "h200": (H200, "H200")}
BODY = sdep(
    methods=[{"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 4},
             {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "numSpeculativeTokens": 4}],
    gpuPools=[{"name": "a100", "nodeSelector": {"pool": "a100"}, "minReplicas": 1, "maxReplicas": 3,
               "pricePerGpuHour": 1.8},
              {"name": "h200", "nodeSelector": {"pool": "h200"}, "minReplicas": 1, "maxReplicas": 2}],
    policy={"tpotSloMs": 40, "minGainPercent": 5})


def _decisions(status_body: dict, deployments: dict[str, dict | None]) -> dict:
    """What both must agree on, from a status (as stored) and the pools' Deployments."""
    pools = {}
    for pool in status_body.get("pools") or []:
        decision = pool.get("decision") or {}
        dep = deployments.get(pool["name"])
        pools[pool["name"]] = {
            "source": decision.get("source"), "method": decision.get("method"),
            "k": decision.get("numSpeculativeTokens"), "schedule": decision.get("scheduleSummary"),
            "speculating": pool.get("speculationEnabled"),
            "replicas": (dep or {}).get("spec", {}).get("replicas"),
            "engine": speculative_config(dep) if dep else None, "share": pool.get("trafficShare")}
    return {"phase": status_body.get("phase"), "pools": pools}


def operator_state(api) -> dict:
    verdicts = {p["metadata"]["name"]: (p.get("status") or {}).get("phase") for p in profiles(api)}
    with_job = sorted(p["metadata"]["name"] for p in profiles(api)
                      if (p.get("status") or {}).get("jobName") in {j["metadata"]["name"] for j in jobs(api)})
    return {"profiles": verdicts, "jobs": with_job,
            **_decisions(status(api), {name: deployment(api, name) for name in POOLS})}


def simulator_state(cluster: VirtualCluster) -> dict:
    verdicts = {name: cluster.verdicts.get(name) or cluster._profile_view(name).phase for name in cluster.profiles}
    return {"profiles": verdicts, "jobs": sorted(cluster.jobs),
            **_decisions(cluster.status.dump(), dict(cluster.deployments))}


def settle_simulator(cluster: VirtualCluster) -> None:
    """Reconcile the virtual cluster until a reconciliation changes nothing (the operator's watch and timer do the
    same for the real one)."""
    for _ in range(6):
        before = simulator_state(cluster)
        cluster.reconcile(datetime.now(UTC))
        if simulator_state(cluster) == before:
            return
    raise AssertionError(f"the simulator did not settle: {simulator_state(cluster)}")


async def agree(api, cluster: VirtualCluster, step: str) -> dict:
    settle_simulator(cluster)
    expected = simulator_state(cluster)
    try:
        await api.wait_for(lambda: operator_state(api) == expected, timeout_s=60, what=step)
    except TimeoutError:
        pytest.fail(f"{step}: the operator and the simulator disagree\n operator:  {operator_state(api)}\n "
                    f"simulator: {expected}")
    return expected


def publish_simulated(cluster: VirtualCluster, sku: str) -> None:
    """The simulator's benchmark Jobs of `sku` write the same results as the sandbox's (scenario.publish_results)."""
    for name, profile in cluster.profiles.items():
        spec = profile["spec"]
        if spec["sku"] != sku or name not in cluster.jobs:
            continue
        method = spec.get("method") or {}
        cluster.publish(name, measured_status(sku, method.get("method"), method.get("numSpeculativeTokens", 4),
                                              levels=spec["concurrencyLevels"],
                                              requests_per_level=spec.get("requestsPerLevel", 64)),
                        datetime.now(UTC))


async def test_the_operator_and_the_simulator_take_the_same_decisions_at_every_step(sandbox, operator,
                                                                                  operator_config):
    stop = asyncio.Event()
    controller = asyncio.create_task(play_deployment_controller(sandbox, stop))
    cluster = VirtualCluster(spec=SpeculativeDeploymentSpec.model_validate(BODY["spec"]), namespace=NAMESPACE,
                             config=load_config(operator_config))
    try:
        # One GPU type: its profiles are created and their Jobs started (two at a time), the pool serves meanwhile.
        await sandbox.create(node("gpu-a100", POOLS["a100"][0], "a100"))
        cluster.add_node("gpu-a100", node("gpu-a100", POOLS["a100"][0], "a100")["metadata"]["labels"])
        await sandbox.create(BODY)
        profiling = await agree(sandbox, cluster, "the A100 pool profiling")
        assert len(profiling["profiles"]) == 3 and len(profiling["jobs"]) == 2

        # Its results: the queued profile's Job starts, then every result is accepted and the pool decided.
        await publish_results(sandbox, POOLS["a100"][1])
        for _ in range(2):
            publish_simulated(cluster, POOLS["a100"][1])
            settle_simulator(cluster)
        decided = await agree(sandbox, cluster, "the A100 pool decided")
        assert decided["pools"]["a100"]["source"] == "profile" and decided["phase"] == "Serving", decided

        # A second GPU type joins: its profiles and Jobs, while the first pool keeps its decision.
        await sandbox.create(node("gpu-h200", POOLS["h200"][0], "h200"))
        cluster.add_node("gpu-h200", node("gpu-h200", POOLS["h200"][0], "h200")["metadata"]["labels"])
        joining = await agree(sandbox, cluster, "the H200 pool joining")
        assert joining["pools"]["a100"] == decided["pools"]["a100"] and len(joining["jobs"]) == 5

        await publish_results(sandbox, POOLS["h200"][1])
        for _ in range(2):
            publish_simulated(cluster, POOLS["h200"][1])
            settle_simulator(cluster)
        both = await agree(sandbox, cluster, "both pools decided")
        assert all(p["source"] == "profile" for p in both["pools"].values()) and both["phase"] == "Serving", both
    finally:
        stop.set()
        await controller
