"""The goodput surface: E_k from counters, step times from throughput, interpolation and live acceptance."""

from __future__ import annotations

import pytest

from specpilot.api.profile import Acceptance, LatencyStats, LevelPoint, Run
from specpilot.policy.surface import (
    NotEnoughDataError,
    acceptance_drift,
    acceptance_from_run,
    build_surface,
    with_live_acceptance,
)


def _run(k: int, throughput: dict[int, float], **counters) -> Run:
    return Run(num_speculative_tokens=k, points=[
        LevelPoint(concurrency=c, output_throughput=t, completed=10, tpot_ms=LatencyStats(p50=1000 * c / t),
                   **counters) for c, t in throughput.items()])


BASE = _run(0, {1: 100.0, 8: 700.0, 64: 3200.0})
K1 = _run(1, {1: 150.0, 8: 1000.0, 64: 3300.0}, num_drafts=1000, accepted_per_position=[800])
K3 = _run(3, {1: 200.0, 8: 1200.0, 64: 3000.0}, num_drafts=1000, accepted_per_position=[800, 600, 400])


def test_tokens_per_step_from_counters_and_step_times_reproduce_measured_throughput():
    surface = build_surface(BASE, [K1, K3])
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


def test_live_acceptance_keeps_step_times_and_reports_drift():
    surface = build_surface(BASE, [K1, K3])
    live = with_live_acceptance(surface, [0.4, 0.3, 0.2], 1.0)
    assert live.step_s(3, 8) == pytest.approx(surface.step_s(3, 8))
    assert live.tokens_per_step[3] == pytest.approx(1.9)
    assert live.goodput(3, 8) < surface.goodput(3, 8)
    assert acceptance_drift(surface, [0.4, 0.3, 0.2], 1.0) == pytest.approx(1.9 / 2.8 - 1)


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
