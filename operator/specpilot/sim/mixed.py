"""Mixed fleets: several GPU pools (A100, H100, H200, ...) sharing one load, placed by each policy and served
request by request.

Each pool is profiled synthetically and decided by the operator's own pool planner
(`sim.policies.profile_and_decide_pool`: method and speculation schedule per GPU type), which gives its curve:
TPOT per replica at each concurrency
under the decided schedule, and the SLO-feasible concurrency. Every control interval each placement policy
sees the deployment's demand as the operator does (arrival rate over the observation window x mean output
tokens, and the requests in flight of its own fleet from a fluid model of it, `FluidFleet`; the planner's
`demand_tokens_per_second` of both) and sets the replicas per pool and the share of arrivals each pool gets
(specpilot's planners forecast the demand over the lead time from their history, as in the operator):

- `even-split`: today's operator: one Service (an even split per pod) and every pool scaled alone by
  policy.replicas on the load that split gives it (its SLO-feasible capacity under its schedule; the fixed
  point of the pools' autoscalers, `policy.fleet.even_split_replicas`, each pool starting at one replica),
  engines speculating as each pool's decision says;
- `cost-optimal-no-sd`: an SD-unaware cost optimiser (AIBrix-style): the fleet planner with free weights
  on profiles without speculation, engines without speculation, as such an optimiser deploys them;
- `specpilot-service`: the operator's decision under the one-Service constraint, engines on their schedules;
- `specpilot`: the operator's decision with gateway routing (HTTPRoute weights), engines on their schedules;
- `oracle`: the same decision told the true demand within the lead time (the peak arrival rate per control
  interval between now and when the next decision's replicas serve; the lead time is the replica start-up)
  instead of forecasting it, so its replicas serve when the load arrives: the cost reference no forecaster can
  beat by much;

specpilot's three are `policy.plan.plan_deployment` itself, run at every tick on a virtual cluster of the fleet
(`sim.placements.OperatorPlacement`); the even splits and the SD-unaware optimiser are references built from the
policy's parts (`sim.placements.EvenSplit`, `NoSdOptimiser`);
- `even-split-hpa`: the even split with each pool's autoscaler target utilisation tuned (bisection,
  `tune_even_split`) until the fleet reaches specpilot's SLO attainment: what today's routing costs at the
  same service.

Arrivals are Poisson; routing by weights or by even per-pod choice thins them into independent Poisson
streams per pool with rate share x rate, so each pool is served by the request-level simulator
(`sim.fleet.fleet_run`, all pools in step) with its own stream and the planned replicas (started with the startup delay,
drained on scale-down). A request log is routed request by request instead (`_LiveLog`: each request a
pool drawn by the shares at its arrival, the same draw under every placement). Shares follow the replicas
serving (a planned replica serves `startup_s` after it was asked for), as a Service's endpoints and the
planner's ready-replica weights do. The fleet's figures add the pools': $/Mtok = dollars / tokens, SLO
attainment (TTFT, TPOT, both) over all arrived requests, GPU-hours.

A pool may join mid-trace (`MixedPool.joins_at_s`, the `join` scenario): the operator's profiling planner
runs its profiling Jobs on the twin's time (`sim.joining`), it takes no replicas until its profiles are
Ready, and its Jobs' GPU time (refinement included) is added to every placement's cost and GPU-hours.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from ..perf import DEFAULT_CATALOG
from ..perf.cost import tokens_per_second
from ..policy.fleet import (
    CurvePoint,
    FleetDemand,
    FleetPool,
    FleetSettings,
    FleetState,
    ReplicaCurve,
    Routing,
    history_from,
)
from .connector import EPOCH
from .fleet import (
    DEFAULT_SLO_TTFT_MS,
    Action,
    ArrivalChunks,
    FleetConfig,
    FleetSetup,
    Mode,
    Observation,
    SimResult,
    fleet_run,
)
from .joining import Joining, plan_joining, with_refinement
from .placements import EvenSplit, NoSdOptimiser, OperatorPlacement, PoolReading, fleet_spec
from .policies import Candidate, PlanningInputs, PoolPlanning, profile_and_decide_pool
from .requestlog import RATE_BIN_S, RequestLog
from .traces import LoadTrace, parse_trace
from .workloads import request_lengths

__all__ = [
    "PLACEMENTS",
    "SCENARIOS",
    "MixedComparison",
    "MixedPool",
    "MixedScenario",
    "PlacementResult",
    "PreparedPool",
    "HpaTuning",
    "compare",
    "place",
    "prepare",
    "tune_even_split",
]

PLACEMENTS = ("even-split", "even-split-hpa", "cost-optimal-no-sd", "specpilot-service", "specpilot", "oracle")
PLACEMENT_WORDS = {
    "even-split": "today: one Service (even per-pod split), each pool autoscaled alone on its share, with SD",
    "even-split-hpa": "the even split, its autoscalers' target utilisation tuned to reach specpilot's SLO "
                      "attainment",
    "cost-optimal-no-sd": "cost-optimal placement on profiles without SD (free weights), served without SD",
    "specpilot-service": "specpilot fleet planner, one Service (even per-pod split), with SD schedules",
    "specpilot": "specpilot fleet planner, gateway routing (HTTPRoute weights), with SD schedules",
    "oracle": "specpilot's planner told the true demand within one start-up (clairvoyant): the cost reference",
}
DEFAULT_MODEL = "meta-llama/Llama-3.1-8B-Instruct"
ATTAINMENT_TOLERANCE_POINTS = 0.1
"""SLO attainments within this many percentage points count as equal."""
SHIPPED_LOG = "data/request-log.csv"
"""The request log the `log` scenario replays, in the specpilot package (scripts/make_request_log.py)."""


@dataclasses.dataclass(frozen=True)
class MixedPool:
    name: str
    sku: str
    gpus: int
    """GPUs the pool's nodes have for this deployment (bounds its replicas)."""
    min_replicas: int = 0
    price_per_gpu_hour: float | None = None
    """USD per GPU-hour; the catalog's on-demand price when unset."""
    joins_at_s: float | None = None
    """The pool's nodes appear this many seconds into the trace (None: there from the start): the profiling
    planner profiles it then (`sim.joining`), and it serves once its profiles are Ready."""


@dataclasses.dataclass(frozen=True)
class MixedScenario:
    name: str
    description: str
    pools: tuple[MixedPool, ...]
    trace: str
    slo_tpot_ms: float
    workload: str = "sharegpt"
    model_id: str = DEFAULT_MODEL
    methods: str = "ngram:4,eagle3:4"
    tensor_parallel_size: int = 1
    profiling_time_scale: float = 1.0
    """A joining pool's Jobs take their time on the twin times this (--fast shrinks them with the trace)."""
    slo_ttft_ms: float = DEFAULT_SLO_TTFT_MS
    trace_scale: float = 1.0
    """A request log's time is compressed by this (`--trace-scale`)."""
    duration_s: float | None = None
    """Simulated time (None: the trace's own)."""
    thin_log: int = 1
    """A request log keeps every n-th request (--fast: a quarter of the load, the same bursts)."""
    warm: bool = True
    """The planners start with the demand history the deployment's metrics hold from before the trace (the
    trace continued backwards, `prior_history`), as the operator seeds its history from Prometheus; False (
    `--cold-start`): a deployment that has never served, no history."""

    def load_trace(self) -> LoadTrace:
        """The scenario's trace; `data/...` names a log shipped in the specpilot package unless such a file
        exists where the command runs."""
        text = self.trace
        if text == SHIPPED_LOG and not Path(text).exists():
            text = str(Path(__file__).resolve().parents[1] / SHIPPED_LOG)
        trace = parse_trace(text, scale=self.trace_scale)
        if isinstance(trace, RequestLog) and self.thin_log > 1:
            trace = trace.thinned(self.thin_log)
        return trace.with_duration(self.duration_s) if self.duration_s else trace

    def fast(self) -> MixedScenario:
        """The same fleet and shape at a quarter of the load and GPUs, over a quarter-hour (a request log: every
        fourth request, at its own times): for tests (a pool joins at the same point of the day, and its
        profiling shrinks with the day)."""
        kind, *numbers = self.trace.split(":")
        pools = tuple(dataclasses.replace(p, gpus=max(1, p.gpus // 4)) for p in self.pools)
        if self.trace.lower().endswith(".csv"):
            return dataclasses.replace(self, pools=pools, thin_log=self.thin_log * 4)
        if kind == "bursts":
            base, peak, *rest = (float(n) for n in numbers)
            every, length = (rest + [600.0, 60.0][len(rest):])[:2]
            return dataclasses.replace(self, pools=pools, duration_s=(self.duration_s or 3600.0) / 4,
                                       trace=f"bursts:{base / 4:g}:{peak / 4:g}:{every / 4:g}:{length / 4:g}")
        if kind != "diurnal":
            raise ValueError(f"scenario {self.name}: --fast needs a diurnal or bursts trace or a request log "
                             f"(got {self.trace})")
        peak, trough = float(numbers[0]) / 4, float(numbers[1]) / 4
        squeeze = 0.25 / float(numbers[2]) if len(numbers) > 2 else 1.0
        pools = tuple(dataclasses.replace(p, joins_at_s=p.joins_at_s * squeeze if p.joins_at_s is not None else None)
                      for p in pools)
        return dataclasses.replace(self, pools=pools, trace=f"diurnal:{peak:g}:{trough:g}:0.25",
                                   profiling_time_scale=self.profiling_time_scale * squeeze)


_DAY = "a day's diurnal load compressed into 3 hours"
SCENARIOS: dict[str, MixedScenario] = {s.name: s for s in (
    MixedScenario(
        "default", f"Llama-3.1-8B, ShareGPT, {_DAY} (40-320 req/s), TPOT SLO 15 ms, catalog prices, "
                   "8 A100 (one kept), 8 H100 and 8 H200 GPUs",
        (MixedPool("a100", "A100-80GB-SXM", 8, 1), MixedPool("h100", "H100-SXM", 8),
         MixedPool("h200", "H200", 8)),
        "diurnal:320:40:3", 15.0),
    MixedScenario(
        "owned-a100", "the default fleet with owned A100s at $1.00/GPU-h and a 12 ms TPOT SLO: without "
                      "speculation an A100 holds 7 requests within it, with EAGLE-3 45, so speculation moves "
                      "the overflow past the H100s from the H200s to the A100s",
        (MixedPool("a100", "A100-80GB-SXM", 16, 1, 1.0), MixedPool("h100", "H100-SXM", 4),
         MixedPool("h200", "H200", 8)),
        "diurnal:240:40:3", 12.0),
    MixedScenario(
        "loose-slo", f"the default fleet under a 30 ms TPOT SLO (speculation gains little at capacity), {_DAY}",
        (MixedPool("a100", "A100-80GB-SXM", 8, 1), MixedPool("h100", "H100-SXM", 8),
         MixedPool("h200", "H200", 8)),
        "diurnal:400:40:3", 30.0),
    MixedScenario(
        "code", f"HumanEval-like code traffic (high acceptance), TPOT SLO 15 ms, {_DAY}",
        (MixedPool("a100", "A100-80GB-SXM", 8, 1), MixedPool("h100", "H100-SXM", 8),
         MixedPool("h200", "H200", 8)),
        "diurnal:320:40:3", 15.0, workload="humaneval"),
    MixedScenario(
        "join", f"the default fleet, but the H200 pool's nodes appear 1 h into {_DAY} (before the peak at "
                "1.5 h): the profiling planner profiles the new GPU type (baseline, ngram, EAGLE-3, one Job at "
                "a time on the twin) and the pool serves once its profiles are Ready",
        (MixedPool("a100", "A100-80GB-SXM", 8, 1), MixedPool("h100", "H100-SXM", 8),
         MixedPool("h200", "H200", 8, joins_at_s=3600.0)),
        "diurnal:320:40:3", 15.0),
    MixedScenario(
        "bursty", "the default fleet under bursts: 100 req/s with 120 s at 300 req/s every 10 minutes, an hour "
                  "(ShareGPT, TPOT SLO 15 ms)",
        (MixedPool("a100", "A100-80GB-SXM", 8, 1), MixedPool("h100", "H100-SXM", 8),
         MixedPool("h200", "H200", 8)),
        "bursts:100:300:600:120", 15.0, duration_s=3600.0),
    MixedScenario(
        "log", "the default fleet replaying a request log (6,000 long chat requests over 19 minutes, bursty at "
               "the 10 s scale; scripts/make_request_log.py), TPOT SLO 15 ms",
        (MixedPool("a100", "A100-80GB-SXM", 8, 1), MixedPool("h100", "H100-SXM", 8),
         MixedPool("h200", "H200", 8)),
        SHIPPED_LOG, 15.0),
)}


@dataclasses.dataclass
class PreparedPool:
    """A pool with its decision: the curves the planners see and the engine mode it serves with."""

    spec: MixedPool
    setup: FleetSetup
    planning: PoolPlanning
    sd_mode: Mode
    sd_method: str | None
    sd_pool: FleetPool
    """As the fleet planner sees it under its decided schedule."""
    plain_pool: FleetPool
    """As an SD-unaware optimiser sees it: the baseline's curve."""
    max_replicas: int
    joining: Joining | None = None
    """A pool that joins mid-trace: when it joined, when it serves, the Jobs it ran (None: there throughout)."""

    def serving_at(self, t_s: float) -> bool:
        return self.joining is None or t_s >= self.joining.serving_at_s


def _curve(tpot_ms_at: Callable[[float], float] | None, max_num_seqs: int) -> tuple[CurvePoint, ...]:
    if tpot_ms_at is None:
        return ()
    points, c = [], 1
    while c <= max_num_seqs:
        ms = float(tpot_ms_at(float(c)))
        if math.isfinite(ms) and ms > 0:
            points.append(CurvePoint(float(c), ms))
        c *= 2
    return tuple(points)


def prepare(scenario: MixedScenario, trace: LoadTrace, config: FleetConfig, seed: int = 0) -> list[PreparedPool]:
    """Profile and decide every pool as the operator would: first on the load the trace would give half its
    replicas, then again on the per-replica concurrency the fleet placement gives it (the operator re-decides
    a pool on the load it observes, and under fleet placement a pool runs near its capacity). A pool that joins
    mid-trace is profiled from when it joins (`sim.joining`): it serves once its profiles are Ready, and the
    refinement its decision asks for is charged after."""
    first = _prepare(scenario, trace, config, seed, {})
    output_tokens = _mean_output_tokens(trace, first)
    timeline = place("specpilot", first, trace, output_tokens, config, scenario)
    histograms = {}
    for pool in first:
        name = pool.spec.name
        seen: dict[int, float] = {}
        for i, replicas in enumerate(timeline.replicas[name]):
            if replicas < 1 or timeline.shares[name][i] <= 0:
                continue
            tokens = float(trace.rate_rps(np.array([timeline.times_s[i]]))[0]) * output_tokens
            per_replica = tokens * timeline.shares[name][i] / replicas
            level = _concurrency_at(pool.sd_pool, per_replica, config.max_num_seqs)
            seen[level] = seen.get(level, 0.0) + 1.0
        if seen:
            total = sum(seen.values())
            histograms[name] = sorted((float(c), w / total) for c, w in seen.items())
    prepared = _prepare(scenario, trace, config, seed, histograms)
    for pool in prepared:
        if pool.joining is not None:
            pool.joining = with_refinement(pool.joining, pool.planning, pool.setup, scenario.slo_tpot_ms,
                                           scenario.profiling_time_scale)
    return prepared


def _mean_output_tokens(trace: LoadTrace, prepared: Sequence[PreparedPool]) -> float:
    """Output tokens per request the planners multiply the arrival rate by: the log's own, else the workload's."""
    if isinstance(trace, RequestLog) and trace.requests:
        return trace.mean_output_tokens
    return float(prepared[0].setup.lengths.mean_output_tokens)


def arrival_rate_rps(trace: LoadTrace, t0_s: float, t1_s: float) -> float:
    """The mean arrival rate over [t0_s, t1_s]: what the observation window shows at t1_s (a request log's
    arrivals counted; a rate trace's rate averaged)."""
    t0_s = max(t0_s, 0.0)
    if isinstance(trace, RequestLog):
        if t1_s - t0_s < RATE_BIN_S:  # nothing observed yet: the first bin's rate
            return float(trace.rate_rps(np.array([t0_s]))[0])
        return trace.arrivals_between(t0_s, t1_s) / (t1_s - t0_s)
    grid = np.linspace(t0_s, t1_s, 16) if t1_s > 0 else np.array([0.0])
    return float(trace.rate_rps(grid).mean())


def _concurrency_at(view: FleetPool, wanted: float, max_num_seqs: int) -> int:
    """The per-replica concurrency at which the pool's curve delivers `wanted` tokens/s (Little's law)."""
    for point in view.curve:
        if tokens_per_second(point.concurrency, point.tpot_ms) >= wanted:
            return int(max(1, round(point.concurrency)))
    return max_num_seqs


def _prepare(scenario: MixedScenario, trace: LoadTrace, config: FleetConfig, seed: int,
             histograms: dict[str, list[tuple[float, float]]]) -> list[PreparedPool]:
    candidates = tuple(Candidate.parse(text) for text in scenario.methods.split(","))
    prepared = []
    tp = scenario.tensor_parallel_size
    # a request log's pools are profiled on its own lengths (a custom workload of the logged prompts)
    logged = trace.lengths(request_lengths(scenario.workload)) if isinstance(trace, RequestLog) else None
    for i, pool in enumerate(scenario.pools):
        DEFAULT_CATALOG.resolve(pool.sku)
        hi = pool.gpus // tp
        if hi < 1:
            raise ValueError(f"pool {pool.name}: {pool.gpus} GPUs hold no replica of {tp} GPUs")
        setup = FleetSetup(scenario.model_id, pool.sku, scenario.workload, tp, pool.price_per_gpu_hour, logged)
        inputs = PlanningInputs(setup, candidates, replicas=max(1, hi // 2), min_replicas=1, max_replicas=hi,
                                slo_tpot_ms=scenario.slo_tpot_ms, max_num_seqs=config.max_num_seqs,
                                seed=seed + 17 * i, fleet_placed=True)
        planning = profile_and_decide_pool(inputs, trace, histograms.get(pool.name))
        chosen, base = planning.chosen, planning.row(planning.dynamic, None)
        if planning.dynamic.decision.method and chosen.schedule is not None:
            ks = tuple(chosen.schedule.k_by_batch_size) or (0,)
            ks = (ks + (ks[-1],) * config.max_num_seqs)[:config.max_num_seqs]
            mode, method = Mode("schedule", True, ks, method=chosen.method), chosen.method
        else:
            mode, method = Mode("no-sd", False, (0,) * config.max_num_seqs), None
        price = setup.gpu_price_per_hour

        def view(row, pool=pool, price=price, hi=hi) -> FleetPool:
            return FleetPool(pool.name, price, tp, min(pool.min_replicas, hi), hi,
                             _curve(row.tpot_ms_at, config.max_num_seqs), row.capacity_concurrency,
                             gpus_available=pool.gpus)

        joining = None if pool.joins_at_s is None else plan_joining(
            pool.name, pool.sku, setup, candidates, pool.joins_at_s, trace.duration_s, scenario.profiling_time_scale)
        prepared.append(PreparedPool(pool, setup, planning, mode, method, view(chosen), view(base), hi, joining))
    return prepared


@dataclasses.dataclass
class Timeline:
    """What a placement policy decided at each control tick: replicas and shares per pool."""

    times_s: np.ndarray
    replicas: dict[str, np.ndarray]
    shares: dict[str, np.ndarray]
    cost_per_mtok_planned: np.ndarray
    reasons: list[str]
    duration_s: float = 0.0

    def replica_changes_per_hour(self) -> dict[str, float]:
        """Per pool, how often its planned replicas changed, per hour of the trace (churn: each change starts
        or drains a pod)."""
        hours = max(self.duration_s, 1e-9) / 3600.0
        return {n: float(np.count_nonzero(np.diff(r))) / hours for n, r in self.replicas.items()}


class FluidFleet:
    """Requests in flight per pool on a fluid model of the placed fleet: what the operator's `requests in flight`
    shows (running + waiting), so the planner gets the same demand signal in the simulator as in a cluster.

    Each control interval a pool gets its share of the arriving tokens and serves, on the replicas that serve,
    up to what they deliver at their admission limit (the curve at the decision's concurrency); the rest waits
    (a backlog in tokens, drained first). Running requests are the concurrency at which the serving replicas
    deliver what they serve (Little's law on the curve); waiting ones the backlog over the mean output length."""

    def __init__(self, views: Sequence[FleetPool], output_tokens: float) -> None:
        self.views = {v.name: v for v in views}
        self.curves = {v.name: ReplicaCurve(v.curve) for v in views if v.curve}
        self.output_tokens = max(output_tokens, 1.0)
        self.backlog = {v.name: 0.0 for v in views}
        self.running = {v.name: 0.0 for v in views}

    def use(self, views: Sequence[FleetPool]) -> None:
        """The pools' curves as their decisions now hold them."""
        self.views = {v.name: v for v in views}
        self.curves = {v.name: ReplicaCurve(v.curve) for v in views if v.curve}

    def requests_in_flight(self) -> float:
        return sum(self.running.values()) + sum(self.backlog.values()) / self.output_tokens

    def advance(self, tokens_per_second: float, shares: dict[str, float], serving: dict[str, int],
                seconds: float) -> None:
        for name, view in self.views.items():
            arriving = max(tokens_per_second, 0.0) * shares.get(name, 0.0)
            curve, ready = self.curves.get(name), serving.get(name, 0)
            if curve is None or ready <= 0:
                self.backlog[name] += arriving * seconds
                self.running[name] = 0.0
                continue
            limit = view.max_concurrency if view.max_concurrency and view.max_concurrency > 0 else curve.last
            most = ready * curve.tokens_per_second(limit)
            served = min(arriving + self.backlog[name] / seconds, most)
            self.backlog[name] = max(self.backlog[name] + (arriving - served) * seconds, 0.0)
            self.running[name] = ready * curve.concurrency_for(served / ready, limit) if served > 0 else 0.0


def prior_history(trace: LoadTrace, output_tokens: float, settings: FleetSettings, window_s: float,
                  step_s: float) -> tuple[tuple[datetime, float], ...]:
    """The demand history the deployment's metrics hold at the trace's start, as the operator reads it from
    Prometheus on its first placement: the trace continued backwards (periodic: the day before was this day,
    a log's traffic went on as logged) over the planner's `history_seconds`, observed every `step_s` over
    `window_s` as at every tick after."""
    period = trace.duration_s
    samples = []
    for t in np.arange(-settings.history_seconds, 0.0, step_s):
        grid = np.mod(np.linspace(t - window_s, t, 16), period)
        samples.append((EPOCH + timedelta(seconds=float(t)), float(trace.rate_rps(grid).mean()) * output_tokens))
    return history_from(samples, settings)


def true_peak_rps(trace: LoadTrace, t0_s: float, t1_s: float, step_s: float) -> float:
    """The highest arrival rate over [t0_s, t1_s] in `step_s` bins: what a clairvoyant planner is told."""
    edges = np.arange(t0_s, t1_s + step_s / 2, step_s)
    return max((arrival_rate_rps(trace, a, a + step_s) for a in edges), default=0.0)


def place(placement: str, prepared: Sequence[PreparedPool], trace: LoadTrace, output_tokens: float,
          config: FleetConfig, scenario: MixedScenario, utilization_percent: float | None = None) -> Timeline:
    """Run one placement policy over the trace open loop: the requests in flight come from a fluid model of the
    placed fleet (`FluidFleet`), not from serving it (`run_placement` serves it in the loop). Every placement sees
    the observed demand (the arrival rate over the observation window x the mean output length) and the requests
    in flight, the planners' `demand_tokens_per_second` of both; specpilot's planners forecast from their history
    over the lead time (the replica start-up), the oracle is told the true peak within it instead.
    `utilization_percent`: the even splits' autoscaler target (None: the planner's default)."""
    timeline, _ = _drive(placement, prepared, trace, output_tokens, config, scenario, utilization_percent)
    return timeline


def run_placement(placement: str, prepared: Sequence[PreparedPool], trace: LoadTrace, output_tokens: float,
                  config: FleetConfig, scenario: MixedScenario, utilization_percent: float | None = None,
                  seed: int = 0) -> PlacementResult:
    """One placement policy closed loop, as the operator runs: every pool served request by request in step
    (`sim.fleet.fleet_run`), and at every control tick the placement sees what the operator's metrics show (the
    arrival rate over the observation window x the mean output length, and the pools' running + waiting requests
    over the window), plans, and its replicas and shares act on the next tick's arrivals."""
    timeline, runs = _drive(placement, prepared, trace, output_tokens, config, scenario, utilization_percent,
                            seed=seed, closed=True)
    joinings = [p.joining for p in prepared if p.joining is not None]
    return PlacementResult(placement, timeline, runs, sum(j.cost_usd for j in joinings),
                           sum(j.gpu_hours for j in joinings))


def _pool_in_flight(observation: Observation | None) -> float | None:
    """Running + waiting requests of one pool over the window, as its vLLM metrics show them."""
    if observation is None:
        return None
    return observation.running_per_replica * observation.serving_replicas + observation.waiting


def _observed(observation: Observation | None, output_tokens: float) -> dict[str, float | None]:
    """What a pool's metrics show the fleet planner: its requests in flight, its running requests per serving
    replica and its requests' p95 TPOT over the window."""
    if observation is None:
        return {}
    serving = observation.serving_replicas
    return {"requests_in_flight": _pool_in_flight(observation),
            "observed_concurrency": observation.running_per_replica if serving else None,
            "observed_tpot_p95_ms": observation.tpot_p95_ms}


class _LiveLog:
    """A request log routed request by request as the closed loop decides the shares: each request to the pool its
    draw (the same under every placement: it depends on the seed only) picks by the shares of its arrival's control
    tick."""

    def __init__(self, log: RequestLog, names: Sequence[str], tick_s: float, ticks: int, seed: int) -> None:
        self.log, self.names, self.tick_s = log, list(names), tick_s
        self.u = np.random.default_rng(seed).random(log.requests)
        self.tick = np.clip((log.arrival_s // tick_s).astype(np.int64), 0, ticks - 1)
        self.table = np.zeros((ticks, len(self.names)))

    def pool_of(self, index: np.ndarray) -> np.ndarray:
        rows = self.table[self.tick[index]]
        total = rows.sum(axis=1, keepdims=True)
        rows = np.where(total > 0, rows / np.where(total > 0, total, 1.0), 0.0)
        rows[total[:, 0] <= 0, 0] = 1.0  # no share anywhere: the first pool takes it
        cumulative = np.cumsum(rows, axis=1)
        return np.minimum((self.u[index][:, None] >= cumulative).sum(axis=1), len(self.names) - 1)


class _LiveLogArrivals:
    """One pool's requests of a `_LiveLog`, slice by slice (each draws its acceptance factor, as a log's do)."""

    def __init__(self, live: _LiveLog, column: int, lengths, rng: np.random.Generator, dt: float) -> None:
        log = live.log
        self.live, self.column = live, column
        output = np.maximum(np.asarray(log.output_tokens, dtype=float), 2.0)
        prompt = np.asarray(log.input_tokens, dtype=float)
        sigma = lengths.acceptance_sigma
        factor = rng.lognormal(-sigma**2 / 2, sigma, log.requests)
        self.columns = (np.asarray(log.arrival_s, dtype=float), prompt + output, output, factor)
        n_slices = int(math.ceil(log.duration_s / dt)) + 1
        self.bounds = np.searchsorted(log.arrival_s, np.arange(n_slices + 1) * dt, side="left")

    def slice(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        i = min(i, self.bounds.size - 2)
        index = np.arange(self.bounds[i], self.bounds[i + 1])
        index = index[self.live.pool_of(index) == self.column] if index.size else index
        return tuple(c[index] for c in self.columns)  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True, eq=False)
class _LiveRoutedTrace(LoadTrace):
    """The deployment's arrivals thinned by a pool's share as the closed loop decides it, tick by tick."""

    base: LoadTrace | None = None
    tick_s: float = 15.0
    table: np.ndarray | None = None
    column: int = 0
    live_log: _LiveLog | None = None

    def rate_rps(self, t_s: np.ndarray) -> np.ndarray:
        t = np.asarray(t_s, dtype=float)
        table = self.live_log.table if self.live_log is not None else self.table
        index = np.clip((t // self.tick_s).astype(int), 0, len(table) - 1)
        return self.base.rate_rps(t) * table[index, self.column]

    def arrivals(self, lengths, rng: np.random.Generator, dt: float):
        if self.live_log is not None:
            return _LiveLogArrivals(self.live_log, self.column, lengths, rng, dt)
        ratio = self.tick_s / dt
        chunk = int(round(ratio)) if abs(ratio - round(ratio)) < 1e-9 and ratio >= 1 else 1
        return ArrivalChunks(self, lengths, rng, dt, chunk=chunk)

    def describe(self) -> str:
        return f"{self.base.describe()}, routed share"


@dataclasses.dataclass
class _LivePool:
    """A pool's engines in the closed loop: the driver sends its replicas and mode; `modes` grows as the placement
    asks for engine configurations it had not asked for before."""

    name: str
    method: str | None
    modes: dict[str, Mode]
    first_mode: str
    first: int = 0

    def start(self) -> Action:
        return Action(self.first, self.first_mode)

    def control(self, observation: Observation) -> Action:  # the driver acts instead
        raise RuntimeError("a closed-loop pool is driven by its placement")


def _operator_placement(prepared: Sequence[PreparedPool], scenario: MixedScenario, routing: Routing,
                        config: FleetConfig) -> OperatorPlacement:
    """specpilot's placement of the scenario: the operator's decision on a virtual cluster of its pools, with the
    profiles each pool's decision was prepared from."""
    keys = [tuple(c.key for c in p.planning.candidates) for p in prepared]
    if len(set(keys)) > 1:
        raise ValueError(f"scenario {scenario.name}: the pools' candidates differ ({keys})")
    spec = fleet_spec(
        [{"name": p.spec.name, "price": p.setup.gpu_price_per_hour, "min": min(p.spec.min_replicas, p.max_replicas),
          "max": p.max_replicas} for p in prepared],
        scenario.model_id, scenario.tensor_parallel_size, [c.dump() for c in prepared[0].planning.candidates],
        routing, scenario.slo_tpot_ms, scenario.slo_ttft_ms)
    profiles = {p.spec.name: {"baseline": p.planning.baseline.dump(),
                              **{k: v.dump() for k, v in p.planning.profiles.items()}} for p in prepared}
    return OperatorPlacement(spec, {p.spec.name: p.setup.sku for p in prepared},
                             {p.spec.name: p.spec.gpus for p in prepared}, profiles, config.max_num_seqs,
                             config.observation_window_s)


def _fluid_readings(fluid: FluidFleet, tokens_per_second: float, shares: dict[str, float],
                    ready: dict[str, int]) -> dict[str, PoolReading]:
    """What each pool's metrics show on the fluid model: its share of the demand, its running and waiting requests."""
    readings = {}
    for n, serving in ready.items():
        running = fluid.running[n]
        readings[n] = PoolReading(tokens_per_second * shares.get(n, 0.0), running,
                                  fluid.backlog[n] / fluid.output_tokens, serving,
                                  concurrency_histogram=((running / serving, 1.0),) if serving else ())
    return readings


def _observed_readings(observed: dict[str, Observation], output_tokens: float) -> dict[str, PoolReading]:
    """What each pool's metrics show of its request-level run over the window."""
    return {n: PoolReading(o.arrival_rate_rps * output_tokens, o.running_per_replica * o.serving_replicas,
                           o.waiting, o.serving_replicas, o.rollout_in_progress, o.concurrency_histogram,
                           o.tpot_p95_ms) for n, o in observed.items()}


def _drive(placement: str, prepared: Sequence[PreparedPool], trace: LoadTrace, output_tokens: float,
           config: FleetConfig, scenario: MixedScenario, utilization_percent: float | None = None, seed: int = 0,
           closed: bool = False) -> tuple[Timeline, dict[str, SimResult | None]]:
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; use one of {', '.join(PLACEMENTS)}")
    dt, window = config.control_interval_s, config.observation_window_s
    times = np.arange(0.0, trace.duration_s, dt)
    even = placement in ("even-split", "even-split-hpa")
    routing = Routing.SERVICE if even or placement == "specpilot-service" else Routing.GATEWAY
    settings = FleetSettings(routing=routing, tpot_slo_ms=scenario.slo_tpot_ms, ttft_slo_ms=scenario.slo_ttft_ms)
    if utilization_percent is not None:
        settings = dataclasses.replace(settings, target_utilization_percent=utilization_percent)
    oracle = placement == "oracle"
    plain = placement == "cost-optimal-no-sd"
    views = [dataclasses.replace(p.plain_pool if plain else p.sd_pool, lead_time_seconds=config.startup_s)
             for p in prepared]
    names = [v.name for v in views]
    fixed_modes = {p.spec.name: Mode("no-sd", False, (0,) * config.max_num_seqs) if plain else p.sd_mode
                   for p in prepared}
    # the demand history the deployment's metrics hold from before the trace (even splits keep none)
    history = prior_history(trace, output_tokens, settings, window, dt) if scenario.warm and not even else ()
    operator = None if even or plain else _operator_placement(prepared, scenario, routing, config)
    if operator is not None:
        for pool in prepared:
            if pool.serving_at(0.0):
                operator.join(pool.spec.name)
        operator.warm(history, config.startup_s if scenario.warm else None)
    mode_names = {n: m.name for n, m in fixed_modes.items()}
    even_split = EvenSplit(views, settings, mode_names) if even else None
    optimiser = NoSdOptimiser(settings, mode_names, FleetState(history=history) if scenario.warm else None) \
        if plain else None
    fluid = FluidFleet(operator.pools() if operator else views, output_tokens)
    replicas = {n: np.zeros(len(times), dtype=int) for n in names}
    shares = {n: np.zeros(len(times)) for n in names}
    cost = np.full(len(times), np.nan)
    reasons: list[str] = []
    current = {n: 0 for n in names}
    asked: dict[str, list[tuple[float, int]]] = {n: [] for n in names}
    # closed loop: every pool served in step, its observation read at each tick
    steps: dict[str, object] = {}
    observed: dict[str, Observation] = {}
    results: dict[str, SimResult | None] = {}
    live_log = table = None
    if closed:
        table = np.zeros((len(times), len(names)))
        if isinstance(trace, RequestLog):
            live_log = _LiveLog(trace, names, dt, len(times), seed + 99)
            table = live_log.table
    tick = None
    for i, t in enumerate(times):
        now = EPOCH + timedelta(seconds=float(t))
        observed_rate = arrival_rate_rps(trace, t - window, t) * output_tokens
        if closed and i:
            ready = {n: observed[n].serving_replicas if n in observed else 0 for n in names}
            readings = _observed_readings(observed, output_tokens)
            in_flight = sum(_pool_in_flight(o) for o in observed.values())
        else:
            ready = {n: _ready(asked[n], t, config.startup_s, current[n]) for n in names}
            before = {n: shares[n][i - 1] for n in names} if i else {n: 1 / len(names) for n in names}
            readings = _fluid_readings(fluid, observed_rate, before, ready)
            in_flight = fluid.requests_in_flight()
        if operator is not None:
            for pool in prepared:
                if pool.serving_at(float(t)) and not operator.joined(pool.spec.name):
                    operator.join(pool.spec.name)
            # the oracle is told the highest rate between now and the next decision's replicas serving
            told = (true_peak_rps(trace, float(t), float(t) + config.startup_s + dt, dt) * output_tokens
                    if oracle else None)
            tick = operator.start(now, observed_rate, {p.spec.name: p.planning.concurrency_histogram
                                                       for p in prepared}, dt) if i == 0 \
                else operator.step(now, readings, told)
            fluid.use(operator.pools())
        else:
            demand = FleetDemand(observed_rate, in_flight)
            pools = [dataclasses.replace(v, current_replicas=current[v.name],
                                         ready_replicas=ready[v.name] if i else None,
                                         **_observed(observed.get(v.name), output_tokens)) for v in views]
            # a pool that has not joined yet, or is still profiling, has no GPUs to place replicas on
            pools = [p if pool.serving_at(float(t)) else dataclasses.replace(p, min_replicas=0, max_replicas=0,
                                                                            gpus_available=0)
                     for p, pool in zip(pools, prepared, strict=True)]
            tick = even_split.step(i == 0, now, pools, demand, ready) if even_split is not None \
                else optimiser.step(now, pools, demand)
        for n in names:
            current[n] = tick.replicas[n]
            shares[n][i] = tick.shares[n]
        cost[i] = tick.cost_per_mtok if tick.cost_per_mtok is not None else np.nan
        reasons.append(tick.reason)
        for n in names:
            replicas[n][i] = current[n]
            if not asked[n] or asked[n][-1][1] != current[n]:
                asked[n].append((float(t), current[n]))
        if not closed:
            serving_next = {n: _ready(asked[n], t, config.startup_s, current[n]) if i else current[n] for n in names}
            fluid.advance(arrival_rate_rps(trace, t, t + dt) * output_tokens, {n: shares[n][i] for n in names},
                          serving_next, dt)
            continue
        for j, (n, pool) in enumerate(zip(names, prepared, strict=True)):
            table[i, j] = shares[n][i]
            if i == 0:
                modes = operator.modes(n) if operator is not None else {fixed_modes[n].name: fixed_modes[n]}
                routed = _LiveRoutedTrace(trace.duration_s, base=trace, tick_s=dt, table=table, column=j,
                                          live_log=live_log)
                steps[n] = fleet_run(_LivePool(f"{placement}/{n}", None if plain else pool.sd_method, modes,
                                               tick.modes[n], current[n]), routed, pool.setup, config,
                                     scenario.slo_tpot_ms, pool.max_replicas, seed + 1000 * j, scenario.slo_ttft_ms)
        for n in names:
            if n in results:
                continue
            try:
                observed[n] = next(steps[n]) if i == 0 else steps[n].send(Action(current[n], tick.modes[n]))
            except StopIteration as done:
                results[n] = done.value
    if closed:
        for n, step in steps.items():
            while n not in results:  # the last ticks' slices
                try:
                    observed[n] = step.send(Action(current[n], tick.modes[n]))
                except StopIteration as done:
                    results[n] = done.value
        results = {n: (results[n] if replicas[n].any() else None) for n in names}
    return Timeline(times, replicas, shares, cost, reasons, float(trace.duration_s)), results


def _ready(asked: list[tuple[float, int]], t: float, startup_s: float, current: int) -> int:
    """Replicas serving at t: scale-ups count once `startup_s` has passed, scale-downs at once."""
    if not asked:
        return current
    ready = asked[0][1]  # the first replicas started warm
    for when, n in asked[1:]:
        if n < ready or when + startup_s <= t:
            ready = n
    return min(ready, current)


@dataclasses.dataclass
class PlacementResult:
    placement: str
    timeline: Timeline
    pools: dict[str, SimResult | None]
    """Each pool's request-level run (None: the pool never ran a replica)."""
    profiling_cost_usd: float = 0.0
    """Joining pools' profiling and refinement Jobs (their GPUs bill while they measure)."""
    profiling_gpu_hours: float = 0.0
    tuning: HpaTuning | None = None
    """For `even-split-hpa`: the target utilisation found and whether it reached the attainment asked for."""

    @property
    def _runs(self) -> list[SimResult]:
        return [r for r in self.pools.values() if r is not None]

    @property
    def cost_usd(self) -> float:
        return sum(r.cost_usd for r in self._runs) + self.profiling_cost_usd

    @property
    def output_tokens(self) -> float:
        return sum(r.output_tokens for r in self._runs)

    @property
    def slo_output_tokens(self) -> float:
        """Output tokens of the requests within both SLOs."""
        return sum(r.slo_output_tokens for r in self._runs)

    @property
    def cost_per_mtok(self) -> float:
        return self.cost_usd / self.output_tokens * 1e6 if self.output_tokens > 0 else math.inf

    @property
    def cost_per_mtok_within_slo(self) -> float:
        """The fleet's dollars over only the tokens of requests within both SLOs: what a useful token costs."""
        return self.cost_usd / self.slo_output_tokens * 1e6 if self.slo_output_tokens > 0 else math.inf

    @property
    def gpu_hours(self) -> float:
        return sum(r.gpu_hours for r in self._runs) + self.profiling_gpu_hours

    @property
    def requests_arrived(self) -> int:
        return sum(r.requests_arrived for r in self._runs)

    def _share(self, met: Callable[[SimResult], int]) -> float:
        arrived = self.requests_arrived
        return sum(met(r) for r in self._runs) / arrived if arrived else 1.0

    @property
    def slo_attainment(self) -> float:
        """Share of arrived requests that completed within both the TTFT and the TPOT SLO."""
        return self._share(lambda r: r.slo_met)

    @property
    def tpot_attainment(self) -> float:
        return self._share(lambda r: r.tpot_met)

    @property
    def ttft_attainment(self) -> float:
        return self._share(lambda r: r.ttft_met)

    @property
    def tpot_p95_ms(self) -> float:
        """The worst pool's p95 TPOT (a fleet percentile would need the pools' histograms merged)."""
        return max((r.tpot_p95_ms for r in self._runs if r.requests_completed), default=math.nan)

    def mean_shares(self) -> dict[str, float]:
        return {n: float(s.mean()) for n, s in self.timeline.shares.items()}

    def summary(self) -> dict[str, object]:
        return {"placement": self.placement, "cost_per_mtok": self.cost_per_mtok,
                "cost_per_mtok_within_slo": self.cost_per_mtok_within_slo, "cost_usd": self.cost_usd,
                "gpu_hours": self.gpu_hours, "slo_attainment": self.slo_attainment,
                "ttft_attainment": self.ttft_attainment, "tpot_attainment": self.tpot_attainment,
                "tpot_p95_ms_worst_pool": self.tpot_p95_ms, "requests_arrived": self.requests_arrived,
                "output_tokens": self.output_tokens, "slo_output_tokens": self.slo_output_tokens,
                "mean_shares": self.mean_shares(),
                "replica_changes_per_hour": self.timeline.replica_changes_per_hour(),
                **({"tuning": dataclasses.asdict(self.tuning)} if self.tuning else {}),
                "pools": {n: (r.summary() if r is not None else None) for n, r in self.pools.items()}}


@dataclasses.dataclass(frozen=True)
class HpaTuning:
    """How `tune_even_split` set the even split's autoscaler target."""

    target_attainment: float
    """The SLO attainment (both SLOs) asked for: specpilot's."""
    utilization_percent: float
    """The highest target utilisation found that reaches it (or the lowest tried, when none does)."""
    attainment: float
    reached: bool
    evaluations: int
    """Placements simulated in the search."""

    def words(self) -> str:
        if self.reached:
            return (f"target utilisation {self.utilization_percent:.0f}% reaches {self.attainment:.1%} "
                    f"(specpilot's {self.target_attainment:.1%})")
        return (f"no target utilisation reaches specpilot's {self.target_attainment:.1%}: at "
                f"{self.utilization_percent:.0f}% it serves {self.attainment:.1%}")


HPA_UTILIZATION_RANGE_PERCENT = (10.0, 100.0)
HPA_BISECTION_STEPS = 5


def tune_even_split(target_attainment: float, evaluate: Callable[[float], PlacementResult],
                    low_percent: float = HPA_UTILIZATION_RANGE_PERCENT[0],
                    high_percent: float = HPA_UTILIZATION_RANGE_PERCENT[1],
                    steps: int = HPA_BISECTION_STEPS) -> PlacementResult:
    """The even split at the highest autoscaler target utilisation whose SLO attainment reaches
    `target_attainment` (within ATTAINMENT_TOLERANCE_POINTS): bisection over the target between the bounds,
    `evaluate(percent)` simulating the placement at one target. A lower target runs more replicas, so
    attainment falls as the target rises; the highest target that still reaches it is the cheapest. When even
    the lowest target falls short, that run is returned with `reached` false."""
    evaluations = 0

    def run(percent: float) -> tuple[PlacementResult, bool]:
        nonlocal evaluations
        evaluations += 1
        result = evaluate(percent)
        return result, result.slo_attainment * 100 >= target_attainment * 100 - ATTAINMENT_TOLERANCE_POINTS

    def done(result: PlacementResult, percent: float, reached: bool) -> PlacementResult:
        result.tuning = HpaTuning(target_attainment, percent, result.slo_attainment, reached, evaluations)
        return result

    best, ok = run(high_percent)
    if ok:
        return done(best, high_percent, True)
    best, ok = run(low_percent)
    if not ok:
        return done(best, low_percent, False)
    lo, hi = low_percent, high_percent  # lo reaches the target, hi does not
    for _ in range(steps):
        mid = (lo + hi) / 2
        result, ok = run(mid)
        if ok:
            lo, best = mid, result
        else:
            hi = mid
    return done(best, lo, True)


@dataclasses.dataclass
class MixedComparison:
    scenario: MixedScenario
    trace: LoadTrace
    prepared: list[PreparedPool]
    results: list[PlacementResult]

    def result(self, placement: str) -> PlacementResult:
        return next(r for r in self.results if r.placement == placement)

    def has(self, placement: str) -> bool:
        return any(r.placement == placement for r in self.results)

    def savings(self, placement: str, against: str) -> float:
        """Fractional saving in $/Mtok of `placement` against `against` (0.2: 20% cheaper)."""
        return 1.0 - self.result(placement).cost_per_mtok / self.result(against).cost_per_mtok

    def carrier(self, placement: str) -> str:
        """The pool that carried the most traffic over the trace under `placement`."""
        shares = self.result(placement).mean_shares()
        return max(shares, key=shares.get)


def compare(scenario: MixedScenario, config: FleetConfig | None = None, seed: int = 0,
            placements: Sequence[str] = PLACEMENTS,
            progress: Callable[[str], None] | None = None) -> MixedComparison:
    """Every placement over the scenario's trace, each pool served by the request-level simulator
    (`even-split-hpa` tuned to the attainment of `specpilot`, which then runs as well)."""
    config = config or FleetConfig()
    trace = scenario.load_trace()
    prepared = prepare(scenario, trace, config, seed)
    output_tokens = _mean_output_tokens(trace, prepared)

    def run(placement: str, utilization_percent: float | None = None) -> PlacementResult:
        if progress:
            progress(placement)
        return run_placement(placement, prepared, trace, output_tokens, config, scenario, utilization_percent,
                             seed)

    done: dict[str, PlacementResult] = {}
    for placement in placements:
        if placement != "even-split-hpa":
            done[placement] = run(placement)
    if "even-split-hpa" in placements:
        target = (done.get("specpilot") or run("specpilot")).slo_attainment
        done["even-split-hpa"] = tune_even_split(target, lambda percent: run("even-split-hpa", percent))
    return MixedComparison(scenario, trace, prepared, [done[p] for p in placements])
