"""A GPU type joining a simulated fleet: its profiling Jobs, decided by the operator's own decision
(`policy.plan.plan_deployment`, which runs the profiling planner, on a `sim.cluster.VirtualCluster`), each taking
the time its benchmark sweep takes on the twin, then its refinement.

What a benchmark Job does (benchmark-job/specpilot_bench/cli.py and sweep.py, manifests/benchmark.py), and how
it is timed here, by the bench's own numbers (`perf.bench_model`):

- one engine start per run (`ENGINE_START_S`: model load, compilation, CUDA graphs; the Job's pod start, once
  per Job, is not counted); a baseline profile is one run (k = 0), a method's two (k = 1 and its largest K,
  the drafter loaded);
- per run the concurrency levels in order (the API's default levels, 1 to 256); per level a warm-up (about
  one request's latency at c) and then max(requestsPerLevel, 2c) requests kept c in flight, which take
  requests / the twin's request throughput at c (`Twin.benchmark_point`, steady state; `level_wall_s`);
- a run stops early once its output throughput gained under 5% at each of two steps, the bench's
  saturation stop (`saturated`; its SLO stop is not modelled: a run may take longer here than it would);
- Jobs run one at a time per pool (profilingDefaults.maxParallelJobsPerPool = 1) on one replica's GPUs: the
  operator's decision starts them, follows them and accepts each result when its Job completes (the result, the
  twin's synthetic profile, reaches the profile with the Job's completion);
- refinement (`policy.refine.pool_refinement`, what the operator asks of the pool's decision, at the default
  refineBudgetPercent): its first round's Jobs, each an engine start per k and its levels x repeats; Jobs of
  one profile run one after another (appends go one Job at a time), different profiles' side by side. The
  operator serves a pool's decision while it refines, so refinement is charged (GPU-hours) but does not hold
  serving; later rounds, which depend on what the first measures, are not simulated.

The pool serves once every profile it needs is Ready. Until then the simulator keeps it out of the placement
(the operator would serve it by its own autoscaling with speculation off, and the fleet planner holds a pool
without a curve at the replicas that gives it; the simulator's placements need a pool's curve, which only its
profiles give).
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Sequence
from datetime import timedelta

from ..api.deployment_spec import DEFAULT_CONCURRENCY_LEVELS, Policy, SpeculativeDeploymentSpec, Strategy
from ..perf.bench_model import DEFAULT_REQUESTS_PER_LEVEL, ENGINE_START_S, level_wall_s, saturated
from ..perf.twin import Twin
from ..policy import profiling
from ..policy.refine import pool_refinement
from .cluster import VirtualCluster
from .connector import EPOCH
from .synthetic import Scenario, synthetic_profiles

__all__ = ["BENCH_ENGINE_START_S", "Joining", "JobRecord", "joining_spec", "plan_joining", "profile_seconds",
           "run_profiling", "run_seconds"]

JOINING_LABEL = "specpilot.io/simulated-pool"
"""The label of a joining pool's simulated node, which its nodeSelector matches."""
BENCH_ENGINE_START_S = ENGINE_START_S
"""`perf.bench_model.ENGINE_START_S`, by the name this module has exported it under."""


def level_seconds(twin: Twin, concurrency: int, k: int, prompt_tokens: int, output_tokens: int,
                  requests_per_level: int = DEFAULT_REQUESTS_PER_LEVEL) -> tuple[float, float]:
    """(seconds, output tokens/s) of one level: its warm-up, then max(requests, 2c) requests at c in flight."""
    point = twin.benchmark_point(concurrency, k, prompt_tokens, max(2, output_tokens))
    rate = float(point["request_throughput"])
    return level_wall_s(concurrency, rate, requests_per_level), float(point["output_throughput_tok_s"])


def run_seconds(twin: Twin, k: int, prompt_tokens: int, output_tokens: int,
                levels: Sequence[int] = tuple(DEFAULT_CONCURRENCY_LEVELS),
                requests_per_level: int = DEFAULT_REQUESTS_PER_LEVEL, repeat: int = 1,
                early_stop: bool = True) -> float:
    """Seconds of one run's sweep (no engine start), stopping once saturated as the bench does."""
    total, throughputs = 0.0, []
    for c in levels:
        seconds, throughput = level_seconds(twin, int(c), k, prompt_tokens, output_tokens, requests_per_level)
        total += seconds * max(1, repeat)
        throughputs.append(throughput)
        if early_stop and saturated(throughputs):
            break
    return total


def profile_seconds(setup, method: str | None, max_k: int, engine_start_s: float = ENGINE_START_S) -> float:
    """Seconds of one profiling Job: the baseline's k = 0 run (`method` None), or a method's k = 1 and K runs,
    each with an engine start. `setup`: the pool's `sim.fleet.FleetSetup`."""
    lengths = setup.lengths
    prompt, output = lengths.mean_prompt_tokens, max(2, lengths.mean_output_tokens)
    twin = setup.twin(method)
    ks = (0,) if method is None else tuple(sorted({1, max_k}))
    return sum(engine_start_s + run_seconds(twin, k, prompt, output) for k in ks)


@dataclasses.dataclass(frozen=True)
class JobRecord:
    profile: str
    """The profile's key: baseline or the candidate's."""
    kind: str
    """profile or refine."""
    start_s: float
    end_s: float

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s


@dataclasses.dataclass(frozen=True)
class Joining:
    """A pool whose nodes appear during the trace: when, when it serves, and the Jobs it ran."""

    pool: str
    sku: str
    joined_at_s: float
    serving_at_s: float
    """When every profile it needs was Ready (math.inf: one failed, or the trace ended first)."""
    jobs: tuple[JobRecord, ...]
    gpus_per_job: int
    price_per_gpu_hour: float
    max_parallel_jobs: int = 1

    @property
    def profiling_s(self) -> float:
        return self.serving_at_s - self.joined_at_s

    @property
    def refined_at_s(self) -> float | None:
        ends = [j.end_s for j in self.jobs if j.kind == "refine"]
        return max(ends) if ends else None

    @property
    def gpu_hours(self) -> float:
        return sum(j.seconds for j in self.jobs) * self.gpus_per_job / 3600.0

    @property
    def cost_usd(self) -> float:
        return self.gpu_hours * self.price_per_gpu_hour

    def words(self) -> str:
        profiles = sum(1 for j in self.jobs if j.kind == "profile")
        refines = [j for j in self.jobs if j.kind == "refine"]
        refined = (f"; {len(refines)} refinement Job(s) until {self.refined_at_s / 3600:.2f} h"
                   if refines else "; no refinement asked for")
        if not math.isfinite(self.serving_at_s):
            return (f"pool {self.pool} ({self.sku}) joined at {self.joined_at_s / 3600:.2f} h and was not profiled "
                    f"before the trace ended (or a profile failed): it never serves; {self.gpu_hours:.2f} GPU-hours "
                    f"of Jobs (${self.cost_usd:.2f}) charged to every placement")
        return (f"pool {self.pool} ({self.sku}) joined at {self.joined_at_s / 3600:.2f} h, ran {profiles} "
                f"profiling Job(s) {'one' if self.max_parallel_jobs == 1 else f'up to {self.max_parallel_jobs}'} at a time "
                f"for {self.profiling_s / 60:.1f} min and serves from "
                f"{self.serving_at_s / 3600:.2f} h{refined}; {self.gpu_hours:.2f} GPU-hours of Jobs "
                f"(${self.cost_usd:.2f}) charged to every placement")

    def to_dict(self) -> dict:
        return {"pool": self.pool, "sku": self.sku, "joined_at_s": self.joined_at_s,
                "serving_at_s": self.serving_at_s, "profiling_s": self.profiling_s,
                "refined_at_s": self.refined_at_s, "gpu_hours": self.gpu_hours, "cost_usd": self.cost_usd,
                "jobs": [dataclasses.asdict(j) for j in self.jobs]}


def joining_spec(pool: str, sku: str, model_id: str, candidates, max_parallel_jobs: int = 1,
                 tensor_parallel_size: int = 1) -> SpeculativeDeploymentSpec:
    """The SpeculativeDeployment of a joining pool: its model on `sku`, the `candidates` (`sim.policies.Candidate`s;
    one of a method twice is named method-K), profiled `max_parallel_jobs` at a time."""
    methods = []
    counts = collections.Counter(c.method for c in candidates)
    for candidate in candidates:
        method = Scenario(sku, model_id, candidate.method, max_k=candidate.max_k,
                          tensor_parallel_size=tensor_parallel_size).candidate()
        if counts[candidate.method] > 1:
            method = method.model_copy(update={"name": f"{candidate.method}-{candidate.max_k}"})
        methods.append(method.dump())
    return SpeculativeDeploymentSpec.model_validate({
        "model": {"id": model_id, "tensorParallelSize": tensor_parallel_size},
        "gpuPools": [{"name": pool, "sku": sku, "nodeSelector": {JOINING_LABEL: pool}}],
        "methods": methods, "profiling": {"maxParallelJobsPerPool": max_parallel_jobs}})


def run_profiling(spec: SpeculativeDeploymentSpec, seconds: dict[str, float], joined_at_s: float,
                  horizon_s: float) -> tuple[float, list[JobRecord]]:
    """The operator's decision (`policy.plan.plan_deployment`, through `sim.cluster.VirtualCluster`) on the pool
    of `spec` from `joined_at_s`, when its node appears: `seconds` is each needed profile's Job time by its key
    (baseline or the candidate's). A Job's result (the twin's synthetic profile) reaches its profile when the
    Job completes. Returns (when every profile was Ready, or math.inf; the Jobs run)."""
    [pool] = spec.gpu_pools
    cluster = VirtualCluster(spec=spec, name=pool.name)
    cluster.add_node(f"{pool.name}-node", {JOINING_LABEL: pool.name})
    key_of = {n.name: n.key for n in cluster.snapshot(EPOCH).profiling.needed}
    running: dict[str, tuple[float, float]] = {}
    records: list[JobRecord] = []
    results: dict[str, dict] = {}
    t = joined_at_s
    while t <= horizon_s:
        now = EPOCH + timedelta(seconds=t)
        for name, (_, end) in running.items():
            if t >= end and cluster.jobs.get(name) != profiling.COMPLETE:  # the bench publishes before it exits
                cluster.publish(name, results.setdefault(name, _result(spec, cluster.profiles[name])),
                                EPOCH + timedelta(seconds=end))
        plan = cluster.reconcile(now)
        for start in plan.profiling.of(profiling.StartJob):
            key = key_of[start.name]
            running[start.name] = (t, t + seconds[key])
            records.append(JobRecord(key, "profile", t, t + seconds[key]))
        rollup = plan.profiling.rollup
        if rollup.failed:
            return math.inf, records
        if rollup.ready == rollup.total:
            return t, records
        # the next change: a Job completing (the watch wakes the operator), else a Wait's end, else a second on
        ends = [end for _, end in running.values() if end > t]
        wake = plan.profiling.next_wake
        later = [x for x in [*ends, *([(wake - EPOCH).total_seconds()] if wake is not None else [])] if x > t]
        t = min(later, default=t + 1.0)
    return math.inf, records


def _result(spec: SpeculativeDeploymentSpec, profile: dict) -> dict:
    """What the profile's benchmark Job writes: the twin's synthetic measurement of it (noise-free)."""
    method = (profile.get("spec") or {}).get("method") or {}
    scenario = Scenario(spec.gpu_pools[0].sku, spec.model.id, method.get("method") or "eagle3",
                        max_k=int(method.get("numSpeculativeTokens") or 4),
                        tensor_parallel_size=spec.model.tensor_parallel_size)
    baseline, measured = synthetic_profiles(scenario, noise=0.0)
    return (measured if method else baseline).status.dump()


def refinement_records(planning, setup, slo_tpot_ms: float, start_s: float, time_scale: float,
                       engine_start_s: float = ENGINE_START_S) -> list[JobRecord]:
    """The first refinement round the operator asks of the pool's decision (`planning`: its
    `sim.policies.PoolPlanning`) at the default budget, timed on the twin; Jobs of one profile one after
    another from `start_s`."""
    policy = Policy(tpot_slo_ms=slo_tpot_ms, strategy=Strategy.DYNAMIC)
    found = pool_refinement(planning.dynamic, policy, planning.baseline, dict(planning.profiles))
    if found is None or found.done:
        return []
    lengths = setup.lengths
    prompt, output = lengths.mean_prompt_tokens, max(2, lengths.mean_output_tokens)
    method_of = {c.key: c.method for c in planning.candidates}
    ends: dict[str, float] = {}
    records = []
    for job in found.jobs():
        method = method_of.get(job.profile_key)
        twin = setup.twin(method)
        seconds = sum(engine_start_s + run_seconds(twin, k, prompt, output, job.levels, repeat=job.repeat,
                                                   early_stop=False) for k in job.ks) * time_scale
        begin = ends.get(job.profile_key, start_s)
        ends[job.profile_key] = begin + seconds
        records.append(JobRecord(job.profile_key, "refine", begin, begin + seconds))
    return records


def plan_joining(pool: str, sku: str, setup, candidates, joined_at_s: float, horizon_s: float,
                 time_scale: float = 1.0, max_parallel_jobs: int = 1) -> Joining:
    """The pool's profiling from `joined_at_s` (`candidates`: `sim.policies.Candidate`s; `time_scale` shrinks
    every Job's time with a compressed trace), without refinement (`with_refinement` adds it). A Job's record
    names its profile by the candidate's key (method-K when two candidates share one method)."""
    spec = joining_spec(pool, sku, setup.model_id, candidates, max_parallel_jobs, setup.tensor_parallel_size)
    seconds = {"baseline": profile_seconds(setup, None, 0) * time_scale}
    for candidate, method in zip(candidates, spec.methods, strict=True):
        seconds[method.key] = profile_seconds(setup, candidate.method, candidate.max_k) * time_scale
    serving_at, records = run_profiling(spec, seconds, joined_at_s, horizon_s)
    return Joining(pool, sku, joined_at_s, serving_at, tuple(records), setup.tensor_parallel_size,
                   setup.gpu_price_per_hour, max_parallel_jobs)


def with_refinement(joining: Joining, planning, setup, slo_tpot_ms: float, time_scale: float = 1.0) -> Joining:
    if not math.isfinite(joining.serving_at_s):
        return joining
    refine = refinement_records(planning, setup, slo_tpot_ms, joining.serving_at_s, time_scale)
    return dataclasses.replace(joining, jobs=(*joining.jobs, *refine))

