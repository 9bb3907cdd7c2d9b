"""The decision-quality benchmark's own scoring (benchmarks/decision_quality.py): its figures back the
closing notes, so the ideal planner and the expectation over draws are checked here."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.decision_quality import in_expectation, score, score_ks
from specpilot.api.deployment_spec import DEFAULT_CONCURRENCY_LEVELS
from specpilot.sim.synthetic import Scenario, true_curves

SCENARIO = Scenario("H100-SXM", "Qwen/Qwen3-8B", "eagle3")
LEVELS = tuple(DEFAULT_CONCURRENCY_LEVELS)


@pytest.fixture(scope="module")
def truth():
    return true_curves(SCENARIO, 256)


def test_the_ideal_planner_on_a_noise_free_profile_is_the_oracle(truth):
    s = score(SCENARIO, truth, noise=0.0, seed=0, min_gain_percent=0.0, levels=LEVELS, ideal=True)
    assert s.worst == pytest.approx(1.0)
    assert s.mean == pytest.approx(1.0)


def test_the_ideal_planner_pays_for_noise_but_never_speculates_at_a_loss_beyond_the_noise(truth):
    draws = [score(SCENARIO, truth, noise=0.05, seed=seed, min_gain_percent=2.0, levels=LEVELS, ideal=True)
             for seed in range(4)]
    assert min(d.worst for d in draws) < 1.0  # noise moves its crossover
    assert all(d.vs_sd_off > 0.95 for d in draws)


def test_scores_of_a_fixed_k_and_their_expectation(truth):
    off = score_ks([0] * 256, truth, 2.0)
    assert off.vs_sd_off == pytest.approx(1.0)
    assert off.worst < 0.7  # EAGLE-3 on H100 gains well over 40% at low load
    always = score_ks([4] * 256, truth, 2.0)
    expected = in_expectation({(SCENARIO, 0): off, (SCENARIO, 1): always})[SCENARIO]
    averaged = [(a + b) / 2 for a, b in zip(off.to_oracle, always.to_oracle, strict=True)]
    assert expected.worst == pytest.approx(min(averaged))
    assert expected.worst_at == averaged.index(min(averaged)) + 1
    assert expected.mean == pytest.approx(sum(averaged) / 256)
    assert expected.vs_sd_off == pytest.approx(
        min((a + b) / 2 for a, b in zip(off.to_sd_off, always.to_sd_off, strict=True)))


def test_refinement_is_simulated_as_a_refinement_job_measures(truth):
    from benchmarks.decision_quality import ENGINE_START_S, refined, score_refined

    # noise-free: nothing is uncertain, nothing is measured again
    plan, first, extra, rounds = refined(SCENARIO, 0.0, 0, 2.0, LEVELS, 2, 1.0)
    assert rounds == 0 and extra.engine_starts == 0 and extra.levels == 0 and extra.seconds == 0
    assert first.engine_starts == 3 and first.levels == 3 * len(LEVELS)
    assert first.seconds > 3 * ENGINE_START_S
    # noisy: the requested levels are re-drawn and appended, at one engine start per profile and k
    plan, first, extra, rounds = refined(SCENARIO, 0.05, 3, 2.0, LEVELS, 1, 1.0)
    assert rounds == 1 and 1 <= extra.engine_starts <= 3
    assert 0 < extra.levels <= first.levels  # the budget: the first sweep's levels
    repeated = [run for run in plan.surface.curves if max(run.counts) > 1]
    assert repeated  # the repeated levels count as more measurements in the fit
    s, first_again, extra_again = score_refined(SCENARIO, truth, 0.05, 3, 2.0, LEVELS, 1, 1.0)
    assert (first_again, extra_again) == (first, extra) and 0.9 < s.worst <= 1.0


def test_the_restated_targets_read_the_scores():
    from benchmarks.decision_quality import Cost, restated

    truth_ = true_curves(SCENARIO, 256)
    good = score_ks([truth_.oracle_k(c) for c in range(1, 257)], truth_, 2.0)
    expected = in_expectation({(SCENARIO, 0): good})
    text, met = restated(expected, {(SCENARIO, 0): good},
                         {(SCENARIO, 0): (Cost(3, 36, 1000.0), Cost(2, 10, 300.0))})
    assert met and "per-draw worst >= 0.97 in 100.0% of 1" in text and "+30.0%" in text
    text, met = restated(expected, {(SCENARIO, 0): good},
                         {(SCENARIO, 0): (Cost(3, 36, 1000.0), Cost(4, 40, 600.0))})
    assert not met  # +60% profiling time


def test_each_scenario_draws_its_own_noise():
    """Draw n of every scenario used to share one noise sequence, so similar scenarios (the two 8B models)
    missed or met the bars together and the printed standard error did not hold."""
    from benchmarks.decision_quality import _profiles, draw_seed

    llama = Scenario("H100-SXM", "meta-llama/Llama-3.1-8B-Instruct", "eagle3")

    def noise(scenario, seed):
        noisy, _ = _profiles(scenario, 0.05, seed, LEVELS)
        clean, _ = _profiles(scenario, 0.0, seed, LEVELS)
        return [a.request_throughput / b.request_throughput
                for a, b in zip(noisy.status.run(0).points, clean.status.run(0).points, strict=True)]

    assert draw_seed(SCENARIO, 0) == draw_seed(SCENARIO, 0)
    assert draw_seed(SCENARIO, 0) != draw_seed(llama, 0) != draw_seed(llama, 1)
    assert noise(SCENARIO, 0) == noise(SCENARIO, 0)  # reproducible
    assert noise(SCENARIO, 0) != pytest.approx(noise(llama, 0), rel=1e-3)
    assert noise(llama, 0) != pytest.approx(noise(llama, 1), rel=1e-3)


def test_a_scenario_is_refined_with_its_pool_whose_fits_share_the_knee(monkeypatch):
    """As the operator refines a pool: every method of the scenario's pool is refined in the same round and
    planned again on what all of them measured, each fit weighing the others' evidence of the knee."""
    import benchmarks.decision_quality as dq

    pool = dq._refined_pool(SCENARIO, 0.05, 5, 0.0, LEVELS, 1, 2.0)
    assert set(pool) == set(dq.METHODS)
    for method, (plan, first, extra, rounds) in pool.items():
        assert plan.surface.fit.shared_prior in ("used", "refused")
        assert dq.refined(dataclasses.replace(SCENARIO, method=method), 0.05, 5, 0.0, LEVELS, 1, 2.0) == \
            (plan, first, extra, rounds)
    refined_somewhere = [m for m, (_, _, extra, _) in pool.items() if extra.levels > 0]
    assert refined_somewhere
    # on its own (--no-shared-knee), nothing is pooled: the same draws, fits without the others' evidence
    monkeypatch.setattr(dq, "SHARED_KNEE", False)
    alone = dq._refined_pool.__wrapped__(SCENARIO, 0.05, 5, 0.0, LEVELS, 1, 2.0)
    assert all(plan.surface.fit.shared_prior == "none" for plan, *_ in alone.values())
    assert {m: first for m, (_, first, _, _) in alone.items()} == {m: first for m, (_, first, _, _) in pool.items()}
