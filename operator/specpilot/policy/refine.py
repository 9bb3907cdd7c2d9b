"""What the planner is unsure of: which measurements to take so that the schedule's k and its on/off are
right near the crossovers. Pure, like the rest of `policy`.

A schedule changes k at a few batch sizes (its boundaries: 4 -> 3, ..., 1 -> 0, the crossover). At a boundary
the two k are tied by construction, and how far the tie may lie from where the profile puts it is the
standard error of their goodput ratio there (`MethodSurface.ratio_se`, calibrated against the twin; the
decision's crossoverUncertaintyPercent is the same figure at the crossover). Where CONFIDENCE_Z times that
error exceeds the policy's minimum gain (at least MIN_THRESHOLD_PERCENT), the k on either side of the
boundary may be wrong by more than the gain the schedule insists on (a chance above about 5%), and measuring
again is worth it. What settles a boundary is a measurement at its batch size itself, in the runs its two k
are drawn from: k = 0 from the baseline run (the method profile's own K=0 run when it has one, else the
baseline profile), a k > 0 from the method's run at that k or, for a k between measured runs, from both
neighbours (k = 1 and K). The first sweep's levels lie a factor of 1.5-2 apart, and between them the tie
rests on the fit's shape; a level at the boundary measures the tie where it is (repeating the levels
around it instead reached 96.2% of draws within 3% of the best k on the twin for +49% profiling time,
measuring at it 97.5% for +45%; docs/decisions.md). Its precision now is the fit's there, worth about as much as
the levels around it measured m times; measuring it n times shrinks the error roughly as sqrt(m / (m + n)),
and n is the fewest repeats that bring CONFIDENCE_Z errors below the threshold, at most `max_repeat` (8 at
the default budget, in proportion to the budget; see there).

Each boundary's worth is the drop in the chance that the estimated gain is off by more than the threshold,
2 * Phi(-threshold / se), per second of measuring it costs (the mean duration of the levels around it; per
measured level where the points carry no durations); boundaries are taken best first while the budget
lasts (a boundary that does not fit whole gets the repeats that fit; a run's levels share its largest
repeat, as its one refinement Job repeats them). Only the schedule to be served is
refined: the chosen candidate's, or, when no speculation is chosen, the best candidate's (its crossover is
then what decides on/off). The budget counts measured levels (one level of one run measured once); a
refinement Job per profile measures its levels once per k, each k on its own engine start (`jobs()`).

Refinement is one round. Once the profiles carry points beyond their first sweep (`spent_levels` > 0: a
level measured again, or one the spec does not list) the plan is done, and
says what is still uncertain. On the twin, more rounds cost more than they buy: each starts its engines
again for what the first round left of the budget (a budget of twice the first sweep's levels spent over up
to four rounds costs +67% profiling time for 96.2% of draws within 3% of the best k, against +48% for 95.4%
in one round; 1.5 times over rounds until done, +54% for 93.6%; docs/decisions.md).

For the controller (the operator's side of refinement):

    plan = plan_refinement(policy, candidates, baseline, profiles, price_per_gpu_hour=...,
                           gpus_per_replica=..., concurrency_histogram=..., budget_levels=None)
    if not plan.done:
        for job in plan.jobs():       # one refinement Job per entry (round 1)
            benchmark_job(profile_name=job.profile_name, ..., refine=job.run(1))
            # (the run carries its part when a profile has several Jobs in the round)
    # when the Jobs succeed (their points are appended to the profiles), decide again; plan_refinement
    # then says done (plan.reason says why, and what is still uncertain).

`budget_levels` defaults to DEFAULT_BUDGET_SHARE of the levels the group's profiles measured in their first
sweep (`initial_levels`), and what is spent is read off the profiles themselves (`spent_levels`: points
beyond the first measurement of each level), so the plan needs no state of its own.
`refinement_done(plan)` is `plan.done`. `RefinePlan.to_dict()` is what `specpilot plan -o json` shows as
`refine` (docs/profiles.md).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from typing import Any

from ..api.deployment_spec import Policy, Profiling, Strategy
from ..api.methods import CandidateMethod
from ..api.profile import SpeculationProfile
from ..manifests.benchmark import RefineRun
from .choose import BASELINE_KEY, decide_pool
from .comparison import PoolPlan
from .schedule import SchedulePlan
from .surface import MethodSurface

__all__ = [
    "CONFIDENCE_Z",
    "DEFAULT_BUDGET_SHARE",
    "MAX_REPEAT",
    "MAX_REPEAT_CEILING",
    "MIN_THRESHOLD_PERCENT",
    "UNPROFILED_SOURCES",
    "Boundary",
    "RefineJob",
    "RefinePlan",
    "RefineRequest",
    "allocate",
    "boundaries",
    "initial_levels",
    "level_budget",
    "max_repeat",
    "plan_refinement",
    "pool_refinement",
    "refinement_done",
    "spent_levels",
]

DEFAULT_BUDGET_SHARE = Profiling.model_fields["refine_budget_percent"].default / 100
"""Refinement budget, in measured levels, as a share of the levels the group's first sweep measured: the API's
default (spec.profiling.refineBudgetPercent), its one home. What one round costs in profiling time at each
budget, and what it settles, is measured on the twin by benchmarks/decision_quality.py (docs/decisions.md)."""
UNPROFILED_SOURCES = ("none", "prior")
"""Decision sources that rest on no profile (api Decision.source): nothing to refine."""
MAX_REPEAT = 8
"""Most measurements asked of one level of one run in one round at the default budget (`max_repeat`)."""
MAX_REPEAT_CEILING = 12
"""Most measurements of one level in one round at any budget: a run keeps at most 64 points, and 12 sweep
levels plus four changes of k measured 12 times each fit."""
CONFIDENCE_Z = 2.0
"""A boundary is settled when CONFIDENCE_Z standard errors fit within the threshold (about 95%)."""
MIN_THRESHOLD_PERCENT = 1.0
"""Uncertainty (percent) below which a boundary counts as settled, whatever the minimum gain (at minGain 0
every boundary would otherwise stay uncertain for ever)."""


def _phi(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def wrong_chance(se: float, threshold: float) -> float:
    """Chance that an estimate with relative standard error `se` is off by more than `threshold`."""
    if se <= 0:
        return 0.0
    return 2.0 * _phi(-threshold / se)


@dataclasses.dataclass(frozen=True)
class RunRef:
    """One run of one profile: the profile's key (a candidate key, or BASELINE_KEY) and name, and its k."""

    profile_key: str
    profile_name: str | None
    num_speculative_tokens: int


@dataclasses.dataclass(frozen=True)
class Boundary:
    """A batch size where the schedule changes k, and how precisely the profile places it."""

    candidate: str
    batch_size: int
    """The last batch size of the lower range (k_from runs up to here, k_to from the next one)."""
    k_from: int
    k_to: int
    uncertainty: float | None
    """Relative standard error of G_from / G_to at batch_size (None: no roofline fit, unknown)."""
    threshold: float
    runs: tuple[RunRef, ...]
    """The runs the two k are drawn from."""
    levels: tuple[int, ...]
    """The levels to measure: (batch_size,), where the two k are tied."""
    measured: int
    """Times the measured levels around batch_size are measured now (the fewest among them): what the fit's
    precision at batch_size is worth in measurements of it."""
    seconds: float | None = None
    """How long measuring `levels` once in each of `runs` takes (the mean duration of the measured levels
    around batch_size, from their points), when known."""

    @property
    def uncertain(self) -> bool:
        return self.uncertainty is not None and CONFIDENCE_Z * self.uncertainty > self.threshold

    @property
    def crossover(self) -> bool:
        return self.k_to == 0

    def after(self, repeat: int) -> float | None:
        """The uncertainty expected after measuring `levels` `repeat` times."""
        if self.uncertainty is None:
            return None
        return self.uncertainty * math.sqrt(self.measured / (self.measured + repeat))

    def repeats_needed(self, cap: int = MAX_REPEAT) -> int:
        """Fewest repeats that bring the uncertainty to the threshold (at most `cap`, `max_repeat`)."""
        if not self.uncertain:
            return 0
        n = math.ceil(self.measured * ((CONFIDENCE_Z * self.uncertainty / self.threshold) ** 2 - 1.0) - 1e-9)
        return max(1, min(cap, n))

    def cost(self, repeat: int) -> int:
        return repeat * len(self.levels) * len(self.runs)

    def price(self, repeat: int) -> float:
        """What `repeat` more measurements cost to rank by: their measuring time when the points say it
        (a level at concurrency 1 takes minutes, one at 256 seconds), else their count."""
        return repeat * self.seconds if self.seconds else float(self.cost(repeat))

    def worth(self, repeat: int) -> float:
        """Drop in the chance of a wrong k (or a wrong on/off) here from `repeat` more measurements."""
        if self.uncertainty is None or repeat < 1:
            return 0.0
        return wrong_chance(self.uncertainty, self.threshold) - wrong_chance(self.after(repeat), self.threshold)

    def describe(self) -> str:
        what = (f"SD off above {self.batch_size}" if self.crossover
                else f"k {self.k_from} -> {self.k_to} at {self.batch_size}")
        known = "unknown" if self.uncertainty is None else f"±{self.uncertainty * 100:.1f}%"
        need = self.threshold / CONFIDENCE_Z * 100
        return f"{self.candidate}: {what} (gain known to {known}, needs ±{need:.1f}%)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate": self.candidate,
            "batchSize": self.batch_size,
            "fromK": self.k_from,
            "toK": self.k_to,
            "crossover": self.crossover,
            "uncertaintyPercent": None if self.uncertainty is None else round(self.uncertainty * 100, 2),
            "thresholdPercent": round(self.threshold * 100, 2),
            "neededPercent": round(self.threshold / CONFIDENCE_Z * 100, 2),
            "levels": list(self.levels),
        }


@dataclasses.dataclass(frozen=True)
class RefineRequest:
    """Measure one level of one run `repeat` times (appended to the profile's run; a level the run has, or a
    boundary's batch size between its levels)."""

    profile_key: str
    """The candidate's key, or BASELINE_KEY for the baseline profile."""
    profile_name: str | None
    """The SpeculationProfile's metadata.name (None when the profile carries none, e.g. a bare file)."""
    num_speculative_tokens: int
    concurrency: int
    repeat: int
    worth: float
    """Drop in the chance of a wrong k or on/off it buys (its boundaries' worth, shared among their levels)."""
    reason: str
    """The boundaries it settles, in words."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": self.profile_key,
            "profileName": self.profile_name,
            "k": self.num_speculative_tokens,
            "concurrency": self.concurrency,
            "repeat": self.repeat,
            "worth": round(self.worth, 4),
            "reason": self.reason,
        }


@dataclasses.dataclass(frozen=True)
class RefineJob:
    """One refinement Job: a profile's levels at its ks, each repeated; what `manifests.benchmark_job` takes."""

    profile_key: str
    profile_name: str | None
    ks: tuple[int, ...]
    levels: tuple[int, ...]
    repeat: int
    part: int | None = None
    """Which of its profile's Jobs this round it is (from 1), when the profile has more than one."""

    @property
    def engine_starts(self) -> int:
        return len(self.ks)

    @property
    def measured_levels(self) -> int:
        return len(self.ks) * len(self.levels) * self.repeat

    def run(self, round_index: int) -> RefineRun:
        """This Job as round `round_index` of the profile's refinement (`manifests.benchmark.benchmark_job`'s
        `refine`): its points appended to the profile."""
        return RefineRun(round=round_index, levels=list(self.levels), ks=list(self.ks), repeat=self.repeat,
                         append=True, part=self.part)

    def bench_args(self) -> list[str]:
        """The same as `specpilot-bench` flags (a refinement by hand, next to --profile-name or --model)."""
        return ["--levels", ",".join(map(str, self.levels)), "--ks", ",".join(map(str, self.ks)),
                "--repeat", str(self.repeat), "--append"]

    def to_dict(self) -> dict[str, Any]:
        return {"profile": self.profile_key, "profileName": self.profile_name, "ks": list(self.ks),
                "levels": list(self.levels), "repeat": self.repeat, "part": self.part,
                "engineStarts": self.engine_starts, "measuredLevels": self.measured_levels}


@dataclasses.dataclass(frozen=True)
class RefinePlan:
    """The refinement a group of profiles asks for now, best first, within what is left of the budget."""

    requests: tuple[RefineRequest, ...]
    boundaries: tuple[Boundary, ...]
    """Every boundary of the refined schedule, settled or not."""
    budget_levels: int
    spent_levels: int
    done: bool
    reason: str

    @property
    def uncertain(self) -> tuple[Boundary, ...]:
        return tuple(b for b in self.boundaries if b.uncertain)

    @property
    def requested_levels(self) -> int:
        return sum(r.repeat for r in self.requests)

    @property
    def unaddressed(self) -> tuple[Boundary, ...]:
        """Uncertain boundaries no request measures (the budget left did not reach them)."""
        asked = {(r.profile_key, r.num_speculative_tokens, r.concurrency) for r in self.requests}
        return tuple(b for b in self.uncertain
                     if not any((ref.profile_key, ref.num_speculative_tokens, c) in asked
                                for ref in b.runs for c in b.levels))

    def jobs(self) -> list[RefineJob]:
        """The requests grouped into Jobs, measuring exactly what they ask for: a Job repeats all its levels
        alike, so per profile and k the levels asking for the same repeats go together, and the ks asking
        for the same levels and repeats share one Job (one engine start per k either way)."""
        by_run: dict[tuple[str, str | None, int, int], list[int]] = {}
        for r in self.requests:
            by_run.setdefault((r.profile_key, r.profile_name, r.num_speculative_tokens, r.repeat),
                              []).append(r.concurrency)
        grouped: dict[tuple[str, str | None, tuple[int, ...], int], list[int]] = {}
        for (key, name, k, repeat), levels in by_run.items():
            grouped.setdefault((key, name, tuple(sorted(levels)), repeat), []).append(k)
        jobs = [RefineJob(key, name, tuple(sorted(ks)), levels, repeat)
                for (key, name, levels, repeat), ks in sorted(grouped.items(),
                                                              key=lambda item: (item[0][0], min(item[1])))]
        per_profile: dict[str, int] = {}
        for job in jobs:
            per_profile[job.profile_key] = per_profile.get(job.profile_key, 0) + 1
        seen: dict[str, int] = {}
        out = []
        for job in jobs:  # several Jobs of one profile in one round need names of their own
            if per_profile[job.profile_key] > 1:
                seen[job.profile_key] = seen.get(job.profile_key, 0) + 1
                job = dataclasses.replace(job, part=seen[job.profile_key])
            out.append(job)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "done": self.done,
            "reason": self.reason,
            "budgetLevels": self.budget_levels,
            "spentLevels": self.spent_levels,
            "requestedLevels": self.requested_levels,
            "uncertain": [b.to_dict() for b in self.uncertain],
            "unaddressed": [b.batch_size for b in self.unaddressed],
            "requests": [r.to_dict() for r in self.requests],
            "jobs": [j.to_dict() for j in self.jobs()],
        }


def refinement_done(plan: RefinePlan) -> bool:
    """Whether refinement stops: no boundary is uncertain beyond the threshold, the profiles were refined
    once already, or the budget is spent (or what is left buys nothing)."""
    return plan.done


def _bracket(levels: Sequence[int], c: int) -> tuple[int, ...]:
    """The measured levels around batch size c (the last two beyond the last, the first two below the first)."""
    levels = sorted(set(levels))
    if len(levels) <= 2:
        return tuple(levels)
    below = [x for x in levels if x <= c]
    above = [x for x in levels if x > c]
    if not above:
        return tuple(levels[-2:])
    if not below:
        return tuple(levels[:2])
    return (below[-1], above[0])


def _runs_for(surface: MethodSurface, k: int, method_key: str, method_name: str | None,
              baseline_key: str, baseline_name: str | None) -> list[tuple[RunRef, int]]:
    """(run, index into surface.curves) of the runs k is drawn from."""
    measured = surface.measured_k
    if k == 0:
        return [(RunRef(baseline_key, baseline_name, 0), 0)]
    if k in measured:
        return [(RunRef(method_key, method_name, k), measured.index(k))]
    below = max(i for i, kk in enumerate(measured) if 1 <= kk < k)
    above = min(i for i, kk in enumerate(measured) if kk > k)
    return [(RunRef(method_key, method_name, measured[i]), i) for i in (below, above)]


def boundaries(plan: SchedulePlan, min_gain_percent: float, method_key: str, method_name: str | None = None,
               baseline_key: str = BASELINE_KEY, baseline_name: str | None = None,
               ks: Sequence[int] | None = None,
               profiles: dict[str, SpeculationProfile | None] | None = None) -> list[Boundary]:
    """Every batch size where the schedule's k changes, with its uncertainty and what places it.

    `ks` replaces the schedule's k per batch size (a restart plan: k up to the crossover, 0 above); the
    baseline run is named by `baseline_key` / `baseline_name` (the method profile itself when its own K=0
    run is the one the surface used). `profiles` (key -> profile) gives the points' durations, by which
    allocate() ranks."""
    surface = plan.surface
    if surface is None or not plan.ok:
        return []
    dense = list(ks if ks is not None else plan.k_by_batch_size)
    threshold = max(min_gain_percent, MIN_THRESHOLD_PERCENT) / 100.0
    out = []
    for c in range(1, len(dense)):
        k_from, k_to = dense[c - 1], dense[c]
        if k_from == k_to:
            continue
        runs = {}
        for k in (k_from, k_to):
            for ref, index in _runs_for(surface, k, method_key, method_name, baseline_key, baseline_name):
                runs[ref] = index
        level_sets = [surface.curves[i].levels for i in runs.values()]
        common = sorted(set.intersection(*(set(lv) for lv in level_sets))) or sorted(set(level_sets[0]))
        around = _bracket(common, c)
        measured = []
        for i in runs.values():
            curve = surface.curves[i]
            counts = curve.counts or (1,) * len(curve.levels)
            measured += [counts[curve.levels.index(x)] for x in around if x in curve.levels]
        seconds = _seconds(profiles, runs, around)
        out.append(Boundary(method_key, c, k_from, k_to, surface.ratio_se(k_from, k_to, float(c)), threshold,
                            tuple(runs), (c,), min(measured, default=1),
                            None if seconds is None else seconds / len(around)))
    return out


def _seconds(profiles: dict[str, SpeculationProfile | None] | None, runs: Iterable[RunRef],
             levels: Sequence[int]) -> float | None:
    """Seconds one measurement of each level in each run took (the median of its points' durations); None
    when a point lacks one."""
    if not profiles:
        return None
    total = 0.0
    for ref in runs:
        profile = profiles.get(ref.profile_key)
        run = profile.status.run(ref.num_speculative_tokens) if profile is not None and profile.status else None
        for c in levels:
            durations = sorted(p.duration_s for p in (run.points if run else []) if p.concurrency == c
                               and p.duration_s and math.isfinite(p.duration_s))
            if not durations:
                return None
            total += durations[len(durations) // 2]
    return total


def max_repeat(budget_levels: int, first_sweep_levels: int) -> int:
    """Most measurements one level of one run may take in the round: MAX_REPEAT at the default budget, in
    proportion to the budget (1.5 times the sweep: 6; 3 times: 12), between 1 and MAX_REPEAT_CEILING.

    A refinement Job measures all of a run's levels alike, so one change asking for many repeats lifts every
    level of its runs to as many. Under the default budget a cap of 12 then spends the budget before the
    other changes are measured (96.3% / 95.2% of draws within 3% of the best k on two halves of the twin's
    draws, against 97.5% at 8), while with three times the levels it buys 97.9%; at 1.5 times, a cap of 6
    does better than 8 (96.1% against 95.6%, for less time). docs/decisions.md."""
    if first_sweep_levels <= 0:
        return MAX_REPEAT
    share = budget_levels / first_sweep_levels
    return max(1, min(MAX_REPEAT_CEILING, math.floor(MAX_REPEAT * share / DEFAULT_BUDGET_SHARE + 1e-9)))


def allocate(candidates: Iterable[Boundary], budget_left: int, cap: int = MAX_REPEAT) -> list[RefineRequest]:
    """Requests for the uncertain boundaries, best worth per measuring time first (per measured level where
    the durations are unknown), within `budget_left` measured levels.

    A refinement Job repeats every level of a run alike (one engine start per run), so the requests of one
    run share its largest repeat, and a boundary costs what it adds to its runs' Jobs: its levels at its
    repeats, plus the repeats its repeat adds to the levels already asked of those runs."""
    offers = []
    for b in candidates:
        if not b.uncertain:
            continue
        n = b.repeats_needed(cap)
        offers.append((b.worth(n) / b.price(n), b, n))
    offers.sort(key=lambda o: -o[0])
    plan: dict[RunRef, tuple[set[int], int]] = {}
    worth: dict[tuple[RunRef, int], float] = {}
    reasons: dict[tuple[RunRef, int], list[str]] = {}

    def cost(state: dict[RunRef, tuple[set[int], int]]) -> int:
        return sum(len(levels) * repeat for levels, repeat in state.values())

    def with_boundary(b: Boundary, n: int) -> dict[RunRef, tuple[set[int], int]]:
        state = dict(plan)
        for ref in b.runs:
            levels, repeat = state.get(ref, (set(), 0))
            state[ref] = (levels | set(b.levels), max(repeat, n))
        return state

    left = budget_left
    for _, b, n in offers:
        while n >= 1 and cost(with_boundary(b, n)) - cost(plan) > left:
            n -= 1
        if n < 1:
            continue
        state = with_boundary(b, n)
        left -= cost(state) - cost(plan)
        plan = state
        share = b.worth(n) / (len(b.runs) * len(b.levels))
        for ref in b.runs:
            for c in b.levels:
                worth[ref, c] = worth.get((ref, c), 0.0) + share
                reasons.setdefault((ref, c), []).append(b.describe())
    requests = [RefineRequest(ref.profile_key, ref.profile_name, ref.num_speculative_tokens, c, repeat,
                              worth.get((ref, c), 0.0), "; ".join(dict.fromkeys(reasons.get((ref, c), []))))
                for ref, (levels, repeat) in plan.items() for c in sorted(levels)]
    return sorted(requests, key=lambda r: (-r.worth, r.profile_key, r.num_speculative_tokens, r.concurrency))


def _first_points(profile: SpeculationProfile, run) -> int:
    """Levels of the first sweep a run measured: its distinct concurrencies that the profile's spec lists. A
    level only refinement measured (a boundary's batch size) is not one of them."""
    sweep = set(profile.spec.concurrency_levels)
    return len({p.concurrency for p in run.points if p.concurrency in sweep})


def initial_levels(profiles: Iterable[SpeculationProfile | None]) -> int:
    """Levels the profiles' runs measured once (their first sweep): distinct spec levels per run."""
    return sum(_first_points(profile, run)
               for profile in profiles if profile is not None and profile.status
               for run in profile.status.runs)


def spent_levels(profiles: Iterable[SpeculationProfile | None]) -> int:
    """Measurements beyond the first sweep's, over the profiles' runs: what refinement has spent (repeats of
    a sweep level, and every measurement of a level only refinement asked for)."""
    return sum(len(run.points) - _first_points(profile, run)
               for profile in profiles if profile is not None and profile.status
               for run in profile.status.runs)


def level_budget(profiles: Iterable[SpeculationProfile | None], share: float = DEFAULT_BUDGET_SHARE) -> int:
    """The round's budget in measured levels: `share` (spec.profiling.refineBudgetPercent / 100) of the levels
    the group's first sweep measured, rounded up."""
    return math.ceil(share * initial_levels(profiles))


def _name(profile: SpeculationProfile | None) -> str | None:
    return (profile.metadata or {}).get("name") if profile is not None else None


def refine_pool_plan(pool_plan: PoolPlan, policy: Policy, baseline: SpeculationProfile | None,
                     profiles: dict[str, SpeculationProfile], budget_levels: int | None = None) -> RefinePlan:
    """The refinement for a pool's decision already made (`decide_pool`'s PoolPlan); see plan_refinement."""
    group = [baseline, *profiles.values()]
    spent = spent_levels(group)
    budget = level_budget(group) if budget_levels is None else max(0, int(budget_levels))
    rows = [r for r in pool_plan.candidates[1:] if r.ready and r.schedule is not None and r.schedule.ok]
    if not rows:
        return RefinePlan((), (), budget, spent, True, "nothing to refine: no candidate has a schedule")
    chosen = next((r for r in rows if r.key == pool_plan.decision.method), None)
    if chosen is None:  # no speculation chosen: the best candidate's crossover decides on/off
        chosen = max(rows, key=lambda r: r.expected_goodput_tok_s or 0.0)
    profile = profiles.get(chosen.key)
    own_baseline = profile is not None and profile.status is not None and profile.status.run(0) is not None
    base_key, base_name = (chosen.key, _name(profile)) if own_baseline else (BASELINE_KEY, _name(baseline))
    ks = None
    if chosen.strategy == Strategy.RESTART:
        crossover = chosen.crossover_concurrency
        size = chosen.schedule.max_batch_size
        ks = [chosen.num_speculative_tokens if crossover is None or c <= crossover else 0
              for c in range(1, size + 1)]
    found = boundaries(chosen.schedule, policy.min_gain_percent, chosen.key, _name(profile), base_key, base_name,
                       ks=ks, profiles={chosen.key: profile, BASELINE_KEY: baseline})
    return _plan(found, budget, spent, max_repeat(budget, initial_levels(group)))


def pool_refinement(pool_plan: PoolPlan, policy: Policy, baseline: SpeculationProfile | None,
                    profiles: dict[str, SpeculationProfile],
                    budget_percent: float = DEFAULT_BUDGET_SHARE * 100) -> RefinePlan | None:
    """The refinement the operator asks of a pool's decision: None where it asks none, with refinement off
    (`budget_percent`, spec.profiling.refineBudgetPercent, 0) or a decision that rests on no profile (source
    none or prior); else `refine_pool_plan` within `budget_percent` of the group's first sweep."""
    decision = pool_plan.decision
    if budget_percent == 0 or decision is None or decision.source in UNPROFILED_SOURCES:
        return None
    budget = level_budget([baseline, *profiles.values()], budget_percent / 100)
    return refine_pool_plan(pool_plan, policy, baseline, profiles, budget_levels=budget)


def _plan(found: Sequence[Boundary], budget: int, spent: int, cap: int) -> RefinePlan:
    uncertain = [b for b in found if b.uncertain]
    if not uncertain:
        reason = ("no uncertain boundary: every change of k is known within the minimum gain" if found
                  else "no boundary: the schedule keeps one k at every batch size")
        return RefinePlan((), tuple(found), budget, spent, True, reason)
    still = "; ".join(b.describe() for b in uncertain)
    if spent > 0:
        return RefinePlan((), tuple(found), budget, spent, True,
                          f"refined once ({spent} levels measured after the first sweep); refinement is one "
                          f"round, and still uncertain: {still}")
    # From here nothing is spent yet: the whole budget is left for the one round.
    if budget <= 0:
        return RefinePlan((), tuple(found), budget, spent, True,
                          f"budget spent ({spent} of {budget} levels); still uncertain: {still}")
    requests = allocate(uncertain, budget, cap)
    if not requests:
        return RefinePlan((), tuple(found), budget, spent, True,
                          f"the budget left ({budget} levels) buys no measurement; still uncertain: {still}")
    return RefinePlan(tuple(requests), tuple(found), budget, spent, False,
                      f"{len(uncertain)} uncertain boundar{'y' if len(uncertain) == 1 else 'ies'}: {still}")


def refine_schedule(plan: SchedulePlan, min_gain_percent: float, method_key: str, budget_levels: int,
                    spent: int = 0, baseline_key: str = BASELINE_KEY,
                    profiles: dict[str, SpeculationProfile | None] | None = None) -> RefinePlan:
    """The refinement of one method's schedule (a plan from `plan_schedule` / `plan_from_runs`), without a
    pool decision: what benchmarks/decision_quality.py simulates. `profiles`: key -> profile, for the
    points' durations and the first sweep the budget is a share of (`max_repeat`)."""
    cap = max_repeat(budget_levels, initial_levels(profiles.values())) if profiles else MAX_REPEAT
    return _plan(boundaries(plan, min_gain_percent, method_key, baseline_key=baseline_key, profiles=profiles),
                 budget_levels, spent, cap)


def plan_refinement(policy: Policy, candidates: list[CandidateMethod], baseline: SpeculationProfile | None,
                    profiles: dict[str, SpeculationProfile], *, budget_levels: int | None = None,
                    price_per_gpu_hour: float = 0.0, gpus_per_replica: int = 1,
                    concurrency_histogram: list[tuple[float, float]] | None = None,
                    engine_supports_dynamic: bool = True, max_batch_size: int = 256) -> RefinePlan:
    """What to measure next for one pool's group of profiles (the arguments are decide_pool's; see the
    module). Never raises on profile data: without a usable schedule the plan is done, with the reason."""
    pool_plan = decide_pool(policy, candidates, baseline, profiles, price_per_gpu_hour, gpus_per_replica,
                            concurrency_histogram=concurrency_histogram,
                            engine_supports_dynamic=engine_supports_dynamic, max_batch_size=max_batch_size)
    return refine_pool_plan(pool_plan, policy, baseline, profiles, budget_levels)
