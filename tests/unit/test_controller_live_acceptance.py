"""Live acceptance feeds the decision with hysteresis: it never flips back and forth by its own effect, and
it compares like with like (first-position acceptance: later positions mix in steps a schedule drafted less)."""

from __future__ import annotations

import pytest

from specpilot.api.deployment import Decision, ObservedLoad, PoolStatus
from specpilot.controller.reconcile import _basis, _live_acceptance

PROFILE = {"metadata": {"name": "h100-sxm-ngram-x"}, "status": {"completedAt": "2026-11-29T00:00:00Z", "runs": [
    {"numSpeculativeTokens": 4, "acceptance": {"perPosition": [0.8, 0.6, 0.4, 0.2], "draftsPerStep": 1.0,
                                               "meanAcceptanceLength": 3.0}}]}}
METHODS = {"ngram": PROFILE}


def pool(decision: Decision, enabled: bool, first: float | None, later: float = 0.05) -> PoolStatus:
    observed = None
    if first is not None:
        observed = ObservedLoad(concurrency=40, acceptance_per_position=[first, later, later, later],
                                drafts_per_step=0.7, mean_acceptance_length=1 + first + 3 * later)
    return PoolStatus(name="h100", decision=decision, speculation_enabled=enabled, observed=observed)


def test_a_schedule_drafting_fewer_tokens_is_not_drift():
    served = Decision(method="ngram", num_speculative_tokens=4)
    # Position 0 as profiled; later positions low only because the schedule drafts k=1 at this load.
    assert _live_acceptance(pool(served, True, 0.79), METHODS) is None


def test_large_drift_scales_the_profile_and_is_kept_while_speculation_is_off():
    served = Decision(method="ngram", num_speculative_tokens=4)
    live = _live_acceptance(pool(served, True, 0.4), METHODS)  # half the profiled first-position acceptance
    assert list(live) == ["ngram"]
    assert live["ngram"][0] == pytest.approx([0.4, 0.3, 0.2, 0.1]) and live["ngram"][1] == 1.0
    off = Decision(method=None, live_method="ngram", live_acceptance_per_position=live["ngram"][0],
                   live_drafts_per_step=1.0)
    assert _live_acceptance(pool(off, False, None), METHODS) == live
    assert _basis(1, PROFILE, METHODS, _live_acceptance(pool(off, False, None), METHODS)) == \
        _basis(1, PROFILE, METHODS, live)


def test_live_data_moves_only_past_the_band_and_returns_to_the_profile():
    used = Decision(method="ngram", live_method="ngram", live_acceptance_per_position=[0.4, 0.3, 0.2, 0.1],
                    live_drafts_per_step=1.0)
    assert _live_acceptance(pool(used, True, 0.42), METHODS)["ngram"][0] == [0.4, 0.3, 0.2, 0.1]  # within 10%
    assert _live_acceptance(pool(used, True, 0.6), METHODS)["ngram"][0] == pytest.approx([0.6, 0.45, 0.3, 0.15])
    assert _live_acceptance(pool(used, True, 0.79), METHODS) is None  # back at the profile
    assert _live_acceptance(pool(used, True, 0.74), METHODS)["ngram"][0] == [0.4, 0.3, 0.2, 0.1]  # in between
