"""Load rises and falls: the restart strategy toggles speculation with hysteresis, and SD-aware autoscaling
changes replicas. Pods serve vLLM-named metrics (the observer's exporter) on their own loopback address;
the operator scrapes them directly (metrics.source: pods)."""

from __future__ import annotations

import asyncio
import random

import pytest

from specpilot_sandbox.exporter import VllmMetricsState, start_exporter
from tests.operator.scenario import (
    H100,
    NAMESPACE,
    condition,
    deployment,
    events,
    node,
    play_deployment_controller,
    publish_results,
    create_serving_pod,
    sdep,
    speculative_config,
    status,
)

pytestmark = pytest.mark.operator

PORT = 28000 + random.randint(0, 999)


def pool_status(api) -> dict:
    return next(iter(status(api).get("pools") or [{}]))


async def test_restart_strategy_toggles_with_hysteresis_and_replicas_follow_load(sandbox, operator):
    controller_stop = asyncio.Event()
    controller = asyncio.create_task(play_deployment_controller(sandbox, controller_stop))
    state = VllmMetricsState(model_name="llama")
    ip = f"127.0.{random.randint(1, 250)}.{random.randint(2, 250)}"
    runner, _ = await start_exporter(state, host=ip, port=PORT)
    try:
        await sandbox.create(node("gpu-a", H100, "h100"))
        # Data parallel 2: vLLM ignores a per-batch-size schedule, so the restart strategy is chosen.
        await sandbox.create(sdep(
            model={"id": "meta-llama/Llama-3.1-8B-Instruct", "dataParallelSize": 2},
            methods=[{"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 4}],
            policy={"tpotSloMs": 15, "hysteresis": {"bandPercent": 20, "minDwellSeconds": 1,
                                                    "cooldownSeconds": 2}},
            serving={"minReplicas": 1, "maxReplicas": 4, "port": PORT, "scaleDownStabilizationSeconds": 0},
            metrics={"source": "pods", "intervalSeconds": 5, "windowSeconds": 30}))
        await sandbox.wait_for(lambda: len(sandbox.objects("speculationprofiles", NAMESPACE)) == 2,
                               what="baseline and ngram profiles")
        await publish_results(sandbox, "H100-SXM")
        decision = await sandbox.wait_for(lambda: (pool_status(sandbox).get("decision") or {}).get("method"),
                                          what="a decision")
        decision = pool_status(sandbox)["decision"]
        assert decision["strategy"] == "restart"
        crossover = decision["crossoverConcurrency"]
        assert crossover and 20 < crossover < 200
        assert pool_status(sandbox)["speculationEnabled"] is True
        assert speculative_config(deployment(sandbox, "h100"))["method"] == "ngram"
        assert "num_speculative_tokens_per_batch_size" not in speculative_config(deployment(sandbox, "h100"))
        # The Deployment controller (played here) finishes the rollout: the condition says so.
        await sandbox.wait_for(lambda: (condition(sandbox, "RolledOut") or {}).get("status") == "True",
                               what="RolledOut=True")

        await create_serving_pod(sandbox, deployment(sandbox, "h100"), "llama-h100-7d9f8-a1b2c", ip)
        high, low = crossover * 1.6, crossover * 0.3
        # Live acceptance as profiled: the decision stands and only the load moves.
        profiled = next(p for p in sandbox.objects("speculationprofiles", NAMESPACE) if p["spec"].get("method"))
        acceptance = max(profiled["status"]["runs"], key=lambda r: r["numSpeculativeTokens"])["acceptance"]
        state.set_load(running=high, waiting=2)
        state.set_rates(request_steps_per_second=50, drafts_per_step=acceptance["draftsPerStep"],
                        acceptance_per_position=acceptance["perPosition"], finished_requests_per_second=1)

        await sandbox.wait_for(lambda: pool_status(sandbox).get("speculationEnabled") is False, timeout_s=90,
                               what="speculation off above the band")
        await sandbox.wait_for(lambda: speculative_config(deployment(sandbox, "h100")) is None,
                               what="the engine rolled without speculation")
        toggled = await sandbox.wait_for(lambda: events(sandbox, "SpeculationToggled"), what="a toggle Event")
        assert "off" in toggled[0]["message"]
        # The SD-aware planner asks for more replicas at this load; scale-up is immediate.
        await sandbox.wait_for(lambda: (deployment(sandbox, "h100")["spec"].get("replicas") or 1) > 1,
                               what="scale up")
        assert (condition(sandbox, "MetricsAvailable") or {}).get("status") == "True"
        observed = pool_status(sandbox)["observed"]
        assert observed["concurrency"] > crossover
        # Once load is observed the decision weighs it (and says so), instead of the profiled levels.
        revisited = await sandbox.wait_for(lambda: (pool_status(sandbox).get("decision") or {}).get("loadConcurrency"),
                                           what="the decision re-made at the observed load")
        assert revisited > crossover and "observed load" in pool_status(sandbox)["decision"]["reason"]
        assert pool_status(sandbox)["decision"]["method"] == "ngram"

        state.set_load(running=low, waiting=0)
        await sandbox.wait_for(lambda: pool_status(sandbox).get("speculationEnabled") is True, timeout_s=90,
                               what="speculation back on below the band")
        assert speculative_config(deployment(sandbox, "h100"))["method"] == "ngram"
        # The Event is its own API call next to the status patch: wait for it rather than race it.
        toggled = await sandbox.wait_for(lambda: len(events(sandbox, "SpeculationToggled")) >= 2 and
                                         events(sandbox, "SpeculationToggled"), what="the toggle-on Event")
        assert len(toggled) == 2 and {"speculation on" in e["message"] for e in toggled} == {True, False}

        # The pod goes away: metrics are missing, the last decision and replicas hold, and the condition says so.
        await runner.cleanup()
        runner = None
        replicas = deployment(sandbox, "h100")["spec"].get("replicas")
        missing = await sandbox.wait_for(
            lambda: (condition(sandbox, "MetricsAvailable") or {}).get("status") == "False"
            and condition(sandbox, "MetricsAvailable"), timeout_s=60, what="MetricsAvailable=False")
        assert "holding the last decision" in missing["message"]
        assert pool_status(sandbox)["speculationEnabled"] is True
        assert deployment(sandbox, "h100")["spec"].get("replicas") == replicas
    finally:
        controller_stop.set()
        await controller
        if runner is not None:
            await runner.cleanup()
