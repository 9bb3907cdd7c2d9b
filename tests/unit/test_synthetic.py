"""Synthetic profiles from the twin: shape of what the benchmark would write, noise, and true curves."""

from __future__ import annotations

import pytest

from specpilot.api.deployment_spec import DEFAULT_CONCURRENCY_LEVELS
from specpilot.api.profile import SpeculationProfile
from specpilot.policy.surface import build_surface
from specpilot.sim.synthetic import Scenario, synthetic_profiles, true_curves

SCENARIO = Scenario("H100-SXM", "meta-llama/Llama-3.1-8B-Instruct", "eagle3", "sharegpt")


def test_profiles_look_like_benchmark_output_and_round_trip():
    baseline, method = synthetic_profiles(SCENARIO, noise=0.0)
    assert baseline.spec.method is None and [r.num_speculative_tokens for r in baseline.status.runs] == [0]
    assert [r.num_speculative_tokens for r in method.status.runs] == [1, 4]
    assert method.status.phase == "Succeeded" and method.status.kv_capacity_tokens < baseline.status.kv_capacity_tokens
    assert [p.concurrency for p in method.status.runs[1].points] == DEFAULT_CONCURRENCY_LEVELS
    assert len(method.status.runs[1].points[0].accepted_per_position) == 4
    assert SpeculationProfile.model_validate(method.dump()) == method


def test_noiseless_profile_recovers_the_twin_at_every_k_and_concurrency():
    baseline, method = synthetic_profiles(SCENARIO, noise=0.0)
    truth = true_curves(SCENARIO, 256)
    surface = build_surface(baseline.status.run(0), method.status.runs)
    assert surface.fit is not None
    # the roofline fit reproduces the measured runs and predicts the unmeasured k = 2, 3 between levels and
    # beyond the last level (128), where the twin turns compute-bound
    for c in (1, 8, 24, 64, 100, 128, 192, 256):
        for k in range(5):
            assert surface.goodput(k, c) == pytest.approx(truth.goodput_tok_s[k][c - 1], rel=0.01), (k, c)
        assert surface.baseline_goodput(c) == pytest.approx(truth.baseline_goodput_tok_s[c - 1], rel=0.01)
    assert surface.tokens_per_step[4] == pytest.approx(SCENARIO.twin().tokens_per_step(4), rel=0.02)


def test_noise_is_seeded():
    a = synthetic_profiles(SCENARIO, noise=0.05, seed=3)[1]
    b = synthetic_profiles(SCENARIO, noise=0.05, seed=3)[1]
    c = synthetic_profiles(SCENARIO, noise=0.05, seed=4)[1]
    throughput = lambda p: [x.output_throughput for x in p.status.runs[1].points]  # noqa: E731
    assert throughput(a) == throughput(b) != throughput(c)


def test_true_curves_oracle():
    truth = true_curves(SCENARIO, 256)
    assert truth.oracle_k(1) == 4 and truth.oracle_k(256) <= 1
    assert len(truth.goodput_tok_s[0]) == 256
