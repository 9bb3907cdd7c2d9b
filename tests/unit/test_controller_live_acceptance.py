"""Live acceptance feeds the decision with hysteresis: it never flips back and forth by its own effect."""

from __future__ import annotations

from specpilot.api.deployment import Decision, ObservedLoad, PoolStatus
from specpilot.controller.reconcile import _basis, _live_acceptance

PROFILE = {"metadata": {"name": "h100-sxm-ngram-x"}, "status": {"completedAt": "2026-11-29T00:00:00Z", "runs": [
    {"numSpeculativeTokens": 4, "acceptance": {"perPosition": [0.6, 0.4, 0.3, 0.2], "draftsPerStep": 1.0,
                                               "meanAcceptanceLength": 2.5}}]}}
METHODS = {"ngram": PROFILE}


def pool(decision: Decision, enabled: bool, observed_length: float | None) -> PoolStatus:
    observed = None
    if observed_length is not None:
        per_position = [(observed_length - 1) / 4] * 4
        observed = ObservedLoad(concurrency=4, acceptance_per_position=per_position, drafts_per_step=1.0,
                                mean_acceptance_length=observed_length)
    return PoolStatus(name="h100", decision=decision, speculation_enabled=enabled, observed=observed)


def test_small_drift_keeps_the_profile():
    served = Decision(method="ngram", num_speculative_tokens=4)
    assert _live_acceptance(pool(served, True, 2.6), METHODS) is None  # 4% off


def test_large_drift_uses_live_data_and_keeps_it_when_speculation_turns_off():
    served = Decision(method="ngram", num_speculative_tokens=4)
    live = _live_acceptance(pool(served, True, 1.8), METHODS)  # 28% off the profile
    assert live == {"ngram": ([0.2, 0.2, 0.2, 0.2], 1.0)}
    # The live data made the decision "no speculation": nothing is observed any more, and it must stay.
    off = Decision(method=None, live_method="ngram", live_acceptance_per_position=[0.2] * 4, live_drafts_per_step=1.0)
    assert _live_acceptance(pool(off, False, None), METHODS) == live
    assert _basis(1, PROFILE, METHODS, _live_acceptance(pool(off, False, None), METHODS)) == \
        _basis(1, PROFILE, METHODS, live)


def test_live_data_moves_only_past_the_band_and_returns_to_the_profile():
    used = Decision(method="ngram", live_method="ngram", live_acceptance_per_position=[0.2] * 4,
                    live_drafts_per_step=1.0)
    # 1.85 is within 10% of the 1.8 the decision used: keep it (no rollout for noise).
    assert _live_acceptance(pool(used, True, 1.85), METHODS) == {"ngram": ([0.2] * 4, 1.0)}
    # 1.4 is far from both: new live data.
    (per_position, _), = _live_acceptance(pool(used, True, 1.4), METHODS).values()
    assert [round(p, 6) for p in per_position] == [0.1] * 4
    # Back near the profile (2.45 vs 2.5): the profile again.
    assert _live_acceptance(pool(used, True, 2.45), METHODS) is None
    # In between (7% off): keep what the decision used.
    assert _live_acceptance(pool(used, True, 2.32), METHODS) == {"ngram": ([0.2] * 4, 1.0)}
