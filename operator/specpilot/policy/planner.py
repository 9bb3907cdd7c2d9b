"""The pool planner: one pool's next status, what to actuate and what to announce, from typed inputs.

Pure: no I/O, no clock, no process state. The operator's controller (`controller.reconcile`) gathers the
inputs (spec, the pool's previous status, its validated profiles, the latest observation, the Deployment's
replicas and rollout, now), calls `plan_pool`, and executes the result: it applies `serve` to the pool's
Deployment, re-measures `reprofile` when asked, and posts `events`. The fleet simulator
(`sim.policies.OperatorPolicy`) calls the same function with its own observations, so what `specpilot
simulate` reports is what the operator would do.

Everything the planner remembers between calls lives in the `PoolStatus` it returns (the decision and its
basis, the live-acceptance band, the restart toggle's clocks, the replica stabilisation window), so a
restarted operator or a new leader continues exactly where the last one stopped.

What it decides, in order:
1. Live acceptance (`live_acceptance`): the served method's first-position acceptance, observed, against
   its profile, with hysteresis. Past `profiling.reprofile.acceptanceDrift` the served method's profile is
   re-measured (`reprofile`), unless it is shared with other deployments (`PoolProfiles.shared`): then only
   this deployment's decision follows its own live acceptance, and the shared profile is left alone.
2. The decision (`policy.choose.decide_pool`), recomputed only when its basis (spec generation, profiles,
   live acceptance) changed or the observed load moved (`revisit_for_load`).
3. Whether the engine speculates: always under a schedule (the engine switches K itself); by the restart
   hysteresis (`policy.restart.step`) otherwise.
4. Replicas (`policy.replicas.plan_replicas`) with the decision's SLO-feasible capacity per replica.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from datetime import datetime

from pydantic import ValidationError

from .. import specdec
from ..api.deployment_spec import Autoscaling, GpuPool, Policy, SpeculativeDeploymentSpec, Strategy
from ..api.deployment_status import (
    MAX_TPOT_POINTS,
    Decision,
    ObservedLoad,
    PoolStatus,
    ProfileProgress,
    Refinement,
    RefinementJob,
    RefinementState,
    ReplicaTarget,
    TpotPoint,
)
from ..api.methods import CandidateMethod
from ..api.profile import SpeculationProfile
from ..observe.model import PoolObservation
from ..manifests.names import refine_job_name
from .choose import BASELINE_KEY, decide_pool
from .comparison import PoolPlan
from .events import Event
from .load_checks import revisit_for_load
from .refine import UNPROFILED_SOURCES, level_budget, refine_pool_plan
from .replicas import ReplicaState, demand_at_capacity, plan_replicas, replica_bounds
from .restart import Observation as RestartObservation
from .restart import RestartState
from .restart import step as restart_step
from .slo import pool_attainment

__all__ = [
    "LIVE_RESCHEDULE_DRIFT",
    "PoolInputs",
    "PoolOutcome",
    "PoolProfiles",
    "Reprofile",
    "Serve",
    "acceptance_drift",
    "basis",
    "live_acceptance",
    "observed_load",
    "plan_pool",
    "profiled_acceptance",
]

LIVE_RESCHEDULE_DRIFT = 0.10
"""Relative change of first-position acceptance, live against the profile, that recomputes the schedule."""

ProfileLike = SpeculationProfile | dict
"""A profile typed, or as stored (camelCase)."""
LiveAcceptance = dict[str, tuple[list[float], float]]
"""Method key -> (per-position acceptance, drafts per step) the decision uses instead of the profile's."""


@dataclasses.dataclass(frozen=True)
class PoolProfiles:
    """The pool's profiles on its GPU type, validated where they entered (only Succeeded ones)."""

    baseline: SpeculationProfile | None = None
    methods: dict[str, SpeculationProfile] = dataclasses.field(default_factory=dict)
    """Method key -> its profile."""
    ready: int = 0
    total: int = 0
    failed: int = 0
    names: tuple[str, ...] = ()
    """Every profile the pool needs (its status lists them)."""
    shared: frozenset[str] = frozenset()
    """Method keys whose profile other deployments use too: live evidence from this deployment's pods
    re-decides this deployment only and never re-measures those."""
    bodies: dict[str, dict] | None = None
    """Instead of `baseline` and `methods`: the profiles as stored ("baseline" and method keys -> object),
    validated only when a decision is made from them (most reconciliations keep the decision: what it
    rests on is read from the stored form, and validating every profile each time would cost more than
    the rest of the reconciliation)."""

    def unvalidated(self) -> tuple[ProfileLike | None, dict[str, ProfileLike]]:
        """(baseline, method key -> profile), stored or typed: enough for the basis and live acceptance."""
        if self.bodies is None:
            return self.baseline, dict(self.methods)
        return self.bodies.get("baseline"), {k: v for k, v in self.bodies.items() if k != "baseline"}

    def validated(self) -> tuple[SpeculationProfile | None, dict[str, SpeculationProfile]]:
        """(baseline, method key -> profile), validated once per PoolProfiles; a stored profile that does not
        validate is left out (it is then as if not measured)."""
        if self.bodies is None:
            return self.baseline, dict(self.methods)
        cached = self.__dict__.get("_validated")
        if cached is None:
            valid = {}
            for key, body in self.bodies.items():
                try:
                    valid[key] = SpeculationProfile.model_validate(body)
                except ValidationError:
                    continue
            cached = (valid.pop("baseline", None), valid)
            object.__setattr__(self, "_validated", cached)
        return cached


@dataclasses.dataclass(frozen=True)
class PoolInputs:
    spec: SpeculativeDeploymentSpec
    generation: int | None
    pool: GpuPool
    sku: str | None
    """The pool's GPU type (None: no node and no spec says which yet)."""
    gpu_products: tuple[str, ...]
    nodes: int
    previous: PoolStatus
    profiles: PoolProfiles
    observation: PoolObservation | None
    """A fresh observation of the pool's pods, or None (not due, not ready, or metrics missing)."""
    current_replicas: int | None
    """The Deployment's spec.replicas (None: no Deployment yet)."""
    rolling_out: bool
    """A rollout of the Deployment is in progress (or stalled): the restart toggle holds."""
    price_per_gpu_hour: float
    now: datetime
    refine_jobs: dict[str, str] = dataclasses.field(default_factory=dict)
    """The current refinement round's Jobs that exist: name -> "Active", "Complete" or "Failed"."""


@dataclasses.dataclass(frozen=True)
class Serve:
    """How the pool's engines run."""

    method: CandidateMethod | None
    num_speculative_tokens: int | None
    schedule: list | None
    """The per-batch-size schedule, when the engine switches K itself."""
    replicas: int | None
    """Replicas to write; None when an external autoscaler owns them."""


@dataclasses.dataclass(frozen=True)
class Reprofile:
    """Re-measure the served method's profile: live acceptance drifted past the spec's bound."""

    method: str
    drift: float


@dataclasses.dataclass
class PoolOutcome:
    status: PoolStatus
    """The pool's next status (the executor adds the rollout state once it applied `serve`)."""
    serve: Serve | None
    """None: nothing to serve yet (no GPU type)."""
    reprofile: Reprofile | None = None
    events: list[Event] = dataclasses.field(default_factory=list)
    toggled: str | None = None
    """"on"/"off" when the restart toggle switched speculation in this call."""
    refine: list[RefinementJob] = dataclasses.field(default_factory=list)
    """Refinement Jobs to create (the current round's that do not exist yet)."""


def profiled_acceptance(profile: ProfileLike | None) -> tuple[list[float], float] | None:
    """(per-position acceptance, drafts per step) of the profile's largest-K run, or None."""
    if isinstance(profile, dict):
        runs = [r for r in ((profile.get("status") or {}).get("runs") or [])
                if r.get("numSpeculativeTokens") and ((r.get("acceptance") or {}).get("perPosition"))]
        if not runs:
            return None
        top = max(runs, key=lambda r: r["numSpeculativeTokens"])["acceptance"]
        return [float(p) for p in top["perPosition"]], float(top.get("draftsPerStep") or 1.0)
    runs = [r for r in ((profile.status.runs if profile and profile.status else None) or [])
            if r.num_speculative_tokens and r.acceptance and r.acceptance.per_position]
    if not runs:
        return None
    top = max(runs, key=lambda r: r.num_speculative_tokens)
    return list(top.acceptance.per_position), float(top.acceptance.drafts_per_step or 1.0)


def _fingerprint(profile: ProfileLike) -> str:
    """name@completion#points of a profile, the same for its typed and stored forms."""
    if isinstance(profile, dict):
        status = profile.get("status") or {}
        completed = status.get("completedAt")
        try:
            completed = datetime.fromisoformat(str(completed).replace("Z", "+00:00")).isoformat() if completed \
                else ""
        except ValueError:
            completed = str(completed)
        points = sum(len(run.get("points") or []) for run in status.get("runs") or [])
        return f"{(profile.get('metadata') or {}).get('name', '')}@{completed}#{points}"
    completed = profile.status.completed_at if profile.status else None
    points = sum(len(run.points) for run in (profile.status.runs if profile.status else []))
    return f"{profile.metadata.get('name', '')}@{completed.isoformat() if completed else ''}#{points}"


def _name(profile: ProfileLike, default: str) -> str:
    meta = profile.get("metadata") if isinstance(profile, dict) else profile.metadata
    return (meta or {}).get("name") or default


def acceptance_drift(pool: PoolStatus, methods: dict[str, ProfileLike]) -> float | None:
    """|live - profiled| / profiled acceptance at the first draft position of the served method, or None.

    Only position 0 compares like with like: under a schedule the engine drafts fewer tokens at higher
    batch sizes, so later positions and the mean acceptance length mix in steps that never drafted them."""
    decision, observed = pool.decision, pool.observed
    if decision is None or not decision.method or not pool.speculation_enabled:
        return None
    profiled = profiled_acceptance(methods.get(decision.method))
    if observed is None or not observed.acceptance_per_position or profiled is None:
        return None
    return abs(observed.acceptance_per_position[0] - profiled[0][0]) / max(profiled[0][0], 1e-9)


def live_acceptance(pool: PoolStatus, methods: dict[str, ProfileLike]) -> LiveAcceptance | None:
    """The acceptance the decision should use instead of the profile's, with hysteresis so that noise and
    the decision's own effect (speculation off: nothing observed) never flip it back and forth:
    - live first-position acceptance more than 10% off the profile, and more than 10% off what the current
      decision already used: the profile's per-position curve scaled to the live level;
    - back within 5% of the profile: none (the profile again);
    - otherwise (no fresh data, or in between): whatever the current decision used."""
    decision = pool.decision
    kept = None
    if decision is not None and decision.live_method and decision.live_acceptance_per_position:
        kept = {decision.live_method: (list(decision.live_acceptance_per_position),
                                       decision.live_drafts_per_step or 1.0)}
    drift = acceptance_drift(pool, methods)
    if drift is None:
        return kept
    if drift < LIVE_RESCHEDULE_DRIFT / 2:
        return None
    if drift < LIVE_RESCHEDULE_DRIFT:
        return kept
    live_first = pool.observed.acceptance_per_position[0]
    if kept and decision.method in kept:
        kept_first = kept[decision.method][0][0]
        if abs(live_first - kept_first) / max(kept_first, 1e-9) < LIVE_RESCHEDULE_DRIFT:
            return kept
    per_position, drafts_per_step = profiled_acceptance(methods[decision.method])
    scale = live_first / max(per_position[0], 1e-9)
    return {decision.method: ([min(1.0, p * scale) for p in per_position], drafts_per_step)}


def basis(generation: int | None, baseline: ProfileLike | None, methods: dict[str, ProfileLike],
          live: LiveAcceptance | None) -> str:
    """A short hash of what a decision rests on: the spec generation, each profile's name, completion time
    and measured points (a refinement round appends some), and the live acceptance (rounded, so noise does
    not change it)."""
    parts = [f"g{generation}"]
    for key, profile in [("baseline", baseline)] * (baseline is not None) + sorted(methods.items(),
                                                                                     key=lambda kv: kv[0]):
        parts.append(f"{key}:{_fingerprint(profile)}")
    for key, (per_position, drafts_per_step) in sorted((live or {}).items()):
        length = specdec.tokens_per_step(per_position, drafts_per_step, len(per_position))
        parts.append(f"live:{key}:{round(length * 10) / 10:.1f}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:12]


def observed_load(observation: PoolObservation, policy: Policy) -> ObservedLoad:
    """What the status shows of an observation (with its SLO attainment against `policy`)."""
    return ObservedLoad(
        concurrency=round(max(observation.running_per_replica, 0.0), 3),
        waiting=round(max(observation.waiting_per_replica, 0.0), 3),
        generation_tokens_per_second=_round(observation.generation_tokens_per_second),
        requests_in_flight=round(max(observation.total_running + observation.total_waiting, 0.0), 3),
        tpot_p95_ms=_round(observation.tpot_p95_ms),
        acceptance_per_position=[round(p, 4) for p in observation.acceptance_per_position],
        mean_acceptance_length=_round(observation.mean_acceptance_length),
        drafts_per_step=_round(observation.drafts_per_step),
        slo=pool_attainment(observation, policy),
        observed_at=observation.observed_at)


def plan_pool(inputs: PoolInputs) -> PoolOutcome:
    """The pool's next status, how to serve it, and what to announce."""
    old, profiles = inputs.previous, inputs.profiles
    status = PoolStatus(
        name=inputs.pool.name, sku=inputs.sku, gpu_products=list(inputs.gpu_products), nodes=inputs.nodes,
        profiles=ProfileProgress(ready=profiles.ready, total=profiles.total, failed=profiles.failed,
                                 names=list(profiles.names)),
        speculation_enabled=old.speculation_enabled, last_toggle_at=old.last_toggle_at,
        above_threshold_since=old.above_threshold_since, below_threshold_since=old.below_threshold_since,
        observed=old.observed, replicas=old.replicas,
        desired_replicas=old.desired_replicas, decision=old.decision,
        capacity_concurrency_per_replica=old.capacity_concurrency_per_replica,
        replica_targets=list(old.replica_targets))
    outcome = PoolOutcome(status=status, serve=None)
    if inputs.sku is None:
        return outcome
    if inputs.observation is not None:
        status.observed = observed_load(inputs.observation, inputs.spec.policy)

    _, methods = profiles.unvalidated()
    drift = acceptance_drift(status, methods)
    if drift is not None and drift > inputs.spec.profiling.reprofile.acceptance_drift:
        served = status.decision.method
        if served in profiles.shared:
            words = (f"pool {status.name}: live acceptance of {served} is {drift:.0%} off its profile; the "
                     f"profile is shared with other deployments, so only this deployment follows its live "
                     f"acceptance (annotate specpilot.io/reprofile to re-measure it for everyone)")
            if not (old.decision and old.decision.live_method == served):
                outcome.events.append(Event("Warning", "AcceptanceDrift", words))
        else:
            outcome.reprofile = Reprofile(served, drift)
            methods.pop(served, None)  # measured again: the decision does without it meanwhile
            outcome.events.append(Event(
                "Warning", "AcceptanceDrift", f"pool {status.name}: live acceptance of {served} is {drift:.0%} "
                f"off its profile: re-profiling {_name(profiles.unvalidated()[1][served], served)}"))

    decision, capacity, pool_plan = _decide(inputs, status, methods)
    status.decision = decision
    if capacity is not None or decision is not old.decision:
        status.capacity_concurrency_per_replica = capacity
    _refine(inputs, status, pool_plan, methods, outcome)

    enabled = _speculation_state(inputs, status, outcome)
    replicas = _replicas(inputs, status)
    spec = inputs.spec
    candidate = next((m for m in spec.methods if m.key == decision.method), None) if enabled else None
    dynamic = decision.strategy == Strategy.DYNAMIC.value and bool(decision.schedule)
    outcome.serve = Serve(method=candidate,
                          num_speculative_tokens=decision.num_speculative_tokens if candidate else None,
                          schedule=list(decision.schedule) if candidate and dynamic else None,
                          replicas=replicas)
    status.speculation_enabled = candidate is not None
    status.replicas = replicas if replicas is not None else int(inputs.current_replicas or 0)
    return outcome


def _decide(inputs: PoolInputs, old: PoolStatus,
            methods: dict[str, ProfileLike]) -> tuple[Decision, float | None, PoolPlan | None]:
    """Recompute the pool's decision only when what it rests on changed: the spec, the profiles, live
    acceptance that drifted from the profile, or the observed load (first seen, or moved a factor of 2 after
    the cooldown). A change of method or schedule means a rollout."""
    spec, profiles, now = inputs.spec, inputs.profiles, inputs.now
    live = live_acceptance(old, methods)
    baseline = profiles.unvalidated()[0]
    key = basis(inputs.generation, baseline, methods, live)
    histogram = inputs.observation.concurrency_histogram if inputs.observation else None
    if old.decision is not None and old.decision.basis == key and not revisit_for_load(
            old.decision, histogram, now, spec.policy.hysteresis.cooldown_seconds):
        return old.decision, None, None
    typed_baseline, typed_methods = profiles.validated()
    typed_methods = {k: v for k, v in typed_methods.items() if k in methods}
    if baseline is None or typed_baseline is None or not typed_methods:
        decision = _waiting_decision(spec, profiles.ready, profiles.total, now)
        decision.basis = key
        return decision, None, None
    plan = decide_pool(
        policy=spec.policy, candidates=list(spec.methods), baseline=typed_baseline, profiles=typed_methods,
        price_per_gpu_hour=inputs.price_per_gpu_hour,
        gpus_per_replica=spec.model.tensor_parallel_size * spec.model.data_parallel_size,
        concurrency_histogram=histogram, live_acceptance=live,
        # A change of method rolls the pods: the one served now stays unless another beats it by the margin.
        incumbent=old.decision.method if old.decision is not None else None,
        engine_supports_dynamic=spec.model.data_parallel_size == 1, now=now,
        fleet_placed=fleet_placed(spec))
    chosen = next((r for r in plan.candidates if r.key == (plan.decision.method or BASELINE_KEY)), None)
    update: dict = {"basis": key, "tpot_curve": tpot_curve(chosen.tpot_ms_at if chosen else None,
                                                          plan.capacity_concurrency_per_replica)}
    for method, (per_position, drafts_per_step) in (live or {}).items():
        update.update(live_method=method, live_acceptance_per_position=per_position,
                      live_drafts_per_step=drafts_per_step)
    return plan.decision.model_copy(update=update), plan.capacity_concurrency_per_replica, plan


def _refine(inputs: PoolInputs, status: PoolStatus, plan: PoolPlan | None, methods: dict[str, ProfileLike],
            outcome: PoolOutcome) -> None:
    """Adaptive refinement (policy.refine): after a decision from profiles, measure at the batch sizes of its
    uncertain changes of k, a round of Jobs at a time, and decide again, until none is uncertain beyond the
    minimum gain or profiling.refineBudgetPercent is spent. A round's Jobs append to the profiles; the round
    ends when all of them completed and their points reached the decision (its basis counts them)."""
    spec, old = inputs.spec, inputs.previous.refinement
    percent = spec.profiling.refine_budget_percent
    if percent == 0 or status.decision is None or status.decision.source in UNPROFILED_SOURCES \
            or inputs.profiles.unvalidated()[0] is None:
        status.refinement = None
        return
    status.refinement = old
    if old is not None and old.state == RefinementState.MEASURING:
        states = [inputs.refine_jobs.get(job.job_name) for job in old.jobs]
        failed = [job.job_name for job, state in zip(old.jobs, states, strict=True) if state == "Failed"]
        if failed:
            status.refinement = old.model_copy(update={
                "state": RefinementState.FAILED, "jobs": [],
                "message": f"refinement Job(s) {', '.join(failed)} failed (see `kubectl logs job/{failed[0]}`); "
                           f"the decision stands on what was measured; annotate specpilot.io/reprofile to "
                           f"measure again"})
            outcome.events.append(Event("Warning", "RefinementFailed",
                                               f"pool {status.name}: {status.refinement.message}"))
            return
        if plan is None or not all(state == "Complete" for state in states):
            outcome.refine = [job for job, state in zip(old.jobs, states, strict=True) if state is None]
            return
    if plan is None:
        return  # the decision stands on the same profiles: so does what refinement found
    typed_baseline, typed_methods = inputs.profiles.validated()
    typed_methods = {k: v for k, v in typed_methods.items() if k in methods}
    budget = level_budget([typed_baseline, *typed_methods.values()], percent / 100)
    found = refine_pool_plan(plan, spec.policy, typed_baseline, typed_methods, budget_levels=budget)
    rounds = old.round if old is not None else 0
    if found.done:
        state = RefinementState.BUDGET_SPENT if found.uncertain else RefinementState.SETTLED
        status.refinement = Refinement(round=rounds, state=state, message=found.reason, budget_levels=budget,
                                       spent_levels=found.spent_levels)
        if state == RefinementState.BUDGET_SPENT:
            status.decision = status.decision.model_copy(update={
                "reason": f"{status.decision.reason}; still uncertain after the refinement budget: {found.reason}"})
        if old is not None and old.state != state:
            outcome.events.append(Event("Normal", "RefinementDone",
                                               f"pool {status.name}: after {rounds} round(s): {found.reason}"))
        return
    rounds += 1
    jobs = [RefinementJob(profile=job.profile_name, job_name=refine_job_name(job.profile_name, rounds, job.part),
                          part=job.part, ks=list(job.ks), levels=list(job.levels), repeat=job.repeat)
            for job in found.jobs() if job.profile_name][:16]
    status.refinement = Refinement(round=rounds, state=RefinementState.MEASURING, message=found.reason,
                                   budget_levels=budget, spent_levels=found.spent_levels, jobs=jobs)
    outcome.refine = list(jobs)
    outcome.events.append(Event(
        "Normal", "Refining", f"pool {status.name}: round {rounds}: measuring "
        + "; ".join(f"{j.profile} k={','.join(map(str, j.ks))} at {','.join(map(str, j.levels))} x{j.repeat}"
                    for j in jobs) + f" ({found.reason})"))


def fleet_placed(spec: SpeculativeDeploymentSpec) -> bool:
    """Whether the deployment's pools are placed by the fleet planner (policy.placement): two or more pools
    and replicas not fixed. Its pools then weigh speculation by what it does to the fleet's cost per token
    (policy.load_checks.fleet_capacity_check)."""
    return len(spec.gpu_pools) >= 2 and spec.serving.autoscaling != Autoscaling.NONE.value


def _waiting_decision(spec: SpeculativeDeploymentSpec, ready: int, total: int, now: datetime) -> Decision:
    reason = f"waiting for profiles ({ready}/{total} ready): serving without speculation"
    if spec.profiling.speculate_before_profiled:
        first = spec.methods[0]
        return Decision(method=first.key, num_speculative_tokens=first.num_speculative_tokens,
                        strategy=Strategy.RESTART, source="prior", decided_at=now,
                        reason=f"waiting for profiles ({ready}/{total} ready): speculating with {first.key} at "
                               f"K={first.num_speculative_tokens} (profiling.speculateBeforeProfiled)")
    return Decision(method=None, source="none", reason=reason, decided_at=now)


def _speculation_state(inputs: PoolInputs, pool: PoolStatus, outcome: PoolOutcome) -> bool:
    """Whether the engine runs with speculation: always under a schedule (it switches K itself), by the
    hysteresis state machine under the restart strategy. Updates the toggle clocks in `pool`."""
    decision, old = pool.decision, inputs.previous
    if decision is None or not decision.method:
        return False
    if decision.strategy != Strategy.RESTART.value or decision.crossover_concurrency is None:
        return True
    if old.decision is not None and old.decision.method == decision.method:
        enabled = old.speculation_enabled
    else:
        # A new method starts on unless the load already seen is past the crossover.
        seen_load = old.observed.concurrency if old.observed else None
        enabled = seen_load is None or seen_load < decision.crossover_concurrency
    state = RestartState(speculation_enabled=enabled, last_toggle_at=old.last_toggle_at,
                         above_since=old.above_threshold_since, below_since=old.below_threshold_since)
    observation = inputs.observation
    seen = RestartObservation(max(observation.running_per_replica + observation.waiting_per_replica, 0.0),
                              observation.observed_at) if observation else None
    step = restart_step(state, seen, decision.crossover_concurrency, inputs.spec.policy.hysteresis,
                        inputs.rolling_out)
    pool.last_toggle_at = step.state.last_toggle_at
    pool.above_threshold_since = step.state.above_since
    pool.below_threshold_since = step.state.below_since
    if step.state.speculation_enabled != state.speculation_enabled:
        outcome.toggled = "on" if step.state.speculation_enabled else "off"
        outcome.events.append(Event("Normal", "SpeculationToggled",
                                           f"pool {pool.name}: speculation {outcome.toggled}: {step.reason}"))
    return step.state.speculation_enabled


def _replicas(inputs: PoolInputs, pool: PoolStatus) -> int | None:
    """Replicas to write: None in external mode (HPA/KEDA owns spec.replicas; the status only publishes)."""
    spec = inputs.spec
    lo, hi = replica_bounds(spec, inputs.pool)
    now_replicas = inputs.current_replicas if inputs.current_replicas is not None else lo
    external = spec.serving.autoscaling == Autoscaling.EXTERNAL.value
    if spec.serving.autoscaling == Autoscaling.NONE.value:
        pool.desired_replicas = lo
        pool.replica_targets = []
        return lo
    if not pool.capacity_concurrency_per_replica:
        pool.desired_replicas = max(lo, min(hi, now_replicas))
        return None if external else pool.desired_replicas
    observation = inputs.observation
    demand = None
    if observation is not None:
        # Requests last longer on a fuller replica: the demand the capacity is measured against.
        demand = demand_at_capacity(
            max(observation.total_running + observation.total_waiting, 0.0),
            max(observation.replicas_reporting, 1), _curve_function(pool.decision),
            pool.capacity_concurrency_per_replica)
    result = plan_replicas(
        ReplicaState(tuple((t.time, t.replicas) for t in pool.replica_targets)), demand_concurrency=demand,
        current_replicas=now_replicas, capacity_per_replica=pool.capacity_concurrency_per_replica,
        target_utilization_percent=spec.serving.target_utilization_percent, min_replicas=lo, max_replicas=hi,
        stabilization_seconds=spec.serving.scale_down_stabilization_seconds, now=inputs.now)
    pool.replica_targets = [ReplicaTarget(time=t, replicas=r) for t, r in result.state.recent]
    pool.desired_replicas = result.replicas
    return None if external else result.replicas


def tpot_curve(tpot_ms_at, capacity: float | None) -> list[TpotPoint]:
    """The option's TPOT at 1, 2, 4, ... requests per replica, through the first power of two at or past
    its capacity (what the status keeps of the profiles' TPOT surface)."""
    if tpot_ms_at is None or not capacity:
        return []
    points, c = [], 1
    while len(points) < MAX_TPOT_POINTS:
        ms = float(tpot_ms_at(float(c)))
        if not math.isfinite(ms) or ms < 0:
            break
        points.append(TpotPoint(concurrency=c, ms=round(ms, 4)))
        if c >= capacity:
            break
        c *= 2
    return points


def _curve_function(decision: Decision | None):
    """TPOT at any concurrency from the decision's curve: linear in log2(concurrency) between its points."""
    points = [(math.log2(max(p.concurrency, 1.0)), p.ms) for p in (decision.tpot_curve if decision else [])]
    if len(points) < 2:
        return None

    def at(c: float) -> float:
        x = math.log2(max(c, 1.0))
        if x >= points[-1][0]:
            (x0, y0), (x1, y1) = points[-2], points[-1]
        else:
            i = next(i for i, (px, _) in enumerate(points) if px >= x)
            (x0, y0), (x1, y1) = points[max(i - 1, 0)], points[max(i, 1)]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 > x0 else y0

    return at


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
