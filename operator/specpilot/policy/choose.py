"""Method choice for one pool: which candidate (or none) to serve, with which schedule, and why.

Every candidate with a Succeeded profile gets its schedule (policy.schedule) and its expected goodput over
the concurrency the replicas see: the observed histogram, else `policy.expectedConcurrency`, else a uniform
spread over the profiled levels. Memory counts: a drafter takes KV cache, so a replica holds at most
kv_capacity_tokens / tokens-per-request requests and goodput saturates there. The baseline (no
speculation, the plain engine without a drafter) is a candidate too: a method is deployed only when it beats
it by `policy.minGainPercent` over that load (0.1% at least, so the baseline wins ties). This is where the
drafter's own cost is weighed; a schedule's noise guard compares against k = 0 on the method's engine. The
objective picks by goodput or by dollars per million tokens (price_per_gpu_hour * gpus_per_replica / (3600 *
tokens/s per replica)).

Strategy: dynamic puts the schedule in the engine; restart (policy says so, or auto when the method or
engine cannot take a schedule) serves one fixed k and lets policy.restart toggle speculation around the
crossover concurrency. `decide_pool` is pure: the operator passes in what it read and writes out the result.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from ..api.deployment import Decision, Objective, Policy, Strategy
from ..api.methods import MODEL_FREE_METHODS, CandidateMethod, SpeculativeMethod
from ..api.profile import ProfilePhase, Run, SpeculationProfile
from ..api.schedule import summary
from ..perf.cost import cost_per_million_tokens
from .schedule import SchedulePlan, plan_schedule
from .surface import (
    BaselineSurface,
    MethodSurface,
    NotEnoughDataError,
    build_baseline,
    pool_surfaces,
    with_live_acceptance,
)

__all__ = ["BASELINE_KEY", "CandidatePlan", "PoolPlan", "decide_pool", "tokens_per_request"]

BASELINE_KEY = "baseline"
DEFAULT_PROMPT_TOKENS = 512
"""Prompt length assumed for memory when neither the workload nor the profile's KV usage tells it."""


@dataclasses.dataclass(frozen=True)
class CandidatePlan:
    """One row of the comparison: a candidate (or the baseline) on this pool."""

    key: str
    method: str | None
    ready: bool
    note: str = ""
    strategy: Strategy = Strategy.DYNAMIC
    num_speculative_tokens: int = 0
    schedule: SchedulePlan | None = None
    crossover_concurrency: int | None = None
    crossover_gain_se: float | None = None
    """Relative standard error of the gain at the crossover (see SchedulePlan.crossover_gain_se)."""
    kv_max_concurrency: int | None = None
    expected_goodput_tok_s: float | None = None
    cost_per_mtok: float | None = None
    capacity_concurrency: float | None = None
    tpot_ms_at: Callable[[float], float] | None = dataclasses.field(default=None, compare=False, repr=False)
    """TPOT (ms) the option runs at with c concurrent requests per replica: what the replica planner scales
    the observed demand by (policy.planner)."""

    @property
    def crossover_uncertainty_percent(self) -> float | None:
        """crossover_gain_se in percent, as the decision and the plan report it."""
        return None if self.crossover_gain_se is None else round(self.crossover_gain_se * 100, 2)


@dataclasses.dataclass(frozen=True)
class PoolPlan:
    """The decision for a pool, the table behind it and the SLO-feasible concurrency per replica."""

    decision: Decision
    candidates: tuple[CandidatePlan, ...]
    capacity_concurrency_per_replica: float | None


def _ready(profile: SpeculationProfile | None) -> bool:
    return bool(profile and profile.status and profile.status.phase == ProfilePhase.SUCCEEDED.value
                and profile.status.runs)


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


def _kv_max_concurrency(profile: SpeculationProfile) -> int | None:
    if not profile.status or not profile.status.kv_capacity_tokens:
        return None
    return max(1, int(profile.status.kv_capacity_tokens // tokens_per_request(profile)))


def _distribution(policy: Policy, histogram: Sequence[tuple[float, float]] | None,
                  levels: Sequence[int]) -> tuple[list[tuple[float, float]], str]:
    if histogram:
        points = [(float(c), float(w)) for c, w in histogram
                  if math.isfinite(c) and math.isfinite(w) and c > 0 and w > 0]
        if points:
            return points, "observed load"
    if policy.expected_concurrency:
        return [(float(p.concurrency), float(p.weight)) for p in policy.expected_concurrency], "expected load"
    return [(float(c), 1.0) for c in levels], "profiled levels (no load known yet)"


def _expected(goodput_at, distribution: Sequence[tuple[float, float]], kv_max: int | None) -> float:
    total = sum(w for _, w in distribution)
    return sum(w * goodput_at(min(c, kv_max) if kv_max else c) for c, w in distribution) / total


def _capacity(tpot_at, slo_ms: float | None, limit: int) -> float:
    """Largest c in 1..limit such that every c' <= c meets the TPOT SLO (limit when there is no SLO)."""
    if slo_ms is None:
        return float(limit)
    capacity = 0
    for c in range(1, limit + 1):
        if not tpot_at(c) <= slo_ms:
            break
        capacity = c
    return float(capacity)


def _restart_plan(surface: MethodSurface, baseline: BaselineSurface, policy: Policy, max_batch_size: int,
                  distribution, kv_max: int | None) -> tuple[SchedulePlan, int, int | None, float, callable]:
    """Best fixed k for the restart strategy: on at k up to the crossover, off (baseline engine) above."""
    best = None
    for k in surface.available_k():
        if k == 0:
            continue
        plan = plan_schedule(surface, policy.tpot_slo_ms, policy.min_gain_percent, max_batch_size, ks=[0, k])
        # Off here means rolling out the plain engine (no drafter): speculation stays on only while it beats
        # that engine by the minimum gain, not just the method engine's own k=0.
        margin = _margin(policy.min_gain_percent)
        off_at = next((c for c, kk in enumerate(plan.k_by_batch_size, start=1)
                       if kk == 0 or surface.goodput(k, float(c)) < margin * baseline.goodput(float(c))), None)
        crossover = None if off_at is None else off_at - 1
        if crossover == 0:
            continue

        def goodput_at(c: float, k=k, crossover=crossover) -> float:
            on = crossover is None or c <= crossover
            return surface.goodput(k, max(1.0, c)) if on else baseline.goodput(max(1.0, c))

        expected = _expected(goodput_at, distribution, kv_max)
        if best is None or expected > best[3]:
            best = (plan, k, crossover, expected, goodput_at)
    return best


def decide_pool(policy: Policy, candidates: list[CandidateMethod], baseline: SpeculationProfile | None,
                profiles: dict[str, SpeculationProfile], price_per_gpu_hour: float, gpus_per_replica: int,
                concurrency_histogram: list[tuple[float, float]] | None = None,
                live_acceptance: dict[str, tuple[list[float], float]] | None = None,
                incumbent: str | None = None,
                engine_supports_dynamic: bool = True, max_batch_size: int = 256,
                now: datetime | None = None) -> PoolPlan:
    """Decide what one pool serves. Never raises on profile data: missing data becomes a reasoned decision."""
    now = now or datetime.now(UTC)
    baseline_run, baseline_profile = _find_baseline(baseline, profiles)
    if baseline_run is None:
        return _no_data(now, "not enough data: no Succeeded baseline profile (a K=0 run) for this pool yet; "
                             "speculation stays off until it is measured")
    try:
        base_surface = build_baseline(baseline_run)
    except NotEnoughDataError as exc:
        return _no_data(now, f"not enough data: {exc}")
    distribution, load_words = _distribution(policy, concurrency_histogram, base_surface.levels)
    base_kv = _kv_max_concurrency(baseline_profile)
    base_limit = min(max_batch_size, base_kv or max_batch_size)
    base_expected = _expected(base_surface.goodput, distribution, base_kv)
    rows = [CandidatePlan(
        key=BASELINE_KEY, method=None, ready=True, note="no speculation",
        kv_max_concurrency=base_kv, expected_goodput_tok_s=base_expected,
        cost_per_mtok=_cost(price_per_gpu_hour, gpus_per_replica, base_expected),
        capacity_concurrency=_capacity(base_surface.tpot_ms, policy.tpot_slo_ms, base_limit),
        tpot_ms_at=base_surface.tpot_ms)]
    sources: dict[str, str] = {}
    # every ready method's surface, fitted with what the pool's other methods measured of the shared knee;
    # a method profile's own K=0 run when it has one (same engine build), else the pool's baseline
    ready = [(c, profiles[c.key]) for c in candidates if _ready(profiles.get(c.key))]
    surfaces = pool_surfaces({
        c.key: (profile.status.run(0) or baseline_run, profile.status.runs,
                SpeculativeMethod(c.method) not in MODEL_FREE_METHODS)
        for c, profile in ready})
    for candidate in candidates:
        row, source = _candidate_row(candidate, profiles.get(candidate.key), surfaces.get(candidate.key),
                                     base_surface, policy, distribution,
                                     price_per_gpu_hour, gpus_per_replica, live_acceptance or {},
                                     engine_supports_dynamic, max_batch_size)
        rows.append(row)
        sources[candidate.key] = source
    if policy.ttft_slo_ms is not None:
        rows = [rows[0], *(_within_ttft(r, profiles.get(r.key), policy.ttft_slo_ms, distribution) for r in rows[1:])]
    chosen = _pick(rows, policy.objective, policy.min_gain_percent, incumbent)
    decision = _decision(chosen, rows, base_expected, load_words, sources.get(chosen.key, "profile"), now,
                         policy.objective, policy.min_gain_percent)
    if load_words == "observed load":
        decision.load_concurrency = observed_load_level(concurrency_histogram)
    return PoolPlan(decision=decision, candidates=tuple(rows),
                    capacity_concurrency_per_replica=chosen.capacity_concurrency)


def _find_baseline(baseline: SpeculationProfile | None,
                   profiles: dict[str, SpeculationProfile]) -> tuple[Run | None, SpeculationProfile | None]:
    if _ready(baseline) and baseline.status.run(0) is not None:
        return baseline.status.run(0), baseline
    for profile in profiles.values():
        if _ready(profile) and profile.status.run(0) is not None:
            return profile.status.run(0), profile
    return None, None


def _cost(price_per_gpu_hour: float, gpus_per_replica: int, goodput: float | None) -> float | None:
    if not goodput or goodput <= 0 or not math.isfinite(goodput) or price_per_gpu_hour <= 0 or gpus_per_replica < 1:
        return None
    return cost_per_million_tokens(price_per_gpu_hour, gpus_per_replica, goodput)


def _candidate_row(candidate: CandidateMethod, profile: SpeculationProfile | None,
                   built: MethodSurface | NotEnoughDataError | None, base: BaselineSurface,
                   policy: Policy, distribution, price: float, gpus: int,
                   live: dict[str, tuple[list[float], float]], engine_dynamic: bool,
                   max_batch_size: int) -> tuple[CandidatePlan, str]:
    key = candidate.key
    if not _ready(profile):
        phase = profile.status.phase if profile and profile.status else "missing"
        return CandidatePlan(key=key, method=candidate.method, ready=False,
                             note=f"profile not ready ({phase})"), "none"
    if not isinstance(built, MethodSurface):
        return CandidatePlan(key=key, method=candidate.method, ready=False, note=f"not enough data: {built}"), "none"
    surface = built
    source = "profile"
    if key in live and live[key][0]:
        per_position, drafts_per_step = live[key]
        surface = with_live_acceptance(surface, per_position, drafts_per_step)
        source = "live-acceptance"
    kv_max = _kv_max_concurrency(profile)
    limit = min(max_batch_size, kv_max or max_batch_size)
    restart = (policy.strategy == Strategy.RESTART.value
               or (policy.strategy == Strategy.AUTO.value
                   and not (candidate.supports_dynamic_schedule and engine_dynamic)))
    note = "; ".join(surface.notes)
    if restart:
        best = _restart_plan(surface, base, policy, max_batch_size, distribution, kv_max)
        if best is None:
            return CandidatePlan(key=key, method=candidate.method, ready=True, strategy=Strategy.RESTART,
                                 note="no k beats no speculation at any concurrency", kv_max_concurrency=kv_max,
                                 expected_goodput_tok_s=0.0), source
        plan, k, crossover, expected, goodput_at = best
        def tpot_at(c: float) -> float:
            return surface.tpot_ms(k, c) if crossover is None or c <= crossover else base.tpot_ms(c)

        capacity = _capacity(tpot_at, policy.tpot_slo_ms, limit)
        return CandidatePlan(key=key, method=candidate.method, ready=True, note=note, strategy=Strategy.RESTART,
                             num_speculative_tokens=k, schedule=plan, crossover_concurrency=crossover,
                             crossover_gain_se=surface.speedup_se(k, crossover) if crossover else None,
                             kv_max_concurrency=kv_max, expected_goodput_tok_s=expected,
                             cost_per_mtok=_cost(price, gpus, expected), capacity_concurrency=capacity,
                             tpot_ms_at=tpot_at), source
    plan = plan_schedule(surface, policy.tpot_slo_ms, policy.min_gain_percent, max_batch_size)
    expected = _expected(plan.goodput_at, distribution, kv_max)
    return CandidatePlan(key=key, method=candidate.method, ready=True, note=note, strategy=Strategy.DYNAMIC,
                         num_speculative_tokens=plan.num_speculative_tokens, schedule=plan,
                         crossover_concurrency=plan.crossover_concurrency,
                         crossover_gain_se=plan.crossover_gain_se, kv_max_concurrency=kv_max,
                         expected_goodput_tok_s=expected, cost_per_mtok=_cost(price, gpus, expected),
                         capacity_concurrency=_capacity(plan.tpot_ms_at, policy.tpot_slo_ms, limit),
                         tpot_ms_at=plan.tpot_ms_at), source


def _margin(min_gain_percent: float) -> float:
    """Factor by which a method must beat no speculation: the minimum gain, 0.1% at least (ties stay off)."""
    return 1.0 + max(1e-3, min_gain_percent / 100.0)


def _pick(rows: list[CandidatePlan], objective: str, min_gain_percent: float,
          incumbent: str | None = None) -> CandidatePlan:
    """The row to serve. A change costs a rollout, so the option served now (`incumbent`: a candidate key, or
    None for no speculation) stays unless another beats it by the minimum gain; with no incumbent, a method
    must beat no speculation by it."""
    baseline = rows[0]
    margin = _margin(min_gain_percent)
    usable = [r for r in rows[1:] if r.ready and r.num_speculative_tokens > 0 and r.expected_goodput_tok_s]
    by_cost = objective == Objective.COST.value and all(r.cost_per_mtok for r in [baseline, *usable])

    def beats(a: CandidatePlan, b: CandidatePlan) -> bool:
        if by_cost:
            return a.cost_per_mtok * margin < b.cost_per_mtok
        return a.expected_goodput_tok_s > b.expected_goodput_tok_s * margin

    if by_cost:
        best = min(usable, key=lambda r: r.cost_per_mtok, default=None)
        best_overall = min([baseline, *usable], key=lambda r: r.cost_per_mtok)
    else:
        best = max(usable, key=lambda r: r.expected_goodput_tok_s, default=None)
        best_overall = max([baseline, *usable], key=lambda r: r.expected_goodput_tok_s)
    current = next((r for r in usable if r.key == incumbent), None) if incumbent else baseline
    if current is not None and (current is best_overall or not beats(best_overall, current)):
        return current
    return best if best is not None and beats(best, baseline) else baseline


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


def _pct(a: float, b: float) -> str:
    return f"{(a / b - 1) * 100:+.0f}%"


def _decision(chosen: CandidatePlan, rows: list[CandidatePlan], base_expected: float, load_words: str,
              source: str, now: datetime, objective: str, min_gain_percent: float = 0.0) -> Decision:
    baseline = rows[0]
    ranked = sorted((r for r in rows[1:] if r.ready and r.expected_goodput_tok_s),
                    key=lambda r: -r.expected_goodput_tok_s)
    not_ready = [r.key for r in rows[1:] if not r.ready]
    tail = f"; not ready: {', '.join(not_ready)}" if not_ready else ""
    if chosen is baseline:
        if ranked:
            best = ranked[0]
            reason = (f"no speculation: the best candidate, {best.key}, gets "
                      f"{_pct(best.expected_goodput_tok_s, base_expected)} goodput at the {load_words}")
            if min_gain_percent > 0.1 and best.expected_goodput_tok_s > base_expected:
                reason += f" (a method must beat no speculation by {min_gain_percent:g}%)"
            reason += tail
        else:
            reason = f"no speculation: no candidate has a usable profile yet{tail}"
        return Decision(method=None, num_speculative_tokens=0, schedule=[], schedule_summary="",
                        strategy=Strategy.DYNAMIC, crossover_concurrency=None,
                        cost_per_mtok_with_sd=baseline.cost_per_mtok, cost_per_mtok_without_sd=baseline.cost_per_mtok,
                        expected_speedup=1.0, source="profile" if ranked else "none", reason=reason, decided_at=now)
    others = [r for r in ranked if r.key != chosen.key]
    if others:
        lead = (f"{chosen.key} beats {others[0].key} by "
                f"{(chosen.expected_goodput_tok_s / others[0].expected_goodput_tok_s - 1) * 100:.0f}% goodput")
    else:
        lead = f"{chosen.key} is the only ready candidate"
    reason = (f"{lead} at the {load_words} ({_pct(chosen.expected_goodput_tok_s, base_expected)} over no "
              f"speculation)")
    if objective == Objective.COST.value and chosen.cost_per_mtok:
        reason += f", ${chosen.cost_per_mtok:.3g}/Mtok"
    if chosen.crossover_concurrency is not None:
        reason += f"; SD off above {chosen.crossover_concurrency} concurrent requests"
        if chosen.crossover_gain_se is not None:
            reason += f" (its gain there known to ±{chosen.crossover_gain_se * 100:.1f}%)"
    if chosen.strategy == Strategy.RESTART:
        reason += f"; restart strategy: k={chosen.num_speculative_tokens}, toggled by rollout around the crossover"
    reason += tail
    dynamic = chosen.strategy == Strategy.DYNAMIC
    ranges = list(chosen.schedule.ranges) if dynamic and chosen.schedule else []
    return Decision(method=chosen.key, num_speculative_tokens=chosen.num_speculative_tokens, schedule=ranges,
                    schedule_summary=summary(ranges) if ranges else "", strategy=chosen.strategy,
                    crossover_concurrency=chosen.crossover_concurrency,
                    crossover_uncertainty_percent=chosen.crossover_uncertainty_percent,
                    cost_per_mtok_with_sd=chosen.cost_per_mtok, cost_per_mtok_without_sd=baseline.cost_per_mtok,
                    expected_speedup=chosen.expected_goodput_tok_s / base_expected, source=source, reason=reason,
                    decided_at=now)


def _no_data(now: datetime, reason: str) -> PoolPlan:
    return PoolPlan(decision=Decision(method=None, source="none", reason=reason, decided_at=now),
                    candidates=(), capacity_concurrency_per_replica=None)


def _within_ttft(row: CandidatePlan, profile: SpeculationProfile | None, slo_ms: float,
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
