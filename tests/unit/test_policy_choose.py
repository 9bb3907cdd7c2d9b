"""decide_pool: method choice per pool, strategy, memory, cost and reasons."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from specpilot.api.deployment import Policy
from specpilot.api.profile import ProfilePhase
from specpilot.perf import cost_per_million_tokens
from specpilot.policy.choose import BASELINE_KEY, CandidatePlan, _pick, decide_pool
from specpilot.sim.synthetic import Scenario, synthetic_profiles

NOW = datetime(2026, 1, 1, tzinfo=UTC)
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _pool(methods, workload="sharegpt", sku="H100-SXM"):
    profiles, candidates, baseline = {}, [], None
    for method in methods:
        baseline, profile = synthetic_profiles(Scenario(sku, MODEL, method, workload), noise=0.0)
        profiles[profile.spec.method.key] = profile
        candidates.append(profile.spec.method)
    return baseline, profiles, candidates


@pytest.fixture(scope="module")
def pool():
    return _pool(["eagle3", "ngram", "suffix"])


def test_picks_the_best_method_with_a_filled_decision(pool):
    baseline, profiles, candidates = pool
    plan = decide_pool(Policy(), candidates, baseline, profiles, 2.5, 1, now=NOW)
    d = plan.decision
    assert d.method == "eagle3" and d.strategy == "dynamic" and d.source == "profile"
    assert d.num_speculative_tokens == max(r.num_speculative_tokens for r in d.schedule)
    assert d.schedule_summary.startswith("1-") and d.decided_at == NOW
    assert d.expected_speedup > 1.2
    assert "eagle3 beats" in d.reason and "over no speculation" in d.reason
    assert plan.capacity_concurrency_per_replica == 256
    assert [r.key for r in plan.candidates] == ["baseline", "eagle3", "ngram", "suffix"]


def test_cost_figures_follow_the_formula(pool):
    baseline, profiles, candidates = pool
    plan = decide_pool(Policy(), candidates, baseline, profiles, 3.0, 2, now=NOW)
    for row in plan.candidates:
        assert row.cost_per_mtok == pytest.approx(cost_per_million_tokens(3.0, 2, row.expected_goodput_tok_s))
        assert row.cost_per_mtok == pytest.approx(3.0 * 2 / (3600 * row.expected_goodput_tok_s) * 1e6)
    chosen = next(r for r in plan.candidates if r.key == plan.decision.method)
    assert plan.decision.cost_per_mtok_with_sd == pytest.approx(chosen.cost_per_mtok)
    assert plan.decision.cost_per_mtok_without_sd == pytest.approx(plan.candidates[0].cost_per_mtok)


def test_suffix_takes_the_restart_strategy_and_so_does_an_engine_without_schedules(pool):
    baseline, profiles, candidates = pool
    suffix = [c for c in candidates if c.key == "suffix"]
    plan = decide_pool(Policy(), suffix, baseline, profiles, 2.5, 1, now=NOW)
    assert plan.decision.method == "suffix" and plan.decision.strategy == "restart"
    assert plan.decision.schedule == [] and plan.decision.num_speculative_tokens >= 1
    eagle = [c for c in candidates if c.key == "eagle3"]
    plan = decide_pool(Policy(), eagle, baseline, profiles, 2.5, 1, engine_supports_dynamic=False, now=NOW)
    assert plan.decision.strategy == "restart"
    plan = decide_pool(Policy(strategy="restart"), eagle, baseline, profiles, 2.5, 1, now=NOW)
    assert plan.decision.strategy == "restart" and "toggled by rollout" in plan.decision.reason


def test_restart_keeps_speculation_on_only_while_it_beats_the_plain_engine_by_the_minimum_gain():
    """Off under the restart strategy is a rollout to the plain engine (no drafter), so the crossover is where
    speculating stops beating that engine by minGainPercent, not the drafter-loaded engine's own k=0."""
    from specpilot.policy.surface import build_baseline, build_surface

    baseline, profiles, candidates = _pool(["draft_model"])
    policy = Policy(strategy="restart", min_gain_percent=2)
    plan = decide_pool(policy, candidates, baseline, profiles, 2.5, 1, now=NOW)
    d = plan.decision
    assert d.strategy == "restart" and d.crossover_concurrency
    row = next(r for r in plan.candidates if r.key == d.method)
    plain = build_baseline(baseline.status.run(0))
    surface = build_surface(baseline.status.run(0), profiles[d.method].status.runs)
    for c in range(1, row.crossover_concurrency + 1):
        assert surface.goodput(d.num_speculative_tokens, c) >= 1.02 * plain.goodput(c), c


def test_picks_the_baseline_when_every_method_loses(pool):
    baseline, profiles, candidates = pool
    high_load = Policy(expected_concurrency=[{"concurrency": 2000, "weight": 1}], min_gain_percent=50)
    plan = decide_pool(high_load, candidates, baseline, profiles, 2.5, 1, now=NOW)
    assert plan.decision.method is None and plan.decision.expected_speedup == 1.0
    assert plan.decision.reason.startswith("no speculation")


def test_draft_model_memory_caps_concurrency():
    baseline, profiles, candidates = _pool(["draft_model"], workload="json-extraction", sku="L40S")
    plan = decide_pool(Policy(), candidates, baseline, profiles, 1.0, 1, now=NOW)
    base_row, draft_row = plan.candidates
    assert draft_row.kv_max_concurrency < base_row.kv_max_concurrency
    assert plan.capacity_concurrency_per_replica <= next(
        r.kv_max_concurrency for r in plan.candidates if r.key == (plan.decision.method or "baseline"))


def test_observed_histogram_and_live_acceptance(pool):
    baseline, profiles, candidates = pool
    low = decide_pool(Policy(), candidates, baseline, profiles, 2.5, 1, concurrency_histogram=[(1, 1.0)], now=NOW)
    assert "observed load" in low.decision.reason
    worse = decide_pool(Policy(), candidates, baseline, profiles, 2.5, 1, concurrency_histogram=[(1, 1.0)],
                        live_acceptance={"eagle3": ([0.2, 0.05, 0.01, 0.0], 1.0)}, now=NOW)
    eagle_low = next(r for r in low.candidates if r.key == "eagle3")
    eagle_live = next(r for r in worse.candidates if r.key == "eagle3")
    assert eagle_live.expected_goodput_tok_s < eagle_low.expected_goodput_tok_s
    if worse.decision.method == "eagle3":
        assert worse.decision.source == "live-acceptance"


def test_missing_baseline_or_unready_profiles_hold_speculation_off(pool):
    baseline, profiles, candidates = pool
    plan = decide_pool(Policy(), candidates, None, {}, 2.5, 1, now=NOW)
    assert plan.decision.method is None and plan.decision.source == "none"
    assert "not enough data" in plan.decision.reason
    pending = profiles["eagle3"].model_copy(deep=True)
    pending.status.phase = ProfilePhase.RUNNING.value
    plan = decide_pool(Policy(), candidates[:1], baseline, {"eagle3": pending}, 2.5, 1, now=NOW)
    assert plan.decision.method is None and "not ready: eagle3" in plan.decision.reason



def test_a_method_must_beat_no_speculation_by_the_minimum_gain():
    """Deploying a method at all (vs the plain engine, where the drafter's own cost is weighed) is the pool's
    choice: it needs minGainPercent over the expected load, by goodput or by $/Mtok; ties keep the baseline."""
    base = CandidatePlan(key=BASELINE_KEY, method=None, ready=True, expected_goodput_tok_s=100.0, cost_per_mtok=1.0)
    method = CandidatePlan(key="eagle3", method="eagle3", ready=True, num_speculative_tokens=3,
                           expected_goodput_tok_s=101.5, cost_per_mtok=1.0 / 1.015)
    for objective in ("goodput", "cost"):
        assert _pick([base, method], objective, 1.0) is method
        assert _pick([base, method], objective, 2.0) is base
    tie = dataclasses.replace(method, expected_goodput_tok_s=100.0, cost_per_mtok=1.0)
    assert _pick([base, tie], "goodput", 0.0) is base and _pick([base, tie], "cost", 0.0) is base
