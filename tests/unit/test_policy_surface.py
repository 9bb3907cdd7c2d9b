"""The goodput surface: E_k from counters, step times from throughput, the roofline fit or interpolation,
and live acceptance."""

from __future__ import annotations

import math

import pytest

from specpilot.api.profile import Acceptance, LatencyStats, LevelPoint, Run
from specpilot.policy.surface import (
    NotEnoughDataError,
    acceptance_from_run,
    build_surface,
    with_live_acceptance,
)


def _run(k: int, throughput: dict[int, float], **counters) -> Run:
    return Run(num_speculative_tokens=k, points=[
        LevelPoint(concurrency=c, output_throughput=t, completed=10, tpot_ms=LatencyStats(p50=1000 * c / t),
                   **counters) for c, t in throughput.items()])


# three levels per run: too few for the roofline fit (it needs four), so step times are interpolated
BASE = _run(0, {1: 100.0, 8: 700.0, 64: 3200.0})
K1 = _run(1, {1: 150.0, 8: 1000.0, 64: 3300.0}, num_drafts=1000, accepted_per_position=[800])
K3 = _run(3, {1: 200.0, 8: 1200.0, 64: 3000.0}, num_drafts=1000, accepted_per_position=[800, 600, 400])


def test_tokens_per_step_from_counters_and_interpolated_steps_reproduce_measured_throughput():
    surface = build_surface(BASE, [K1, K3])
    assert surface.fit is None and any("interpolated" in note for note in surface.notes)
    assert surface.tokens_per_step == pytest.approx((1.0, 1.8, 2.4, 2.8))
    for c, t in {1: 100.0, 8: 700.0, 64: 3200.0}.items():
        assert surface.goodput(0, c) == pytest.approx(t)
    for c, t in {1: 200.0, 8: 1200.0, 64: 3000.0}.items():
        assert surface.goodput(3, c) == pytest.approx(t)
    assert surface.speedup(3, 64) < 1 < surface.speedup(3, 1)


def test_middle_k_interpolates_step_time_between_k1_and_kmax_not_from_k0():
    surface = build_surface(BASE, [K1, K3])
    s1, s3 = surface.step_s(1, 8), surface.step_s(3, 8)
    assert surface.step_s(2, 8) == pytest.approx((s1 + s3) / 2)
    assert surface.goodput(2, 8) == pytest.approx(8 * 2.4 / ((s1 + s3) / 2))
    assert surface.step_s(0, 8) == pytest.approx(8 / 700.0)


def test_between_levels_and_beyond_the_last_level():
    surface = build_surface(BASE, [K1, K3])
    assert 700.0 < surface.goodput(0, 20) < 3200.0
    # beyond the last level no k speculates more profitably than at the edge
    for k in (1, 2, 3):
        assert surface.speedup(k, 200) <= surface.speedup(k, 64) + 1e-9


def test_ngram_drafts_per_step_from_generation_tokens():
    run = _run(2, {1: 100.0}, num_drafts=300, accepted_per_position=[150, 90], generation_tokens=1250)
    p, f = acceptance_from_run(run, model_drafter=False)
    assert p == pytest.approx([0.5, 0.3])
    # request-steps = 1250 generated - 240 accepted - 10 first tokens = 1000
    assert f == pytest.approx(0.3)
    assert acceptance_from_run(run, model_drafter=True)[1] == 1.0


def test_acceptance_falls_back_to_the_aggregate_and_is_made_non_increasing():
    run = Run(num_speculative_tokens=3, points=[LevelPoint(concurrency=1, output_throughput=10.0)],
              acceptance=Acceptance(per_position=[0.5, 0.7, 0.2], drafts_per_step=0.5))
    p, f = acceptance_from_run(run, model_drafter=False)
    assert p == [0.5, 0.5, 0.2] and f == 0.5


def test_live_acceptance_keeps_step_times():
    surface = build_surface(BASE, [K1, K3])
    live = with_live_acceptance(surface, [0.4, 0.3, 0.2], 1.0)
    assert live.decode_step_s(3, 8) == pytest.approx(surface.decode_step_s(3, 8))
    assert live.tokens_per_step[3] == pytest.approx(1.9)
    assert live.goodput(3, 8) < surface.goodput(3, 8)


def test_missing_data_is_named():
    with pytest.raises(NotEnoughDataError, match="baseline"):
        build_surface(_run(0, {}), [K1, K3])
    with pytest.raises(NotEnoughDataError, match="speculative run"):
        build_surface(BASE, [])
    with pytest.raises(NotEnoughDataError, match="acceptance"):
        build_surface(BASE, [_run(2, {1: 150.0})])


def test_without_a_k1_run_only_measured_k_are_offered():
    surface = build_surface(BASE, [K3])
    assert surface.available_k() == (0, 3)
    assert any("k=1" in note for note in surface.notes)


def _roofline_runs(prefill_s: float = 0.0, noise: dict[tuple[int, int], float] | None = None,
                   per_sequence: dict[int, float] | None = None) -> list[Run]:
    """Runs generated from the surface's own model: d_k(b) = a_k + m_k b + w max(0, q_k b / N - 1), 256 output
    tokens per request, N = 200 verified tokens, f = 1 (q_k = 1 + k), acceptance 0.8, 0.6, 0.4; m_k linear
    in k unless `per_sequence` says otherwise."""
    fixed = {0: 7e-3, 1: 8e-3, 3: 10e-3}
    per_sequence = per_sequence or {0: 4e-5, 1: 6e-5, 3: 1e-4}
    e = {0: 1.0, 1: 1.8, 3: 2.8}
    runs = []
    for k in (0, 1, 3):
        points = []
        for c in (1, 2, 4, 8, 16, 32, 64, 128):
            step = fixed[k] + per_sequence[k] * c + 0.9 * fixed[0] * max(0.0, (1 + k) * c / 200 - 1)
            step *= (noise or {}).get((k, c), 1.0)
            request_s = 255 / e[k] * step + c * prefill_s  # b / R: decode steps plus the request's prefill share
            throughput = 256 * c / request_s
            extra = {}
            if k:
                extra = dict(num_drafts=1000, accepted_per_position=[800, 600, 400][:k])
            points.append(LevelPoint(concurrency=c, output_throughput=throughput, completed=64,
                                     generation_tokens=64 * 256,
                                     ttft_ms=LatencyStats(p50=1e3 * (prefill_s + step / 2)),
                                     itl_ms=LatencyStats(p50=1e3 * step), **extra))
        runs.append(Run(num_speculative_tokens=k, points=points))
    return runs


def test_roofline_fit_places_the_knee_for_every_k_and_extrapolates_like_a_roofline():
    base, k1, k3 = _roofline_runs()
    surface = build_surface(base, [k1, k3])
    assert surface.fit is not None and surface.fit.rms_relative_residual < 0.01
    assert float(surface.fit.weights @ surface.fit.knee_tokens) == pytest.approx(200, rel=0.05)

    def truth(k: int, b: float) -> float:
        fixed = 8e-3 + (k - 1) * 1e-3
        return fixed + (6e-5 + (k - 1) * 2e-5) * b + 0.9 * 7e-3 * max(0.0, (1 + k) * b / 200 - 1)

    # k=2 was never run: its knee (b = 200/3) lies between the k=1 and k=3 knees, and beyond the last level
    # (128) the baseline turns compute-bound at b = 200, as no straight line through the data would say
    for b in (10, 50, 67, 80, 100, 128, 180, 256):
        assert surface.decode_step_s(2, b) == pytest.approx(truth(2, b), rel=0.02)
    assert surface.decode_step_s(0, 256) == pytest.approx(7e-3 + 4e-5 * 256 + 0.9 * 7e-3 * 0.28, rel=0.02)


def test_prefill_is_taken_out_of_the_steps_so_a_middle_k_is_not_flattered():
    base, k1, k3 = _roofline_runs(prefill_s=0.02)
    surface = build_surface(base, [k1, k3])
    assert surface.prefill_s == pytest.approx(0.02, rel=0.01)
    for b in (8, 64, 128):
        decode = 9e-3 + 8e-5 * b + 0.9 * 7e-3 * max(0.0, 3 * b / 200 - 1)
        expected = 256 * b / (255 / 2.4 * decode + b * 0.02)  # E_2 = 2.4
        assert surface.goodput(2, b) == pytest.approx(expected, rel=0.02)


def test_a_fit_that_misses_the_data_falls_back_to_interpolation():
    # one level of each run off by a factor of two: no roofline goes through that
    runs = _roofline_runs(noise={(0, 16): 2.0, (1, 32): 0.5, (3, 8): 2.0})
    surface = build_surface(runs[0], runs[1:])
    assert surface.fit is None
    assert any("misses the measurements" in note for note in surface.notes)
    assert surface.goodput(0, 16) == pytest.approx(runs[0].points[4].output_throughput)


def test_a_level_measured_again_weighs_as_many_measurements_in_the_fit():
    # the baseline's level 64 reads 8% slow; measuring level 32 three more times (exactly) pins the line down,
    # so the fit leans less on the stray level than when each level is measured once
    def fitted_error_at_64(repeats: int) -> float:
        base, k1, k3 = _roofline_runs(noise={(0, 64): 1.08})
        extra = [p for p in base.points if p.concurrency in (32, 128)] * repeats
        base = base.model_copy(update={"points": [*base.points, *extra]})
        surface = build_surface(base, [k1, k3])
        assert surface.fit is not None
        truth = 7e-3 + 4e-5 * 64
        return abs(surface.decode_step_s(0, 64) / truth - 1.0)

    once, again = fitted_error_at_64(0), fitted_error_at_64(3)
    assert again < 0.8 * once


def test_the_speedup_carries_a_standard_error_that_matches_its_error_against_the_truth():
    from specpilot.sim.synthetic import Scenario, synthetic_profiles, true_curves

    scenario = Scenario("H100-SXM", "Qwen/Qwen3-8B", "eagle3")
    truth = true_curves(scenario, 256)
    baseline, method = synthetic_profiles(scenario, noise=0.0)
    exact = build_surface(baseline.status.run(0), method.status.runs)
    assert exact.speedup_se(1, 128) < 0.005  # noise-free profiles: the fit leaves (almost) nothing unexplained
    assert exact.speedup_se(0, 128) == 0.0

    z = []
    for seed in range(8):
        baseline, method = synthetic_profiles(scenario, noise=0.05, seed=seed)
        surface = build_surface(baseline.status.run(0), method.status.runs)
        for c in (16, 48, 96, 128, 160, 192, 256):
            se = surface.speedup_se(1, c)
            assert 0.005 < se < 0.1  # 5% noise per level: a few percent
            true = truth.goodput_tok_s[1][c - 1] / truth.goodput_tok_s[0][c - 1]
            z.append(math.log(surface.speedup(1, c) / true) / se)
    # calibrated: the error is within one standard error about two times in three, within two nearly always
    within_one = sum(abs(x) <= 1 for x in z) / len(z)
    within_two = sum(abs(x) <= 2 for x in z) / len(z)
    assert 0.5 <= within_one <= 0.85 and within_two >= 0.88


def test_without_the_fit_there_is_no_standard_error():
    surface = build_surface(BASE, [K1, K3])  # three levels: interpolated
    assert surface.fit is None and surface.speedup_se(1, 8) is None


def test_per_sequence_costs_linear_in_k_are_assumed_only_while_the_data_allows():
    def k3_error(per_sequence: dict[int, float]) -> float:
        runs = _roofline_runs(per_sequence=per_sequence)
        surface = build_surface(runs[0], runs[1:])
        assert surface.fit is not None
        return max(abs(surface.decode_step_s(3, b) / (10e-3 + per_sequence[3] * b
                                                       + 0.9 * 7e-3 * max(0.0, 4 * b / 200 - 1)) - 1)
                   for b in (1, 2, 4, 8, 16, 32, 64, 128))

    # m_3 far above the line through m_0 and m_1 (3e-4 against 1e-4): the tie is refused, the k=3 run fitted
    assert k3_error({0: 4e-5, 1: 6e-5, 3: 3e-4}) < 0.01
    # on the line: the tie holds and reproduces the runs as well
    assert k3_error({0: 4e-5, 1: 6e-5, 3: 1e-4}) < 0.01


def test_tying_the_per_sequence_costs_makes_the_step_ratios_more_precise_under_noise():
    # the step-time ratios between k are what the schedule weighs; 5% noise per level, 60 draws
    import numpy as np

    import specpilot.perf.roofline_fit as module

    def true_step(k: int, b: float) -> float:
        return 7e-3 + 1e-3 * k + (4e-5 + 2e-5 * k) * b + 0.9 * 7e-3 * max(0.0, (1 + k) * b / 200 - 1)

    rng = np.random.default_rng(7)
    errors = {"tied": [], "free": []}
    for _ in range(60):
        noise = {(k, c): math.exp(rng.normal(0, 0.05)) for k in (0, 1, 3) for c in (1, 2, 4, 8, 16, 32, 64, 128)}
        runs = _roofline_runs(noise=noise)
        for label, critical in (("tied", module._TIE_F_CRITICAL), ("free", -1.0)):  # -1: the tie always refused
            module._TIE_F_CRITICAL, saved = critical, module._TIE_F_CRITICAL
            try:
                surface = build_surface(runs[0], runs[1:])
            finally:
                module._TIE_F_CRITICAL = saved
            for k, other, b in ((1, 0, 64), (1, 0, 128), (3, 1, 128)):
                estimate = surface.decode_step_s(k, b) / surface.decode_step_s(other, b)
                errors[label].append(math.log(estimate / (true_step(k, b) / true_step(other, b))))
    rms = {label: math.sqrt(sum(e * e for e in values) / len(values)) for label, values in errors.items()}
    assert rms["tied"] < 0.9 * rms["free"]
