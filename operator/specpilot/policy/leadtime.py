"""A pool's scale-up lead time, measured from its own Deployment (pure): from the reconciliation that asked for more
replicas than were ready until the one that found them all ready (pods created, images pulled, weights loaded,
the engine's readiness probe passed). The fleet planner forecasts demand over it (`policy.fleet`: how far ahead
the replicas must be asked for).

What a measurement needs between reconciliations is kept in the pool's status (`scaleUpStartedAt`,
`scaleUpTo`, `scaleUpLeadTimes`), so a restarted operator goes on measuring. A reading is as fine as the
reconciliations that see it (the timer's interval, or sooner on a watched change), so it errs long, which is the
safe side for a forecast.
"""

from __future__ import annotations

from datetime import datetime

from ..api.deployment_status import MAX_LEAD_TIMES, PoolStatus

__all__ = ["MAX_LEAD_TIME_S", "measured_lead_time", "track_scale_up"]


MAX_LEAD_TIME_S = 3600.0
"""The longest lead time the planner looks ahead by. The samples come back from the status, which whoever may patch
it can write: one that is not a finite number of seconds in [0, this] is not a measurement, and is left out."""


def measured_lead_time(pool: PoolStatus | None) -> float | None:
    """The longest of the pool's recent scale-up lead times (None: none measured yet)."""
    samples = [s for s in (pool.scale_up_lead_times if pool is not None else []) if 0 <= s <= MAX_LEAD_TIME_S]
    return max(samples) if samples else None


def track_scale_up(pool: PoolStatus, previous: PoolStatus, asked: int | None, ready: int, now: datetime) -> None:
    """Carry the pool's scale-up measurement into its next status: a scale-up pending in `previous` that `ready`
    replicas complete records its lead time; replicas `asked` for beyond those ready start one; asking for no more
    than are ready drops a pending one unmeasured.

    A pending scale-up keeps its target when more replicas are asked for meanwhile (a ramp asks at every
    reconciliation): it measures its own replicas from their ask to their readiness. Raising its target instead
    would measure the whole ramp, not one replica's start (a 2-minute start read as 4.5 minutes on a rising
    day). The replicas asked for later start the next measurement once it completes, which reads them short; the
    planner looks ahead by the longest recent sample, so a short one does not shorten its horizon."""
    since, to = previous.scale_up_started_at, previous.scale_up_to
    samples = list(previous.scale_up_lead_times)
    if since is not None and to is not None and ready >= to:
        samples = [*samples, round(max((now - since).total_seconds(), 0.0), 1)][-MAX_LEAD_TIMES:]
        since = to = None
    if asked is not None and asked > ready:
        if since is None:
            since, to = now, asked
        else:
            to = min(to or asked, asked)
    elif since is not None:
        since = to = None
    pool.scale_up_started_at, pool.scale_up_to, pool.scale_up_lead_times = since, to, samples
