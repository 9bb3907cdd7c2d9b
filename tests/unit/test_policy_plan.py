"""`policy.plan.plan_deployment`: one pure decision from a snapshot of what a reconciliation read, to the next
status and the typed actions that make it real."""

from __future__ import annotations

import copy
import dataclasses
from datetime import UTC, datetime, timedelta

from specpilot.api.deployment_spec import SpeculativeDeploymentSpec
from specpilot.api.deployment_status import SpeculativeDeploymentStatus
from specpilot.config import OperatorConfig
from specpilot.observe.model import PoolObservation
from specpilot.policy.needs import needed_profiles
from specpilot.api.deployment_spec import Routing
from specpilot.policy.plan import (
    ApplyDeployment,
    ApplyRouting,
    DeploymentSnapshot,
    PoolReadings,
    PoolSnapshot,
    RoutingApis,
    plan_deployment,
    settle,
)
from specpilot.policy.pools import NodeInfo, pool_views
from specpilot.policy.profiling import all_accepted
from specpilot.sim.synthetic import Scenario, synthetic_profiles

NOW = datetime(2026, 12, 6, 12, 0, 0, tzinfo=UTC)
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SKUS = {"h100": "H100-SXM", "a100": "A100-SXM4-80GB"}


def _spec(**serving) -> SpeculativeDeploymentSpec:
    candidate = Scenario("H100-SXM", MODEL, "eagle3").candidate()
    return SpeculativeDeploymentSpec.model_validate({
        "model": {"id": MODEL},
        "gpuPools": [{"name": pool, "sku": sku, "nodeSelector": {"pool": pool}, "pricePerGpuHour": price}
                     for (pool, sku), price in zip(SKUS.items(), (4.0, 2.0), strict=True)],
        "methods": [candidate.dump()],
        "policy": {"tpotSloMs": 30},
        "serving": {"maxReplicas": 6, **serving}})


def _nodes(*pools: str) -> list[NodeInfo]:
    return [NodeInfo(name=f"{pool}-node", labels={"pool": pool}) for pool in pools]


def _observation(tokens_per_s: float, running: float) -> PoolObservation:
    return PoolObservation(
        replicas_reporting=1, running_per_replica=running, waiting_per_replica=0.0, total_running=running,
        total_waiting=0.0, generation_tokens_per_second=tokens_per_s, tpot_p95_ms=None, acceptance_per_position=[],
        drafts_per_step=None, mean_acceptance_length=None, kv_cache_usage=None, observed_at=NOW, window_s=60.0,
        concurrency_histogram=[(running, 1.0)])


def _snapshot(spec: SpeculativeDeploymentSpec, nodes: list[NodeInfo], *, observed: bool = True,
              gateway: bool = False, old: SpeculativeDeploymentStatus | None = None,
              readings: PoolReadings | None = None) -> DeploymentSnapshot:
    views = pool_views(spec, nodes)
    needed = needed_profiles(spec, views, OperatorConfig())
    profiles = {}
    for need in needed:
        baseline, method = synthetic_profiles(Scenario(need.sku, MODEL, "eagle3"), noise=0.0)
        profiles[need.name] = (baseline if need.candidate is None else method).dump()
    deployments = {v.pool.name: {"metadata": {"name": f"chat-{v.pool.name}", "generation": 1},
                                 "spec": {"replicas": 1},
                                 "status": {"observedGeneration": 1, "replicas": 1, "updatedReplicas": 1,
                                            "readyReplicas": 1, "availableReplicas": 1}} for v in views}
    return DeploymentSnapshot(
        spec=spec, name="chat", uid="u1", generation=1, old=old or SpeculativeDeploymentStatus(), now=NOW,
        pools=[PoolSnapshot(view=v, current=deployments[v.pool.name] if v.nodes else None,
                            observation=_observation(900.0, 12.0) if observed and v.nodes else None,
                            price_per_gpu_hour=v.pool.price_per_gpu_hour, gpus_available=8 if v.nodes else None)
               for v in views],
        profiling=all_accepted(needed, NOW), profiles=profiles,
        readings=readings or PoolReadings([], [v.pool.name for v in views if v.nodes and observed]),
        routing_apis=RoutingApis(http_routes=gateway, inference_pools=gateway))


def _condition(status: SpeculativeDeploymentStatus, type_: str):
    return next((c for c in status.conditions if c.type == type_), None)


def test_a_profiled_two_pool_deployment_is_decided_placed_and_applied_in_one_plan():
    snapshot = _snapshot(_spec(routing="gateway", gateway={"parentRefs": [{"name": "gw"}]}), _nodes("h100", "a100"),
                         gateway=True)
    plan = plan_deployment(snapshot)
    applies = plan.of(ApplyDeployment)
    assert [a.pool for a in applies] == ["h100", "a100"]
    assert plan.served == {"h100", "a100"}
    status = plan.status
    # every pool decided from its own GPU type's profiles, and the fleet placed across both
    assert all(p.decision is not None and p.decision.method for p in status.pools)
    assert status.fleet is not None and status.fleet.routing == "gateway"
    placed = {p.name: p.fleet_target_replicas for p in status.pools}
    assert {a.pool: a.serve.replicas for a in applies} == placed
    # the route's weights are the planned shares of the pools that serve
    (route,) = plan.of(ApplyRouting)
    assert route.mode is Routing.GATEWAY and route.weights == status.routing.weights
    assert set(route.weights) <= {"h100", "a100"} and sum(route.weights.values()) == 1000
    assert status.routing.mode == "gateway" and status.routing.requested == "gateway"
    assert _condition(status, "Profiled").status == "True"
    assert _condition(status, "Serving").status == "True"
    assert _condition(status, "MetricsAvailable").reason == "MetricsFresh"
    assert status.cost_per_mtok == status.fleet.cost_per_mtok
    # a decision from nothing is a change: each pool's is in the history and announced once
    assert {e.reason for e in plan.events} >= {"DecisionChanged"}
    assert set(plan.decided) == {"h100", "a100"}


def test_the_plan_is_pure_the_same_snapshot_gives_the_same_plan_and_is_left_as_it_was():
    snapshot = _snapshot(_spec(), _nodes("h100", "a100"))
    before = copy.deepcopy(snapshot.old.dump()), copy.deepcopy(dict(snapshot.profiles))
    first, second = plan_deployment(snapshot), plan_deployment(snapshot)
    assert first.status.dump() == second.status.dump()
    assert first.actions == second.actions and first.events == second.events
    assert (snapshot.old.dump(), dict(snapshot.profiles)) == before


def test_the_next_reconciliation_from_the_plans_status_keeps_the_decision_and_announces_nothing_new():
    spec = _spec()
    first = plan_deployment(_snapshot(spec, _nodes("h100", "a100")))
    again = plan_deployment(_snapshot(spec, _nodes("h100", "a100"), old=first.status))
    assert [p.decision.method for p in again.status.pools] == [p.decision.method for p in first.status.pools]
    assert again.decided == {} and not [e for e in again.events if e.reason == "DecisionChanged"]


def test_a_pool_without_nodes_is_reported_once():
    spec = _spec()
    plan = plan_deployment(_snapshot(spec, _nodes("h100")))
    nodes = _condition(plan.status, "NodesAvailable")
    assert nodes.status == "False" and "a100" in nodes.message and "nodeSelector" in nodes.message
    assert [e.reason for e in plan.events].count("NoNodes") == 1
    again = plan_deployment(_snapshot(spec, _nodes("h100"), old=plan.status))
    assert "NoNodes" not in [e.reason for e in again.events]


def test_missing_metrics_hold_the_decision_and_say_so_once():
    spec = _spec()
    decided = plan_deployment(_snapshot(spec, _nodes("h100", "a100"))).status
    readings = PoolReadings(["pool h100: Prometheus answered 503"], [])
    plan = plan_deployment(_snapshot(spec, _nodes("h100", "a100"), observed=False, old=decided,
                                     readings=readings))
    metrics = _condition(plan.status, "MetricsAvailable")
    assert metrics.status == "False" and "holding the last decision" in metrics.message
    assert [p.decision.method for p in plan.status.pools] == [p.decision.method for p in decided.pools]
    assert [e.reason for e in plan.events].count("MetricsUnavailable") == 1
    again = plan_deployment(_snapshot(spec, _nodes("h100", "a100"), observed=False, old=plan.status,
                                      readings=readings))
    assert "MetricsUnavailable" not in [e.reason for e in again.events]


def test_settle_reads_each_rollout_from_what_the_apply_returned():
    snapshot = _snapshot(_spec(), _nodes("h100", "a100"))
    plan = plan_deployment(snapshot)
    stalled = {"metadata": {"name": "chat-h100", "generation": 2},
               "spec": {"replicas": 1, "progressDeadlineSeconds": 600},
               "status": {"observedGeneration": 2, "conditions": [
                   {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}]}}
    settle(plan, {"h100": stalled, "a100": snapshot.pools[1].current}, "chat", 1, NOW)
    assert {p.name: p.rollout for p in plan.status.pools} == {"h100": "Stalled", "a100": "RolledOut"}
    assert [e.reason for e in plan.events].count("RolloutStalled") == 1
    rolled = _condition(plan.status, "RolledOut")
    assert rolled.status == "False" and rolled.reason == "ProgressDeadlineExceeded"


def test_the_plan_changes_nothing_of_the_status_it_was_given():
    """plan_deployment copies the old status shallowly (its fields are assigned, every pool's status built anew): a
    plan that mutated what the old status holds would corrupt the snapshot's own `_was` checks, the rollout
    comparison in `settle` and, in the simulator, the status it keeps."""
    spec = _spec()
    first = plan_deployment(_snapshot(spec, _nodes("h100", "a100"), gateway=True))
    second = plan_deployment(_snapshot(spec, _nodes("h100", "a100"), gateway=True, old=first.status))
    assert second.status.fleet is not None and second.status.pools[0].decision is not None  # a rich status
    old = second.status
    before = old.model_dump(mode="json")
    later = dataclasses.replace(_snapshot(spec, _nodes("h100"), gateway=True, old=old), now=NOW + timedelta(hours=1))
    plan = plan_deployment(later)
    settle(plan, {}, "llama", 1, later.now)
    assert old.model_dump(mode="json") == before
    assert plan.status.model_dump(mode="json") != before
