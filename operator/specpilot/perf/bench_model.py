"""What a benchmark Job does, in numbers: its requests and warm-up per level, when its sweep stops, and how long
an engine start and a level take. One home for the bench itself (`specpilot_bench.cli` and `.sweep` take their
rules from here), the operator's plausibility check of what it reports, the simulator's profiling Jobs
(`sim.joining`) and the decision-quality benchmark's profiling time (benchmarks/decision_quality.py).

- A run is one engine start (`ENGINE_START_S`), then the concurrency levels in order.
- At level c the bench awaits a warm-up of min(c, DEFAULT_WARMUP_REQUESTS) requests (`default_warmup`), then
  sends max(requestsPerLevel, MIN_WAVES x c) requests keeping c in flight (`level_requests`). A point's
  durationS is the measured requests alone (`level_duration_s`); the level's wall time adds the warm-up,
  about one request's latency at c (`level_wall_s`).
- A sweep stops once its output throughput gained under SATURATION_GAIN at each of two steps (`saturated`;
  the bench also stops where two levels in a row break the SLO, `specpilot_bench.sweep.stop_reason`).
"""

from __future__ import annotations

from collections.abc import Sequence

from ..api.deployment_spec import Profiling

__all__ = [
    "DEFAULT_REQUESTS_PER_LEVEL",
    "DEFAULT_WARMUP_REQUESTS",
    "ENGINE_START_S",
    "MIN_WAVES",
    "SATURATION_GAIN",
    "default_warmup",
    "level_duration_s",
    "level_requests",
    "level_wall_s",
    "saturated",
]

ENGINE_START_S = 90.0
"""Seconds from launching a run's engine to its serving: model load, compilation and CUDA graphs of an 8B model
with its drafter on one GPU (about 1-2 min). The bench launches one engine per run inside the Job's pod, which
is scheduled and has its image once per Job, before the first run; that pod start is not counted here. A new
serving replica's start-up (`sim.fleet.FleetConfig.startup_s`, 120 s: pod, image, engine, readiness) is
longer by it."""
DEFAULT_REQUESTS_PER_LEVEL: int = Profiling.model_fields["requests_per_level"].default
"""spec.profiling.requestsPerLevel's default."""
MIN_WAVES = 2
"""Requests per level are at least this many times the level's concurrency: fewer never hold c in flight."""
DEFAULT_WARMUP_REQUESTS = 4
"""Warm-up requests per level unless the bench's --warmup-requests says otherwise (at most the level's
concurrency): enough to run the level's code paths once. A full wave would not reach steady state either (the
warm-up is awaited before the measured requests start, which then arrive together); MIN_WAVES of measured
requests see to that."""
SATURATION_GAIN = 0.05
"""A level that raises output throughput by less than this (relative) counts as saturated."""


def level_requests(concurrency: int, requests_per_level: int = DEFAULT_REQUESTS_PER_LEVEL) -> int:
    """Measured requests the bench sends at a level: max(requestsPerLevel, MIN_WAVES x concurrency)."""
    return max(requests_per_level, MIN_WAVES * concurrency)


def default_warmup(concurrency: int) -> int:
    """Warm-up requests before a level: min(concurrency, DEFAULT_WARMUP_REQUESTS)."""
    return min(concurrency, DEFAULT_WARMUP_REQUESTS)


def level_duration_s(concurrency: int, request_throughput: float,
                     requests_per_level: int = DEFAULT_REQUESTS_PER_LEVEL) -> float:
    """Seconds a level's measured requests take at `request_throughput` (requests/s, steady state): what the
    level's point records as durationS."""
    return level_requests(concurrency, requests_per_level) / request_throughput


def level_wall_s(concurrency: int, request_throughput: float,
                 requests_per_level: int = DEFAULT_REQUESTS_PER_LEVEL) -> float:
    """Seconds a level holds the engine: its warm-up, about one request's latency at c (Little's law:
    c / request throughput), then its measured requests."""
    return (concurrency + level_requests(concurrency, requests_per_level)) / request_throughput


def saturated(output_throughputs: Sequence[float]) -> bool:
    """Whether a sweep's output throughputs so far (in level order) gained under SATURATION_GAIN at each of
    its last two steps."""
    if len(output_throughputs) < 3:
        return False
    a, b, c = output_throughputs[-3:]
    return a > 0 and b > 0 and b < a * (1 + SATURATION_GAIN) and c < b * (1 + SATURATION_GAIN)
