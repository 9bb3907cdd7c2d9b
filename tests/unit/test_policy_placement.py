"""Fleet placement of a deployment (policy.placement): pool statuses in, shares and replicas back into them."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from specpilot.api.deployment_spec import GpuPool, SpeculativeDeploymentSpec
from specpilot.api.deployment_status import Decision, ObservedLoad, PoolStatus, TpotPoint
from specpilot.controller.metrics import OperatorMetrics
from specpilot.policy.placement import FleetMember, clear_plan, fleet_demand, place_fleet, write_plan

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEVELS = (1, 2, 4, 8, 16, 32, 64, 128)


def spec(**serving) -> SpeculativeDeploymentSpec:
    return SpeculativeDeploymentSpec.model_validate({
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
        "methods": [{"method": "ngram", "numSpeculativeTokens": 4}],
        "gpuPools": [{"name": n, "nodeSelector": {"pool": n}} for n in ("a100", "h100", "h200")],
        "policy": {"tpotSloMs": 30},
        "serving": {"minReplicas": 0, "maxReplicas": 8, "scaleDownStabilizationSeconds": 300, **serving}})


def status(name: str, base_ms: float, slope: float, tokens: float = 0.0, concurrency: float = 0.0,
           replicas: int = 1, profiled: bool = True) -> PoolStatus:
    curve = [TpotPoint(concurrency=c, ms=base_ms * (1 + slope * c)) for c in LEVELS]
    decision = Decision(method="ngram", source="profile", tpot_curve=curve) if profiled else \
        Decision(method=None, source="none", reason="waiting for profiles")
    return PoolStatus(name=name, sku=name.upper(), decision=decision, replicas=replicas,
                      capacity_concurrency_per_replica=128.0 if profiled else None,
                      observed=ObservedLoad(concurrency=concurrency, waiting=0.0,
                                            requests_in_flight=concurrency * replicas,
                                            generation_tokens_per_second=tokens))


def members(statuses: list[PoolStatus], prices=(1.8, 2.5, 3.5), gpus=(None, None, None), current=1):
    return [FleetMember(spec=GpuPool(name=s.name, node_selector={"pool": s.name}), status=s, previous=s,
                        price_per_gpu_hour=p,
                        gpus_available=g, current_replicas=current, ready_replicas=current,
                        per_pool_replicas=current)
            for s, p, g in zip(statuses, prices, gpus, strict=True)]


def fleet(tokens_each: float, **kw):
    return [status("a100", 14.0, 0.02, tokens_each), status("h100", 8.0, 0.012, tokens_each),
            status("h200", 7.0, 0.01, tokens_each)]


def test_demand_sums_the_pools_observations():
    demand = fleet_demand([status("a", 10, 0.01, 1000.0, 4.0, replicas=2), status("b", 10, 0.01, 500.0, 2.0)])
    assert demand.tokens_per_second == 1500.0 and demand.requests_in_flight == 4.0 * 2 + 2.0  # summed over pods
    assert fleet_demand([PoolStatus(name="a")]) is None


def test_a_pool_with_no_replica_ready_adds_no_demand():
    """A pool the fleet scaled to zero (or whose pods all went) is observed no more, so its status keeps its last
    observation: that load went to the other pools, and counting it again would size the fleet for it twice."""
    statuses = fleet(3000.0)
    drained = members(statuses)
    drained[2] = dataclasses.replace(drained[2], current_replicas=0, ready_replicas=0)
    outcome = place_fleet(spec(), drained, None, T0)
    assert outcome.fleet.demand_tokens_per_second == 6000.0  # a100 and h100 only (nothing in flight)
    assert place_fleet(spec(), members(statuses), None, T0).fleet.demand_tokens_per_second == 9000.0
    nothing_ready = [dataclasses.replace(m, ready_replicas=0) for m in members(statuses)]
    assert place_fleet(spec(), nothing_ready, None, T0).fleet.reason.startswith("waiting for load metrics")


def test_a_fleet_at_zero_runs_one_replica_on_its_cheapest_profiled_pool_to_be_observed():
    """Every pool may scale to zero (minReplicas 0) and none runs: no pod reports load, so the fleet would wait for
    metrics that never come. One replica runs on the profiled pool with the lowest price until load is seen."""
    statuses = [status("a100", 14.0, 0.02), status("h100", 8.0, 0.012), status("h200", 7.0, 0.01)]
    at_zero = members(statuses, current=0)
    outcome = place_fleet(spec(), at_zero, None, T0)
    assert outcome.plan is None and outcome.replicas == {"a100": 1}
    assert "one runs on a100" in outcome.fleet.reason
    unprofiled = members([status("a100", 14.0, 0.02, profiled=False), *statuses[1:]], current=0)
    assert place_fleet(spec(), unprofiled, None, T0).replicas == {"h100": 1}
    no_gpus = [dataclasses.replace(m, gpus_available=0) if m.spec.name == "a100" else m for m in at_zero]
    assert place_fleet(spec(), no_gpus, None, T0).replicas == {"h100": 1}
    one_runs = [dataclasses.replace(m, current_replicas=1) if m.spec.name == "h200" else m for m in at_zero]
    assert place_fleet(spec(), one_runs, None, T0).replicas == {}  # it will report load once ready


def test_placement_writes_shares_replicas_and_reasons_into_the_statuses():
    statuses = fleet(6000.0)
    outcome = place_fleet(spec(), members(statuses), None, T0)
    assert outcome.fleet.cost_per_mtok > 0 and outcome.fleet.slo_feasible
    assert "fleet $" in outcome.fleet.reason and outcome.fleet.routing == "service"
    total = 0.0
    for s in statuses:
        replicas = write_plan(s, outcome.plan, external=False)
        assert s.replicas == replicas == s.desired_replicas == outcome.replicas[s.name]
        total += s.traffic_share
        assert s.fleet_reason.startswith(s.name)
    assert abs(total - 1.0) < 1e-3
    metrics = OperatorMetrics()
    metrics.record_fleet("team", "llama", statuses, outcome.fleet.cost_per_mtok)
    shares = [metrics.registry.get_sample_value("specpilot_traffic_share",
                                                {"namespace": "team", "deployment": "llama", "pool": s.name})
              for s in statuses]
    assert abs(sum(shares) - 1.0) < 1e-3
    assert metrics.registry.get_sample_value("specpilot_fleet_cost_per_million_tokens_dollars",
                                             {"namespace": "team", "deployment": "llama"}) == outcome.fleet.cost_per_mtok


def test_external_autoscaling_only_publishes_the_fleet_replicas():
    statuses = fleet(6000.0)
    outcome = place_fleet(spec(autoscaling="external"), members(statuses), None, T0)
    for s in statuses:
        s.replicas = 1
        write_plan(s, outcome.plan, external=True)
        assert s.replicas == 1 and s.desired_replicas == outcome.replicas[s.name]


def test_shares_move_with_demand_and_announce_it():
    low = fleet(500.0)
    first = place_fleet(spec(), members(low), None, T0)
    for s in low:
        write_plan(s, first.plan, external=False)
    # The new statuses come from the pools' own planner (no fleet fields): what the fleet remembers is the old.
    high = [PoolStatus(name=s.name, sku=s.sku, decision=s.decision, replicas=s.replicas,
                       capacity_concurrency_per_replica=s.capacity_concurrency_per_replica,
                       observed=ObservedLoad(requests_in_flight=60.0, generation_tokens_per_second=20_000.0))
            for s in low]
    remembered = [dataclasses.replace(m, previous=old) for m, old in zip(members(high), low, strict=True)]
    later = place_fleet(spec(), remembered, first.fleet, T0 + timedelta(seconds=30))
    assert sum(later.replicas.values()) > sum(first.replicas.values())
    assert [e for e in later.events if e.reason == "FleetSharesMoved"]
    assert later.fleet.shares_moved_at == T0 + timedelta(seconds=30)


def test_gpus_of_the_nodes_bound_a_pool_and_it_is_marked_full():
    statuses = fleet(30_000.0)
    outcome = place_fleet(spec(), members(statuses, gpus=(None, None, 2)), None, T0)
    h200 = outcome.plan.pool("h200")
    assert h200.replicas == 2 and h200.full
    write_plan(statuses[2], outcome.plan, external=False)
    assert statuses[2].full and "GPUs its nodes have are taken" in statuses[2].fleet_reason


def test_unprofiled_pool_keeps_its_own_replicas():
    statuses = [status("a100", 14.0, 0.02, 3000.0), status("h100", 8.0, 0.012, 3000.0),
                status("h200", 7.0, 0.01, 3000.0, profiled=False)]
    outcome = place_fleet(spec(), members(statuses, current=2), None, T0)
    assert outcome.replicas["h200"] == 2 and not outcome.plan.pool("h200").planned


def test_a_joining_pool_takes_no_share_until_a_pod_of_it_is_ready():
    """Under one Service a pool's share is its ready pods' part: a GPU type that just joined (its Deployment
    not created yet, so the reconciliation passes 0 ready) leaves the others' shares where they were, and
    takes its share once its first pod is ready, not a share that comes and goes with its Deployment."""
    statuses = [status("a100", 14.0, 0.02, 3000.0), status("h100", 8.0, 0.012, 3000.0),
                status("h200", 7.0, 0.01, 0.0, profiled=False)]
    joining = members(statuses)
    joining[2] = dataclasses.replace(joining[2], current_replicas=None, ready_replicas=0)
    outcome = place_fleet(spec(), joining, None, T0)
    before = {p.name: p.share for p in place_fleet(spec(), joining[:2], None, T0).plan.pools}
    assert outcome.plan.pool("h200").share == 0.0
    assert {p.name: p.share for p in outcome.plan.pools if p.name != "h200"} == before
    joining[2] = dataclasses.replace(joining[2], current_replicas=1, ready_replicas=1)
    assert place_fleet(spec(), joining, None, T0).plan.pool("h200").share > 0.0


def test_nothing_is_placed_without_load_price_or_a_second_pool():
    quiet = [PoolStatus(name=n, sku=n.upper()) for n in ("a100", "h100")]
    outcome = place_fleet(spec(), members([*quiet, status("h200", 7, 0.01)])[:2], None, T0)
    assert outcome.replicas == {} and "waiting for load metrics" in outcome.fleet.reason
    unpriced = place_fleet(spec(), members(fleet(100.0), prices=(1.8, 0.0, 3.5)), None, T0)
    assert unpriced.replicas == {} and "pricePerGpuHour" in unpriced.fleet.reason
    assert place_fleet(spec(), members(fleet(100.0))[:1], None, T0) is None
    assert place_fleet(spec(autoscaling="none"), members(fleet(100.0)), None, T0) is None
    placed = fleet(100.0)[0]
    write_plan(placed, place_fleet(spec(), members(fleet(100.0)), None, T0).plan, external=False)
    clear_plan(placed)
    assert placed.traffic_share is None and placed.fleet_targets == [] and placed.fleet_reason == ""


def test_an_unchanged_placement_keeps_its_time_so_nothing_is_written():
    statuses = fleet(100.0)
    remembered = members(statuses)
    previous, stamps = None, []
    for step in range(4):
        outcome = place_fleet(spec(), [dataclasses.replace(m, previous=m.status) for m in remembered], previous,
                              T0 + timedelta(seconds=15 * step))
        for pool in remembered:
            write_plan(pool.status, outcome.plan, external=False)
        if previous is not None and outcome.fleet.reason == previous.reason:
            assert outcome.fleet == previous  # the same placement: the same status, so no write
        previous = outcome.fleet
        stamps.append(outcome.fleet.planned_at)
    # the first plan, then the same plan kept as the incumbent (its reason says so once), then unchanged
    assert stamps[-1] == stamps[-2] == stamps[1] and len(set(stamps)) == 2
    moved = place_fleet(spec(), members(fleet(400.0)), previous, T0 + timedelta(seconds=90))
    assert moved.fleet.planned_at == T0 + timedelta(seconds=90)
