"""The decision-quality benchmark's own scoring (benchmarks/decision_quality.py): its figures back the
closing notes, so the ideal planner and the expectation over draws are checked here."""

from __future__ import annotations

import pytest

from benchmarks.decision_quality import in_expectation, score, score_ks
from specpilot.api.deployment import DEFAULT_CONCURRENCY_LEVELS
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
