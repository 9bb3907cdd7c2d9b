"""decide_pool: method choice per pool, strategy, memory, cost and reasons."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from specpilot.api.deployment_spec import Policy
from specpilot.api.profile import ProfilePhase
from specpilot.perf import cost_per_million_tokens
from specpilot.policy.choose import BASELINE_KEY, _pick, decide_pool
from specpilot.policy.comparison import CandidatePlan
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


def _row(key, goodput, method="eagle3", k=4):
    return CandidatePlan(key=key, method=None if key == BASELINE_KEY else method, ready=True,
                         num_speculative_tokens=0 if key == BASELINE_KEY else k, expected_goodput_tok_s=goodput,
                         cost_per_mtok=1e6 / goodput)


@pytest.mark.parametrize("objective", ["goodput", "cost"])
def test_the_served_option_stays_unless_another_beats_it_by_the_minimum_gain(objective):
    rows = [_row(BASELINE_KEY, 1000), _row("eagle3", 1100), _row("ngram", 1120, "ngram")]
    # No incumbent: the best method, since it beats no speculation by more than 2%.
    assert _pick(rows, objective, 2).key == "ngram"
    # eagle3 is served and ngram is only ~2% better: no rollout for that.
    assert _pick(rows, objective, 2, incumbent="eagle3").key == "eagle3"
    # A clear win moves it.
    rows[2] = _row("ngram", 1200, "ngram")
    assert _pick(rows, objective, 2, incumbent="eagle3").key == "ngram"
    # Served and still the best, even if by less than the margin over no speculation: it stays.
    rows = [_row(BASELINE_KEY, 1000), _row("eagle3", 1010)]
    assert _pick(rows, objective, 2).key == BASELINE_KEY
    assert _pick(rows, objective, 2, incumbent="eagle3").key == "eagle3"
    # No speculation is served: a method must beat it by the margin; once it is behind by more, it goes.
    assert _pick(rows, objective, 2, incumbent=None).key == BASELINE_KEY
    rows = [_row(BASELINE_KEY, 1000), _row("eagle3", 970)]
    assert _pick(rows, objective, 2, incumbent="eagle3").key == BASELINE_KEY
    # An incumbent that is no longer usable (profile gone) does not hold anything.
    rows = [_row(BASELINE_KEY, 1000), _row("ngram", 1100, "ngram")]
    assert _pick(rows, objective, 2, incumbent="eagle3").key == "ngram"


def test_observed_load_level_is_the_weighted_median():
    from specpilot.policy.load_checks import observed_load_level

    assert observed_load_level(None) is None and observed_load_level([]) is None
    assert observed_load_level([(4, 10), (100, 1)]) == 4
    assert observed_load_level([(4, 1), (30, 1), (100, 5)]) == 100
    assert observed_load_level([(float("nan"), 5), (8, 1), (0, 3)]) == 8


def test_a_decision_is_revisited_when_load_is_first_seen_and_when_it_moves_a_factor_of_two(pool):
    from datetime import timedelta

    from specpilot.policy.load_checks import revisit_for_load

    baseline, profiles, candidates = pool
    made = decide_pool(Policy(), candidates, baseline, profiles, 2.5, 1, now=NOW).decision
    assert made.load_concurrency is None and "profiled levels" in made.reason
    assert not revisit_for_load(made, None, NOW, 600)  # nothing observed: it stands
    assert revisit_for_load(made, [(8, 1.0)], NOW, 600)  # first observed load: at once
    seen = decide_pool(Policy(), candidates, baseline, profiles, 2.5, 1, concurrency_histogram=[(8, 1.0)],
                       incumbent=made.method, now=NOW).decision
    assert seen.load_concurrency == 8 and "observed load" in seen.reason
    later = NOW + timedelta(seconds=601)
    assert not revisit_for_load(seen, [(12, 1.0)], later, 600)  # moved less than 2x
    assert not revisit_for_load(seen, [(64, 1.0)], NOW + timedelta(seconds=60), 600)  # within the cooldown
    assert revisit_for_load(seen, [(64, 1.0)], later, 600)
    assert revisit_for_load(seen, [(3, 1.0)], later, 600)
    waiting = seen.model_copy(update={"source": "none"})
    assert not revisit_for_load(waiting, [(64, 1.0)], later, 600)  # not a profile decision


def test_the_decision_says_how_precisely_the_profile_places_the_crossover():
    profiles, candidates = {}, []
    for method in ("eagle3", "ngram"):
        baseline, profile = synthetic_profiles(Scenario("H100-SXM", MODEL, method), noise=0.05, seed=1)
        profiles[profile.spec.method.key] = profile
        candidates.append(profile.spec.method)
    plan = decide_pool(Policy(), candidates, baseline, profiles, 2.5, 1, now=NOW)
    d = plan.decision
    assert d.method == "eagle3" and d.crossover_concurrency is not None
    rows = {r.key: r for r in plan.candidates}
    assert d.crossover_uncertainty_percent == pytest.approx(rows["eagle3"].crossover_gain_se * 100, abs=0.01)
    assert 1.0 < d.crossover_uncertainty_percent < 6.0  # 5% noise per level
    assert f"known to ±{d.crossover_uncertainty_percent:.1f}%" in d.reason
    assert rows["ngram"].crossover_gain_se is not None

    # noise-free profiles: the crossover is exact
    baseline, exact = synthetic_profiles(Scenario("H100-SXM", MODEL, "ngram"), noise=0.0)
    d = decide_pool(Policy(), [exact.spec.method], baseline, {exact.spec.method.key: exact}, 2.5, 1, now=NOW).decision
    assert d.crossover_concurrency is not None and d.crossover_uncertainty_percent < 0.5
