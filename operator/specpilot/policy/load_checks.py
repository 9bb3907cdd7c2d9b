"""Capacity and load checks behind a pool's method choice (policy.choose): the requests a replica's KV memory
holds, the concurrency and tokens/s a replica serves within the TPOT SLO, whether a fleet placed by cost per
token should serve without speculation, the TTFT SLO's feasibility test, and when an observed load moved enough
to revisit a decision."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from datetime import datetime

from ..api.deployment_status import Decision
from ..api.profile import Run, SpeculationProfile
from ..perf.cost import tokens_per_second
from .choose_reasons import percent_over
from .comparison import CandidatePlan, gain_margin

__all__ = [
    "DEFAULT_PROMPT_TOKENS",
    "LOAD_REVISIT_FACTOR",
    "fleet_capacity_check",
    "kv_max_concurrency",
    "observed_load_level",
    "revisit_for_load",
    "slo_capacity_tok_s",
    "slo_concurrency",
    "tokens_per_request",
    "within_ttft",
]

DEFAULT_PROMPT_TOKENS = 512
"""Prompt length assumed for memory when neither the workload nor the profile's KV usage tells it."""


def tokens_per_request(profile: SpeculationProfile) -> float:
    """KV tokens one request holds: the workload's prompt + output length, else read off the profile's KV
    usage (peak usage * capacity / running requests at the largest level that did not wait), else a default
    prompt of DEFAULT_PROMPT_TOKENS plus the output length."""
    workload = profile.spec.workload
    if workload.input_len:
        return float(workload.input_len + workload.output_len)
    status = profile.status
    if status and status.kv_capacity_tokens:
        for run in status.runs:
            for point in sorted(run.points, key=lambda p: -p.concurrency):
                if point.kv_cache_usage and point.mean_running and (point.mean_waiting or 0) < 1:
                    # usage peaks when requests are at full length: prompt + output
                    return max(1.0, point.kv_cache_usage * status.kv_capacity_tokens / point.mean_running)
    return float(DEFAULT_PROMPT_TOKENS + workload.output_len)


def kv_max_concurrency(profile: SpeculationProfile) -> int | None:
    if not profile.status or not profile.status.kv_capacity_tokens:
        return None
    return max(1, int(profile.status.kv_capacity_tokens // tokens_per_request(profile)))


def slo_concurrency(tpot_at, slo_ms: float | None, limit: int) -> float:
    """Largest c in 1..limit such that every c' <= c meets the TPOT SLO (limit when there is no SLO)."""
    if slo_ms is None:
        return float(limit)
    capacity = 0
    for c in range(1, limit + 1):
        if not tpot_at(c) <= slo_ms:
            break
        capacity = c
    return float(capacity)


def slo_capacity_tok_s(row: CandidatePlan) -> float | None:
    """Output tokens/s one replica delivers at its SLO-feasible concurrency (Little's law: c * 1000 / TPOT(c));
    None when the row has no curve or no feasible concurrency."""
    c = row.capacity_concurrency
    if not row.ready or row.tpot_ms_at is None or not c or c <= 0:
        return None
    ms = float(row.tpot_ms_at(c))
    return tokens_per_second(c, ms) if math.isfinite(ms) and ms > 0 else None


def fleet_capacity_check(chosen: CandidatePlan, baseline: CandidatePlan, min_gain_percent: float) -> str | None:
    """Whether a pool of a fleet placed by cost per token should serve without speculation after all.

    The fleet planner (policy.fleet) pays for whole replicas and sizes each pool by its SLO-feasible throughput,
    so a pool's tokens cost its price over that throughput wherever the fleet runs it above its minimum (at the
    minimum the replicas are paid for whatever they serve). A drafter takes KV cache and step time even where
    the schedule is off, so under a loose SLO an engine without speculation can hold more load within the SLO
    than the same engine with it: then deploying the method makes the fleet's tokens dearer even though it
    speeds up the pool's own load. Returns why to serve without speculation when that throughput beats the
    chosen method's by the minimum gain, else None (the pool's own decision stands)."""
    if chosen is baseline or chosen.method is None:
        return None
    with_sd, without = slo_capacity_tok_s(chosen), slo_capacity_tok_s(baseline)
    if with_sd is None or without is None or not without > with_sd * gain_margin(min_gain_percent):
        return None
    return (f"no speculation: in a fleet placed by cost per token, a replica without speculation holds "
            f"{without:.0f} tok/s within the SLO ({baseline.capacity_concurrency:.0f} requests) against "
            f"{with_sd:.0f} with {chosen.key} ({chosen.capacity_concurrency:.0f}), {percent_over(without, with_sd)}: "
            f"its tokens cost less without the drafter")


LOAD_REVISIT_FACTOR = 2.0
"""The observed load must move this factor from the load a decision weighed before the method is revisited."""


def observed_load_level(histogram: Sequence[tuple[float, float]] | None) -> float | None:
    """The weighted median per-replica concurrency of an observed histogram, or None without one."""
    points = sorted((float(c), float(w)) for c, w in histogram or []
                    if math.isfinite(c) and math.isfinite(w) and c > 0 and w > 0)
    total = sum(w for _, w in points)
    if not total:
        return None
    seen = 0.0
    for c, w in points:
        seen += w
        if seen >= total / 2:
            return c
    return points[-1][0]


def revisit_for_load(decision: Decision | None, histogram: Sequence[tuple[float, float]] | None,
                     now: datetime, cooldown_seconds: float) -> bool:
    """Whether a standing decision should be re-made because the observed load moved.

    Only decisions made from profiles; the first time load is observed (the decision weighed the expected
    load or the profiled levels), and after that when the weighted median concurrency moved a factor of
    LOAD_REVISIT_FACTOR from the one the decision weighed and the pool's cooldown has passed since it was
    made. The re-made decision keeps the served method unless another beats it by the minimum gain, so a
    revisit rolls the pods only for a clear win.
    """
    load = observed_load_level(histogram)
    if decision is None or load is None or decision.source not in ("profile", "live-acceptance"):
        return False
    if decision.load_concurrency is None:
        return True
    moved = abs(math.log(load / decision.load_concurrency)) >= math.log(LOAD_REVISIT_FACTOR)
    waited = decision.decided_at is None or (now - decision.decided_at).total_seconds() >= cooldown_seconds
    return moved and waited


def within_ttft(row: CandidatePlan, profile: SpeculationProfile | None, slo_ms: float,
                distribution: Sequence[tuple[float, float]]) -> CandidatePlan:
    """policy.ttftSloMs: a method whose profiled TTFT p95 at the operating load (the load-weighted mean
    concurrency per replica), at the K it would run there, exceeds the SLO is infeasible (not ready)."""
    if not row.ready or row.num_speculative_tokens <= 0 or profile is None or profile.status is None:
        return row
    total = sum(w for _, w in distribution)
    load = sum(c * w for c, w in distribution) / total if total > 0 else 1.0
    ks = row.schedule.k_by_batch_size if row.schedule is not None else ()
    k = ks[min(len(ks), max(1, round(load))) - 1] if ks else row.num_speculative_tokens
    runs = [r for r in profile.status.runs if r.points]
    if not runs:
        return row
    run = min(runs, key=lambda r: abs(r.num_speculative_tokens - k))
    ttft = _ttft_p95_at(run, load)
    if ttft is None or ttft <= slo_ms:
        return row
    return dataclasses.replace(row, ready=False, note=(
        f"TTFT p95 {ttft:.0f} ms at {load:.0f} concurrent requests per replica (K={run.num_speculative_tokens}) "
        f"exceeds policy.ttftSloMs {slo_ms:g} ms"))


def _ttft_p95_at(run: Run, concurrency: float) -> float | None:
    """Profiled TTFT p95 (ms) at `concurrency`, linear between the measured levels (clamped at the ends); p95
    as the mean of p90 and p99 where both were measured, else the nearest statistic there is."""
    points = []
    for point in sorted(run.points, key=lambda p: p.concurrency):
        stats = point.ttft_ms
        if stats.p90 is not None and stats.p99 is not None:
            value = (stats.p90 + stats.p99) / 2
        else:
            value = next((v for v in (stats.p99, stats.p90, stats.p50, stats.mean) if v is not None), None)
        if value is not None and math.isfinite(value):
            points.append((float(point.concurrency), value))
    if not points:
        return None
    if concurrency <= points[0][0]:
        return points[0][1]
    for (c0, v0), (c1, v1) in zip(points, points[1:]):
        if concurrency <= c1:
            return v0 + (v1 - v0) * (concurrency - c0) / (c1 - c0)
    return points[-1][1]
