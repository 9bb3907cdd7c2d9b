"""The restart-strategy controller: hysteresis band, dwell, cooldown, rollouts and missing metrics."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.api.deployment_spec import Hysteresis
from specpilot.policy.restart import Action, Observation, RestartState, step

T0 = datetime(2026, 1, 1, tzinfo=UTC)
H = Hysteresis(band_percent=20, min_dwell_seconds=300, cooldown_seconds=600)


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_turns_off_after_dwell_above_the_band_and_on_after_dwell_below():
    state = RestartState(speculation_enabled=True)
    r = step(state, Observation(61, _at(0)), 50, H, False)
    assert r.action == Action.KEEP and r.state.above_since == _at(0)
    r = step(r.state, Observation(61, _at(299)), 50, H, False)
    assert r.action == Action.KEEP
    r = step(r.state, Observation(61, _at(300)), 50, H, False)
    assert r.action == Action.DISABLE and not r.state.speculation_enabled and r.state.last_toggle_at == _at(300)
    r = step(r.state, Observation(30, _at(400)), 50, H, False)
    r = step(r.state, Observation(30, _at(700)), 50, H, False)
    assert r.action == Action.KEEP and "cooldown" in r.reason
    r = step(r.state, Observation(30, _at(900)), 50, H, False)
    assert r.action == Action.ENABLE and r.state.speculation_enabled


def test_a_dip_resets_the_dwell():
    state = RestartState(speculation_enabled=True)
    r = step(state, Observation(70, _at(0)), 50, H, False)
    r = step(r.state, Observation(55, _at(200)), 50, H, False)
    r = step(r.state, Observation(70, _at(350)), 50, H, False)
    assert r.action == Action.KEEP and r.state.above_since == _at(350)


def test_never_during_a_rollout_and_holds_without_metrics():
    state = RestartState(speculation_enabled=True, above_since=_at(0))
    r = step(state, Observation(100, _at(1000)), 50, H, True)
    assert r.action == Action.KEEP and "rollout" in r.reason
    r = step(state, None, 50, H, False)
    assert r.action == Action.KEEP and r.state == state and "metrics missing" in r.reason


def test_no_crossover_means_speculation_stays_or_comes_on():
    r = step(RestartState(speculation_enabled=False), Observation(500, _at(0)), None, H, False)
    r = step(r.state, Observation(500, _at(300)), None, H, False)
    assert r.action == Action.ENABLE
    r = step(r.state, Observation(5000, _at(5000)), None, H, False)
    assert r.action == Action.KEEP


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(1, 600), st.floats(0, 200), st.booleans(), st.booleans()), max_size=60),
       st.floats(5, 100), st.booleans())
def test_properties_cooldown_rollout(events, crossover, enabled):
    state, now, toggles = RestartState(speculation_enabled=enabled), 0.0, []
    for gap, load, rolling, missing in events:
        now += gap
        r = step(state, None if missing else Observation(load, _at(now)), crossover, H, rolling)
        if r.action != Action.KEEP:
            assert not rolling and not missing
            assert r.state.speculation_enabled == (r.action == Action.ENABLE) != state.speculation_enabled
            toggles.append(now)
        state = r.state
    assert all(b - a >= H.cooldown_seconds for a, b in zip(toggles, toggles[1:]))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(1, 600), st.floats(0.8, 1.2)), max_size=60), st.floats(5, 100), st.booleans())
def test_oscillating_load_inside_the_band_never_toggles(events, crossover, enabled):
    state, now = RestartState(speculation_enabled=enabled), 0.0
    for gap, factor in events:
        now += gap
        r = step(state, Observation(crossover * factor, _at(now)), crossover, H, False)
        assert r.action == Action.KEEP
        state = r.state
