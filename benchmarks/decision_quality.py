"""Decision quality of the planner against the digital twin's truth; exit 1 when a target is missed.

For every scenario (SKU x model x method x workload) and noise draw, a baseline and a method profile are
synthesised the way the benchmark Job measures them (the profiled levels, k=1 and k=max runs, 5% log-normal
noise on every level's step and prefill time), the planner builds a schedule from them, and the schedule is
scored on the twin's noise-free goodput at every concurrency 1..256 (the engine's batch is capped at the
KV capacity, as in the engine):

- worst: the lowest ratio to the per-concurrency oracle (the best k at that concurrency on the method's
  engine) - target >= 0.97;
- mean: the mean of that ratio over concurrency - target >= 0.99;
- vs SD off: the lowest ratio to speculation off, k=0 on the same engine - target >= 0.99. That is what the
  schedule controls: at a batch size it can speculate or not, but not unload the drafter.
- vs the plain engine (no drafter loaded; shown, and the bar of the method choice below): where a loaded
  draft model's prefill and KV memory cost more than any k gains, no schedule reaches it ("drafter" is
  the oracle over the plain engine).

Each method's fit weighs in what the other two methods of its pool (same SKU, model and workload) measured
of the knee and weight share, as decide_pool pools a pool's candidates (--no-shared-knee: each method on its
own runs): from their first sweeps without refinement (refined() with no rounds); with it, the pool is
refined together and planned again on what all of its methods measured, as the operator refines a pool.

Each scenario draws its own noise (draw_seed: the draw number and the scenario's name), so scenario-draws
are independent and the binomial standard error printed next to a share holds.

Two readings of a target on a noisy measurement, both printed:

- in expectation: per scenario, each concurrency's ratio averaged over the draws, i.e. what the planner
  delivers on average from a profile measured with this noise. The targets are checked in this reading,
  and on noise-free profiles (the model itself).
- each draw alone: the number of scenario-draws missing a target. At 5% noise per level this reading is
  out of reach of any planner: the ideal planner, which knows the twin's exact curves and estimates only
  one throughput scale per run from the same profile, is scored the same way and shown next to it.

The method choice (what the operator deploys, through its whole decision: `policy.plan.plan_deployment` on a
virtual cluster with the profiles accepted and the load observed; the method with its schedule, or no
speculation) is checked against the plain engine at constant observed loads of 4, 32 and 128 per replica: >= 0.99
in expectation. The schedule-accuracy and no-load-known readings measure the parts that decision calls
(`plan_schedule`, `decide_pool`, `refine_pool_plan`) against the twin's truth, as components: they read the
chooser's rows and refinement requests, which a plan does not carry. Below the
summaries, where the per-draw misses are: what the schedule chose against the oracle, the concurrency
region, the method, how precisely the profile gives the gain of k=1 over k=0 near the crossover, and how
many plain-engine misses the minimum gain forgoes by design. The other settings (the API default levels,
powers of two to 128, 19 denser levels; minimum gain 1, 2 and 5%) are summarised in both readings.
`specpilot plan` on 20 profiles is timed at the end (target < 1 s).

The method choice with no load known (issue 29): `decide_pool` without a histogram, on each scenario's first
sweep and again after the refinement round it asks for (measured from the twin with fresh noise), noise-free
and at the noise, on the twin's scenarios and on weaker drafters (UNKNOWN_LOAD_SCALES: acceptance x 0.6, 0.4,
0.3 on ShareGPT). Scored on the truth averaged over the first sweep's levels (each alike): what was deployed
over the plain engine, against the better of deploying the planned schedule and not. Reported: cheap methods
that gain >= 5% at some level and cost nothing where their schedule is off (the case class) dropped by the
deploy test (target 0), wrong choices and their loss for the rest, and the flips between a method and no
speculation in refinement, with whether the gain where the schedule speculates moved by more than its standard
error. Its figures depend only on decide_pool, so running this script with PYTHONPATH pointed at an older
checkout's operator/ gives that code's figures (`--unknown-load-only`, about 2 min).

Refinement (issue 14): after the first sweep, the planner's refinement requests (policy.refine: each
uncertain change of k measured at its batch size, repeated) are measured the way a refinement Job measures
them - each requested level drawn from the twin with fresh noise and appended to its run - and the schedule is planned
again, until the planner says it is done, as the operator does (it refines one round; --refine-rounds caps
the loop). The issue's restated targets are reported without and with refinement:

- noise-free: worst >= 0.98 at every batch size and mean >= 0.995 (each scenario);
- at the noise (5%) and draws (12): mean >= 0.995 (the mean of the scenario-draws' means), and per-draw
  worst >= 0.97 in at least 97% of scenario-draws, spending at most 50% more profiling time than the first
  sweep. Profiling time = engine starts x ENGINE_START_S + each measured level's duration (its requests,
  max(64, 2c) as the benchmark Job sends them, over the level's request throughput; both from
  specpilot.perf.bench_model, the bench's numbers the simulator's Jobs take too); a refinement Job starts one
  engine per k it measures.

They are read at minGain 0 (--restated-min-gain; the issue measures against no speculation at minGain 0):
a minimum gain of g% forgoes up to g% by design (plus the 0.5% smoothing tolerance), so at the policy
default of 2% a noise-free worst >= 0.98 cannot hold wherever the true gain passes through 2-2.5%. The
policy default's figures are printed next to them.

Run: python benchmarks/decision_quality.py [--noise 0.05] [--seeds 12] [--min-gain 2] [--levels 1,2,...]
     [--no-alternatives] [--refine-rounds 8] [--refine-budget 2.0] [--no-refine] [--restated-min-gain 0]
     [--no-unknown-load | --unknown-load-only]
     (about 8 min; about 5 min without the alternatives; about 3.5 min without them and refinement; the
     unknown-load check alone about 2 min)
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import functools
import io
import itertools
import math
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import yaml

from specpilot.api.deployment_spec import DEFAULT_CONCURRENCY_LEVELS
from specpilot.api.deployment_spec import Policy, SpeculativeDeploymentSpec
from specpilot.api.profile import Run
from specpilot.api.schedule import k_at
from specpilot.perf.bench_model import ENGINE_START_S, level_duration_s
from specpilot.policy.choose import decide_pool
from specpilot.policy.plan import ApplyDeployment, plan_deployment
from specpilot.policy.refine import DEFAULT_BUDGET_SHARE, level_budget, refine_schedule, spent_levels
from specpilot.policy.schedule import SMOOTHING_TOLERANCE, SchedulePlan, plan_schedule
from specpilot.policy.surface import MethodSurface, pool_surfaces
from specpilot.sim import synthetic
from specpilot.sim.cluster import VirtualCluster
from specpilot.sim.connector import EPOCH, load_observation
from specpilot.sim.synthetic import Scenario, TrueCurves, synthetic_profiles, true_curves

SKUS = ("H100-SXM", "A100-80GB-SXM", "L40S")
MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B")
METHODS = ("eagle3", "draft_model", "ngram")
WORKLOADS = ("sharegpt", "humaneval", "json-extraction")
MAX_CONCURRENCY = 256
LEVELS_TO_128 = (1, 2, 4, 8, 16, 32, 64, 128)
"""Powers of two to 128 (the API default before 48, 96, 192 and 256 were added)."""
LEVELS_DENSE = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)
"""19 levels, denser where the crossovers lie (32..256): what measuring more levels buys."""
TARGETS = {"worst": 0.97, "mean": 0.99, "vs_sd_off": 0.99}
"""worst and mean: ratios to the per-concurrency oracle; vs_sd_off: to speculation off (k=0) on the same engine."""
RESTATED = {"noise_free_worst": 0.98, "noise_free_mean": 0.995, "mean": 0.995, "draw_worst": 0.97,
            "draws_meeting": 0.97, "extra_time": 0.50}
"""Issue 14's restated targets (see the module)."""


@dataclasses.dataclass(frozen=True)
class Score:
    worst: float
    worst_at: int
    mean: float
    vs_no_sd: float
    drafter: float
    """Lowest ratio of the oracle to no-SD: below 1 where the loaded drafter costs more than any k gains."""
    worst_k: tuple[int, int] = (0, 0)
    """(planned k, oracle k) at `worst_at`."""
    vs_no_sd_at: int = 1
    vs_no_sd_k: tuple[int, int] = (0, 0)
    """(planned k, oracle k) at `vs_no_sd_at`, the concurrency of the lowest ratio to min(no-SD, oracle)."""
    vs_no_sd_guarded: bool = False
    """At `vs_no_sd_at` the schedule keeps k=0 and the oracle's true gain over k=0 is within the minimum
    gain and the smoothing tolerance: forgone by design (k=0 on a drafter-loaded engine is below no-SD)."""
    gain_errors: tuple[float, ...] = ()
    """log(estimated / true) of G_1 / G_0 at the concurrencies (within the KV capacity) where the true gain of
    k=1 over k=0 is within -5..+5%: the precision the decision at the crossover rests on."""
    gain_z: tuple[float, ...] = ()
    """gain_errors over the planner's stated standard error of each (MethodSurface.speedup_se)."""
    to_oracle: tuple[float, ...] = ()
    """Per concurrency 1..256: the ratio to the oracle, ..."""
    to_sd_off: tuple[float, ...] = ()
    """... to k=0 on the same engine, ..."""
    to_no_sd: tuple[float, ...] = ()
    """... and to min(no-SD, oracle)."""

    @property
    def vs_sd_off(self) -> float:
        """The lowest ratio to speculation off on the same engine (k=0, drafter loaded)."""
        return min(self.to_sd_off, default=1.0)

    def misses(self) -> dict[str, bool]:
        return {name: getattr(self, name) < bar for name, bar in TARGETS.items()}


@functools.lru_cache(maxsize=4096)
def _profiles(scenario: Scenario, noise: float, seed: int, levels: tuple[int, ...]):
    """A scenario-draw's (baseline, method) profiles, synthesised once for the planner, the ideal planner
    and the method choice (deterministic per seed; nobody modifies them)."""
    return synthetic_profiles(scenario, noise=noise, seed=draw_seed(scenario, seed), levels=levels)


def draw_seed(scenario: Scenario, seed: int) -> int:
    """The noise seed of draw `seed` of a scenario: its own per scenario. With the draw number alone, every
    scenario drew the same noise sequence, and scenarios with similar curves (the two 8B models, one SKU's
    methods) missed or met the bars together: 1296 scenario-draws then counted as far fewer independent ones,
    and two 12-draw halves of one planner differed by up to 5 points (90.4% and 96.0%)."""
    return int(np.random.SeedSequence([seed, zlib.crc32(scenario.label().encode())]).generate_state(1)[0])


SHARED_KNEE = True
"""Each method's fit weighs in what the pool's other methods measured of the knee and weight share, as
decide_pool does (--no-shared-knee: each method on its own, as before)."""


def _anchor(scenario: Scenario) -> Scenario:
    """The scenario that stands for its pool (caches are per pool)."""
    return dataclasses.replace(scenario, method=METHODS[0]) if scenario.method in METHODS else scenario


def _planned_ks(plan, truth: TrueCurves) -> list[int]:
    """The schedule's k at every concurrency 1..256 (the engine's batch is capped at the KV capacity)."""
    return [plan.k_at(min(c, truth.kv_max_concurrency)) for c in range(1, MAX_CONCURRENCY + 1)]


def ideal_ks(truth: TrueCurves, baseline: Run, method_runs: list[Run],
             min_gain_percent: float) -> list[int]:
    """What a planner that knows the twin's exact curves would choose from the same noisy profile.

    Its only unknown is one throughput scale per run (baseline, k=1, K), estimated as the geometric mean of
    measured / true over the run's levels - the most any planner can learn from one noisy measurement per
    level. A middle k takes the scale interpolated (in log) between k=1 and K. It applies the same minimum
    gain over k=0 and no smoothing. What it misses per draw, no planner can meet from such a profile."""
    def scale(run: Run, true_of: Sequence[float]) -> float:
        logs = [math.log(p.output_throughput / true_of[p.concurrency - 1]) for p in run.points
                if p.output_throughput and p.concurrency <= len(true_of)]
        return math.exp(statistics.fmean(logs))

    scales = {0: scale(baseline, truth.baseline_goodput_tok_s)}
    for run in method_runs:
        scales[run.num_speculative_tokens] = scale(run, truth.goodput_tok_s[run.num_speculative_tokens])
    top = max(scales)
    for k in range(1, top + 1):
        if k not in scales:
            w = (k - 1) / (top - 1)
            scales[k] = math.exp((1 - w) * math.log(scales[1]) + w * math.log(scales[top]))
    margin = 1.0 + min_gain_percent / 100.0
    ks = []
    for c in range(1, MAX_CONCURRENCY + 1):
        at = min(c, truth.kv_max_concurrency) - 1
        estimate = {k: truth.goodput_tok_s[k][at] * scales[k] for k in truth.goodput_tok_s}
        best = max(estimate, key=lambda k: (estimate[k], -k))
        ks.append(best if best == 0 or estimate[best] >= margin * estimate[0] else 0)
    return ks


def score_ks(ks: Sequence[int], truth: TrueCurves, min_gain_percent: float, plan=None) -> Score:
    """Score a k per concurrency 1..256 on the twin's noise-free goodput (see the module)."""
    to_oracle, to_off, to_k0, drafter, pairs, errors, z = [], [], [], [], [], [], []
    for c, planned in enumerate(ks, start=1):
        true_gain = truth.goodput_tok_s[1][c - 1] / truth.goodput_tok_s[0][c - 1]
        if plan is not None and plan.surface is not None and c <= truth.kv_max_concurrency \
                and abs(true_gain - 1.0) <= 0.05:
            errors.append(math.log(plan.surface.speedup(1, c) / true_gain))
            se = plan.surface.speedup_se(1, c)
            if se:
                z.append(errors[-1] / se)
        got = truth.goodput_tok_s[planned][c - 1]
        oracle = max(curve[c - 1] for curve in truth.goodput_tok_s.values())
        no_sd = truth.baseline_goodput_tok_s[c - 1]
        to_oracle.append(got / oracle)
        to_off.append(got / min(no_sd, oracle))
        to_k0.append(got / truth.goodput_tok_s[0][c - 1])
        drafter.append(oracle / no_sd)
        pairs.append((planned, truth.oracle_k(c)))
    worst = min(to_oracle)
    worst_at = to_oracle.index(worst) + 1
    vs_at = to_off.index(min(to_off)) + 1
    oracle_gain = max(curve[vs_at - 1] for curve in truth.goodput_tok_s.values()) / truth.goodput_tok_s[0][vs_at - 1]
    margin = (1.0 + min_gain_percent / 100.0) * (1.0 + SMOOTHING_TOLERANCE)
    guarded = pairs[vs_at - 1][0] == 0 and oracle_gain <= margin
    return Score(worst, worst_at, statistics.fmean(to_oracle), min(to_off), min(drafter), pairs[worst_at - 1],
                 vs_at, pairs[vs_at - 1], guarded, tuple(errors), gain_z=tuple(z), to_oracle=tuple(to_oracle),
                 to_sd_off=tuple(to_k0), to_no_sd=tuple(to_off))


def score(scenario: Scenario, truth: TrueCurves, noise: float, seed: int, min_gain_percent: float,
          levels: tuple[int, ...], ideal: bool = False) -> Score:
    if ideal:
        baseline, method = _profiles(scenario, noise, seed, levels)
        return score_ks(ideal_ks(truth, baseline.status.run(0), list(method.status.runs),
                                 min_gain_percent), truth, min_gain_percent)
    plan, _, _, _ = refined(scenario, noise, seed, min_gain_percent, levels, 0, 0.0)  # the first sweep, pooled
    return score_ks(_planned_ks(plan, truth), truth, min_gain_percent, plan)


@dataclasses.dataclass(frozen=True)
class Cost:
    """Profiling time of a scenario-draw: engine starts, measured levels and their seconds."""

    engine_starts: int
    levels: int
    seconds: float

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.engine_starts + other.engine_starts, self.levels + other.levels,
                    self.seconds + other.seconds)


def level_seconds(point) -> float:
    """How long the benchmark Job measures a level: its requests over the level's request throughput."""
    return level_duration_s(point.concurrency, point.request_throughput)


def profiling_cost(profiles) -> Cost:
    points = [p for prof in profiles for run in prof.status.runs for p in run.points]
    starts = sum(prof.status.engine_starts or len(prof.status.runs) for prof in profiles)
    return Cost(starts, len(points), starts * ENGINE_START_S + sum(level_seconds(p) for p in points))


def _plan_pool(members: list[_Member], min_gain_percent: float) -> dict[str, SchedulePlan]:
    """Every member's schedule from its profiles as they stand, fitted as decide_pool fits a pool's methods
    (`pool_surfaces`: each with what the others measured of the knee and weight share; each on its own
    with --no-shared-knee)."""
    runs = {m.scenario.method: (m.baseline.status.run(0), m.method.status.runs, m.scenario.method != "ngram")
            for m in members}
    pools = [runs] if SHARED_KNEE else [{key: value} for key, value in runs.items()]
    surfaces = {key: surface for pool in pools for key, surface in pool_surfaces(pool).items()}
    plans = {}
    for m in members:
        surface = surfaces[m.scenario.method]
        plan = (plan_schedule(surface, min_gain_percent=min_gain_percent, max_batch_size=MAX_CONCURRENCY)
                if isinstance(surface, MethodSurface) else None)
        if plan is None or not plan.ok:
            raise SystemExit(f"{m.scenario.label()}: planner returned no schedule: "
                             f"{plan.reason if plan is not None else f'not enough data: {surface}'}")
        plans[m.scenario.method] = plan
    return plans


def refined(scenario: Scenario, noise: float, seed: int, min_gain_percent: float, levels: tuple[int, ...],
            rounds: int, budget_share: float):
    """(plan, first-sweep cost, refinement cost, rounds run) of a scenario-draw refined as the operator
    refines it: each round the planner's requests (policy.refine) are measured like a refinement Job measures
    them (one engine start per profile and k; each requested level re-drawn from the twin with fresh noise,
    `repeat` times, appended to its run), then planned again. The scenario is refined with its pool (the
    other METHODS on the same SKU, model and workload), whose fits share the knee and weight share."""
    return _refined_pool(_anchor(scenario), noise, seed, min_gain_percent, levels, rounds,
                         budget_share)[scenario.method]


@dataclasses.dataclass
class _Member:
    """One method of a pool being refined: its profiles (copies it appends to) and what they cost."""

    scenario: Scenario
    baseline: object
    method: object
    first: Cost
    budget: int
    twins: dict
    rng: np.random.Generator
    extra: Cost = Cost(0, 0, 0.0)
    rounds: int = 0
    finished: bool = False


def _member(scenario: Scenario, noise: float, seed: int, levels: tuple[int, ...], budget_share: float) -> _Member:
    first_baseline, first_method = _profiles(scenario, noise, seed, levels)
    baseline, method = first_baseline.model_copy(deep=True), first_method.model_copy(deep=True)
    for profile in (baseline, method):  # the durations the benchmark Job would see (its requests per level)
        for run in profile.status.runs:
            for point in run.points:
                point.duration_s = level_seconds(point)
    return _Member(scenario, baseline, method, profiling_cost([baseline, method]),
                   level_budget([baseline, method], budget_share),
                   {"baseline": scenario.twin(speculative=False), scenario.method: scenario.twin()},
                   np.random.default_rng([draw_seed(scenario, seed), 7919]))


@functools.lru_cache(maxsize=2048)
def _refined_pool(anchor: Scenario, noise: float, seed: int, min_gain_percent: float, levels: tuple[int, ...],
                  rounds: int, budget_share: float) -> dict[str, tuple]:
    """refined() for every method of the anchor's pool at once, as the operator refines a pool: every
    method's requests come from plans that weigh the others' first sweeps, the round measures them all, and
    the pool is planned again on everything measured (a method settled once is not refined again)."""
    methods = METHODS if anchor.method in METHODS else (anchor.method,)
    members = [_member(dataclasses.replace(anchor, method=m), noise, seed, levels, budget_share) for m in methods]

    plans = _plan_pool(members, min_gain_percent)
    for _ in range(rounds):
        measured = False
        for m in members:
            if m.finished:
                continue
            request = refine_schedule(plans[m.scenario.method], min_gain_percent, m.scenario.method, m.budget,
                                      spent_levels([m.baseline, m.method]),
                                      profiles={"baseline": m.baseline, m.scenario.method: m.method})
            if request.done:
                m.finished = True
                continue
            m.rounds += 1
            measured = True
            for job in request.jobs():
                profile = m.baseline if job.profile_key == "baseline" else m.method
                for k in job.ks:
                    run = profile.status.run(k)
                    new = [synthetic._point(m.twins[job.profile_key], m.scenario, c, k, m.rng, noise, 64)
                           for _ in range(job.repeat) for c in job.levels]
                    for point in new:
                        point.duration_s = level_seconds(point)
                    run.points.extend(new)
                    m.extra = m.extra + Cost(1, len(new), ENGINE_START_S + sum(level_seconds(p) for p in new))
        if not measured:
            break
        plans = _plan_pool(members, min_gain_percent)
    return {m.scenario.method: (plans[m.scenario.method], m.first, m.extra, m.rounds) for m in members}


def score_refined(scenario: Scenario, truth: TrueCurves, noise: float, seed: int, min_gain_percent: float,
                  levels: tuple[int, ...], rounds: int, budget_share: float) -> tuple[Score, Cost, Cost]:
    plan, first, extra, _ = refined(scenario, noise, seed, min_gain_percent, levels, rounds, budget_share)
    return score_ks(_planned_ks(plan, truth), truth, min_gain_percent, plan), first, extra


def restated(noise_free: dict[Scenario, Expected], scores: dict[tuple[Scenario, int], Score],
             costs: dict[tuple[Scenario, int], tuple[Cost, Cost]] | None = None) -> tuple[str, bool]:
    """Issue 14's restated targets in words, and whether all are met."""
    nf_worst = min(e.worst for e in noise_free.values())
    nf_mean = min(e.mean for e in noise_free.values())
    n = len(scores)
    meeting = sum(s.worst >= RESTATED["draw_worst"] for s in scores.values()) / n
    mean = statistics.fmean(s.mean for s in scores.values())
    met = (nf_worst >= RESTATED["noise_free_worst"] and nf_mean >= RESTATED["noise_free_mean"]
           and mean >= RESTATED["mean"] and meeting >= RESTATED["draws_meeting"])
    text = (f"noise-free lowest worst {nf_worst:.3f} (>= 0.98), lowest mean {nf_mean:.4f} (>= 0.995); "
            f"noisy mean of means {mean:.4f} (>= 0.995), per-draw worst >= 0.97 in {meeting:.1%} of {n} "
            f"scenario-draws (>= 97%; ±{math.sqrt(meeting * (1 - meeting) / n):.1%}, one binomial standard "
            f"error: each scenario draws its own noise)")
    if costs:
        ratios = [extra.seconds / first.seconds for first, extra in costs.values()]
        starts = statistics.fmean(extra.engine_starts for _, extra in costs.values())
        levels = statistics.fmean(extra.levels for _, extra in costs.values())
        first_starts = statistics.fmean(first.engine_starts for first, _ in costs.values())
        first_levels = statistics.fmean(first.levels for first, _ in costs.values())
        over = sum(r > RESTATED["extra_time"] for r in ratios)
        met = met and statistics.fmean(ratios) <= RESTATED["extra_time"]
        text += (f"; extra profiling time mean {statistics.fmean(ratios):+.1%}, largest {max(ratios):+.1%} "
                 f"(<= +50%; over it in {over}/{n}), {starts:.2f} engine starts and {levels:.1f} levels per "
                 f"scenario-draw on top of the first sweep's {first_starts:.0f} and {first_levels:.0f}")
    return text, met


DECISION_LOADS = (4, 32, 128)
"""Per-replica concurrencies the method choice is checked at (a constant observed load each)."""


def deployed_k(scenario: Scenario, baseline, method, load: int, min_gain_percent: float):
    """What the operator deploys on a pool of the scenario observed at `load` requests per replica, through its
    whole decision (`policy.plan.plan_deployment` on a `sim.cluster.VirtualCluster` with the two profiles
    accepted): K at each batch size, or None for the plain engine."""
    candidate = scenario.candidate()
    spec = SpeculativeDeploymentSpec.model_validate({
        "model": {"id": scenario.model_id, "tensorParallelSize": scenario.tensor_parallel_size},
        "methods": [candidate.dump()],
        "gpuPools": [{"name": "bench", "sku": scenario.sku, "pricePerGpuHour": 1.0}],
        "policy": {"minGainPercent": min_gain_percent}, "profiling": {"refineBudgetPercent": 0},
        "serving": {"autoscaling": "none", "minReplicas": 1, "maxReplicas": 1}})
    cluster = VirtualCluster(spec=spec, name="bench")
    cluster.add_node("node", {})
    cluster.accept("bench", {"baseline": baseline.dump(), candidate.key: method.dump()})
    snapshot = cluster.snapshot(EPOCH)
    seen = load_observation(1, float(load), 0.0, EPOCH, 60.0, [(float(load), 1.0)])
    snapshot = dataclasses.replace(snapshot, pools=[dataclasses.replace(p, observation=seen) for p in snapshot.pools])
    [apply] = plan_deployment(snapshot).of(ApplyDeployment)
    serve = apply.serve
    if serve.method is None or not serve.num_speculative_tokens:
        return None
    top = serve.num_speculative_tokens
    return lambda c: k_at(serve.schedule, c, top) if serve.schedule else top


def decided_vs_plain(scenario: Scenario, truth: TrueCurves, noise: float, seed: int, min_gain_percent: float,
                     levels: tuple[int, ...]) -> tuple[float, ...]:
    """At each of DECISION_LOADS, the true goodput of what the operator deploys for that observed load
    (`deployed_k`: the method with its schedule, or the plain engine) over the plain engine's: the
    no-speculation bar for the method choice, which is where the drafter's own cost (its prefill, its KV memory)
    is weighed."""
    baseline, method = _profiles(scenario, noise, seed, levels)
    ratios = []
    for load in DECISION_LOADS:
        k_of = deployed_k(scenario, baseline, method, load, min_gain_percent)
        c = min(load, truth.kv_max_concurrency)
        got = (truth.goodput_tok_s[k_of(c)][c - 1] if k_of is not None
               else truth.baseline_goodput_tok_s[load - 1])
        ratios.append(got / truth.baseline_goodput_tok_s[load - 1])
    return tuple(ratios)


def decisions_summary(truths: dict[Scenario, TrueCurves], noise: float, seeds: int, min_gain_percent: float,
                      levels: tuple[int, ...]) -> tuple[str, bool]:
    """The method choice against the plain engine at DECISION_LOADS: in expectation over the draws per
    scenario and load (target >= 0.99), and per draw."""
    per_draw, expected = [], []
    for scenario, truth in truths.items():
        draws = [decided_vs_plain(scenario, truth, noise, seed, min_gain_percent, levels) for seed in range(seeds)]
        per_draw.extend(r for d in draws for r in d)
        expected.extend(statistics.fmean(values) for values in zip(*draws, strict=True))
    bar = TARGETS["vs_sd_off"]
    missed = sum(e < bar for e in expected)
    text = (f"missed vs the plain engine>=0.99 {missed}/{len(expected)} in expectation (lowest "
            f"{min(expected):.3f}), {sum(r < bar for r in per_draw)}/{len(per_draw)} per draw (lowest "
            f"{min(per_draw):.3f})")
    return text, missed > 0


# --- issue 29: deploying a method with no load known -------------------------------------------------------

UNKNOWN_LOAD_SCALES = (0.6, 0.4, 0.3)
"""Acceptance scales of the weak-drafter scenarios added to the twin's for the unknown-load check: every
position's acceptance times the scale (for n-gram: matches found that much less often), on ShareGPT. They
make the case class of issue 29: a method with a large gain at low load and none at high load."""
CHEAP_GAIN = 0.05
"""A method 'gains' when its best k beats the plain engine by at least this at some first-sweep level ..."""
CHEAP_COST = 0.005
"""... and costs nothing when scheduled off when k=0 on its engine is within this of the plain engine at
every first-sweep level (issue 29's target: no such method is dropped)."""


@dataclasses.dataclass(frozen=True)
class ScaledScenario(Scenario):
    """A twin scenario whose acceptance is `acceptance_scale` times the workload's (a weaker drafter)."""

    acceptance_scale: float = 1.0

    def twin(self, speculative: bool = True):
        if not speculative or self.acceptance_scale == 1.0:
            return super().twin(speculative)
        from specpilot.api.methods import method_family
        from specpilot.perf import DEFAULT_CATALOG, Twin, resolve_model
        from specpilot.perf.acceptance import AcceptanceProfile, acceptance_profile

        family = method_family(self.method)
        prior = acceptance_profile(family, self.workload, Twin.MAX_K)
        weaker = AcceptanceProfile(tuple(p * self.acceptance_scale for p in prior.per_position),
                                   prior.drafts_per_step)
        return Twin(DEFAULT_CATALOG.resolve(self.sku), resolve_model(self.model_id), self.tensor_parallel_size,
                    method=family, workload=self.workload, acceptance=weaker)

    def label(self) -> str:
        scale = f" x{self.acceptance_scale:g}" if self.acceptance_scale != 1.0 else ""
        return super().label() + scale


def unknown_load_scenarios() -> list[Scenario]:
    """The twin's scenarios and the weak-drafter ones (UNKNOWN_LOAD_SCALES)."""
    twin = list(itertools.starmap(Scenario, itertools.product(SKUS, MODELS, METHODS, WORKLOADS)))
    weak = [ScaledScenario(sku, model, method, "sharegpt", acceptance_scale=scale)
            for sku, model, method, scale in itertools.product(SKUS, MODELS, METHODS, UNKNOWN_LOAD_SCALES)]
    return twin + weak


def cheap_and_gaining(truth: TrueCurves, levels: Sequence[int]) -> bool:
    """Issue 29's case class, by the twin's truth: at some first-sweep level the best k gains CHEAP_GAIN or
    more over the plain engine, and k=0 on the method's engine costs nothing (CHEAP_COST) at any of them."""
    gains = max(max(curve[c - 1] for curve in truth.goodput_tok_s.values()) / truth.baseline_goodput_tok_s[c - 1]
                for c in levels)
    costs = min(truth.goodput_tok_s[0][c - 1] / truth.baseline_goodput_tok_s[c - 1] for c in levels)
    return gains >= 1.0 + CHEAP_GAIN and costs >= 1.0 - CHEAP_COST


def _true_ratio(row, truth: TrueCurves, c: int) -> float:
    """The true goodput of a candidate row's plan at concurrency c over the plain engine's."""
    plain = truth.baseline_goodput_tok_s[c - 1]
    if row.strategy == "restart" or getattr(row.strategy, "value", None) == "restart":
        on = row.crossover_concurrency is None or c <= row.crossover_concurrency
        return truth.goodput_tok_s[row.num_speculative_tokens][c - 1] / plain if on else 1.0
    k = row.schedule.k_at(min(c, truth.kv_max_concurrency))
    return truth.goodput_tok_s[k][c - 1] / plain


def gain_where_on(row, levels: Sequence[int], kv_max: int | None) -> tuple[float, float]:
    """(estimated gain, its standard error) of a row's schedule over k=0 on its engine, averaged over the
    first-sweep levels where it speculates; (0, 0) where it speculates at none. Computed here from the
    row's schedule and surface, so that the figure is the same before and after issue 29."""
    schedule = row.schedule
    if schedule is None or not schedule.ok or schedule.surface is None:
        return 0.0, 0.0
    gains, ses = [], []
    for c in levels:
        at = min(c, kv_max) if kv_max else c
        k = schedule.k_at(at)
        if k > 0:
            gains.append(schedule.surface.speedup(k, at) - 1.0)
            ses.append(schedule.surface.speedup_se(k, at) or 0.0)
    if not gains:
        return 0.0, 0.0
    return statistics.fmean(gains), statistics.fmean(ses)


@dataclasses.dataclass(frozen=True)
class UnknownLoadOutcome:
    """What decide_pool deployed with no load known for one scenario-draw, first sweep and refined, scored."""

    cheap: bool
    deployed: tuple[bool, bool]
    """(first sweep, after one refinement round)."""
    value: tuple[float, float]
    """The true goodput of what was deployed over the plain engine's, averaged over the first-sweep levels
    (1.0 when nothing was deployed)."""
    best: tuple[float, float]
    """max(1, the same figure had the method been deployed with its planned schedule)."""
    moved: bool
    """Whether the gain where the schedule speculates moved by more than its standard error in refinement."""
    lowest: tuple[float, float] = (1.0, 1.0)
    """The lowest true ratio to the plain engine at a first-sweep level of what was deployed (1.0: nothing)."""
    speculates: tuple[bool, bool] = (True, True)
    """Whether the method's schedule speculates at any first-sweep level (where it does not, no deploy test
    can deploy it: its per-batch noise guard dropped it)."""
    reason: str = ""


def _measure_refinement(request, scenario: Scenario, baseline, method, noise: float, rng) -> int:
    """Measure a refinement plan's Jobs the way a refinement Job does (fresh noise, appended); levels."""
    twins = {"baseline": scenario.twin(speculative=False), scenario.candidate().key: scenario.twin()}
    measured = 0
    for job in request.jobs():
        profile = baseline if job.profile_key == "baseline" else method
        twin = twins["baseline" if job.profile_key == "baseline" else scenario.candidate().key]
        for k in job.ks:
            run = profile.status.run(k)
            if run is None:
                continue
            new = [synthetic._point(twin, scenario, c, k, rng, noise, 64) for _ in range(job.repeat)
                   for c in job.levels]
            run.points.extend(new)
            measured += len(new)
    return measured


def unknown_load_outcome(scenario: Scenario, truth: TrueCurves, noise: float, seed: int,
                         min_gain_percent: float, levels: tuple[int, ...]) -> UnknownLoadOutcome:
    """decide_pool with no load known on the scenario-draw's first sweep, then after the refinement round
    `specpilot plan` asks for (measured from the twin with fresh noise and appended), scored on the truth."""
    from specpilot.policy.refine import refine_pool_plan

    first_baseline, first_method = _profiles(scenario, noise, seed, levels)
    baseline, method = first_baseline.model_copy(deep=True), first_method.model_copy(deep=True)
    candidate = scenario.candidate()
    policy = Policy(min_gain_percent=min_gain_percent)
    deployed, value, best, gains, speculates, lowest, reason = [], [], [], [], [], [], ""
    for step in range(2):
        plan = decide_pool(policy, [candidate], baseline, {candidate.key: method}, price_per_gpu_hour=1.0,
                           gpus_per_replica=1, max_batch_size=MAX_CONCURRENCY)
        row = next(r for r in plan.candidates if r.key == candidate.key)
        on = plan.decision.method is not None
        if_deployed = (statistics.fmean(_true_ratio(row, truth, c) for c in levels)
                       if row.ready and row.num_speculative_tokens > 0 else 1.0)
        deployed.append(on)
        lowest.append(min(_true_ratio(row, truth, c) for c in levels) if on else 1.0)
        value.append(if_deployed if on else 1.0)
        best.append(max(1.0, if_deployed))
        gains.append(gain_where_on(row, levels, truth.kv_max_concurrency))
        speculates.append(row.schedule is not None and row.schedule.ok
                          and any(row.schedule.k_at(min(c, truth.kv_max_concurrency)) > 0 for c in levels))
        if step == 0:
            reason = plan.decision.reason
            request = refine_pool_plan(plan, policy, baseline, {candidate.key: method})
            if request.done or not _measure_refinement(request, scenario, baseline, method, noise,
                                                        np.random.default_rng([draw_seed(scenario, seed), 29])):
                deployed.append(on), value.append(value[0]), best.append(best[0]), gains.append(gains[0])
                speculates.append(speculates[0])
                lowest.append(lowest[0])
                break
    (g0, se0), (g1, se1) = gains
    return UnknownLoadOutcome(cheap_and_gaining(truth, levels), tuple(deployed), tuple(value), tuple(best),
                              abs(g1 - g0) > max(se0, se1), tuple(lowest), tuple(speculates), reason)


def unknown_load_report(outcomes: dict[tuple[Scenario, int], UnknownLoadOutcome], step: int) -> dict[str, object]:
    """The figures of one reading (step 0: first sweep, 1: after refinement)."""
    cheap = [o for o in outcomes.values() if o.cheap]
    other = [o for o in outcomes.values() if not o.cheap]

    def regret(group):
        return [o.best[step] - o.value[step] for o in group]

    def wrong(group):  # the other option was better by more than 0.01%
        return sum(o.best[step] - o.value[step] > 1e-4 for o in group)

    out = {"cheap": len(cheap),
           "cheap_dropped": sum(not o.deployed[step] and o.speculates[step] for o in cheap),
           "cheap_unscheduled": sum(not o.deployed[step] and not o.speculates[step] for o in cheap),
           "cheap_wrong": wrong(cheap),
           "other": len(other), "other_deployed": sum(o.deployed[step] for o in other),
           "other_wrong": wrong(other), "cheap_regret": statistics.fmean(regret(cheap)) if cheap else 0.0,
           "other_regret": statistics.fmean(regret(other)) if other else 0.0,
           "other_worst_regret": max(regret(other), default=0.0),
           "other_lowest": min((o.lowest[step] for o in other), default=1.0),
           "cheap_worst_regret": max(regret(cheap), default=0.0)}
    return out


def print_unknown_load(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    print(f"the method choice with no load known (issue 29; decide_pool without a histogram, one candidate; the "
          f"twin's {len(SKUS) * len(MODELS) * len(METHODS) * len(WORKLOADS)} scenarios and "
          f"{len(SKUS) * len(MODELS) * len(METHODS) * len(UNKNOWN_LOAD_SCALES)} with weaker drafters; scored on "
          f"the truth averaged over the first sweep's levels):")
    print(unknown_load_summary(args.noise, args.seeds, args.min_gain, args.levels))
    print(f"  ({time.perf_counter() - started:.0f} s)")


def unknown_load_summary(noise: float, seeds: int, min_gain_percent: float,
                         levels: tuple[int, ...]) -> str:
    """Issue 29's check in words: what decide_pool deploys with no load known, on the twin's scenarios and
    the weak-drafter ones, noise-free and at `noise`, first sweep and after one refinement round."""
    scenarios = unknown_load_scenarios()
    truths = {s: true_curves(s, MAX_CONCURRENCY) for s in scenarios}
    lines = []
    for label, sigma, draws in (("noise-free", 0.0, 1), (f"noise {noise:g}, {seeds} draws", noise, seeds)):
        outcomes = {(s, seed): unknown_load_outcome(s, truths[s], sigma, seed, min_gain_percent, levels)
                    for s in scenarios for seed in range(draws)}
        for step, when in ((0, "first sweep"), (1, "one refinement round")):
            f = unknown_load_report(outcomes, step)
            lines.append(
                f"  {label}, {when}: cheap methods gaining >= {CHEAP_GAIN:.0%} somewhere dropped by the deploy "
                f"test {f['cheap_dropped']}/{f['cheap']} (and {f['cheap_unscheduled']} whose schedule speculates "
                f"at no level: the schedule's noise guard), wrong choice {f['cheap_wrong']} (mean loss "
                f"{f['cheap_regret']:.2%}, largest {f['cheap_worst_regret']:.2%}); the others deployed "
                f"{f['other_deployed']}/{f['other']}, wrong choice {f['other_wrong']} (mean loss "
                f"{f['other_regret']:.2%}, largest {f['other_worst_regret']:.2%}; what they deployed is at "
                f"least {f['other_lowest']:.3f} of the plain engine at every level)")
        flips = [o for o in outcomes.values() if o.deployed[0] != o.deployed[1]]
        guard = [o for o in flips if not all(o.speculates)]
        test = [o for o in flips if all(o.speculates)]
        lines.append(f"  {label}: method <-> no speculation flips in refinement {len(flips)}/{len(outcomes)}: "
                     f"{len(test)} by the deploy test ({sum(not o.moved for o in test)} with the gain where it "
                     f"speculates moved by no more than its standard error), {len(guard)} where the schedule "
                     f"speculates at no level on one side ({sum(not o.moved for o in guard)} not moved)")
    return "\n".join(lines)


def evaluate(truths: dict[Scenario, TrueCurves], noise: float, seeds: int, min_gain_percent: float,
             levels: tuple[int, ...], ideal: bool = False) -> dict[tuple[Scenario, int], Score]:
    return {(scenario, seed): score(scenario, truth, noise, seed, min_gain_percent, levels, ideal)
            for scenario, truth in truths.items() for seed in range(seeds)}


def summary(scores: dict[tuple[Scenario, int], Score]) -> str:
    """Scenario-seeds missing each target, each draw scored alone."""
    n = len(scores)
    missed = {name: sum(s.misses()[name] for s in scores.values()) for name in TARGETS}
    plain = sum(s.vs_no_sd < TARGETS["vs_sd_off"] for s in scores.values())
    mean_of_means = statistics.fmean(s.mean for s in scores.values())
    worst = min(s.worst for s in scores.values())
    return (f"missed worst>=0.97 {missed['worst']:>3}/{n}, mean>=0.99 {missed['mean']:>3}/{n}, "
            f"vs SD off>=0.99 {missed['vs_sd_off']:>3}/{n} (vs the plain engine {plain:>3}/{n}); "
            f"lowest worst {worst:.3f}, mean of means {mean_of_means:.4f}")


@dataclasses.dataclass(frozen=True)
class Expected:
    """One scenario's ratios averaged over the noise draws at each concurrency, then reduced like a Score."""

    worst: float
    worst_at: int
    mean: float
    vs_sd_off: float
    vs_no_sd: float

    def misses(self) -> dict[str, bool]:
        return {name: getattr(self, name) < bar for name, bar in TARGETS.items()}


def in_expectation(scores: dict[tuple[Scenario, int], Score]) -> dict[Scenario, Expected]:
    """Per scenario, the expected ratio at each concurrency over the noise draws (what the planner delivers
    on average from a profile measured with this noise), reduced to the targets' figures."""
    by_scenario: dict[Scenario, list[Score]] = {}
    for (scenario, _), s in scores.items():
        by_scenario.setdefault(scenario, []).append(s)
    out = {}
    for scenario, draws in by_scenario.items():
        def mean_curve(field: str) -> list[float]:
            return [statistics.fmean(values) for values in zip(*(getattr(d, field) for d in draws), strict=True)]
        to_oracle = mean_curve("to_oracle")
        worst = min(to_oracle)
        out[scenario] = Expected(worst, to_oracle.index(worst) + 1, statistics.fmean(to_oracle),
                                 min(mean_curve("to_sd_off")), min(mean_curve("to_no_sd")))
    return out


def expected_summary(expected: dict[Scenario, Expected]) -> str:
    n = len(expected)
    missed = {name: sum(e.misses()[name] for e in expected.values()) for name in TARGETS}
    plain = sum(e.vs_no_sd < TARGETS["vs_sd_off"] for e in expected.values())
    return (f"missed worst>=0.97 {missed['worst']:>2}/{n}, mean>=0.99 {missed['mean']:>2}/{n}, "
            f"vs SD off>=0.99 {missed['vs_sd_off']:>2}/{n} (vs the plain engine {plain:>2}/{n}); lowest worst "
            f"{min(e.worst for e in expected.values()):.3f}, lowest mean {min(e.mean for e in expected.values()):.4f}, "
            f"lowest vs SD off {min(e.vs_sd_off for e in expected.values()):.3f}")


def _region(c: int, levels: tuple[int, ...]) -> str:
    if c > levels[-1]:
        return f"c>{levels[-1]} (beyond the profiled levels)"
    return "c 1-32" if c <= 32 else "c 33-128" if c <= 128 else "c 129-256"


def _kind(planned: int, oracle: int) -> str:
    if planned == 0:
        return "SD off, oracle on"
    if oracle == 0:
        return "SD on, oracle off"
    return "k too low" if planned < oracle else "k too high"


def breakdown(scores: dict[tuple[Scenario, int], Score], levels: tuple[int, ...]) -> str:
    """Where the scenario-seeds missing the worst, vs-SD-off and vs-plain-engine bars miss them: what the
    schedule chose against the oracle at the concurrency of the miss, the concurrency region, and the method."""
    lines = []
    worst = [(sc, s) for (sc, _), s in scores.items() if s.misses()["worst"]]
    off = [(sc, s) for (sc, _), s in scores.items() if s.misses()["vs_sd_off"]]
    vs = [(sc, s) for (sc, _), s in scores.items() if s.vs_no_sd < TARGETS["vs_sd_off"]]

    def off_at(s: Score) -> int:
        return s.to_sd_off.index(min(s.to_sd_off)) + 1

    for title, misses, at, k_of in (("worst", worst, lambda s: s.worst_at, lambda s: s.worst_k),
                                    ("vs SD off", off, off_at, lambda s: (1, 0)),
                                    ("vs the plain engine", vs, lambda s: s.vs_no_sd_at, lambda s: s.vs_no_sd_k)):
        if not misses:
            continue
        by_kind = collections.Counter(_kind(*k_of(s)) for _, s in misses)
        by_region = collections.Counter(_region(at(s), levels) for _, s in misses)
        by_method = collections.Counter(sc.method for sc, _ in misses)
        lines.append(f"  {title} misses ({len(misses)}): "
                     + ", ".join(f"{name} {n}" for name, n in by_kind.most_common()) + "; "
                     + ", ".join(f"{name} {n}" for name, n in by_region.most_common()) + "; "
                     + ", ".join(f"{name} {n}" for name, n in by_method.most_common()))
    errors = sorted(abs(e) for s in scores.values() for e in s.gain_errors)
    if errors:
        rms = math.sqrt(statistics.fmean(e * e for e in errors))
        lines.append(f"  estimated gain of k=1 over k=0 where the true gain is within 5%: RMS error {rms:.1%}, "
                     f"95th percentile {errors[int(0.95 * (len(errors) - 1))]:.1%}, largest {errors[-1]:.1%} "
                     f"({len(errors)} concurrencies)")
    z = [x for s in scores.values() for x in s.gain_z]
    if z:
        lines.append(f"  the planner's stated standard error there (MethodSurface.speedup_se, the decision's "
                     f"crossoverUncertaintyPercent): RMS of error / s.e. {math.sqrt(statistics.fmean(x * x for x in z)):.2f} "
                     f"(1 = calibrated), within 1 s.e. {sum(abs(x) <= 1 for x in z) / len(z):.0%}, within 2 s.e. "
                     f"{sum(abs(x) <= 2 for x in z) / len(z):.0%} ({len(z)} concurrencies)")
    guarded = sum(s.vs_no_sd_guarded for _, s in vs)
    if vs:
        lines.append(f"  vs-plain-engine misses where k=0 was kept and the oracle's true gain over it is within the "
                     f"minimum gain plus the smoothing tolerance (forgone by design): {guarded}")
    return "\n".join(lines)


def time_plan(profiles_dir: Path) -> float:
    from specpilot.cli import main

    files = sorted(str(p) for p in profiles_dir.glob("*.yaml"))
    start = time.perf_counter()
    main(["plan", "--profile", *files, "-o", "json"])
    return time.perf_counter() - start


def write_plan_inputs(directory: Path) -> int:
    """20 profiles: 4 SKU/model groups x (baseline + 4 methods)."""
    count = 0
    for sku, model in itertools.product(("H100-SXM", "A100-80GB-SXM"), MODELS):
        for method in ("eagle3", "draft_model", "ngram", "suffix"):
            baseline, profile = synthetic_profiles(Scenario(sku, model, method), noise=0.05, seed=count)
            (directory / f"{count:02d}.yaml").write_text(yaml.safe_dump(profile.dump()))
            count += 1
        (directory / f"{count:02d}.yaml").write_text(yaml.safe_dump(baseline.dump()))
        count += 1
    return count


def _levels(text: str) -> tuple[int, ...]:
    levels = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    if not levels or levels[0] < 1:
        raise argparse.ArgumentTypeError(f"--levels needs positive integers, e.g. 1,2,4 (got {text!r})")
    return levels


def report_restated(truths: dict[Scenario, TrueCurves], args: argparse.Namespace, min_gain: float,
                    noise_free: dict[Scenario, Expected] | None = None,
                    scores: dict[tuple[Scenario, int], Score] | None = None) -> bool:
    """Print issue 14's restated targets at `min_gain` without and with refinement; whether all are met."""
    label = "the issue's reading" if min_gain == args.restated_min_gain else "the policy default"
    print(f"\nissue 14's restated targets at minGain {min_gain:g}% ({label}; noise {args.noise:g}, "
          f"{args.seeds} draws; engine start = {ENGINE_START_S:g} s):")
    if noise_free is None:
        noise_free = in_expectation(evaluate(truths, 0.0, 1, min_gain, args.levels))
    if scores is None:
        scores = evaluate(truths, args.noise, args.seeds, min_gain, args.levels)
    text, _ = restated(noise_free, scores)
    print(f"  without refinement: {text}")
    started = time.perf_counter()
    refined_scores, costs = {}, {}
    rounds_run = collections.Counter()
    for scenario, truth in truths.items():
        for seed in range(args.seeds):
            s, first, extra = score_refined(scenario, truth, args.noise, seed, min_gain, args.levels,
                                            args.refine_rounds, args.refine_budget)
            refined_scores[scenario, seed] = s
            costs[scenario, seed] = (first, extra)
            rounds_run[refined(scenario, args.noise, seed, min_gain, args.levels, args.refine_rounds,
                               args.refine_budget)[3]] += 1
    nf_refined = {}
    for scenario, truth in truths.items():
        s, _, _ = score_refined(scenario, truth, 0.0, 0, min_gain, args.levels, args.refine_rounds,
                                args.refine_budget)
        nf_refined[scenario] = in_expectation({(scenario, 0): s})[scenario]
    text, met = restated(nf_refined, refined_scores, costs)
    print(f"  with refinement (at most {args.refine_rounds} rounds, budget {args.refine_budget:g} x the first "
          f"sweep's levels): {text}")
    print("  rounds run per scenario-draw: " + ", ".join(f"{r}: {n}" for r, n in sorted(rounds_run.items())))
    misses = collections.Counter(_kind(*s.worst_k) for s in refined_scores.values()
                                 if s.worst < RESTATED["draw_worst"])
    print("  draws below worst 0.97 with refinement, by what the schedule chose at the lowest ratio: "
          + (", ".join(f"{kind} {n}" for kind, n in misses.most_common()) or "none"))
    print(f"  with refinement, the old targets: {summary(refined_scores)}")
    print(f"  ({time.perf_counter() - started:.0f} s)")
    return met


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--noise", type=float, default=0.05, help="sigma of the log-normal noise (default 0.05)")
    parser.add_argument("--seeds", type=int, default=12,
                        help="noise draws per scenario (default 12; the expectation needs several)")
    parser.add_argument("--min-gain", type=float, default=2.0, help="the policy's minGainPercent (default 2)")
    parser.add_argument("--levels", type=_levels, default=tuple(DEFAULT_CONCURRENCY_LEVELS),
                        help="profiled concurrency levels (default: the API default, "
                             f"{','.join(map(str, DEFAULT_CONCURRENCY_LEVELS))})")
    parser.add_argument("--no-alternatives", action="store_true", help="skip the summary of other settings")
    parser.add_argument("--refine-rounds", type=int, default=8,
                        help="refinement rounds at most (default 8: until the planner says done, as in the "
                             "operator; it refines one round)")
    parser.add_argument("--refine-budget", type=float, default=DEFAULT_BUDGET_SHARE,
                        help="refinement budget in measured levels, as a share of the first sweep's "
                             f"(default {DEFAULT_BUDGET_SHARE:g}, the planner's)")
    parser.add_argument("--no-refine", action="store_true", help="skip the refinement comparison")
    parser.add_argument("--no-shared-knee", action="store_true",
                        help="fit each method on its own runs, not with what its pool's other methods measured of "
                             "the knee and weight share (the planner before it pooled them)")
    parser.add_argument("--unknown-load-only", action="store_true",
                        help="run only issue 29's check of the method choice with no load known")
    parser.add_argument("--no-unknown-load", action="store_true",
                        help="skip issue 29's check of the method choice with no load known")
    parser.add_argument("--restated-min-gain", type=float, default=0.0,
                        help="minGain at which issue 14's restated targets are read (default 0: the issue's "
                             "reading; the policy default --min-gain is reported next to it)")
    args = parser.parse_args()
    global SHARED_KNEE
    SHARED_KNEE = not args.no_shared_knee
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1 (got {args.seeds})")

    if args.unknown_load_only:
        print_unknown_load(args)
        return 0
    truths = {scenario: true_curves(scenario, MAX_CONCURRENCY)
              for scenario in itertools.starmap(Scenario, itertools.product(SKUS, MODELS, METHODS, WORKLOADS))}
    print(f"levels {','.join(map(str, args.levels))}; minGain {args.min_gain:g}%; {len(truths)} scenarios")
    noise_free = in_expectation(evaluate(truths, 0.0, 1, args.min_gain, args.levels))
    print(f"\nnoise-free profiles:           {expected_summary(noise_free)}")

    scores = evaluate(truths, args.noise, args.seeds, args.min_gain, args.levels)
    expected = in_expectation(scores)
    print(f"\nnoise {args.noise:g}, {args.seeds} draws per scenario; E = the ratio at each concurrency averaged over "
          f"the draws, draw = the lowest of one draw")
    print(f"{'scenario':<62}{'E worst':>8}{'@c':>5}{'E mean':>8}{'E vs off':>9}{'E plain':>8}"
          f"{'draw worst':>11}{'drafter':>8}")
    by_scenario: dict[Scenario, list[Score]] = {}
    for (scenario, _), s in scores.items():
        by_scenario.setdefault(scenario, []).append(s)
    for scenario, e in sorted(expected.items(), key=lambda item: item[1].worst):
        draws = by_scenario[scenario]
        print(f"{scenario.label():<62}{e.worst:>8.3f}{e.worst_at:>5}{e.mean:>8.3f}{e.vs_sd_off:>9.3f}"
              f"{e.vs_no_sd:>8.3f}{min(s.worst for s in draws):>11.3f}{draws[0].drafter:>8.3f}")
    print(f"\nin expectation over the draws:  {expected_summary(expected)}")
    print(f"each draw alone:                {summary(scores)}")
    ideal = evaluate(truths, args.noise, args.seeds, args.min_gain, args.levels, ideal=True)
    print(f"  the ideal planner, each draw: {summary(ideal)}")
    print("  (the ideal planner knows the twin's exact curves and estimates only one scale per run from the same "
          "profile: what it misses per draw, no planner can meet)")
    decisions, decisions_missed = decisions_summary(truths, args.noise, args.seeds, args.min_gain, args.levels)
    print(f"the method choice (decide_pool: the method with its schedule, or no speculation) at a load of "
          f"{', '.join(map(str, DECISION_LOADS))}:\n  {decisions}")
    if not args.no_unknown_load:
        print_unknown_load(args)
    text = breakdown(scores, args.levels)
    if text:
        print(f"where the per-draw misses are (at each scenario-seed's lowest ratio):\n{text}")

    if not args.no_alternatives:
        print("\nother settings (same noise and draws): in expectation | each draw alone")
        level_sets = list(dict.fromkeys((tuple(DEFAULT_CONCURRENCY_LEVELS), LEVELS_TO_128, LEVELS_DENSE)))
        for levels, min_gain in itertools.product(level_sets, (1.0, 2.0, 5.0)):
            if (levels, min_gain) == (args.levels, args.min_gain):
                continue
            other = evaluate(truths, args.noise, args.seeds, min_gain, levels)
            label = f"levels 1..{levels[-1]} ({len(levels)}), minGain {min_gain:g}%"
            print(f"  {label:<34}{expected_summary(in_expectation(other))}\n  {'':<34}{summary(other)}")

    refine_missed = False
    if not args.no_refine:
        for min_gain in dict.fromkeys((args.restated_min_gain, args.min_gain)):
            met = report_restated(truths, args, min_gain, noise_free if min_gain == args.min_gain else None,
                                  scores if min_gain == args.min_gain else None)
            if min_gain == args.restated_min_gain:
                refine_missed = not met

    with tempfile.TemporaryDirectory() as tmp:
        count = write_plan_inputs(Path(tmp))
        with contextlib.redirect_stdout(io.StringIO()):
            seconds = time_plan(Path(tmp))
    print(f"\nspecpilot plan on {count} profiles: {seconds:.2f} s (target < 1 s)")
    missed = decisions_missed or any(any(e.misses().values()) for e in (*noise_free.values(), *expected.values()))
    print("targets (noise-free, and in expectation at this noise):", "missed" if missed else "met")
    if not args.no_refine:
        print(f"issue 14's restated targets with refinement at minGain {args.restated_min_gain:g}%:",
              "missed" if refine_missed else "met",
              "(reported; the exit status follows the targets above)")
    return 1 if missed or seconds >= 1.0 else 0


if __name__ == "__main__":
    sys.exit(main())
