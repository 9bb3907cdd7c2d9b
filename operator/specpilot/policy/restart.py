"""The restart strategy's controller: when to switch speculation on or off by rolling the pool's pods.

Used when the engine cannot take a per-batch-size schedule (suffix decoding, data parallel > 1, older vLLM).
A pure state machine: the operator keeps `RestartState` in the pool's status and calls `step` with each
observation. Speculation goes off when per-replica concurrency stays above crossover * (1 + band) for
min_dwell_seconds, and on again when it stays below crossover * (1 - band) as long; never within
cooldown_seconds of the last toggle, never while a rollout is in progress, and missing metrics hold.
"""

from __future__ import annotations

import dataclasses
import enum
from datetime import datetime

from ..api.deployment_spec import Hysteresis

__all__ = ["Action", "Observation", "RestartState", "RestartStep", "step"]


class Action(str, enum.Enum):
    KEEP = "keep"
    ENABLE = "enable"
    DISABLE = "disable"


@dataclasses.dataclass(frozen=True)
class RestartState:
    """What the controller remembers between observations (kept in the pool's status)."""

    speculation_enabled: bool
    last_toggle_at: datetime | None = None
    above_since: datetime | None = None
    """When concurrency went above the upper threshold and has stayed there (None: it is not above)."""
    below_since: datetime | None = None
    """When concurrency went below the lower threshold and has stayed there (None: it is not below)."""


@dataclasses.dataclass(frozen=True)
class Observation:
    """Mean running requests per replica over the metrics window, and when it was read."""

    concurrency_per_replica: float
    at: datetime


@dataclasses.dataclass(frozen=True)
class RestartStep:
    state: RestartState
    action: Action
    reason: str


def step(state: RestartState, observation: Observation | None, crossover_concurrency: float | None,
         hysteresis: Hysteresis, rollout_in_progress: bool) -> RestartStep:
    """The next state and action. `crossover_concurrency` None means speculation pays at every load."""
    if observation is None:
        return RestartStep(state, Action.KEEP, "metrics missing: holding the current setting")
    now, load = observation.at, observation.concurrency_per_replica
    if crossover_concurrency is None:
        upper, lower = float("inf"), float("inf")
    else:
        band = hysteresis.band_percent / 100.0
        upper, lower = crossover_concurrency * (1 + band), crossover_concurrency * (1 - band)
    above_since = (state.above_since or now) if load > upper else None
    below_since = (state.below_since or now) if load < lower else None
    state = dataclasses.replace(state, above_since=above_since, below_since=below_since)

    if state.speculation_enabled:
        wanted, since, words = Action.DISABLE, above_since, f"concurrency {load:.1f} above {upper:.1f}"
    else:
        wanted, since, words = Action.ENABLE, below_since, f"concurrency {load:.1f} below {lower:.1f}"
    if since is None:
        return RestartStep(state, Action.KEEP, f"concurrency {load:.1f} within the band: keep speculation "
                                               f"{'on' if state.speculation_enabled else 'off'}")
    held_s = (now - since).total_seconds()
    if held_s < hysteresis.min_dwell_seconds:
        return RestartStep(state, Action.KEEP, f"{words} for {held_s:.0f}s of the "
                                               f"{hysteresis.min_dwell_seconds}s dwell")
    if rollout_in_progress:
        return RestartStep(state, Action.KEEP, f"{words}, but a rollout is in progress: waiting for it")
    if state.last_toggle_at is not None:
        since_toggle = (now - state.last_toggle_at).total_seconds()
        if since_toggle < hysteresis.cooldown_seconds:
            return RestartStep(state, Action.KEEP, f"{words}, but the last toggle was {since_toggle:.0f}s ago "
                                                   f"(cooldown {hysteresis.cooldown_seconds}s)")
    toggled = RestartState(speculation_enabled=wanted == Action.ENABLE, last_toggle_at=now)
    return RestartStep(toggled, wanted, f"{words} for {held_s:.0f}s: turning speculation "
                                        f"{'on' if wanted == Action.ENABLE else 'off'}")
