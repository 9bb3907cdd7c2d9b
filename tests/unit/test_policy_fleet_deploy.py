"""Deploy-or-not in a fleet placed by cost per token (issue 24): a pool whose engine without speculation holds
more tokens/s within the SLO than with the chosen method serves without it, since the fleet planner pays for
whole replicas sized by that throughput; a pool alone, or one where speculation holds more, keeps its decision."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.api.deployment_spec import Autoscaling, GpuPool, Policy, Serving
from specpilot.policy.choose import decide_pool
from specpilot.policy.comparison import CandidatePlan
from specpilot.policy.load_checks import fleet_capacity_check, slo_capacity_tok_s
from specpilot.policy.planner import fleet_placed
from specpilot.sim.synthetic import Scenario, synthetic_profiles

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
# Per-replica concurrency a fleet running the H100 pool near its capacity observes (the simulator's loose-slo
# scenario at its busy hours).
BUSY = [(64.0, 0.2), (128.0, 0.4), (256.0, 0.4)]


def _decide(slo_ms: float, fleet: bool, min_gain_percent: float = 1.0):
    """EAGLE-3 on an H100 from noise-free profiles: under a 30 ms SLO both engines hold 256 requests, and the
    drafter's KV share and step time leave the engine with it 1.4% fewer tokens/s there (so the test's minimum
    gain is 1%; the default 2% keeps the method)."""
    scenario = Scenario(sku="H100-SXM", model_id=LLAMA, method="eagle3", workload="sharegpt", max_k=4)
    baseline, profile = synthetic_profiles(scenario, noise=0.0, seed=3)
    method = scenario.candidate()
    return decide_pool(Policy(tpot_slo_ms=slo_ms, min_gain_percent=min_gain_percent), [method], baseline,
                       {method.key: profile}, 2.5, 1, concurrency_histogram=BUSY, now=NOW, fleet_placed=fleet)


def test_a_loose_slo_fleet_pool_serves_without_the_drafter_that_costs_it_capacity():
    alone, placed = _decide(30.0, fleet=False), _decide(30.0, fleet=True)
    assert alone.decision.method == "eagle3"  # on its own load the method pays
    assert placed.decision.method is None
    assert "in a fleet placed by cost per token" in placed.decision.reason
    assert "eagle3 would get" in placed.decision.reason
    base, row = placed.candidates[0], next(r for r in placed.candidates if r.key == "eagle3")
    assert slo_capacity_tok_s(base) > slo_capacity_tok_s(row)
    # The capacity the replica planner and the fleet planner size by is the served option's.
    assert placed.capacity_concurrency_per_replica == base.capacity_concurrency
    # Below the minimum gain the pool's own decision stands (a rollout is not worth noise).
    assert _decide(30.0, fleet=True, min_gain_percent=2.0).decision.method == "eagle3"


def test_a_tight_slo_fleet_pool_keeps_speculating_where_it_holds_more_within_the_slo():
    placed = _decide(15.0, fleet=True)
    assert placed.decision.method == "eagle3"
    row = next(r for r in placed.candidates if r.key == "eagle3")
    assert slo_capacity_tok_s(row) > slo_capacity_tok_s(placed.candidates[0])


def _row(key, method, capacity, ms):
    return CandidatePlan(key=key, method=method, ready=True, num_speculative_tokens=0 if method is None else 3,
                         capacity_concurrency=capacity, tpot_ms_at=lambda c, ms=ms: ms)


@settings(max_examples=200, deadline=None)
@given(st.floats(1, 256), st.floats(1, 100), st.floats(1, 256), st.floats(1, 100), st.floats(0, 20))
def test_the_check_only_drops_a_method_that_holds_less_by_the_minimum_gain(c_sd, ms_sd, c_base, ms_base, gain):
    chosen, base = _row("eagle3", "eagle3", c_sd, ms_sd), _row("none", None, c_base, ms_base)
    note = fleet_capacity_check(chosen, base, gain)
    with_sd, without = c_sd * 1000 / ms_sd, c_base * 1000 / ms_base
    assert (note is not None) == (without > with_sd * (1 + max(1e-3, gain / 100)))
    assert fleet_capacity_check(base, base, gain) is None  # no speculation chosen: nothing to drop


def test_a_row_without_a_curve_or_capacity_is_never_dropped():
    base = _row("none", None, 256, 10.0)
    for row in (dataclasses.replace(_row("eagle3", "eagle3", 4, 10.0), tpot_ms_at=None),
                _row("eagle3", "eagle3", 0, 10.0), dataclasses.replace(_row("eagle3", "eagle3", 4, 10.0), ready=False)):
        assert fleet_capacity_check(row, base, 2.0) is None


@pytest.mark.parametrize(("pools", "autoscaling", "placed"), [
    (1, Autoscaling.INTERNAL, False), (2, Autoscaling.INTERNAL, True), (3, Autoscaling.EXTERNAL, True),
    (2, Autoscaling.NONE, False)])
def test_a_deployment_is_fleet_placed_with_two_pools_and_replicas_not_fixed(pools, autoscaling, placed):
    from specpilot.api.deployment_spec import ModelSpec, SpeculativeDeploymentSpec
    from specpilot.api.methods import CandidateMethod

    spec = SpeculativeDeploymentSpec(
        model=ModelSpec(id=LLAMA), methods=[CandidateMethod(method="ngram", num_speculative_tokens=3)],
        gpu_pools=[GpuPool(name=f"p{i}", sku="H100-SXM", price_per_gpu_hour=2.5) for i in range(pools)],
        serving=Serving(autoscaling=autoscaling, min_replicas=1, max_replicas=2))
    assert fleet_placed(spec) is placed


def test_without_a_tpot_slo_the_pools_own_decision_stands():
    """No SLO: a replica's capacity is its batch ceiling, where the drafter's KV share always costs throughput;
    dropping speculation there would drop it from every fleet, so the check needs the SLO it sizes by."""
    scenario = Scenario(sku="H100-SXM", model_id=LLAMA, method="eagle3", workload="sharegpt", max_k=4)
    baseline, profile = synthetic_profiles(scenario, noise=0.0, seed=3)
    method = scenario.candidate()
    plan = decide_pool(Policy(min_gain_percent=0.5), [method], baseline, {method.key: profile}, 2.5, 1,
                       concurrency_histogram=BUSY, now=NOW, fleet_placed=True)
    assert plan.decision.method == "eagle3"
