"""Serving policies the fleet simulator compares, each a small object with `start()` and `control(obs)`.

- `no-sd`: no speculation, fixed replicas.
- `always-on`: the method at one fixed k for every batch size (the k that is best at concurrency 1, as a
  team that benchmarks one request at a time would pick), fixed replicas.
- `static<32`: the common rule of thumb: the same k, but no speculation at 32 or more concurrent requests
  (a two-range schedule), fixed replicas.
- `restart-toggle`: the restart strategy: the engine runs the method at a fixed k or without it, and
  `policy.restart.step` (the operator's controller) toggles by rollout around the crossover concurrency,
  fixed replicas.
- `specpilot`: the schedule `policy.choose.decide_pool` picks from synthetic profiles of every candidate
  (built by `sim.synthetic` as the benchmark Job would measure them), fixed replicas.
- `specpilot+autoscale`: that schedule plus `policy.replicas.plan_replicas` with the decision's SLO-feasible
  capacity per replica, between min and max replicas.
- `no-sd+autoscale` (reference): the same replica planner with the capacity of the engine without
  speculation, to show what the speculation-aware capacity adds.

Every decision goes through the same functions the operator calls; this module only adapts the
simulator's observations to them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import numpy as np

from ..api.deployment import Hysteresis, Policy, Strategy
from ..api.profile import SpeculationProfile
from ..policy import restart
from ..policy.choose import BASELINE_KEY, CandidatePlan, PoolPlan, decide_pool
from ..policy.replicas import ReplicaState, plan_replicas
from ..policy.surface import BaselineSurface, build_baseline
from .fleet import Action, FleetSetup, Mode, Observation
from .synthetic import Scenario, synthetic_profiles
from .traces import LoadTrace

__all__ = [
    "Candidate",
    "FixedPolicy",
    "PlanningInputs",
    "PoolPlanning",
    "RestartTogglePolicy",
    "AutoscalePolicy",
    "build_policies",
    "plan_pool",
]

STATIC_RULE_CONCURRENCY = 32
"""The rule of thumb `static<32` follows: no speculation at this many concurrent requests or more."""
_EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A candidate method and the largest k it is profiled at."""

    method: str
    max_k: int = 4

    @classmethod
    def parse(cls, text: str) -> Candidate:
        """`METHOD` or `METHOD:K`, e.g. `eagle3:5`."""
        from ..api.methods import SpeculativeMethod

        method, _, k = text.partition(":")
        try:
            SpeculativeMethod(method)
        except ValueError:
            names = ", ".join(m.value for m in SpeculativeMethod)
            raise ValueError(f"--methods: unknown method {method!r}; use one of {names}") from None
        try:
            max_k = int(k) if k else 4
        except ValueError:
            raise ValueError(f"--methods: K in {text!r} must be an integer, e.g. {method}:4") from None
        if not 1 <= max_k <= 16:
            raise ValueError(f"--methods: K in {text!r} must be within 1..16")
        return cls(method, max_k)


@dataclasses.dataclass(frozen=True)
class PlanningInputs:
    """What the policies are built from: the pool, its candidates, SLO, replica bounds and the load."""

    setup: FleetSetup
    candidates: tuple[Candidate, ...]
    replicas: int = 4
    min_replicas: int = 1
    max_replicas: int = 8
    slo_tpot_ms: float | None = None
    max_num_seqs: int = 256
    profile_noise: float = 0.05
    seed: int = 0
    hysteresis: Hysteresis = dataclasses.field(default_factory=Hysteresis)
    target_utilization_percent: float = 80.0
    scale_down_stabilization_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("--methods: give at least one candidate method, e.g. eagle3:4")
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"replicas: need 1 <= min ({self.min_replicas}) <= max ({self.max_replicas})")
        if not 1 <= self.replicas <= self.max_replicas:
            raise ValueError(f"--replicas must be within 1..--max-replicas ({self.max_replicas}); "
                             f"got {self.replicas}")


@dataclasses.dataclass(frozen=True)
class PoolPlanning:
    """The operator's decisions for the pool: dynamic (schedule) and restart strategy, and their inputs."""

    dynamic: PoolPlan
    restart: PoolPlan
    profiles: dict[str, SpeculationProfile]
    baseline: SpeculationProfile
    concurrency_histogram: list[tuple[float, float]]

    def row(self, plan: PoolPlan, key: str | None) -> CandidatePlan:
        return next(r for r in plan.candidates if r.key == (key or BASELINE_KEY))

    @property
    def baseline_surface(self) -> BaselineSurface:
        return build_baseline(self.baseline.status.run(0))

    @property
    def chosen(self) -> CandidatePlan:
        return self.row(self.dynamic, self.dynamic.decision.method)

    @property
    def fixed_method_row(self) -> CandidatePlan | None:
        """The method the fixed-k policies run: specpilot's choice, else the best-expected candidate."""
        if self.dynamic.decision.method:
            return self.chosen
        ready = [r for r in self.dynamic.candidates[1:] if r.ready and r.expected_goodput_tok_s]
        return max(ready, key=lambda r: r.expected_goodput_tok_s, default=None)


def _scenario(inputs: PlanningInputs, candidate: Candidate) -> Scenario:
    lengths = inputs.setup.lengths
    return Scenario(sku=inputs.setup.sku, model_id=inputs.setup.model_id, method=candidate.method,
                    workload=inputs.setup.workload, max_k=candidate.max_k,
                    tensor_parallel_size=inputs.setup.tensor_parallel_size,
                    output_len=max(2, lengths.mean_output_tokens), prompt_len=lengths.mean_prompt_tokens)


def expected_concurrency_histogram(inputs: PlanningInputs, trace: LoadTrace,
                                   points: int = 96) -> list[tuple[float, float]]:
    """Per-replica concurrency over the trace at `replicas` replicas, by Little's law on the plain engine:
    c = arrival rate per replica * (prefill + output tokens * TPOT(c)). What the pool's Prometheus history
    would show, used as decide_pool's concurrency histogram."""
    twin = inputs.setup.twin(None)
    lengths = inputs.setup.lengths
    context = lengths.mean_prompt_tokens + lengths.mean_output_tokens / 2
    prefill_s = twin.prefill_time_s(lengths.mean_prompt_tokens)
    rates = trace.rate_rps(np.linspace(0.0, trace.duration_s, points, endpoint=False)) / inputs.replicas
    histogram: dict[int, float] = {}
    for rate in rates:
        c = 1.0
        for _ in range(30):
            batch = min(max(c, 1.0), inputs.max_num_seqs)
            c = rate * (prefill_s + lengths.mean_output_tokens * twin.tpot_s(batch, 0, context))
        level = int(min(max(round(c), 1), inputs.max_num_seqs))
        histogram[level] = histogram.get(level, 0.0) + 1.0
    return sorted(histogram.items())


def plan_pool(inputs: PlanningInputs, trace: LoadTrace) -> PoolPlanning:
    """Profile every candidate synthetically and decide the pool as the operator would (dynamic and restart)."""
    profiles: dict[str, SpeculationProfile] = {}
    candidates = []
    baseline = None
    for i, candidate in enumerate(inputs.candidates):
        scenario = _scenario(inputs, candidate)
        base, profile = synthetic_profiles(scenario, noise=inputs.profile_noise, seed=inputs.seed + i)
        baseline = baseline or base
        method = scenario.candidate()
        profiles[method.key] = profile
        candidates.append(method)
    histogram = expected_concurrency_histogram(inputs, trace)
    price = inputs.setup.gpu_price_per_hour
    gpus = inputs.setup.tensor_parallel_size

    def decide(strategy: Strategy) -> PoolPlan:
        policy = Policy(tpot_slo_ms=inputs.slo_tpot_ms, strategy=strategy, hysteresis=inputs.hysteresis)
        return decide_pool(policy, candidates, baseline, profiles, price, gpus, concurrency_histogram=histogram,
                           max_batch_size=inputs.max_num_seqs, now=_EPOCH)

    return PoolPlanning(dynamic=decide(Strategy.DYNAMIC), restart=decide(Strategy.RESTART), profiles=profiles,
                        baseline=baseline, concurrency_histogram=histogram)


def best_k_at_one(row: CandidatePlan) -> int:
    """The k with the highest goodput at concurrency 1 on the candidate's measured surface."""
    surface = row.schedule.surface
    return max((k for k in surface.available_k() if k > 0), key=lambda k: surface.goodput(k, 1.0))


def _constant(k: int, size: int) -> tuple[int, ...]:
    return (k,) * size


@dataclasses.dataclass
class FixedPolicy:
    """One engine mode on a fixed number of replicas."""

    name: str
    method: str | None
    mode: Mode
    replicas: int
    description: str = ""

    @property
    def modes(self) -> dict[str, Mode]:
        return {self.mode.name: self.mode}

    def start(self) -> Action:
        return Action(self.replicas, self.mode.name)

    def control(self, observation: Observation) -> Action:
        return Action(self.replicas, self.mode.name)


@dataclasses.dataclass
class RestartTogglePolicy:
    """Speculation on (fixed k) or off (engine without the drafter), toggled by policy.restart.step."""

    name: str
    method: str
    k: int
    crossover_concurrency: float | None
    hysteresis: Hysteresis
    replicas: int
    max_num_seqs: int
    description: str = ""
    state: restart.RestartState = dataclasses.field(
        default_factory=lambda: restart.RestartState(speculation_enabled=True))

    @property
    def modes(self) -> dict[str, Mode]:
        return {"sd-on": Mode("sd-on", True, _constant(self.k, self.max_num_seqs)),
                "sd-off": Mode("sd-off", False, _constant(0, self.max_num_seqs))}

    def start(self) -> Action:
        self.state = restart.RestartState(speculation_enabled=True)
        return Action(self.replicas, "sd-on")

    def control(self, observation: Observation) -> Action:
        seen = restart.Observation(concurrency_per_replica=observation.running_per_replica,
                                   at=_EPOCH + timedelta(seconds=observation.t_s))
        self.state = restart.step(self.state, seen, self.crossover_concurrency, self.hysteresis,
                                  observation.rollout_in_progress).state
        return Action(self.replicas, "sd-on" if self.state.speculation_enabled else "sd-off")


@dataclasses.dataclass
class AutoscalePolicy:
    """One engine mode; replicas from policy.replicas.plan_replicas with a given capacity per replica."""

    name: str
    method: str | None
    mode: Mode
    capacity_per_replica: float | None
    start_replicas: int
    min_replicas: int
    max_replicas: int
    target_utilization_percent: float
    stabilization_s: float
    tpot_ms_at: Callable[[float], float] | None = None
    """TPOT at a per-replica concurrency under this mode; when given, demand is expressed at capacity."""
    description: str = ""
    state: ReplicaState = dataclasses.field(default_factory=ReplicaState)
    current: int = 0

    @property
    def modes(self) -> dict[str, Mode]:
        return {self.mode.name: self.mode}

    def start(self) -> Action:
        # the pool has run at start_replicas until now: scale-down waits out the stabilisation window
        self.state = ReplicaState(recent=((_EPOCH, self.start_replicas),))
        self.current = self.start_replicas
        return Action(self.current, self.mode.name)

    def control(self, observation: Observation) -> Action:
        demand = observation.running_per_replica * observation.serving_replicas + observation.waiting
        if self.tpot_ms_at is not None:
            demand = demand_at_capacity(demand, observation.serving_replicas, self.tpot_ms_at,
                                        self.capacity_per_replica)
        plan = plan_replicas(self.state, demand, self.current, self.capacity_per_replica,
                             self.target_utilization_percent, self.min_replicas, self.max_replicas,
                             self.stabilization_s, _EPOCH + timedelta(seconds=observation.t_s))
        self.state, self.current = plan.state, plan.replicas
        return Action(self.current, self.mode.name)


def demand_at_capacity(demand: float, replicas: int, tpot_ms_at: Callable[[float], float],
                       capacity_per_replica: float | None) -> float:
    """The concurrency today's request rate would reach if every replica ran at capacity (Little's law).

    Concurrency is request rate times latency, and latency grows with the batch: a lightly loaded replica
    finishes requests fast (under speculation about 3x faster than at capacity), so running + waiting
    seen there understates what the same traffic needs at the capacity the planner divides by. Scaling
    by TPOT(capacity) / TPOT(current) puts both in the same units; an overloaded pool is left as seen.
    """
    if not capacity_per_replica or replicas < 1 or demand <= 0:
        return demand
    current = demand / replicas
    if current >= capacity_per_replica:
        return demand
    now_ms, at_capacity_ms = tpot_ms_at(max(current, 1.0)), tpot_ms_at(capacity_per_replica)
    if not (now_ms > 0 and math.isfinite(now_ms) and math.isfinite(at_capacity_ms)):
        return demand
    return demand * max(1.0, at_capacity_ms / now_ms)


def _schedule_mode(row: CandidatePlan, size: int) -> Mode:
    if row.method is None or row.schedule is None or row.num_speculative_tokens == 0:
        return Mode("no-sd", False, _constant(0, size))
    dense = row.schedule.k_by_batch_size
    k = tuple(dense[min(b, len(dense)) - 1] for b in range(1, size + 1))
    return Mode("schedule", True, k)


def build_policies(inputs: PlanningInputs, planning: PoolPlanning) -> list:
    """The policies to compare, in the order the report lists them."""
    size = inputs.max_num_seqs
    n = inputs.replicas
    policies: list = [FixedPolicy("no-sd", None, Mode("no-sd", False, _constant(0, size)), n,
                                  "no speculation")]
    fixed = planning.fixed_method_row
    if fixed is not None and fixed.schedule is not None:
        k = best_k_at_one(fixed)
        policies.append(FixedPolicy("always-on", fixed.method, Mode("always-on", True, _constant(k, size)), n,
                                    f"{fixed.key} at k={k} for every batch size"))
        rule = tuple(k if b < STATIC_RULE_CONCURRENCY else 0 for b in range(1, size + 1))
        policies.append(FixedPolicy(f"static<{STATIC_RULE_CONCURRENCY}", fixed.method,
                                    Mode("static-rule", True, rule), n,
                                    f"{fixed.key} at k={k} below {STATIC_RULE_CONCURRENCY} concurrent requests, "
                                    f"off from {STATIC_RULE_CONCURRENCY}"))
        restart_row = next((r for r in planning.restart.candidates if r.key == fixed.key), None)
        if restart_row is not None and restart_row.ready and restart_row.num_speculative_tokens > 0:
            crossover = restart_row.crossover_concurrency
            policies.append(RestartTogglePolicy(
                "restart-toggle", fixed.method, restart_row.num_speculative_tokens,
                float(crossover) if crossover is not None else None, inputs.hysteresis, n, size,
                f"{fixed.key} at k={restart_row.num_speculative_tokens}, rolled off above "
                f"{crossover if crossover is not None else 'never'} concurrent requests per replica"))
    chosen = planning.chosen
    mode = _schedule_mode(chosen, size)
    method = chosen.method if mode.speculative else None
    summary = planning.dynamic.decision.schedule_summary or "no speculation"
    policies.append(FixedPolicy("specpilot", method, mode, n, f"{chosen.key}: schedule {summary}"))
    base_row = planning.row(planning.dynamic, None)
    scale = dict(start_replicas=n, min_replicas=inputs.min_replicas, max_replicas=inputs.max_replicas,
                 target_utilization_percent=inputs.target_utilization_percent,
                 stabilization_s=inputs.scale_down_stabilization_s)
    capacity = planning.dynamic.capacity_concurrency_per_replica
    tpot_at = chosen.schedule.tpot_ms_at if mode.speculative else planning.baseline_surface.tpot_ms
    policies.append(AutoscalePolicy("specpilot+autoscale", method, mode, capacity, tpot_ms_at=tpot_at,
                                    description=f"schedule {summary}; {_capacity_words(capacity)}", **scale))
    policies.append(AutoscalePolicy("no-sd+autoscale", None, Mode("no-sd", False, _constant(0, size)),
                                    base_row.capacity_concurrency, tpot_ms_at=planning.baseline_surface.tpot_ms,
                                    description=f"no speculation; {_capacity_words(base_row.capacity_concurrency)}",
                                    **scale))
    return policies


def _capacity_words(capacity: float | None) -> str:
    if capacity is None or not math.isfinite(capacity) or capacity <= 0:
        return "no SLO-feasible capacity: runs the maximum replicas"
    return f"{capacity:g} requests per replica within the TPOT SLO"

