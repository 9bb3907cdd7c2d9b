"""What the observer reports about one serving pool: its load and live speculative-decoding acceptance.

Both sources (Prometheus, direct pod scraping) produce the same `PoolObservation`, or raise
`MetricsUnavailable` with a reason a person can act on; the controller then holds the last decision and
sets MetricsAvailable=False.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import datetime


class MetricsUnavailable(Exception):
    """No usable metrics for a pool; `reason` says why ("no Prometheus at URL", "stale: ...").

    `cut` lists the read bounds that were hit on the way (an answer over the size limit, a source that did
    not answer in time), `code` is a CamelCase reason for a condition when the cause is a setting to fix."""

    def __init__(self, reason: str, *, cut: tuple[str, ...] = (), code: str = "MetricsUnavailable") -> None:
        super().__init__(reason)
        self.reason = reason
        self.cut = tuple(cut)
        self.code = code


@dataclasses.dataclass(frozen=True)
class PoolObservation:
    """Load and live acceptance of one pool over a look-back window ending at `observed_at`.

    Fields that cannot be measured in the window (no finished requests, no drafts, a single sample) are
    None, or an empty list for `acceptance_per_position`.
    """

    replicas_reporting: int
    """Pods whose newest sample is younger than the source's stale_after_s."""
    running_per_replica: float
    """Time-average over the window of the mean vllm:num_requests_running across reporting pods."""
    waiting_per_replica: float
    """Time-average over the window of the mean vllm:num_requests_waiting across reporting pods."""
    total_running: float
    """Time-average over the window of the pool's summed running requests."""
    total_waiting: float
    """Time-average over the window of the pool's summed waiting requests."""
    generation_tokens_per_second: float | None
    """Output tokens per second, summed over the pool's pods."""
    tpot_p95_ms: float | None
    """95th percentile of time per output token of requests finished in the window (bucket-interpolated)."""
    acceptance_per_position: list[float]
    """p_j = accepted tokens at draft position j / drafts, j = 0..K-1; empty when SD is off or idle."""
    drafts_per_step: float | None
    """f = drafts / request-steps (request-steps = generated tokens - accepted tokens): 1 for model-based
    drafters, below 1 for n-gram; None when SD is off or nothing was generated."""
    mean_acceptance_length: float | None
    """Tokens per drafted step, 1 + accepted / drafts; None when there were no drafts."""
    kv_cache_usage: float | None
    """Time-average of the mean vllm:kv_cache_usage_perc (0..1) across reporting pods."""
    observed_at: datetime
    """End of the window (UTC)."""
    window_s: float
    """Length of the look-back window in seconds."""
    concurrency_histogram: list[tuple[float, float]]
    """Per-replica running requests seen over the window: (concurrency, weight) sorted by concurrency,
    weights summing to 1; one sample per pod per sampling step."""
    tpot_buckets: tuple[tuple[float, float], ...] = ()
    """The window's increase of the pool's TPOT histogram, cumulative buckets (le, requests); the SLO
    attainment is read from it (policy.slo)."""
    ttft_buckets: tuple[tuple[float, float], ...] = ()
    """The same of the TTFT histogram."""
    cut: tuple[str, ...] = ()
    """What the read bounds left out of this observation (a pod whose page was over the size limit, draft
    positions beyond the method's K, ...); empty when everything was read."""

    def __post_init__(self) -> None:
        # Where observations enter: numbers a pod or Prometheus sent are made physical here, for both sources
        # (a negative or non-finite gauge, a counter reset read as a negative rate, a fraction above 1).
        set_ = object.__setattr__
        set_(self, "replicas_reporting", max(0, int(self.replicas_reporting)))
        for name in ("running_per_replica", "waiting_per_replica", "total_running", "total_waiting"):
            set_(self, name, _non_negative(getattr(self, name)) or 0.0)
        for name in ("generation_tokens_per_second", "tpot_p95_ms", "drafts_per_step", "mean_acceptance_length"):
            set_(self, name, _non_negative(getattr(self, name)))
        set_(self, "kv_cache_usage", _fraction(self.kv_cache_usage))
        if self.mean_acceptance_length is not None and self.mean_acceptance_length < 1:
            set_(self, "mean_acceptance_length", None)
        positions = []
        for value in self.acceptance_per_position:  # up to the first unusable position: later ones keep their index
            if _fraction(value) is None:
                break
            positions.append(_fraction(value))
        set_(self, "acceptance_per_position", positions)
        histogram = [(c, w) for c, w in self.concurrency_histogram
                     if _non_negative(c) is not None and _non_negative(w) is not None]
        total = sum(w for _, w in histogram)
        set_(self, "concurrency_histogram", [(c, w / total) for c, w in histogram] if total > 0 else [])


def _non_negative(value: float | None) -> float | None:
    """A finite, non-negative number, or None."""
    if value is None:
        return None
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _fraction(value: float | None) -> float | None:
    """A number within [0, 1] (above 1 clamped), or None."""
    value = _non_negative(value)
    return None if value is None else min(1.0, value)
