"""Serving policies the fleet simulator compares, each a small object with `start()` and `control(obs)`.

- `no-sd`: no speculation, fixed replicas.
- `always-on`: the method at one fixed k for every batch size (the k that is best at concurrency 1, as a
  team that benchmarks one request at a time would pick), fixed replicas.
- `static<32`: the common rule of thumb: the same k, but no speculation at 32 or more concurrent requests
  (a two-range schedule), fixed replicas.
- `restart-toggle`: the operator with `policy.strategy: restart` and that method as its only candidate:
  the engine runs the method at the restart plan's k or without it, toggled by rollout around the
  crossover, fixed replicas.
- `specpilot`: the operator with `policy.strategy: dynamic` and every candidate (synthetic profiles built
  by `sim.synthetic` as the benchmark Job would measure them), fixed replicas.
- `specpilot+autoscale`: the same with `serving.autoscaling: internal` between min and max replicas.
- `no-sd+autoscale` (reference): `policy.replicas.plan_replicas` with the capacity of the engine without
  speculation, to show what the speculation-aware capacity adds.

The three operator policies are `OperatorPolicy`: it keeps the pool's `PoolStatus` between control steps
(read back through its JSON form each step, as the operator reads it from the API server) and runs the
operator's own decision, `policy.plan.plan_deployment`, at every control step on the snapshot the controller
would read, through the simulated connector (`sim.connector`) that turns the fleet's observations into the
`PoolObservation` the operator's observer reports and the plan's `Serve` into engine modes and replicas. So what `specpilot
simulate` reports for them is what the operator would do with those observations. The fixed baselines
are simple references, built from the same up-front decision (`profile_and_decide_pool`: `decide_pool` on the
expected load) that the report's header shows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from datetime import datetime, timedelta

import numpy as np

from ..api.deployment_spec import (
    Autoscaling,
    ConcurrencyWeight,
    GpuPool,
    Hysteresis,
    ModelSpec,
    Policy,
    Serving,
    SpeculativeDeploymentSpec,
    Strategy,
)
from ..api.deployment_status import PoolStatus, ReplicaTarget, SpeculativeDeploymentStatus
from ..api.methods import CandidateMethod
from ..api.profile import SpeculationProfile
from ..config import OperatorConfig
from ..observe.model import PoolObservation
from ..policy.choose import BASELINE_KEY, decide_pool
from ..policy.comparison import CandidatePlan, PoolPlan
from ..policy.needs import needed_profiles
from ..policy.plan import ApplyDeployment, DeploymentSnapshot, PoolSnapshot, plan_deployment
from ..policy.planner import PoolProfiles, Serve
from ..policy.pools import NodeInfo, PoolView
from ..policy.profiling import all_accepted
from ..policy.replicas import ReplicaState, demand_at_capacity, plan_replicas
from ..policy.surface import BaselineSurface, build_baseline
from .connector import EPOCH, SimulatedConnector
from .fleet import Action, FleetSetup, Mode, Observation
from .synthetic import Scenario, synthetic_profiles
from .traces import LoadTrace

__all__ = [
    "AutoscalePolicy",
    "Candidate",
    "ControlStep",
    "FixedPolicy",
    "OperatorPolicy",
    "PlanningInputs",
    "PoolPlanning",
    "build_policies",
    "deployment_spec",
    "profile_and_decide_pool",
    "replay_agreement",
    "serve_key",
]

STATIC_RULE_CONCURRENCY = 32
"""The rule of thumb `static<32` follows: no speculation at this many concurrent requests or more."""
_EPOCH = EPOCH


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
    fleet_placed: bool = False
    """The pool is one of a fleet placed by cost per token (decide_pool's `fleet_placed`)."""

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
    candidates: tuple[CandidateMethod, ...] = ()
    """The candidates as the spec lists them, in the order of `PlanningInputs.candidates`."""

    def row(self, plan: PoolPlan, key: str | None) -> CandidatePlan:
        return next(r for r in plan.candidates if r.key == (key or BASELINE_KEY))

    def pool_profiles(self, keys: list[str]) -> PoolProfiles:
        """The planner's typed view of the pool's profiles for the candidates `keys` (all Succeeded)."""
        methods = {k: self.profiles[k] for k in keys}
        names = tuple(sorted({self.baseline.metadata["name"], *(p.metadata["name"] for p in methods.values())}))
        return PoolProfiles(baseline=self.baseline, methods=methods, ready=len(names), total=len(names),
                            names=names)

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


def profile_and_decide_pool(inputs: PlanningInputs, trace: LoadTrace,
                            histogram: list[tuple[float, float]] | None = None) -> PoolPlanning:
    """Profile every candidate synthetically and decide the pool as the operator would (dynamic and restart),
    on `histogram` (per-replica concurrency, weight) when given, else the trace's expected one."""
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
    histogram = histogram or expected_concurrency_histogram(inputs, trace)
    price = inputs.setup.gpu_price_per_hour
    gpus = inputs.setup.tensor_parallel_size

    def decide(strategy: Strategy) -> PoolPlan:
        policy = Policy(tpot_slo_ms=inputs.slo_tpot_ms, strategy=strategy, hysteresis=inputs.hysteresis)
        return decide_pool(policy, candidates, baseline, profiles, price, gpus, concurrency_histogram=histogram,
                           max_batch_size=inputs.max_num_seqs, now=_EPOCH, fleet_placed=inputs.fleet_placed)

    return PoolPlanning(dynamic=decide(Strategy.DYNAMIC), restart=decide(Strategy.RESTART), profiles=profiles,
                        baseline=baseline, concurrency_histogram=histogram, candidates=tuple(candidates))


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


def deployment_spec(inputs: PlanningInputs, candidates: list[CandidateMethod], strategy: Strategy,
                    autoscale: bool, expected: list[tuple[float, float]] | None = None) -> SpeculativeDeploymentSpec:
    """The SpeculativeDeployment spec the simulated pool runs under: the simulator's model, candidates, SLO,
    hysteresis and replica settings; `expected` becomes `policy.expectedConcurrency` (what the planner weighs
    before it has observed the load). Without autoscaling the pool runs `inputs.replicas` replicas."""
    setup = inputs.setup
    expected_concurrency = [ConcurrencyWeight(concurrency=max(1, round(c)), weight=w)
                            for c, w in (expected or []) if w > 0][:256]
    if autoscale:
        serving = Serving(autoscaling=Autoscaling.INTERNAL, min_replicas=inputs.min_replicas,
                          max_replicas=inputs.max_replicas,
                          target_utilization_percent=inputs.target_utilization_percent,
                          scale_down_stabilization_seconds=round(inputs.scale_down_stabilization_s))
    else:
        serving = Serving(autoscaling=Autoscaling.NONE, min_replicas=inputs.replicas, max_replicas=inputs.replicas)
    return SpeculativeDeploymentSpec(
        model=ModelSpec(id=setup.model_id, tensor_parallel_size=setup.tensor_parallel_size),
        methods=candidates,
        gpu_pools=[GpuPool(name="sim", sku=setup.sku, price_per_gpu_hour=setup.gpu_price_per_hour)],
        policy=Policy(tpot_slo_ms=inputs.slo_tpot_ms, strategy=strategy, hysteresis=inputs.hysteresis,
                      expected_concurrency=expected_concurrency),
        serving=serving)


@dataclasses.dataclass(frozen=True)
class ControlStep:
    """One control step as the operator would have seen it: the planner's inputs that vary from step to step
    (the pool's previous status as written, the observation, the Deployment's replicas and rollout, now)
    and what it served."""

    t_s: float
    previous: dict
    """The pool's status before the step, as written to the API server (`PoolStatus.dump()`)."""
    observation: PoolObservation | None
    current_replicas: int
    rolling_out: bool
    now: datetime
    serve: Serve


@dataclasses.dataclass
class OperatorPolicy:
    """The operator's decision on the simulated pool: `policy.plan.plan_deployment` at every control step, on the
    snapshot the controller would read (the pool's Deployment, observation and profiles).

    Keeps the pool's `PoolStatus` between steps and reads it back through its JSON form each time (as the
    operator reads it from the API server), so everything the planner remembers (the decision and its
    basis, the restart toggle's clocks, the replica stabilisation window) goes through the status. The
    connector turns observations into `PoolObservation`s and `Serve` into the fleet's actions.
    `record=True` keeps every `ControlStep` in `steps` (to replay them, see `replay_agreement`)."""

    name: str
    spec: SpeculativeDeploymentSpec
    profiles: PoolProfiles
    connector: SimulatedConnector
    start_replicas: int
    intro: str = ""
    """What the report says of the policy before the engine modes it ran."""
    record: bool = False
    status: PoolStatus | None = None
    current: int = 0
    method: str | None = None
    """The drafter method last served (the report's method column)."""
    steps: list[ControlStep] = dataclasses.field(default_factory=list)
    _profiles: tuple | None = dataclasses.field(default=None, repr=False)
    """(pool view, needed profiles, their bodies by name), built once."""

    @property
    def modes(self) -> dict[str, Mode]:
        return self.connector.modes

    @property
    def description(self) -> str:
        if len(self.modes) <= 1:
            return self.intro
        return f"{self.intro}; ran {', '.join(self.modes)}"

    @property
    def pool(self) -> GpuPool:
        return self.spec.gpu_pools[0]

    def initial_status(self) -> PoolStatus:
        """The pool as a running deployment leaves it: `start_replicas` up until now, so scale-down waits
        out the stabilisation window as it would after any earlier reconcile."""
        targets = []
        if self.spec.serving.autoscaling != Autoscaling.NONE.value:
            targets = [ReplicaTarget(time=self.connector.at(0.0), replicas=self.start_replicas)]
        return PoolStatus(name=self.pool.name, replicas=self.start_replicas, replica_targets=targets)

    def snapshot(self, previous: PoolStatus, observation: PoolObservation | None, current_replicas: int,
                 rolling_out: bool, now: datetime) -> DeploymentSnapshot:
        """What the controller reads for `plan_deployment`, here from the simulated pool: its Deployment (replicas
        and whether a rollout is in progress), the observation, and the profiles under their identities' names."""
        if self._profiles is None:
            view = PoolView(pool=self.pool, nodes=[NodeInfo(f"node-{i}", {}) for i in
                                                   range(self.spec.serving.max_replicas)], skus=[self.pool.sku])
            needed = needed_profiles(self.spec, [view], OperatorConfig())
            baseline, methods = self.profiles.validated()
            chosen = {n.name: baseline if n.candidate is None else methods.get(n.key) for n in needed}
            self._profiles = (view, needed, {name: p.dump() for name, p in chosen.items() if p is not None})
        view, needed, bodies = self._profiles
        deployment = {"metadata": {"name": self.pool.name, "generation": 2}, "spec": {"replicas": current_replicas},
                      "status": {"observedGeneration": 2,
                                 "updatedReplicas": 0 if rolling_out else current_replicas}}
        return DeploymentSnapshot(
            spec=self.spec, name=self.name, uid=self.name, generation=1,
            old=SpeculativeDeploymentStatus(pools=[previous]), now=now,
            pools=[PoolSnapshot(view=view, current=deployment, observation=observation,
                                price_per_gpu_hour=self.pool.price_per_gpu_hour)],
            profiling=all_accepted([n for n in needed if n.name in bodies], now), profiles=bodies)

    def plan(self, previous: PoolStatus, observation: PoolObservation | None, current_replicas: int,
             rolling_out: bool, now: datetime) -> tuple[PoolStatus, Serve | None]:
        """The operator's decision on the pool (`policy.plan.plan_deployment`): its next status and what it serves."""
        plan = plan_deployment(self.snapshot(previous, observation, current_replicas, rolling_out, now))
        applies = plan.of(ApplyDeployment)
        return plan.status.pools[0], applies[0].serve if applies else None

    def start(self) -> Action:
        self.status = self.initial_status()
        self.current = self.start_replicas
        self.steps = []
        return self._step(0.0, None, rolling_out=False)

    def control(self, observation: Observation) -> Action:
        return self._step(observation.t_s, self.connector.observe(observation), observation.rollout_in_progress)

    def _step(self, t_s: float, observation: PoolObservation | None, rolling_out: bool) -> Action:
        written = self.status.dump()
        now = self.connector.at(t_s)
        self.status, serve = self.plan(PoolStatus.model_validate(written), observation, self.current, rolling_out, now)
        if self.record:
            self.steps.append(ControlStep(t_s, written, observation, self.current, rolling_out, now, serve))
        action = self.connector.actuate(serve, self.current)
        self.current = action.replicas
        mode = self.connector.modes[action.mode]
        if mode.speculative:
            self.method = mode.method
        return action


def serve_key(serve: Serve | None) -> tuple | None:
    """What a control step serves, to compare two: method, K, schedule, replicas."""
    if serve is None:
        return None
    schedule = tuple((r.from_batch_size, r.to_batch_size, r.num_speculative_tokens) for r in serve.schedule or ())
    return (serve.method.key if serve.method else None, serve.num_speculative_tokens, schedule, serve.replicas)


def replay_agreement(policy: OperatorPolicy) -> tuple[int, int]:
    """(steps whose serve a fresh planner reproduces, steps): each recorded step re-planned from its status
    as read back from the API server, as a restarted operator would, with the same observation."""
    same = 0
    for step in policy.steps:
        previous = PoolStatus.model_validate(step.previous)
        _, serve = policy.plan(previous, step.observation, step.current_replicas, step.rolling_out, step.now)
        same += serve_key(serve) == serve_key(step.serve)
    return same, len(policy.steps)


@dataclasses.dataclass
class AutoscalePolicy:
    """One engine mode; replicas from policy.replicas.plan_replicas with a given capacity per replica, fed as
    the operator's planner feeds it (running + waiting requests of the pool, scaled by TPOT(capacity) /
    TPOT(load now): policy.replicas.demand_at_capacity)."""

    name: str
    method: str | None
    mode: Mode
    capacity_per_replica: float | None
    start_replicas: int
    min_replicas: int
    max_replicas: int
    target_utilization_percent: float
    stabilization_s: float
    description: str = ""
    tpot_ms_at: Callable[[float], float] | None = None
    """TPOT of the mode at c requests per replica (policy.replicas.demand_at_capacity)."""
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
        # running + waiting summed over the pool, scaled to the capacity's TPOT, as the operator's planner does
        demand = demand_at_capacity(observation.running_per_replica * observation.serving_replicas
                                    + observation.waiting, max(observation.serving_replicas, 1), self.tpot_ms_at,
                                    self.capacity_per_replica)
        plan = plan_replicas(self.state, demand, self.current, self.capacity_per_replica,
                             self.target_utilization_percent, self.min_replicas, self.max_replicas,
                             self.stabilization_s, _EPOCH + timedelta(seconds=observation.t_s))
        self.state, self.current = plan.state, plan.replicas
        return Action(self.current, self.mode.name)


def build_policies(inputs: PlanningInputs, planning: PoolPlanning, record: bool = False) -> list:
    """The policies to compare, in the order the report lists them. `record=True` makes the operator
    policies keep their control steps (`OperatorPolicy.steps`)."""
    size = inputs.max_num_seqs
    n = inputs.replicas
    policies: list = [FixedPolicy("no-sd", None, Mode("no-sd", False, _constant(0, size)), n,
                                  "no speculation")]
    expected = planning.concurrency_histogram

    def operator(name: str, candidates: list[CandidateMethod], strategy: Strategy, autoscale: bool,
                 description: str, **names) -> OperatorPolicy:
        spec = deployment_spec(inputs, candidates, strategy, autoscale, expected)
        return OperatorPolicy(name, spec, planning.pool_profiles([c.key for c in candidates]),
                              SimulatedConnector(size, **names), n, description, record)

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
            candidate = next(c for c in planning.candidates if c.key == fixed.key)
            policies.append(operator(
                "restart-toggle", [candidate], Strategy.RESTART, False,
                f"{fixed.key} at k={restart_row.num_speculative_tokens}, rolled off above "
                f"{crossover if crossover is not None else 'never'} concurrent requests per replica",
                on_name="sd-on", off_name="sd-off"))
    chosen = planning.chosen
    summary = planning.dynamic.decision.schedule_summary or "no speculation"
    everyone = list(planning.candidates)
    policies.append(operator("specpilot", everyone, Strategy.DYNAMIC, False,
                             f"{chosen.key}: schedule {summary}", on_name="schedule"))
    capacity = planning.dynamic.capacity_concurrency_per_replica
    policies.append(operator("specpilot+autoscale", everyone, Strategy.DYNAMIC, True,
                             f"schedule {summary}; {_capacity_words(capacity)}", on_name="schedule"))
    base_row = planning.row(planning.dynamic, None)
    policies.append(AutoscalePolicy("no-sd+autoscale", None, Mode("no-sd", False, _constant(0, size)),
                                    base_row.capacity_concurrency, start_replicas=n, min_replicas=inputs.min_replicas,
                                    max_replicas=inputs.max_replicas,
                                    target_utilization_percent=inputs.target_utilization_percent,
                                    stabilization_s=inputs.scale_down_stabilization_s,
                                    description=f"no speculation; {_capacity_words(base_row.capacity_concurrency)}",
                                    tpot_ms_at=base_row.tpot_ms_at))
    return policies


def _capacity_words(capacity: float | None) -> str:
    if capacity is None or not math.isfinite(capacity) or capacity <= 0:
        return "no SLO-feasible capacity: runs the maximum replicas"
    return f"{capacity:g} requests per replica within the TPOT SLO"

