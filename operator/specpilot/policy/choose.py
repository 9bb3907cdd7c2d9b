"""Method choice for one pool: which candidate (or none) to serve, with which schedule, and why.

Every candidate with a Succeeded profile gets its schedule (policy.schedule) and its expected goodput over
the concurrency the replicas see: the observed histogram, else `policy.expectedConcurrency`, else, with no
load known, the levels of the profiles' first sweep (the spec's), each weighed alike on the relative gain
over no speculation, never by the tokens a level produces; points a refinement round added sharpen the fit
but add no weight. Memory counts: a drafter takes KV cache, so a replica holds at most
kv_capacity_tokens / tokens-per-request requests and goodput saturates there. The baseline (no
speculation, the plain engine without a drafter) is a candidate too, and a method is deployed only when it
passes the deploy test (`DeployCase.pays`): its gain where its schedule speculates beats what keeping it
loaded costs where the schedule is off (the drafter's prefill and KV memory) by `policy.minGainPercent` of
the load it speculates on (0.1% at least, so the baseline wins ties); each figure carries its standard
error. This is where the drafter's own cost is weighed; a schedule's noise guard compares against k = 0 on
the method's engine. On refined profiles the first sweep's verdict holds unless refinement moved the gain
where it speculates or the cost where it is off by more than its uncertainty (`_held`). The objective picks
among the methods that pass by goodput or by dollars per million tokens (price_per_gpu_hour *
gpus_per_replica / (3600 * tokens/s per replica)).

Strategy: dynamic puts the schedule in the engine; restart (policy says so, or auto when the method or
engine cannot take a schedule) serves one fixed k and lets policy.restart toggle speculation around the
crossover concurrency. `decide_pool` is pure: the operator passes in what it read and writes out the result.

The rows it compares are policy.comparison's; the decision's words policy.choose_reasons; the memory, SLO
capacity, TTFT and load checks policy.load_checks.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from datetime import UTC, datetime

from ..api.deployment_spec import Objective, Policy, Strategy
from ..api.methods import MODEL_FREE_METHODS, CandidateMethod, SpeculativeMethod
from ..api.profile import ProfilePhase, Run, SpeculationProfile
from ..perf.cost import cost_per_million_tokens
from .choose_reasons import decision_for, no_data, percent_over
from .comparison import CandidatePlan, DeployCase, PoolPlan, WeighedLoad, gain_margin
from .load_checks import fleet_capacity_check, kv_max_concurrency, observed_load_level, slo_concurrency, within_ttft
from .schedule import SchedulePlan, plan_schedule
from .surface import (
    BaselineSurface,
    MethodSurface,
    NotEnoughDataError,
    build_baseline,
    pool_surfaces,
    with_live_acceptance,
)

__all__ = ["BASELINE_KEY", "decide_pool"]

BASELINE_KEY = "baseline"


def _ready(profile: SpeculationProfile | None) -> bool:
    return bool(profile and profile.status and profile.status.phase == ProfilePhase.SUCCEEDED.value
                and profile.status.runs)


def _distribution(policy: Policy, histogram: Sequence[tuple[float, float]] | None,
                  levels: Sequence[int]) -> WeighedLoad:
    if histogram:
        points = [(float(c), float(w)) for c, w in histogram
                  if math.isfinite(c) and math.isfinite(w) and c > 0 and w > 0]
        if points:
            return WeighedLoad(tuple(points), "observed load")
    if policy.expected_concurrency:
        return WeighedLoad(tuple((float(p.concurrency), float(p.weight)) for p in policy.expected_concurrency),
                           "expected load")
    return WeighedLoad(tuple((float(c), 1.0) for c in levels),
                       f"profiled levels (no load known yet: the first sweep's {len(levels)} levels weighed alike, "
                       f"on the gain over no speculation)", per_level=True)


def _first_sweep(profile: SpeculationProfile | None, measured: Sequence[int]) -> tuple[int, ...]:
    """The levels the profile's spec asked the first sweep for: what the load range is with no load known.
    Points a refinement round added (at other levels, or repeats) sharpen the fit at their levels but are
    no part of it (`measured`, the run's levels, only when the spec names none)."""
    spec_levels = profile.spec.concurrency_levels if profile is not None else None
    levels = sorted({int(c) for c in spec_levels or () if c >= 1})
    return tuple(levels) or tuple(measured)


def _at(c: float, kv_max: int | None, max_batch_size: int) -> float:
    """The batch a replica runs at concurrency c: capped by the KV memory and max_num_seqs."""
    return max(1.0, min(c, float(kv_max or c), float(max_batch_size)))


def _expected(goodput_at, load: WeighedLoad, kv_max: int | None, max_batch_size: int) -> float:
    total = sum(w for _, w in load.points)
    return sum(w * goodput_at(_at(c, kv_max, max_batch_size)) for c, w in load.points) / total


def _deploy_case(load: WeighedLoad, option_at, plain_at) -> DeployCase:
    """What deploying an option changes over `load`. option_at(c) -> (goodput over no speculation's, whether
    it speculates at c, the standard error of that ratio or None); plain_at(c): no speculation's goodput.

    With no load known each level weighs alike (the relative gain, never the tokens a level produces); with a
    known load each point weighs its time share times no speculation's goodput there, so that the net is the
    load's expected goodput over no speculation's, as the expected goodput weighs it. The standard errors of
    the points add up (neighbouring levels share the fit's errors), a conservative sum."""
    total = gain = cost = on_weight = 0.0
    gain_se: float | None = 0.0
    cost_se: float | None = 0.0
    points_on = 0
    for c, w in load.points:
        weight = w if load.per_level else w * plain_at(c)
        ratio, on, se = option_at(c)
        total += weight
        if on:
            gain += weight * (ratio - 1.0)
            on_weight += weight
            points_on += 1
            gain_se = None if gain_se is None or se is None else gain_se + weight * ratio * se
        else:
            cost += weight * (1.0 - ratio)
            cost_se = None if cost_se is None or se is None else cost_se + weight * ratio * se
    if not total > 0:
        return DeployCase(0.0, None, 0.0, None, 0.0, 0, len(load.points))
    return DeployCase(gain / total, None if gain_se is None else gain_se / total, cost / total,
                      None if cost_se is None else cost_se / total, on_weight / total, points_on,
                      len(load.points))


def _restart_plan(surface: MethodSurface, baseline: BaselineSurface, policy: Policy, max_batch_size: int,
                  load: WeighedLoad, kv_max: int | None, base_kv: int | None):
    """Best fixed k for the restart strategy: on at k up to the crossover, off (baseline engine) above; with
    its (plan, k, crossover, deploy case), the case's net deciding between the k."""
    best = None
    for k in surface.available_k():
        if k == 0:
            continue
        plan = plan_schedule(surface, policy.tpot_slo_ms, policy.min_gain_percent, max_batch_size, ks=[0, k])
        # Off here means rolling out the plain engine (no drafter): speculation stays on only while it beats
        # that engine by the minimum gain, not just the method engine's own k=0.
        margin = gain_margin(policy.min_gain_percent)
        off_at = next((c for c, kk in enumerate(plan.k_by_batch_size, start=1)
                       if kk == 0 or surface.goodput(k, float(c)) < margin * baseline.goodput(float(c))), None)
        crossover = None if off_at is None else off_at - 1
        if crossover == 0:
            continue
        case = _deploy_case(load, _restart_option(surface, baseline, k, crossover, load, kv_max, base_kv,
                                                  max_batch_size),
                            lambda c: baseline.goodput(_at(c, base_kv, max_batch_size)))
        if best is None or case.net > best[3].net:
            best = (plan, k, crossover, case)
    return best


def _plain_at(surface: MethodSurface, baseline: BaselineSurface, load: WeighedLoad):
    """No speculation's goodput at a batch, as the deploy test compares against it: with no load known the
    plain engine of the method's own fit (both sides of the ratio from one fit, so that the noise of the
    plain run's levels cancels and an engine that adds nothing when off costs exactly nothing); with a known
    load the plain engine as measured, as its expected goodput is."""
    return surface.baseline_goodput if load.per_level else baseline.goodput


def _restart_option(surface: MethodSurface, baseline: BaselineSurface, k: int, crossover: int | None,
                    load: WeighedLoad, kv_max: int | None, base_kv: int | None, max_batch_size: int):
    plain = _plain_at(surface, baseline, load)

    def option_at(c: float) -> tuple[float, bool, float | None]:
        if crossover is not None and c > crossover:
            return 1.0, False, 0.0  # rolled back to the plain engine: nothing loaded, nothing lost
        at = _at(c, kv_max, max_batch_size)
        return (surface.goodput(k, at) / plain(_at(c, base_kv, max_batch_size)), True,
                surface.speedup_se(k, at))

    return option_at


def _dynamic_option(surface: MethodSurface, baseline: BaselineSurface, plan: SchedulePlan, load: WeighedLoad,
                    kv_max: int | None, base_kv: int | None, max_batch_size: int):
    plain = _plain_at(surface, baseline, load)

    def option_at(c: float) -> tuple[float, bool, float | None]:
        at = _at(c, kv_max, max_batch_size)
        k = plan.k_at(max(1, round(at)))
        se = surface.speedup_se(k, at) if k > 0 else surface.plain_ratio_se(at)
        return plan.goodput_at(at) / plain(_at(c, base_kv, max_batch_size)), k > 0, se

    return option_at


def decide_pool(policy: Policy, candidates: list[CandidateMethod], baseline: SpeculationProfile | None,
                profiles: dict[str, SpeculationProfile], price_per_gpu_hour: float, gpus_per_replica: int,
                concurrency_histogram: list[tuple[float, float]] | None = None,
                live_acceptance: dict[str, tuple[list[float], float]] | None = None,
                incumbent: str | None = None,
                engine_supports_dynamic: bool = True, max_batch_size: int = 256,
                now: datetime | None = None, fleet_placed: bool = False) -> PoolPlan:
    """Decide what one pool serves. Never raises on profile data: missing data becomes a reasoned decision.

    `fleet_placed`: the pool is one of a deployment's fleet placed by cost per token (policy.fleet), where a
    replica's SLO-feasible throughput sets what its tokens cost; under a TPOT SLO the method is then dropped
    where it holds less within the SLO than no speculation (`load_checks.fleet_capacity_check`)."""
    now = now or datetime.now(UTC)
    args = (policy, candidates, price_per_gpu_hour, gpus_per_replica, concurrency_histogram, live_acceptance or {},
            engine_supports_dynamic, max_batch_size)
    options = _options(baseline, profiles, *args)
    if isinstance(options, str):
        return no_data(now, options)
    rows, sources, load, base_expected = options
    first = _first_sweep_inputs(baseline, profiles)
    if first is not None:  # refined profiles: the deploy verdict holds unless refinement moved it beyond noise
        earlier = _options(*first, *args)
        if not isinstance(earlier, str):
            before = {r.key: r for r in earlier[0][1:]}
            guard = gain_margin(policy.min_gain_percent) - 1.0
            rows = [rows[0], *(_held(r, before.get(r.key), guard) for r in rows[1:])]
    picked = chosen = _pick(rows, policy.objective, policy.min_gain_percent, incumbent)
    # Only under a TPOT SLO: it is the bound the fleet sizes replicas by. Without one a replica's capacity is
    # its batch ceiling, where the drafter's KV share always costs throughput: the pool's own goodput
    # decision (speculation where the load is light) stands.
    fleet_note = fleet_capacity_check(picked, rows[0], policy.min_gain_percent) \
        if fleet_placed and policy.tpot_slo_ms is not None else None
    if fleet_note is not None:
        chosen = rows[0]
    decision = decision_for(chosen, rows, base_expected, load, sources.get(chosen.key, "profile"), now,
                            policy.objective, policy.min_gain_percent)
    if fleet_note is not None:
        decision.reason = (f"{fleet_note} (on the pool's own {load.words} {picked.key} would get "
                           f"{percent_over(picked.expected_goodput_tok_s, base_expected)} goodput over no speculation)")
    if load.words == "observed load":
        decision.load_concurrency = observed_load_level(concurrency_histogram)
    return PoolPlan(decision=decision, candidates=tuple(rows),
                    capacity_concurrency_per_replica=chosen.capacity_concurrency)


def _options(baseline: SpeculationProfile | None, profiles: dict[str, SpeculationProfile], policy: Policy,
             candidates: list[CandidateMethod], price_per_gpu_hour: float, gpus_per_replica: int,
             concurrency_histogram: list[tuple[float, float]] | None,
             live_acceptance: dict[str, tuple[list[float], float]], engine_supports_dynamic: bool,
             max_batch_size: int) -> tuple[list[CandidatePlan], dict[str, str], WeighedLoad, float] | str:
    """(the rows of the comparison, each candidate's source, the load weighed, no speculation's expected
    goodput), or why there is no decision to make from profiles yet."""
    baseline_run, baseline_profile = _find_baseline(baseline, profiles)
    if baseline_run is None:
        return ("not enough data: no Succeeded baseline profile (a K=0 run) for this pool yet; "
                "speculation stays off until it is measured")
    try:
        base_surface = build_baseline(baseline_run)
    except NotEnoughDataError as exc:
        return f"not enough data: {exc}"
    load = _distribution(policy, concurrency_histogram, _first_sweep(baseline_profile, base_surface.levels))
    base_kv = kv_max_concurrency(baseline_profile)
    base_limit = min(max_batch_size, base_kv or max_batch_size)
    base_expected = _expected(base_surface.goodput, load, base_kv, max_batch_size)
    rows = [CandidatePlan(
        key=BASELINE_KEY, method=None, ready=True, note="no speculation",
        kv_max_concurrency=base_kv, expected_goodput_tok_s=base_expected,
        cost_per_mtok=_cost(price_per_gpu_hour, gpus_per_replica, base_expected),
        capacity_concurrency=slo_concurrency(base_surface.tpot_ms, policy.tpot_slo_ms, base_limit),
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
                                     base_surface, policy, load, base_expected, base_kv,
                                     price_per_gpu_hour, gpus_per_replica, live_acceptance,
                                     engine_supports_dynamic, max_batch_size)
        rows.append(row)
        sources[candidate.key] = source
    if policy.ttft_slo_ms is not None:
        rows = [rows[0], *(within_ttft(r, profiles.get(r.key), policy.ttft_slo_ms, load.points)
                           for r in rows[1:])]
    return rows, sources, load, base_expected


def _first_sweep_profile(profile: SpeculationProfile | None) -> SpeculationProfile | None:
    """The profile as its first sweep left it: each run's first point at each level its spec lists (a
    refinement round appends its points after them); the profile itself when it holds nothing else."""
    if profile is None or profile.status is None or not profile.status.runs:
        return profile
    sweep = set(profile.spec.concurrency_levels)
    runs, trimmed = [], False
    for run in profile.status.runs:
        seen: set[int] = set()
        kept = []
        for point in run.points:
            if point.concurrency in sweep and point.concurrency not in seen:
                seen.add(point.concurrency)
                kept.append(point)
        trimmed = trimmed or len(kept) != len(run.points)
        runs.append(run.model_copy(update={"points": kept}))
    if not trimmed:
        return profile
    return profile.model_copy(update={"status": profile.status.model_copy(update={"runs": runs})})


def _first_sweep_inputs(baseline: SpeculationProfile | None, profiles: dict[str, SpeculationProfile]
                        ) -> tuple[SpeculationProfile | None, dict[str, SpeculationProfile]] | None:
    """The baseline and the methods' profiles as their first sweeps left them; None when no refinement round
    added to them."""
    first_baseline = _first_sweep_profile(baseline)
    first = {key: _first_sweep_profile(profile) for key, profile in profiles.items()}
    if first_baseline is baseline and all(first[key] is profiles[key] for key in profiles):
        return None
    return first_baseline, first


def _moved(now: DeployCase, before: DeployCase) -> bool:
    """Whether refinement moved the gain where the plan speculates, or the cost where it is off, by more than
    its uncertainty (the larger of the two standard errors; without one, any move counts)."""
    def beyond(a: float, b: float, se_a: float | None, se_b: float | None) -> bool:
        if se_a is None or se_b is None:
            return abs(a - b) > 1e-12
        return abs(a - b) > max(se_a, se_b)

    return (beyond(now.gain_where_on, before.gain_where_on, now.gain_where_on_se, before.gain_where_on_se)
            or beyond(now.cost_where_off, before.cost_where_off, now.cost_where_off_se, before.cost_where_off_se))


def _held(row: CandidatePlan, first: CandidatePlan | None, guard: float) -> CandidatePlan:
    """A refined profile's row with the first sweep's deploy verdict where the two differ and refinement moved
    neither the gain where the plan speculates nor the cost where it is off by more than its uncertainty: a
    round spent to place a crossover does not turn speculation on or off on noise. A plan that no longer
    speculates anywhere is never deployed."""
    case = row.deploy
    before = first.deploy if first is not None and first.ready else None
    if case is None or before is None or not row.ready:
        return row
    verdict = before.pays(guard)
    if case.pays(guard) == verdict or (verdict and case.share_on <= 0) or _moved(case, before):
        return row
    return dataclasses.replace(row, deploy=dataclasses.replace(case, held=verdict))


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
                   policy: Policy, load: WeighedLoad, base_expected: float, base_kv: int | None, price: float,
                   gpus: int, live: dict[str, tuple[list[float], float]], engine_dynamic: bool,
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
    kv_max = kv_max_concurrency(profile)
    limit = min(max_batch_size, kv_max or max_batch_size)
    restart = (policy.strategy == Strategy.RESTART.value
               or (policy.strategy == Strategy.AUTO.value
                   and not (candidate.supports_dynamic_schedule and engine_dynamic)))
    note = "; ".join(surface.notes)
    if restart:
        best = _restart_plan(surface, base, policy, max_batch_size, load, kv_max, base_kv)
        if best is None:
            return CandidatePlan(key=key, method=candidate.method, ready=True, strategy=Strategy.RESTART,
                                 note="no k beats no speculation at any concurrency", kv_max_concurrency=kv_max,
                                 expected_goodput_tok_s=0.0), source
        plan, k, crossover, case = best
        expected = base_expected * (1.0 + case.net)

        def tpot_at(c: float) -> float:
            return surface.tpot_ms(k, c) if crossover is None or c <= crossover else base.tpot_ms(c)

        capacity = slo_concurrency(tpot_at, policy.tpot_slo_ms, limit)
        return CandidatePlan(key=key, method=candidate.method, ready=True, note=note, strategy=Strategy.RESTART,
                             num_speculative_tokens=k, schedule=plan, crossover_concurrency=crossover,
                             crossover_gain_se=surface.speedup_se(k, crossover) if crossover else None,
                             kv_max_concurrency=kv_max, expected_goodput_tok_s=expected,
                             cost_per_mtok=_cost(price, gpus, expected), capacity_concurrency=capacity,
                             tpot_ms_at=tpot_at, deploy=case), source
    plan = plan_schedule(surface, policy.tpot_slo_ms, policy.min_gain_percent, max_batch_size)
    case = _deploy_case(load, _dynamic_option(surface, base, plan, load, kv_max, base_kv, max_batch_size),
                        lambda c: base.goodput(_at(c, base_kv, max_batch_size)))
    expected = base_expected * (1.0 + case.net)
    return CandidatePlan(key=key, method=candidate.method, ready=True, note=note, strategy=Strategy.DYNAMIC,
                         num_speculative_tokens=plan.num_speculative_tokens, schedule=plan,
                         crossover_concurrency=plan.crossover_concurrency,
                         crossover_gain_se=plan.crossover_gain_se, kv_max_concurrency=kv_max,
                         expected_goodput_tok_s=expected, cost_per_mtok=_cost(price, gpus, expected),
                         capacity_concurrency=slo_concurrency(plan.tpot_ms_at, policy.tpot_slo_ms, limit),
                         tpot_ms_at=plan.tpot_ms_at, deploy=case), source


def _case(row: CandidatePlan, baseline: CandidatePlan) -> DeployCase:
    """A row's deploy case; a row built without one (tests) counts as speculating over the whole load."""
    if row.deploy is not None:
        return row.deploy
    net = row.expected_goodput_tok_s / baseline.expected_goodput_tok_s - 1.0
    return DeployCase(max(net, 0.0), None, max(-net, 0.0), None, 1.0, 1, 1)


def _pick(rows: list[CandidatePlan], objective: str, min_gain_percent: float,
          incumbent: str | None = None) -> CandidatePlan:
    """The row to serve. A method is deployed when its deploy test passes (DeployCase.pays: what it gains
    where its schedule speculates beats what keeping it loaded costs where it does not, by the minimum gain of
    the load it speculates on); of those, the best by the objective. A change costs a rollout, so the method
    served now (`incumbent`: a candidate key, or None for no speculation) stays unless another beats it by
    the minimum gain or no speculation beats it by that much over the whole load (DeployCase.loses)."""
    baseline = rows[0]
    margin = gain_margin(min_gain_percent)
    usable = [r for r in rows[1:] if r.ready and r.num_speculative_tokens > 0 and r.expected_goodput_tok_s]
    by_cost = objective == Objective.COST.value and all(r.cost_per_mtok for r in [baseline, *usable])

    def rank(r: CandidatePlan) -> float:
        return -r.cost_per_mtok if by_cost else r.expected_goodput_tok_s

    def beats(a: CandidatePlan, b: CandidatePlan) -> bool:
        if by_cost:
            return a.cost_per_mtok * margin < b.cost_per_mtok
        return a.expected_goodput_tok_s > b.expected_goodput_tok_s * margin

    best = max(usable, key=rank, default=None)
    current = next((r for r in usable if r.key == incumbent), None) if incumbent else None
    if current is not None and not _case(current, baseline).loses(margin - 1.0) \
            and (best is current or not beats(best, current)):
        return current
    paying = [r for r in usable if _case(r, baseline).pays(margin - 1.0)]
    return max(paying, key=rank) if paying else baseline
