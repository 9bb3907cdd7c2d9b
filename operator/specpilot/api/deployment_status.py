"""The `SpeculativeDeployment` status: what specpilot measured, decided and observed, per pool and for the fleet."""

from __future__ import annotations

from datetime import datetime
from enum import Enum

from pydantic import Field

from .base import Condition, Name, ShortText, StatusModel, Text
from .deployment_spec import Strategy
from .schedule import ScheduleRange


class Phase(str, Enum):
    PENDING = "Pending"
    PROFILING = "Profiling"
    SERVING = "Serving"
    DEGRADED = "Degraded"
    FAILED = "Failed"


class ProfileProgress(StatusModel):
    """Profiles of one pool."""

    ready: int = 0
    """Succeeded profiles (baseline and methods)."""
    total: int = 0
    """Profiles needed."""
    failed: int = 0
    """Profiles that failed after retries."""
    names: list[Name] = Field(default_factory=list, max_length=1024)
    """SpeculationProfile names used by this pool."""


class TpotPoint(StatusModel):
    """TPOT of the decided option at one concurrency per replica (from the profiles)."""

    concurrency: float = Field(ge=0)
    """Concurrent requests per replica."""
    ms: float = Field(ge=0)
    """Time per output token, milliseconds."""


MAX_TPOT_POINTS = 16
"""Points of a decision's TPOT curve (powers of two from 1)."""


class Decision(StatusModel):
    """What a pool serves and why."""

    method: str | None = Field(default=None, max_length=64)
    """Chosen candidate's name, or none for no speculation."""
    num_speculative_tokens: int = 0
    """K the engine is started with (the schedule's maximum)."""
    schedule: list[ScheduleRange] = Field(default_factory=list, max_length=4096)
    """Per-batch-size K (empty: none; SD off or the restart strategy)."""
    schedule_summary: Text = ""
    """The schedule in short form, e.g. 1-16:5,17-64:3,65+:0."""
    strategy: Strategy = Strategy.DYNAMIC
    """dynamic (schedule in the engine) or restart (toggle by rollout)."""
    crossover_concurrency: float | None = None
    """Concurrency above which speculation stops paying for this method on this pool."""
    crossover_uncertainty_percent: float | None = None
    """One standard error of the predicted gain of speculation at the crossover, in percent: how precisely
    the profile places the crossover. Above policy.minGainPercent the crossover may be a profiled level or
    more off; more profiling.requestsPerLevel narrows it (four times the requests halve it)."""
    cost_per_mtok_with_sd: float | None = None
    """Predicted dollars per million output tokens with the decision, at the expected load."""
    cost_per_mtok_without_sd: float | None = None
    """Predicted dollars per million output tokens without speculation, at the expected load."""
    expected_speedup: float | None = None
    """Predicted goodput gain over no speculation at the expected load (1.0 = none)."""
    source: str = Field(default="profile", max_length=64)
    """What the decision rests on: profile, live-acceptance, prior, none."""
    reason: Text = ""
    """Why, in words."""
    decided_at: datetime | None = None
    """When it was made."""
    basis: ShortText = ""
    """Fingerprint of what the decision rests on (spec generation, profiles, live acceptance); the decision
    is recomputed, and the pods rolled, only when it changes."""
    live_method: str | None = Field(default=None, max_length=64)
    """When the decision used live acceptance instead of the profile's: for which candidate."""
    live_acceptance_per_position: list[float] = Field(default_factory=list, max_length=64)
    """The live per-position acceptance it used; kept so that turning speculation off (and so observing
    no acceptance) does not flip the decision back to the profile's numbers."""
    live_drafts_per_step: float | None = None
    """The live drafts per step it used."""
    tpot_curve: list[TpotPoint] = Field(default_factory=list, max_length=MAX_TPOT_POINTS)
    """TPOT of the decided option at 1, 2, 4, ... concurrent requests per replica, up to its capacity: the
    replica planner scales observed demand by TPOT(capacity) / TPOT(load now), since requests take longer
    on a fuller replica (Little's law)."""
    load_concurrency: float | None = None
    """Per-replica concurrency (weighted median) of the observed load the decision weighed; none when it
    weighed the expected load or the profiled levels. The method is revisited when the observed load moves
    a factor of 2 from it (at most once per policy.hysteresis.cooldownSeconds), and changed only when
    another option beats the served one by policy.minGainPercent."""


class SloAttainment(StatusModel):
    """The share of requests that met the SLOs over the metrics window, from vLLM's per-request TPOT and TTFT
    histograms. Each figure is exact when the SLO is a bucket bound of vLLM's histogram and interpolated within
    the bucket that holds it otherwise (the `*Bucket` fields name that bucket). The histograms are separate, so
    the share meeting both is known only within bounds: at least tpot + ttft - 100, at most the lower of the two."""

    requests: float | None = None
    """Requests finished in the window (the TPOT histogram's count)."""
    tpot_percent: float | None = None
    """Requests whose time per output token was within policy.tpotSloMs (None: no TPOT SLO)."""
    tpot_bucket: ShortText = ""
    """vLLM's TPOT bucket the figure rests on, e.g. `0.01-0.025 s`."""
    ttft_percent: float | None = None
    """Requests whose time to first token was within policy.ttftSloMs (None: no TTFT SLO)."""
    ttft_bucket: ShortText = ""
    """vLLM's TTFT bucket the figure rests on."""
    both_at_least_percent: float | None = None
    """Requests within both SLOs, at least (the lower bound)."""
    both_at_most_percent: float | None = None
    """Requests within both SLOs, at most (the upper bound)."""
    target_percent: float | None = None
    """policy.sloAttainmentPercent, for the deployment-level figure."""


class ObservedLoad(StatusModel):
    """Load of a pool over the metrics window."""

    concurrency: float | None = None
    """Mean running requests per replica."""
    waiting: float | None = None
    """Mean waiting requests per replica."""
    generation_tokens_per_second: float | None = None
    """Output tokens per second over all replicas."""
    requests_in_flight: float | None = None
    """Running plus waiting requests summed over the replicas reporting (what the fleet placement counts)."""
    tpot_p95_ms: float | None = None
    """p95 time per output token."""
    acceptance_per_position: list[float] = Field(default_factory=list, max_length=64)
    """Live accepted-per-position rates (accepted at j / drafts)."""
    mean_acceptance_length: float | None = None
    """1 + accepted tokens per draft."""
    drafts_per_step: float | None = None
    """Share of request-steps that carried a draft (below 1 for n-gram)."""
    slo: SloAttainment | None = None
    """The pool's share of requests within the SLOs over the window (None: no SLO stated, or no request
    finished)."""
    observed_at: datetime | None = None
    """When the data was read."""


class ReplicaTarget(StatusModel):
    """One replica target the planner computed, kept while it can still hold a scale-down."""

    time: datetime
    """When it was computed."""
    replicas: int = Field(ge=0)
    """The replicas the load asked for then."""


MAX_REPLICA_TARGETS = 64
MAX_FLEET_CHANGES = 32
MAX_LEAD_TIMES = 5
MAX_DEMAND_SAMPLES = 64


class DemandSample(StatusModel):
    """The deployment's observed demand at one time (the largest in its bucket of the history)."""

    time: datetime
    """When it was observed."""
    tokens_per_second: float = Field(ge=0)
    """Output tokens per second arriving."""
"""Bound on the remembered replica targets (the window keeps only targets no later one covers)."""


class RefinementJob(StatusModel):
    """One refinement Job of a round: a profile's runs at some k, measured at some levels (the batch sizes of
    uncertain changes of k, between the sweep's levels or on them) `repeat` times each."""

    profile: str = Field(max_length=253)
    """The SpeculationProfile it appends to."""
    job_name: str = Field(max_length=253)
    """The Job's name."""
    part: int | None = Field(default=None, ge=1)
    """Which of the profile's Jobs in this round (when it has several)."""
    ks: list[int] = Field(default_factory=list, max_length=17)
    """The k values (runs) it measures."""
    levels: list[int] = Field(default_factory=list, max_length=32)
    """The concurrency levels it measures (appended to the runs; a level the profile's spec does not list counts
    as refinement's, not the sweep's)."""
    repeat: int = Field(default=1, ge=1)
    """Times each level is measured."""


class RefinementState(str, Enum):
    MEASURING = "Measuring"
    SETTLED = "Settled"
    BUDGET_SPENT = "BudgetSpent"
    FAILED = "Failed"


class Refinement(StatusModel):
    """Adaptive refinement of the pool's profiles near the decision's uncertain changes of k."""

    round: int = Field(default=0, ge=0)
    """Rounds started so far: one per first sweep of the profiles (refinement is one round)."""
    state: RefinementState = RefinementState.SETTLED
    """Measuring (a round's Jobs run), Settled (no change of k is uncertain beyond policy.minGainPercent),
    BudgetSpent (some still are, and profiling.refineBudgetPercent is spent), or Failed (a Job failed; the
    decision stands on what was measured)."""
    message: Text = ""
    """What is uncertain and what the round measures, or why refinement stopped."""
    budget_levels: int = Field(default=0, ge=0)
    """Measured levels refinement may spend."""
    spent_levels: int = Field(default=0, ge=0)
    """Measured levels spent so far (repeats beyond the first measurement of a level)."""
    jobs: list[RefinementJob] = Field(default_factory=list, max_length=16)
    """The current round's Jobs."""


class PoolStatus(StatusModel):
    """Everything specpilot knows about one pool."""

    name: str = Field(max_length=253)
    """Pool name."""
    sku: str | None = Field(default=None, max_length=253)
    """GPU type in use (from the spec or the nodes)."""
    gpu_products: list[Name] = Field(default_factory=list, max_length=64)
    """`nvidia.com/gpu.product` values of the pool's nodes."""
    nodes: int = 0
    """Matching nodes."""
    profiles: ProfileProgress = Field(default_factory=ProfileProgress)
    """Profiling progress."""
    decision: Decision | None = None
    """Current decision."""
    speculation_enabled: bool = False
    """Whether the running engine speculates (restart strategy: the toggle state)."""
    replicas: int = 0
    """Replicas of the pool's Deployment."""
    rollout: str | None = Field(default=None, max_length=64)
    """The pool Deployment's rollout: RolledOut, RollingOut, or Stalled (no progress within
    spec.serving.rollout.progressDeadlineSeconds)."""
    desired_replicas: int | None = None
    """Replicas the SD-aware planner wants."""
    capacity_concurrency_per_replica: float | None = None
    """Concurrency a replica can take within the SLO under the decision."""
    observed: ObservedLoad | None = None
    """Observed load."""
    last_toggle_at: datetime | None = None
    """Restart strategy: the last time speculation was switched."""
    above_threshold_since: datetime | None = None
    """Restart strategy: since when load has stayed above crossover*(1+band) (the dwell clock)."""
    below_threshold_since: datetime | None = None
    """Restart strategy: since when load has stayed below crossover*(1-band) (the dwell clock)."""
    refinement: Refinement | None = None
    """Adaptive refinement of the pool's profiles (profiling.refineBudgetPercent)."""
    replica_targets: list[ReplicaTarget] = Field(default_factory=list, max_length=MAX_REPLICA_TARGETS)
    """The replica targets of the scale-down stabilisation window that can still hold a scale-down
    (oldest first, each higher than every later one): kept in status so a restarted operator holds them."""
    traffic_share: float | None = Field(default=None, ge=0, le=1)
    """Fleet placement (two or more pools): the fraction of the deployment's traffic planned for this pool."""
    fleet_target_replicas: int | None = Field(default=None, ge=0)
    """Fleet placement: the replicas the fleet's cheapest placement asks of this pool (`replicas` follows it up
    at once and down after the stabilisation window)."""
    load_tokens_per_second: float | None = None
    """Fleet placement: output tokens per second this pool's share of the demand comes to."""
    cost_per_mtok: float | None = None
    """Fleet placement: dollars per million output tokens of this pool at the load it gets."""
    full: bool | None = None
    """Fleet placement: every replica the pool's GPUs (allocatable on its nodes) or maxReplicas allow runs."""
    fleet_reason: Text = ""
    """Fleet placement: why this pool got its replicas and share, in words."""
    fleet_targets: list[ReplicaTarget] = Field(default_factory=list, max_length=MAX_REPLICA_TARGETS)
    """Fleet placement: the scale-down stabilisation window of the fleet's targets for this pool."""
    fleet_tpot_scale: float | None = Field(default=None, ge=0)
    """Fleet placement: the pool's observed p95 TPOT over its curve's TPOT at the concurrency it ran at (smoothed,
    0.8-4): the curve the fleet planner sizes the pool by is scaled by it (1: the replicas run as profiled)."""
    fleet_changes: list[datetime] = Field(default_factory=list, max_length=MAX_FLEET_CHANGES)
    """Fleet placement: when this pool's replicas changed within the last hour, oldest first (a scale-down waits
    while it would leave no room under the bound on changes per hour for a scale-up)."""
    scale_up_started_at: datetime | None = None
    """When the operator asked for more replicas than were ready, while they are not all ready yet (the start
    of the scale-up lead time being measured)."""
    scale_up_to: int | None = Field(default=None, ge=0)
    """The replicas that scale-up asked for: it is measured once this many are ready."""
    scale_up_lead_times: list[float] = Field(default_factory=list, max_length=MAX_LEAD_TIMES)
    """The pool's last scale-up lead times in seconds (asked -> every replica ready), oldest first: the fleet
    planner forecasts demand over the longest (status.fleet.leadTimeSeconds)."""


class FleetStatus(StatusModel):
    """Fleet placement of a deployment with two or more pools (policy.fleet)."""

    routing: str = Field(default="service", max_length=16)
    """How traffic is split as planned: service (one Service, an even split per pod), gateway or inferencePool
    (an HTTPRoute whose weights are the shares)."""
    http_route: str | None = Field(default=None, max_length=253)
    """The HTTPRoute whose backendRefs weights carry the shares (gateway or inferencePool routing in effect)."""
    demand_tokens_per_second: float | None = None
    """The deployment's observed demand in output tokens per second (served plus backlog)."""
    forecast_tokens_per_second: float | None = None
    """The demand the replicas are sized for: the highest expected within the lead time, forecast from the demand
    history (its swings within a lead time at the policy.sloAttainmentPercent quantile, up to its peak or its
    trend), never below the observed demand."""
    headroom_percent: float | None = None
    """How far the forecast lies above the observed demand, in percent (the headroom taken for the lead time)."""
    lead_time_seconds: float | None = None
    """The scale-up lead time the forecast looks ahead (the longest of the pools': pod created -> ready)."""
    demand_history: list[DemandSample] = Field(default_factory=list, max_length=MAX_DEMAND_SAMPLES)
    """The observed demand over the history window (oldest first, the largest per bucket): what the forecast
    reads, kept in status so a restarted operator forecasts the same."""
    cost_per_mtok: float | None = None
    """The fleet's dollars per million output tokens at that demand (every replica of every pool paid)."""
    slo_feasible: bool | None = None
    """False: the demand exceeds what every allowed replica holds within the SLO."""
    reason: Text = ""
    """The placement in words."""
    planned_at: datetime | None = None
    """When the placement was computed."""
    shares_moved_at: datetime | None = None
    """When a pool's share last moved by two percentage points or more (a FleetSharesMoved Event)."""


class RoutingStatus(StatusModel):
    """How the deployment's traffic is routed now (spec.serving.routing, as it could be made real), why, and what
    weighted routing saves against the one Service."""

    mode: str = Field(default="service", max_length=16)
    """The routing in effect: service (the one Service), gateway (an HTTPRoute over one Service per pool) or
    inferencePool (an HTTPRoute over one InferencePool per pool); the cheapest the cluster allows when the one
    asked for cannot run (condition RoutingReady=False)."""
    requested: str = Field(default="auto", max_length=16)
    """spec.serving.routing as asked (auto: the cheapest the cluster allows)."""
    reason: Text = ""
    """Why this mode: what the cluster serves and what the spec and the operator's config name."""
    http_route: str | None = Field(default=None, max_length=253)
    """The HTTPRoute the operator applied (gateway or inferencePool in effect)."""
    weights: dict[str, int] = Field(default_factory=dict, max_length=64)
    """The HTTPRoute's backendRefs weight per pool (out of 1000)."""
    inference_pools: dict[str, str] = Field(default_factory=dict, max_length=64)
    """Pool -> the InferencePool the operator applied for it (inferencePool in effect): the name an endpoint picker
    is deployed for (its Service `<name>-epp` unless spec.serving.inferencePool.endpointPickerRef names one)."""
    service_cost_per_mtok: float | None = None
    """The fleet's planned dollars per million output tokens under the one Service (an even split per pod), at the
    observed demand (two or more pools with load)."""
    weighted_cost_per_mtok: float | None = None
    """The same under weighted routing (gateway or inferencePool: any split)."""
    saving_percent: float | None = None
    """How much less weighted routing pays than the one Service, in percent of the latter."""


class HistoryEntry(StatusModel):
    """A change of decision."""

    time: datetime
    """When."""
    pool: str = Field(max_length=253)
    """Which pool."""
    change: Text
    """What changed, e.g. `eagle3 1-16:4,17+:0 -> ngram 1-8:3,9+:0`."""
    reason: Text = ""
    """Why."""


class SpeculativeDeploymentStatus(StatusModel):
    """Observed state of a SpeculativeDeployment."""

    phase: Phase = Phase.PENDING
    """Pending, Profiling, Serving, Degraded or Failed."""
    progress: ShortText = ""
    """Short progress, e.g. `profiles 5/8`."""
    observed_generation: int | None = None
    """The .metadata.generation last acted on."""
    conditions: list[Condition] = Field(default_factory=list, max_length=32)
    """Valid, Profiled, Serving, RolledOut, MetricsAvailable, MetricsTruncated, NodesAvailable, SloAttained (the
    share of requests within the SLOs against policy.sloAttainmentPercent), FleetCapacity (two or more pools: whether
    every allowed replica together holds the observed demand within the SLO), RoutingReady (the
    routing chosen and made real, or why the one asked for cannot run and the fix), and Reconciled (the
    last reconciliation ran to its end and its status was written; False names the cause and the fix while the
    operator retries with back-off)."""
    pools: list[PoolStatus] = Field(default_factory=list, max_length=64)
    """Per pool: profiles, decision, replicas, load."""
    decision_summary: Text = ""
    """All pools in one line, e.g. `h100=eagle3[1-16:4,17+:0] h200=ngram[1-32:3,33+:0]`."""
    observed_concurrency: float | None = None
    """Mean concurrency per replica over all pools."""
    cost_per_mtok: float | None = None
    """With two or more pools: the fleet's dollars per million output tokens under its placement (fleet.costPerMtok)
    once the pools are profiled and load is observed; otherwise the lowest of the pools'
    decision.costPerMtokWithSd: predicted dollars per million output tokens of the cheapest pool under its
    decision, at its expected load."""
    fleet: FleetStatus | None = None
    """Fleet placement across the pools (two or more pools)."""
    slo_attainment: SloAttainment | None = None
    """The deployment's share of requests within the SLOs over the metrics window, its pools' requests together,
    against policy.sloAttainmentPercent (condition SloAttained)."""
    routing: RoutingStatus | None = None
    """The routing in effect (spec.serving.routing), why, its HTTPRoute, weights and InferencePools, and what
    weighted routing saves."""
    history: list[HistoryEntry] = Field(default_factory=list, max_length=64)
    """The last decision changes (bounded)."""


HISTORY_LIMIT = 20
