"""The operator's fleet placement sized to the SLO attainment: the demand history, change times and calibration go
through the deployment's status (as a restarted operator reads them back) and the forecast shows in it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from specpilot.api.deployment_spec import GpuPool, SpeculativeDeploymentSpec
from specpilot.api.deployment_status import (
    Decision,
    FleetStatus,
    ObservedLoad,
    PoolStatus,
    TpotPoint,
)
from specpilot.policy.fleet import DEFAULT_LEAD_TIME_S
from specpilot.policy.placement import FleetMember, clear_plan, place_fleet, write_plan

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEVELS = (1, 2, 4, 8, 16, 32, 64, 128)
POOLS = (("a100", 14.0, 0.02, 1.8), ("h100", 8.0, 0.012, 2.5), ("h200", 7.0, 0.01, 3.5))


def spec() -> SpeculativeDeploymentSpec:
    return SpeculativeDeploymentSpec.model_validate({
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
        "methods": [{"method": "ngram", "numSpeculativeTokens": 4}],
        "gpuPools": [{"name": n, "nodeSelector": {"pool": n}} for n, *_ in POOLS],
        "policy": {"tpotSloMs": 30, "sloAttainmentPercent": 99},
        "serving": {"minReplicas": 0, "maxReplicas": 16, "scaleDownStabilizationSeconds": 0}})


def status(name: str, base_ms: float, slope: float, tokens: float, tpot_p95_ms: float | None = None) -> PoolStatus:
    curve = [TpotPoint(concurrency=c, ms=base_ms * (1 + slope * c)) for c in LEVELS]
    return PoolStatus(name=name, sku=name.upper(), replicas=1, capacity_concurrency_per_replica=128.0,
                      decision=Decision(method="ngram", source="profile", tpot_curve=curve),
                      observed=ObservedLoad(concurrency=16.0, waiting=0.0, requests_in_flight=16.0,
                                            generation_tokens_per_second=tokens, tpot_p95_ms=tpot_p95_ms))


def reread(model):
    """The status as the API server gives it back: JSON, by its wire names."""
    return type(model).model_validate(model.model_dump(mode="json", by_alias=True, exclude_none=True))


def step(demand_each: float, previous_pools: dict[str, PoolStatus], previous_fleet: FleetStatus | None, now,
         current: dict[str, int], tpot_p95_ms: float | None = None, lead: float | None = None):
    # the deployment's demand (demand_each per pool) as the pools that run observe it: a pool with no replica
    # ready serves nothing and reports nothing (its last observation is no demand now)
    running = [n for n, *_ in POOLS if current.get(n, 1) > 0]
    each = demand_each * len(POOLS) / len(running)
    statuses = [status(n, b, s, each if n in running else 0.0, tpot_p95_ms) for n, b, s, _ in POOLS]
    members = [FleetMember(spec=GpuPool(name=st.name, node_selector={"pool": st.name}), status=st,
                           previous=previous_pools.get(st.name), price_per_gpu_hour=price, gpus_available=None,
                           current_replicas=current.get(st.name, 1), ready_replicas=current.get(st.name, 1),
                           per_pool_replicas=None, lead_time_seconds=lead)
               for st, (_, _, _, price) in zip(statuses, POOLS, strict=True)]
    outcome = place_fleet(spec(), members, previous_fleet, now)
    for st in statuses:
        write_plan(st, outcome.plan, external=False)
    return outcome, {st.name: reread(st) for st in statuses}, reread(outcome.fleet)


def run(demands, **kw):
    pools, fleet, current, outcomes = {}, None, {}, []
    for i, d in enumerate(demands):
        outcome, pools, fleet = step(d, pools, fleet, T0 + timedelta(seconds=30 * i), current, **kw)
        current = dict(outcome.replicas)
        outcomes.append((outcome, fleet, pools))
    return outcomes


def test_the_forecast_and_its_history_go_through_the_status():
    outcomes = run([2000.0] * 6 + [6000.0] * 4 + [2000.0] * 10)
    outcome, fleet, pools = outcomes[-1]
    assert fleet.demand_history and fleet.lead_time_seconds == DEFAULT_LEAD_TIME_S
    assert fleet.forecast_tokens_per_second >= 3 * 6000.0 * 0.99 > fleet.demand_tokens_per_second
    assert fleet.headroom_percent > 100.0 and "swings seen" in fleet.reason
    # the burst seen keeps the replicas it took, read back from the status at every step
    peak = sum(outcomes[9][0].replicas.values())
    assert sum(outcome.replicas.values()) >= peak
    assert any(p.fleet_changes for p in pools.values())


def test_a_measured_lead_time_is_what_the_forecast_looks_ahead():
    outcome, fleet, _ = run([2000.0, 2100.0, 2200.0], lead=300.0)[-1]
    assert fleet.lead_time_seconds == 300.0


def test_the_calibration_is_kept_per_pool_and_cleared_with_the_plan():
    _, _, pools = run([4000.0] * 3, tpot_p95_ms=40.0)[-1]
    assert all(p.fleet_tpot_scale is not None and p.fleet_tpot_scale > 1.0 for p in pools.values())
    placed = next(iter(pools.values())).model_copy()
    clear_plan(placed)
    assert placed.fleet_tpot_scale is None and placed.fleet_changes == []


def test_a_metrics_outage_keeps_the_demand_history_for_the_forecast_after_it():
    outcome, fleet, pools = run([2000.0] * 6 + [6000.0] * 4)[-1]
    assert fleet.demand_history
    unobserved = [PoolStatus(name=n, sku=n.upper(), replicas=1) for n, *_ in POOLS]
    members = [FleetMember(spec=GpuPool(name=st.name, node_selector={"pool": st.name}), status=st,
                           previous=pools[st.name], price_per_gpu_hour=price, gpus_available=None, current_replicas=1,
                           ready_replicas=1, per_pool_replicas=None)
               for st, (_, _, _, price) in zip(unobserved, POOLS, strict=True)]
    waiting = place_fleet(spec(), members, fleet, T0 + timedelta(minutes=10))
    assert waiting.fleet.reason.startswith("waiting for load metrics")
    assert reread(waiting.fleet).demand_history == fleet.demand_history


def test_a_deployment_without_a_history_forecasts_from_the_one_its_metrics_hold():
    statuses = [status(n, b, s, 1000.0) for n, b, s, _ in POOLS]
    members = [FleetMember(spec=GpuPool(name=st.name, node_selector={"pool": st.name}), status=st, previous=None,
                           price_per_gpu_hour=price, gpus_available=None, current_replicas=1, ready_replicas=1,
                           per_pool_replicas=None)
               for st, (_, _, _, price) in zip(statuses, POOLS, strict=True)]
    # half an hour of the deployment's demand as Prometheus holds it: 3000 tok/s with a burst to 9000
    held = [(T0 - timedelta(seconds=30 * i), 9000.0 if 20 <= i < 24 else 3000.0) for i in range(60)]
    cold = place_fleet(spec(), members, None, T0)
    warm = place_fleet(spec(), members, None, T0, seed=held)
    assert cold.fleet.forecast_tokens_per_second == 3000.0  # three pools observed at 1000 each
    assert warm.fleet.forecast_tokens_per_second == 9000.0  # the burst it has seen within the half hour
    assert warm.fleet.demand_history and warm.fleet.demand_history[0].time < T0
    assert sum(warm.replicas.values()) > sum(cold.replicas.values())
    # a history of its own wins over the metrics', and samples from the future or unreadable ones count for nothing
    own = place_fleet(spec(), members, cold.fleet, T0 + timedelta(seconds=15), seed=held)
    assert own.fleet.forecast_tokens_per_second == 3000.0
    forged = [(T0 + timedelta(seconds=5), 1e9), (T0 - timedelta(seconds=5), float("nan")),
              (T0 - timedelta(seconds=10), -5.0), (T0 - timedelta(seconds=20), float("inf"))]
    assert place_fleet(spec(), members, None, T0, seed=forged).fleet.forecast_tokens_per_second == 3000.0
