"""The decision benchmark's check of the method choice with no load known (issue 29): its scenarios, its case
class and its scoring, so that the figures in docs/decisions.md rest on what they say."""

from __future__ import annotations

import pytest

from benchmarks.decision_quality import (
    ScaledScenario,
    Scenario,
    cheap_and_gaining,
    true_curves,
    unknown_load_outcome,
    unknown_load_report,
    unknown_load_scenarios,
)
from specpilot.api.deployment_spec import DEFAULT_CONCURRENCY_LEVELS

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
LEVELS = tuple(DEFAULT_CONCURRENCY_LEVELS)


def test_weaker_drafters_scale_the_acceptance_and_keep_the_plain_engine():
    full = Scenario("H100-SXM", LLAMA, "ngram")
    weak = ScaledScenario("H100-SXM", LLAMA, "ngram", acceptance_scale=0.4)
    assert weak.twin().acceptance.tokens_per_step(4) - 1 == pytest.approx(
        0.4 * (full.twin().acceptance.tokens_per_step(4) - 1))
    assert true_curves(weak).baseline_goodput_tok_s == true_curves(full).baseline_goodput_tok_s
    assert weak.label().endswith("ngram/sharegpt x0.4") and full.label().endswith("ngram/sharegpt")
    scenarios = unknown_load_scenarios()
    assert len(scenarios) == 108 and len(set(scenarios)) == 108


def test_the_case_class_is_a_cheap_method_gaining_five_percent_somewhere():
    assert cheap_and_gaining(true_curves(Scenario("H100-SXM", LLAMA, "ngram")), LEVELS)
    assert cheap_and_gaining(true_curves(ScaledScenario("H100-SXM", LLAMA, "ngram", acceptance_scale=0.4)),
                             LEVELS)  # +6% at 1, nothing from 96 on
    assert not cheap_and_gaining(true_curves(ScaledScenario("H100-SXM", LLAMA, "ngram", acceptance_scale=0.3)),
                                 LEVELS)  # +2% at most
    assert not cheap_and_gaining(true_curves(Scenario("H100-SXM", LLAMA, "draft_model")), LEVELS)  # costs off


def test_an_outcome_scores_what_was_deployed_on_the_truth():
    scenario = ScaledScenario("H100-SXM", LLAMA, "ngram", acceptance_scale=0.4)
    truth = true_curves(scenario)
    outcome = unknown_load_outcome(scenario, truth, 0.0, 0, 2.0, LEVELS)
    assert outcome.cheap and outcome.deployed == (True, True) and outcome.speculates == (True, True)
    assert outcome.value[0] == outcome.best[0] > 1.01  # about +1.9% averaged over the levels
    assert outcome.lowest[0] == pytest.approx(1.0, abs=1e-3)  # off where it does not pay: the plain engine
    figures = unknown_load_report({(scenario, 0): outcome}, 0)
    assert figures["cheap"] == 1 and figures["cheap_dropped"] == 0 and figures["cheap_regret"] == 0.0
    draft = ScaledScenario("H100-SXM", LLAMA, "draft_model", acceptance_scale=0.4)
    outcome = unknown_load_outcome(draft, true_curves(draft), 0.0, 0, 2.0, LEVELS)
    assert not outcome.cheap and outcome.deployed == (False, False) and outcome.value == (1.0, 1.0)
    assert outcome.best[0] - outcome.value[0] < 0.003  # it would have netted about +0.2%


def test_the_method_choice_is_read_from_what_the_operators_decision_deploys():
    """decided_vs_plain scores what plan_deployment applies at each observed load: the same method and K at every
    batch size as the pool chooser it runs picks for that load (the operator adds nothing on top of it here)."""
    from benchmarks.decision_quality import MAX_CONCURRENCY, _profiles, deployed_k
    from specpilot.api.deployment_spec import Policy
    from specpilot.policy.choose import decide_pool

    for method in ("eagle3", "ngram"):  # ngram at 128: the plain engine
        scenario = Scenario("H100-SXM", LLAMA, method)
        baseline, profile = _profiles(scenario, 0.05, 0, LEVELS)
        candidate = scenario.candidate()
        for load in (4, 128):
            k_of = deployed_k(scenario, baseline, profile, load, 2.0)
            plan = decide_pool(Policy(min_gain_percent=2.0), [candidate], baseline, {candidate.key: profile},
                               price_per_gpu_hour=1.0, gpus_per_replica=1,
                               concurrency_histogram=[(float(load), 1.0)], max_batch_size=MAX_CONCURRENCY)
            row = next(r for r in plan.candidates if r.key == candidate.key)
            assert (k_of is None) == (plan.decision.method is None) == (method == "ngram" and load == 128)
            if k_of is not None:
                assert [k_of(c) for c in (1, 8, 64, 256)] == [row.schedule.k_at(c) for c in (1, 8, 64, 256)]
