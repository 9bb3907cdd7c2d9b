"""The fleet planner: replicas per GPU pool and each pool's share of traffic, by cost per token within the SLO.

A SpeculativeDeployment's pools serve one load. Each pool's decision (policy.choose) fixes how its engines
run (method and speculation schedule) and so its curve: TPOT (and TTFT) per replica at each concurrency under
that schedule. From the curve, a replica of pool i delivers G_i(c) = c * 1000 / TPOT_i(c) tokens/s at c
concurrent requests; its SLO-feasible capacity cap_i is G_i at the largest c that meets the TPOT and TTFT SLOs
(and the decision's own capacity), times the target utilisation. Speculation enters there: it lowers TPOT at
low and middle concurrency, so a GPU type with a good drafter holds more load within a tight SLO, and its cost
per token at capacity, price_i * gpus_i / (3600 * cap_i), ranks differently against the others.

The fleet pays for every replica it runs and delivers the demand D (tokens/s) whatever the split, so the
fleet's cost per token is sum_i n_i * price_i * gpus_i / (3600 * D), and the planner minimises sum_i n_i *
cost_i in whole replicas, min_i <= n_i <= max_i (max_i also bounded by the GPUs the pool's nodes have),
under the routing constraint:
- `gateway` (an HTTPRoute with a weight per pool): any split; the load must fit the fleet's capacity,
  sum_i n_i * cap_i >= D (an integer covering problem, solved exactly by branch and bound over the pools in
  order of cost per token at capacity). The split then gives every pool the same fraction of its capacity
  (share_i proportional to n_i * cap_i over the replicas serving now): any split that fits costs the same,
  this one leaves every pool the same headroom, and it only moves when replicas move, so demand jitter
  never moves the weights. A pool with a backlog (more requests in flight than its serving replicas are
  planned for: `FleetPool.requests_in_flight`) gets its weight times planned / in flight (at least a quarter)
  until it drains, while the fleet as a whole has room.
- `service` (one Service, an even split per pod): every replica gets D / N, N = sum_i n_i, so the weakest
  pool in use bounds N >= D / min cap_i; the planner tries each pool's capacity as that bound and fills N
  with the cheapest replicas (per replica, not per token: under an even split every replica carries the same
  load) of the pools at least that strong. Exact.

Requests in flight count too: each needs at least 1000 / TPOT SLO tokens/s to stay within the SLO, so the
demand is at least requests_in_flight * 1000 / tpot_slo_ms (a backlog the arrival rate does not show: requests
waiting must drain). `demand_tokens_per_second` is that rule, the one the operator and the simulator both use.

Sizing to an SLO attainment (`slo_attainment_percent`, policy.sloAttainmentPercent; None: today's sizing by
the target utilisation alone on the current demand). A replica asked for now serves one lead time later (the
pool's scale-up time, pod created -> ready: `FleetPool.lead_time_seconds`), so the planner sizes for the demand
it expects within the lead time, not the demand it sees (`forecast_demand`): from a short history of the
observed demand (kept in the state, the largest sample per bucket over `history_seconds`), the largest of
- the demand now;
- its trend (least squares over the last two lead times) extrapolated one lead time ahead;
- the demand now times the q-quantile (q = the attainment) of the spread seen within one lead time over the
  history (the largest over the smallest demand of each lead-time window), at most the history's peak: a load
  that has burst before is held for through its quiet minutes, one that only drifts is not.
Within a replica, requests in flight are Poisson around their mean (M/G/inf), so a replica runs at a mean
concurrency c whose q-quantile, about c + z_q * sqrt(c), stays within the decision's admission limit (beyond it
requests queue and TTFT breaks), and within its TPOT- and TTFT-feasible concurrency on the calibrated curve
(below); the target utilisation is an upper bound on top of it. A simulator's oracle passes the true demand within the lead time instead
(`FleetDemand.forecast_tokens_per_second`).

Stability: the previous plan stays while it still fits the demand and costs at most `min_gain_percent`
more than the cheapest plan that holds the demand with that margin to spare (`mix_change_percent` more when
that plan starts replicas anywhere: a swap of GPU types); each pool then scales up at once and down only to
the highest target of the last `scale_down_stabilization_seconds` (policy.replicas' window, per pool), as a
single pool does today. As the forecast holds the history's swings, a pool scales down only when the forecast
allows it. Replica changes are
bounded per pool: at most `max_changes_per_hour` in any hour, a scale-down only while it leaves room for a
scale-up after it (scale-ups are never held: the SLO comes first); each change's reason is in the pool's
reason text. A scale-up while the last one's replicas are still starting is the same scaling (a ramp planned
over consecutive reconciliations).

Calibration: a curve is what the profiles measured; replicas serving the deployment's traffic run slower at
their tail (prefill between decode steps, longer contexts than profiled, requests whose drafts are seldom
accepted). The ratio of each pool's observed p95 TPOT to its curve's TPOT at the concurrency it ran at, smoothed
(`FleetState.tpot_scale`, within 0.8-4), scales the curve the pool is sized by: the SLO then holds for the
p95 request at the planned concurrency, not the mean one.

A pool without a curve (not profiled yet) keeps the replicas today's per-pool planner gives it and takes its
even per-pod share of the load; the planner places the rest. Pure: no I/O and no clock.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from statistics import NormalDist

from ..api.deployment_spec import Routing
from ..perf.cost import cost_per_million_tokens, tokens_per_second
from .replicas import ReplicaState, plan_replicas

__all__ = [
    "DEFAULT_LEAD_TIME_S",
    "CurvePoint",
    "FleetDemand",
    "Forecast",
    "FleetPlan",
    "FleetPool",
    "FleetSettings",
    "FleetState",
    "PoolPlacement",
    "ReplicaCurve",
    "Routing",
    "SHARE_MOVE",
    "demand_tokens_per_second",
    "even_split_replicas",
    "forecast_demand",
    "history_from",
    "plan_fleet",
    "route_weights",
]

SHARE_MOVE = 0.02
"""A change of a pool's share this large (2 percentage points) is announced (an Event) and re-weights routes."""
_SEARCH_NODES = 200_000
"""Bound on the branch-and-bound's nodes: beyond it the best plan found so far stands (never hit by 16 pools
of the usual sizes; it keeps the planner's time bounded for any input)."""
DEFAULT_LEAD_TIME_S = 120.0
"""A pool's scale-up lead time (pod created -> serving: image pull, model load, CUDA graphs) when none is known."""
NEW_HIGH = 0.05
"""The observed demand within this fraction of the history's peak, and above what the history reached before the
last two lead times by as much, is a new high, whose trend may go past the peak."""
HISTORY_SAMPLES = 64
"""Samples of the demand history kept (one per history_seconds / HISTORY_SAMPLES, its largest value)."""


@dataclasses.dataclass(frozen=True)
class CurvePoint:
    """A replica of the pool at `concurrency` requests under its decided schedule."""

    concurrency: float
    tpot_ms: float
    ttft_ms: float | None = None


@dataclasses.dataclass(frozen=True)
class FleetPool:
    """One GPU pool as the fleet planner sees it."""

    name: str
    price_per_gpu_hour: float
    gpus_per_replica: int
    min_replicas: int
    max_replicas: int
    curve: tuple[CurvePoint, ...] = ()
    """TPOT/TTFT per concurrency under the pool's decided schedule, ascending; empty: not profiled yet."""
    max_concurrency: float | None = None
    """The decision's SLO-feasible concurrency per replica (it knows the KV cache); None: the curve's end."""
    gpus_available: int | None = None
    """GPUs the pool's nodes can give this deployment (allocatable); None: unknown, not a bound."""
    current_replicas: int = 0
    ready_replicas: int | None = None
    """Replicas serving now (None: all that run): traffic follows serving replicas, so a pool scaling up
    takes its new share as its replicas become ready, and one scaling down keeps its load until they go."""
    held_replicas: int | None = None
    """For a pool without a curve: the replicas today's per-pool planner gives it (else current, bounded)."""
    lead_time_seconds: float | None = None
    """Seconds from asking for a replica to its serving (pod created -> ready), measured or configured; None:
    DEFAULT_LEAD_TIME_S. The planner sizes for the demand expected within the longest lead time."""
    requests_in_flight: float | None = None
    """Running + waiting requests on the pool's replicas now (None: unknown). Under gateway routing a pool holding
    more than its serving replicas are planned to carry gets less new traffic until its backlog drains."""
    observed_concurrency: float | None = None
    """Mean running requests per serving replica over the metrics window (None: not observed)."""
    observed_tpot_p95_ms: float | None = None
    """p95 TPOT of the pool's requests over the same window (None: not observed): against the curve's TPOT at the
    observed concurrency it calibrates the curve the pool is sized by (`FleetState.tpot_scale`)."""

    def __post_init__(self) -> None:
        if not (self.price_per_gpu_hour > 0 and math.isfinite(self.price_per_gpu_hour)):
            raise ValueError(f"pool {self.name}: price_per_gpu_hour must be > 0 (got {self.price_per_gpu_hour})")
        if self.gpus_per_replica < 1:
            raise ValueError(f"pool {self.name}: gpus_per_replica must be >= 1 (got {self.gpus_per_replica})")
        if not 0 <= self.min_replicas <= self.max_replicas:
            raise ValueError(f"pool {self.name}: need 0 <= min_replicas <= max_replicas "
                             f"(got {self.min_replicas}, {self.max_replicas})")
        if self.lead_time_seconds is not None and not (self.lead_time_seconds >= 0
                                                       and math.isfinite(self.lead_time_seconds)):
            raise ValueError(f"pool {self.name}: lead_time_seconds must be >= 0 (got {self.lead_time_seconds})")
        if self.gpus_available is not None and self.gpus_available < 0:
            raise ValueError(f"pool {self.name}: gpus_available must be >= 0 (got {self.gpus_available})")
        previous = 0.0
        for point in self.curve:
            if not (point.concurrency > previous and point.tpot_ms > 0 and math.isfinite(point.tpot_ms)):
                raise ValueError(f"pool {self.name}: the curve needs ascending concurrency > 0 and TPOT > 0 "
                                 f"(got {point})")
            previous = point.concurrency

    @property
    def cost_per_hour(self) -> float:
        """Dollars per replica-hour."""
        return self.price_per_gpu_hour * self.gpus_per_replica

    @property
    def gpu_bound(self) -> int | None:
        """Most replicas the pool's GPUs hold (None: no bound known)."""
        return None if self.gpus_available is None else self.gpus_available // self.gpus_per_replica

    @property
    def upper(self) -> int:
        bound = self.gpu_bound
        return self.max_replicas if bound is None else min(self.max_replicas, bound)

    @property
    def lower(self) -> int:
        return min(self.min_replicas, self.upper)

    @property
    def lead_s(self) -> float:
        return DEFAULT_LEAD_TIME_S if self.lead_time_seconds is None else self.lead_time_seconds


@dataclasses.dataclass(frozen=True)
class FleetDemand:
    """The deployment's observed total demand, over all pools."""

    tokens_per_second: float
    """Output tokens per second asked for: arrival rate x output tokens per request (served + backlog)."""
    requests_in_flight: float | None = None
    """Running + waiting requests over all replicas."""
    forecast_tokens_per_second: float | None = None
    """Told, not forecast: the highest demand within the lead time (a simulator's clairvoyant oracle); None: the
    planner forecasts it from its history."""


@dataclasses.dataclass(frozen=True)
class FleetSettings:
    routing: Routing = Routing.SERVICE
    tpot_slo_ms: float | None = None
    ttft_slo_ms: float | None = None
    target_utilization_percent: float = 80.0
    min_gain_percent: float = 2.0
    """The previous plan stays unless the new one is cheaper by this much (and the previous still fits)."""
    mix_change_percent: float = 10.0
    """When the previous plan no longer fits, the fleet grows from it (keeps its replicas and adds the cheapest
    that fit) unless a different mix is cheaper by this much: a rising load then adds replicas instead of
    swapping one GPU type for another at every step."""
    scale_down_stabilization_seconds: float = 300.0
    slo_attainment_percent: float | None = 99.0
    """The share of requests that must meet the SLOs: the quantile of the demand's swings and of the requests in
    flight per replica the planner sizes for. None: size by the target utilisation on the current demand alone
    (no forecast)."""
    history_seconds: float = 1800.0
    """How far back the demand history reaches (the swings it holds headroom for)."""
    max_changes_per_hour: float | None = 6.0
    """Replica changes per pool in any hour: scale-downs wait while they would leave no room for a scale-up
    (None: no bound)."""

    @property
    def quantile(self) -> float | None:
        if self.slo_attainment_percent is None:
            return None
        return min(max(self.slo_attainment_percent / 100.0, 0.5), 0.9999)

    @property
    def spread_z(self) -> float:
        """z of the attainment quantile: how many standard deviations of requests in flight a replica keeps."""
        q = self.quantile
        return 0.0 if q is None else NormalDist().inv_cdf(q)


@dataclasses.dataclass(frozen=True)
class Forecast:
    """The demand the planner sizes for and why."""

    tokens_per_second: float
    """What the replicas are sized for: the highest of the terms below."""
    observed: float
    trend: float
    """The observed demand's trend extrapolated one lead time ahead."""
    spread: float
    """The observed demand times the quantile of the spread within a lead time seen, at most the peak."""
    peak: float
    """The highest demand in the history."""
    lead_s: float
    told: bool = False
    """The demand within the lead time was given (an oracle), not forecast."""

    @property
    def headroom(self) -> float:
        """Fraction above the observed demand the planner sizes for (0.25: 25% more)."""
        return self.tokens_per_second / self.observed - 1.0 if self.observed > 0 else 0.0

    def words(self) -> str:
        if self.told:
            return f"sized for {self.tokens_per_second:.0f} tok/s told for the next {self.lead_s:g}s"
        if self.tokens_per_second <= self.observed * (1 + 1e-9):
            return f"sized for the observed {self.observed:.0f} tok/s (no rise within {self.lead_s:g}s forecast)"
        why = ("its trend over the lead time" if self.trend >= self.spread
               else f"swings seen within {self.lead_s:g}s (peak {self.peak:.0f})")
        return (f"sized for {self.tokens_per_second:.0f} tok/s, {self.headroom:+.0%} over the observed "
                f"{self.observed:.0f}: {why}")


@dataclasses.dataclass(frozen=True)
class FleetState:
    """What the planner remembers between calls (kept in the deployment's status)."""

    targets: Mapping[str, ReplicaState] = dataclasses.field(default_factory=dict)
    """Per pool, the replica targets within the stabilisation window."""
    replicas: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """The previous plan's optimal replicas per pool (the incumbent the hysteresis keeps)."""
    shares: Mapping[str, float] = dataclasses.field(default_factory=dict)
    history: tuple[tuple[datetime, float], ...] = ()
    """The observed demand (tokens/s), oldest first: the largest per history bucket."""
    changes: Mapping[str, tuple[datetime, ...]] = dataclasses.field(default_factory=dict)
    """Per pool, when its replicas changed within the last hour (the change bound)."""
    tpot_scale: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Per pool, the TPOT its replicas run at over what its curve says at that concurrency (smoothed; 1: as
    profiled): the planner sizes by the curve times it (prefill between decode steps, longer contexts than
    profiled and the like make it above 1)."""


@dataclasses.dataclass(frozen=True)
class PoolPlacement:
    name: str
    replicas: int
    """Replicas to run now (after scale-down stabilisation)."""
    target: int
    """What the fleet's optimum asks of this pool."""
    share: float
    """Fraction of the deployment's traffic routed to the pool (0..1; the shares sum to 1)."""
    load_tokens_per_second: float
    concurrency_per_replica: float | None
    tpot_ms: float | None
    """TPOT at that concurrency, from the curve (None without a curve or without load)."""
    capacity_tokens_per_second: float | None
    """SLO-feasible tokens/s of one replica at the target utilisation (None without a curve)."""
    cost_per_mtok: float | None
    """Dollars per million tokens at the load the pool gets (None without load)."""
    planned: bool
    """False: no curve yet, the pool keeps today's per-pool replicas."""
    full: bool
    """Every replica the pool's GPUs (or maxReplicas) allow runs."""
    reason: str


@dataclasses.dataclass(frozen=True)
class FleetPlan:
    routing: Routing
    pools: tuple[PoolPlacement, ...]
    demand_tokens_per_second: float
    cost_per_hour: float
    cost_per_mtok: float | None
    """The fleet's dollars per million tokens at this demand (None without demand)."""
    slo_feasible: bool
    """The planned replicas hold the demand within the SLO (False: everything runs, and it still does not)."""
    shares_moved: bool
    """Some pool's share moved by SHARE_MOVE or more since the previous plan."""
    reason: str
    state: FleetState
    forecast: Forecast | None = None
    """The demand the replicas were sized for (None: sized on the observed demand alone)."""

    def pool(self, name: str) -> PoolPlacement:
        return next(p for p in self.pools if p.name == name)


class _Curve:
    """TPOT and TTFT of one replica at any concurrency: linear in log2(c) between the points, flat before the
    first, along the last two points' line beyond the last (TPOT times `scale`: the calibration to what runs)."""

    def __init__(self, points: Sequence[CurvePoint], scale: float = 1.0) -> None:
        self.xs = [math.log2(p.concurrency) for p in points]
        self.tpot = [p.tpot_ms * scale for p in points]
        self.ttft = [p.ttft_ms for p in points] if all(p.ttft_ms is not None for p in points) else None
        self.last = points[-1].concurrency

    @staticmethod
    def _at(xs: list[float], ys: list[float], c: float) -> float:
        x = math.log2(max(c, 2.0 ** xs[0]))
        if len(xs) == 1:
            return ys[0]
        i = 1
        while i < len(xs) - 1 and xs[i] < x:
            i += 1
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 1e-9)

    def tpot_ms(self, c: float) -> float:
        return self._at(self.xs, self.tpot, c)

    def ttft_ms(self, c: float) -> float | None:
        return None if self.ttft is None else self._at(self.xs, self.ttft, c)

    def tokens_per_second(self, c: float) -> float:
        return tokens_per_second(c, self.tpot_ms(c))

    def concurrency_for(self, tokens_per_second: float, limit: float) -> float:
        """The concurrency at which a replica delivers `tokens_per_second` (at most `limit`)."""
        lo, hi = 0.0, max(limit, 1e-9)
        if self.tokens_per_second(hi) <= tokens_per_second:
            return hi
        for _ in range(48):
            mid = (lo + hi) / 2
            if self.tokens_per_second(mid) < tokens_per_second:
                lo = mid
            else:
                hi = mid
        return hi

    def feasible_concurrency(self, cap: float, tpot_slo_ms: float | None, ttft_slo_ms: float | None) -> float:
        """The largest concurrency <= cap within both SLOs (to 1e-6 in log2 c); 0 when even one request
        breaks them."""

        def ok(c: float) -> bool:
            if tpot_slo_ms is not None and self.tpot_ms(c) > tpot_slo_ms:
                return False
            ttft = self.ttft_ms(c)
            return not (ttft_slo_ms is not None and ttft is not None and ttft > ttft_slo_ms)

        if ok(cap):
            return cap
        lo, hi = 0.0, math.log2(cap) if cap > 1 else 0.0
        if not ok(1.0):
            return 0.0
        while hi - lo > 1e-6:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if ok(2.0 ** mid) else (lo, mid)
        return 2.0 ** lo


ReplicaCurve = _Curve
"""A pool's curve as the planner reads it (the simulator's fluid model of the fleet reads it the same way)."""


@dataclasses.dataclass
class _Planned:
    pool: FleetPool
    curve: _Curve
    capacity_concurrency: float
    """SLO-feasible concurrency per replica at the target utilisation."""
    capacity: float
    """Tokens/s per replica at that concurrency (0: cannot meet the SLO)."""
    lo: int
    hi: int


def _planned(pool: FleetPool, settings: FleetSettings, spread: bool = True, scale: float = 1.0) -> _Planned:
    curve = _Curve(pool.curve, scale)
    limit = pool.max_concurrency if pool.max_concurrency and pool.max_concurrency > 0 else curve.last
    feasible = curve.feasible_concurrency(limit, settings.tpot_slo_ms, settings.ttft_slo_ms)
    # The target utilisation applies to the load (tokens/s), as policy.replicas applies it to concurrency.
    capacity = curve.tokens_per_second(feasible) * settings.target_utilization_percent / 100 if feasible else 0.0
    if capacity and spread:
        # requests in flight per replica are Poisson around the mean: past the admission limit they queue and TTFT
        # breaks, so the attainment quantile of them stays within it
        usable = usable_concurrency(limit, settings.spread_z)
        capacity = min(capacity, curve.tokens_per_second(min(feasible, usable)))
    at = curve.concurrency_for(capacity, feasible) if capacity else 0.0
    return _Planned(pool, curve, at, capacity, pool.lower, pool.upper)


def usable_concurrency(feasible: float, z: float) -> float:
    """The mean concurrency c with c + z * sqrt(c) = `feasible`: Poisson requests in flight around c stay within
    the SLO-feasible concurrency at the quantile z stands for."""
    if z <= 0 or feasible <= 0:
        return max(feasible, 0.0)
    root = (-z + math.sqrt(z * z + 4 * feasible)) / 2
    return root * root


def _held_replicas(pool: FleetPool) -> int:
    wanted = pool.held_replicas if pool.held_replicas is not None else pool.current_replicas
    return min(max(wanted, pool.lower), pool.upper)


def _cost(planned: Sequence[_Planned], replicas: Sequence[int]) -> float:
    return sum(n * p.pool.cost_per_hour for n, p in zip(replicas, planned, strict=True))


def _fits(planned: Sequence[_Planned], replicas: Sequence[int], demand: float, routing: Routing,
          fixed_replicas: int = 0) -> bool:
    """Whether these replicas hold `demand` tokens/s within the SLO under the routing constraint (`service`:
    `demand` is the whole deployment's, spread over these and `fixed_replicas` other pods)."""
    if any(not p.lo <= n <= p.hi for n, p in zip(replicas, planned, strict=True)):
        return False
    if demand <= 0:
        return True
    if routing.weighted:
        return sum(n * p.capacity for n, p in zip(replicas, planned, strict=True)) >= demand * (1 - 1e-9)
    total = sum(replicas) + fixed_replicas
    if sum(replicas) == 0:
        return False
    weakest = min(p.capacity for n, p in zip(replicas, planned, strict=True) if n > 0)
    return demand / total <= weakest * (1 + 1e-9)


def _plan_gateway(planned: Sequence[_Planned], demand: float) -> list[int] | None:
    """Fewest dollars per hour with sum n_i cap_i >= demand: branch and bound, pools in order of cost per
    token at capacity, bounded below by the fractional fill of the remaining pools. None: infeasible."""
    base = [p.lo for p in planned]
    residual = demand - sum(p.lo * p.capacity for p in planned)
    if residual <= 0:
        return base
    order = sorted((i for i, p in enumerate(planned) if p.capacity > 0 and p.hi > p.lo),
                   key=lambda i: (planned[i].pool.cost_per_hour / planned[i].capacity, i))
    if sum((planned[i].hi - planned[i].lo) * planned[i].capacity for i in order) < residual * (1 - 1e-9):
        return None
    per_token = [planned[i].pool.cost_per_hour / planned[i].capacity for i in order]
    room = [(planned[i].hi - planned[i].lo) * planned[i].capacity for i in order]
    best_cost, best = math.inf, None
    extra = [0] * len(order)
    nodes = 0

    def bound(j: int, need: float) -> float:
        cost = 0.0
        for k in range(j, len(order)):
            if need <= 0:
                break
            take = min(need, room[k])
            cost += take * per_token[k]
            need -= take
        return cost if need <= 1e-9 * max(demand, 1.0) else math.inf

    def search(j: int, need: float, cost: float) -> None:
        nonlocal best_cost, best, nodes
        nodes += 1
        if need <= 1e-9 * max(demand, 1.0):
            if cost < best_cost - 1e-9:
                best_cost, best = cost, list(extra)
            return
        if j == len(order) or nodes > _SEARCH_NODES or cost + bound(j, need) >= best_cost - 1e-9:
            return
        p = planned[order[j]]
        most = min(p.hi - p.lo, max(1, math.ceil(need / p.capacity * (1 - 1e-12))))
        for x in range(most, -1, -1):
            extra[j] = x
            search(j + 1, need - x * p.capacity, cost + x * p.pool.cost_per_hour)
        extra[j] = 0

    search(0, residual, 0.0)
    if best is None:
        return None
    for k, i in enumerate(order):
        base[i] += best[k]
    return base


def _plan_service(planned: Sequence[_Planned], demand: float, fixed_replicas: int) -> list[int] | None:
    """Fewest dollars per hour under an even split per pod: for each pool's capacity as the weakest in use,
    N = max(ceil(demand / weakest) - fixed_replicas, sum of minimums) replicas, the cheapest first among pools at
    least that strong. `fixed_replicas` are pods of pools the planner does not place (they take their share)."""
    base = [p.lo for p in planned]
    if demand <= 0:
        return base
    forced = [p.capacity for p in planned if p.lo > 0]
    best_cost, best = math.inf, None
    for weakest in sorted({p.capacity for p in planned if p.capacity > 0}):
        if forced and weakest > min(forced):
            continue
        eligible = [i for i, p in enumerate(planned) if p.capacity >= weakest]
        need = max(max(math.ceil(demand / weakest * (1 - 1e-12)), 1) - fixed_replicas, sum(base))
        replicas = list(base)
        short = need - sum(replicas)
        for i in sorted(eligible, key=lambda i: (planned[i].pool.cost_per_hour, -planned[i].capacity, i)):
            if short <= 0:
                break
            add = min(short, planned[i].hi - replicas[i])
            replicas[i] += add
            short -= add
        if short > 0:
            continue
        cost = _cost(planned, replicas)
        if cost < best_cost - 1e-9 or (abs(cost - best_cost) <= 1e-9 and sum(replicas) < sum(best)):
            best_cost, best = cost, replicas
    return best


def _grow(planned: Sequence[_Planned], incumbent: Sequence[int], placed_demand: float, total: float,
          held_count: int, routing: Routing) -> list[int] | None:
    """The cheapest plan that keeps at least the incumbent's replicas (within today's bounds)."""
    floor = [dataclasses.replace(p, lo=max(p.lo, min(n, p.hi))) for p, n in zip(planned, incumbent, strict=True)]
    return (_plan_gateway(floor, placed_demand) if routing.weighted
            else _plan_service(floor, total, held_count))


def _serve_the_most(planned: Sequence[_Planned]) -> list[int]:
    """Demand beyond what every allowed replica holds within the SLO: every pool that can hold the SLO at all runs
    at its maximum, and a pool that cannot (no SLO-feasible concurrency: it would carry requests that all miss, or
    under gateway routing none at all) stays at its minimum instead of being paid for nothing."""
    return [p.hi if p.capacity > 0 else p.lo for p in planned]


def even_split_replicas(planned_pools: Sequence[FleetPool], demand: FleetDemand, settings: FleetSettings
                        ) -> dict[str, int]:
    """Today's behaviour, for comparison: one Service (even per-pod split) and every pool scaled alone on the
    load it gets (policy.replicas). At equilibrium every replica carries D / N; each pool's autoscaler wants
    n_i * (D / N) / cap_i replicas, so pools stronger than the per-replica load shrink to their minimum and
    the weakest grows until D / N fits it (the fixed point, found by iterating the autoscalers)."""
    planned = [_planned(p, settings, spread=False) for p in planned_pools]
    replicas = [max(p.lo, 1) if p.hi >= 1 else 0 for p in planned]
    if sum(replicas) == 0:
        return {p.pool.name: 0 for p in planned}
    target = demand_tokens_per_second(demand, settings)
    for _ in range(1000):
        per_replica = target / max(sum(replicas), 1)
        nxt = []
        for n, p in zip(replicas, planned, strict=True):
            want = p.hi if p.capacity <= 0 else math.ceil(n * per_replica / p.capacity - 1e-9)
            nxt.append(min(max(want, p.lo, 1 if n > 0 else 0), p.hi))
        if nxt == replicas:
            break
        replicas = nxt
    return {p.pool.name: n for p, n in zip(planned, replicas, strict=True)}


def demand_tokens_per_second(demand: FleetDemand, settings: FleetSettings) -> float:
    """The deployment's demand in output tokens/s: the observed tokens/s, and at least what the requests in
    flight need to stay within the TPOT SLO (1000 / tpot_slo_ms each: a backlog must drain). The operator
    (policy.placement) and the simulator (sim.mixed) both plan on this."""
    tokens = demand.tokens_per_second if math.isfinite(demand.tokens_per_second) else 0.0
    if demand.requests_in_flight and settings.tpot_slo_ms and math.isfinite(demand.requests_in_flight):
        tokens = max(tokens, tokens_per_second(demand.requests_in_flight, settings.tpot_slo_ms))
    return max(tokens, 0.0)


def _remember(history: Sequence[tuple[datetime, float]], now: datetime, value: float,
              settings: FleetSettings) -> tuple[tuple[datetime, float], ...]:
    """The history with `value` observed at `now`: a step function, one sample per bucket (its largest) within the
    window, a sample only where the demand changed (the one before the window is kept as the value carried into
    it), so an unchanged demand leaves the state, and the status it is kept in, as it was."""
    bucket = timedelta(seconds=max(settings.history_seconds, 1.0) / HISTORY_SAMPLES)
    start = now - timedelta(seconds=max(settings.history_seconds, 0.0))
    valid = [(t, d) for t, d in history if t <= now and math.isfinite(d)]
    older = [i for i, (t, _) in enumerate(valid) if t < start]
    kept = valid[older[-1]:] if older else valid
    if kept and math.isclose(kept[-1][1], value, rel_tol=1e-9, abs_tol=1e-9):
        pass
    elif kept and now - kept[-1][0] < bucket and kept[-1][0] >= start:
        kept[-1] = (kept[-1][0], max(kept[-1][1], value))
    else:
        kept.append((now, value))
    return tuple(kept[-HISTORY_SAMPLES:])


def history_from(samples: Iterable[tuple[datetime, float]], settings: FleetSettings
                 ) -> tuple[tuple[datetime, float], ...]:
    """A demand history from observations made before the planner ran (oldest first): what the metrics hold
    from before a cold start (the operator reads it from Prometheus on a deployment's first placement), kept as
    the planner keeps its own (`_remember`: a sample per bucket, within `history_seconds` of the last)."""
    history: tuple[tuple[datetime, float], ...] = ()
    for t, d in sorted(samples, key=lambda s: s[0]):
        if math.isfinite(d) and d >= 0:
            history = _remember(history, t, d, settings)
    return history


def forecast_demand(history: Sequence[tuple[datetime, float]], observed: float, lead_s: float,
                    quantile: float) -> Forecast:
    """The demand to size for within `lead_s` seconds from the history (the last sample is now's): the observed
    demand times the `quantile` of the history's spread within one lead time (the largest over the smallest
    demand of each lead-time window: a rise or a fall), up to the higher of the history's peak and (at a new
    high: within NEW_HIGH of the peak, and above all the history before the last two lead times) the trend over
    the last two lead times extrapolated one lead time ahead; never below the observed demand. A swing
    never seen is not forecast (a trend steeper than the swings seen is cut to them): a burst is held for
    through the quiet minutes once one has come and gone, a load that only drifts gets its drift."""
    peak = max([observed, *(d for _, d in history)])
    now = history[-1][0] if history else None
    trend = observed
    if now is not None and lead_s > 0:
        recent = [((t - now).total_seconds(), d) for t, d in history if (now - t).total_seconds() <= 2 * lead_s]
        if len(recent) >= 3:
            mx = sum(x for x, _ in recent) / len(recent)
            my = sum(y for _, y in recent) / len(recent)
            var = sum((x - mx) ** 2 for x, _ in recent)
            if var > 0:
                slope = sum((x - mx) * (y - my) for x, y in recent) / var
                trend = observed + max(slope, 0.0) * lead_s
    # the history is a step function (a sample where the demand changed): the windows whose extremes matter start
    # or end at a sample, and one that ends there starts on the value carried from before it
    rises = []
    for i, (t, d) in enumerate(history):
        after = [d, *(e for u, e in history[i + 1:] if (u - t).total_seconds() <= lead_s)]
        before = [e for u, e in history[:i] if (t - u).total_seconds() < lead_s]
        carried = next((e for u, e in reversed(history[:i]) if (t - u).total_seconds() >= lead_s), None)
        ending = [*(() if carried is None else (carried,)), *before, d]
        for window in (after, ending):
            if len(window) > 1 and min(window) > 0:
                rises.append(max(window) / min(window))
    rise = 1.0
    if len(rises) >= 2:
        rises.sort()
        rise = max(rises[min(len(rises) - 1, math.ceil(quantile * len(rises)) - 1)], 1.0)
    # a rise as large as the history's quantile, up to the history's peak or (a new high) the trend's: below a
    # peak seen, a steep trend (a burst's edge) rises to the peak, not past it
    trend = min(trend, observed * rise)
    older = max((d for t, d in history if now is not None and (now - t).total_seconds() > 2 * lead_s), default=0.0)
    if observed < (1 - NEW_HIGH) * peak or older >= (1 - NEW_HIGH) * observed:
        trend = min(trend, peak)  # below a peak seen, or as high as the load has been before: no new high
    spread = min(observed * rise, peak)
    return Forecast(max(observed, trend, spread), observed, trend, spread, peak, lead_s)


TPOT_SCALE_BOUNDS = (0.8, 4.0)
"""The calibration's range: a curve is trusted to within these factors of what runs."""
TPOT_SCALE_WEIGHT = 0.2
"""Weight of each observation in the smoothed calibration (about five control intervals' memory)."""
TPOT_SCALE_MIN_CONCURRENCY = 2.0
"""Below this many running requests per replica an observation says too little to calibrate by."""
TPOT_SCALE_QUEUE = 0.1
"""Waiting requests beyond this fraction of the running ones: a backlog, no observation to calibrate by."""
TPOT_SCALE_STEADY = 0.1
"""The demand moved by more than this fraction since the last observation: no calibration (its window mixes
requests that ran at other concurrencies)."""
TPOT_SCALE_FADE = 0.02
"""Without an observation to calibrate by, the calibration moves this fraction of the way back to 1 per plan."""


def _tpot_scale(pool: FleetPool, previous: float | None, steady: bool = True) -> float | None:
    """The pool's calibration after this observation: its requests' p95 TPOT over the curve's TPOT at the
    concurrency they ran at, smoothed. Only a pool serving without a queue, under a steady demand, says how its
    replicas run: requests that waited, or ran through a backlog, carry its TPOT, not the concurrency's; and
    while the demand moves, the requests finishing ran at another concurrency than the window's mean (higher as
    it falls, lower as it rises). Without such an observation the calibration holds, and fades back towards the
    curve once the pool carries no measurable load (a pool it has starved of traffic would never correct it)."""
    if not steady and previous is not None:
        return previous
    c, tpot = pool.observed_concurrency, pool.observed_tpot_p95_ms
    serving = pool.ready_replicas if pool.ready_replicas is not None else pool.current_replicas
    queued = (pool.requests_in_flight is not None and c is not None and math.isfinite(pool.requests_in_flight)
              and pool.requests_in_flight > c * max(serving, 1) * (1 + TPOT_SCALE_QUEUE) + 1)
    if not pool.curve or c is None or tpot is None or not (math.isfinite(c) and math.isfinite(tpot)) \
            or c < TPOT_SCALE_MIN_CONCURRENCY or tpot <= 0 or queued:
        return None if previous is None else 1.0 + (previous - 1.0) * (1 - TPOT_SCALE_FADE)
    seen = tpot / _Curve(pool.curve).tpot_ms(c)
    seen = min(max(seen, TPOT_SCALE_BOUNDS[0]), TPOT_SCALE_BOUNDS[1])
    return seen if previous is None else previous + TPOT_SCALE_WEIGHT * (seen - previous)


def _steady(history: Sequence[tuple[datetime, float]], arriving: float) -> bool:
    """Whether the demand is where the last observation saw it (within TPOT_SCALE_STEADY): a calibration's
    window then holds requests that ran at the concurrency it reports."""
    if not history or not math.isfinite(arriving):
        return True
    last = history[-1][1]
    return abs(arriving - last) <= TPOT_SCALE_STEADY * max(last, arriving, 1e-9)


def _change_budget(pool: str, previous: FleetState, now: datetime) -> list[datetime]:
    hour_ago = now - timedelta(hours=1)
    return [t for t in previous.changes.get(pool, ()) if hour_ago < t <= now]


def plan_fleet(pools: Sequence[FleetPool], demand: FleetDemand, settings: FleetSettings,
               previous: FleetState | None, now: datetime) -> FleetPlan:
    """Replicas and traffic share per pool for the fleet's lowest cost per token within the SLO."""
    if not pools:
        raise ValueError("the fleet planner needs at least one pool")
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise ValueError(f"pool names must be unique (got {names})")
    previous = previous or FleetState()
    total = demand_tokens_per_second(demand, settings)
    lead_s = max(p.lead_s for p in pools)
    history = previous.history
    forecast = None
    sized = total
    if settings.quantile is not None:
        # the history holds the arriving demand; a backlog (requests in flight beyond it) is sized for now only
        arriving = max(demand.tokens_per_second, 0.0) if math.isfinite(demand.tokens_per_second) else 0.0
        history = _remember(previous.history, now, arriving, settings)
        if demand.forecast_tokens_per_second is not None and math.isfinite(demand.forecast_tokens_per_second):
            told = max(demand.forecast_tokens_per_second, 0.0)
            forecast = Forecast(max(told, total), total, told, told, told, lead_s, told=True)
        else:
            forecast = forecast_demand(history, arriving, lead_s, settings.quantile)
            if total > forecast.tokens_per_second:
                forecast = dataclasses.replace(forecast, tokens_per_second=total)
            forecast = dataclasses.replace(forecast, observed=total)
        sized = forecast.tokens_per_second
    steady = _steady(previous.history, demand.tokens_per_second)
    scales = {p.name: _tpot_scale(p, previous.tpot_scale.get(p.name), steady) for p in pools if p.curve}
    scales = {n: v for n, v in scales.items() if v is not None}
    planned = [_planned(p, settings, scale=scales.get(p.name, 1.0)) for p in pools if p.curve]
    held = {p.name: _held_replicas(p) for p in pools if not p.curve}
    held_count = sum(held.values())
    # A pool the planner does not place takes its even per-pod share of the current fleet.
    current = sum(max(p.current_replicas, 0) for p in pools)
    share_held = min(1.0, held_count / current) if current and held_count else 0.0
    if held_count and not planned:
        share_held = 1.0
    held_load = total * share_held
    placed_demand = max(sized * (1 - share_held), 0.0)

    optimum = (_plan_gateway(planned, placed_demand) if settings.routing.weighted
               else _plan_service(planned, sized, held_count))
    feasible = optimum is not None
    if optimum is None:
        optimum = _serve_the_most(planned)
    incumbent = [previous.replicas.get(p.pool.name) for p in planned]
    kept = False
    if feasible and planned and all(n is not None for n in incumbent):
        fits = (_fits(planned, incumbent, placed_demand, Routing.GATEWAY) if settings.routing.weighted
                else _fits(planned, incumbent, sized, Routing.SERVICE, held_count))
        margin = 1 + max(settings.min_gain_percent, 0.0) / 100
        mix = 1 + max(settings.mix_change_percent, 0.0) / 100
        if fits:
            # A fitting incumbent gives way only to a plan that holds the demand with the margin to spare (an
            # optimum that holds it only just, at a replica boundary, is left again at the next small rise, and
            # the pools it starts and stops flap with the demand's jitter), and that is cheaper: by
            # min_gain_percent when it only scales down, by mix_change_percent when it starts replicas anywhere
            # (a swap of GPU types), as when the fleet grows.
            roomy = (_plan_gateway(planned, placed_demand * margin) if settings.routing.weighted
                     else _plan_service(planned, sized * margin, held_count))
            swap = roomy is not None and any(n > m for n, m in zip(roomy, incumbent, strict=True))
            if roomy is None or _cost(planned, incumbent) <= _cost(planned, roomy) * (mix if swap else margin) + 1e-9:
                optimum, kept = list(incumbent), True
            else:
                optimum = roomy
        else:
            grown = _grow(planned, incumbent, placed_demand, sized, held_count, settings.routing)
            if grown is not None and _cost(planned, grown) <= _cost(planned, optimum) * mix + 1e-9:
                optimum = grown

    targets: dict[str, ReplicaState] = {}
    replicas: dict[str, int] = dict(held)
    changes: dict[str, tuple[datetime, ...]] = {}
    changed: dict[str, str] = {}
    bound = settings.max_changes_per_hour
    for p, want in zip(planned, optimum, strict=True):
        state = previous.targets.get(p.pool.name, ReplicaState())
        current_n = max(p.pool.current_replicas, 0)
        step = plan_replicas(state, demand_concurrency=float(want), current_replicas=current_n,
                             capacity_per_replica=1.0, target_utilization_percent=100.0, min_replicas=p.lo,
                             max_replicas=p.hi, stabilization_seconds=settings.scale_down_stabilization_seconds,
                             now=now)
        n = step.replicas
        recent = _change_budget(p.pool.name, previous, now)
        if n < current_n and current_n <= p.hi and bound is not None and len(recent) + 2 > bound:
            changed[p.pool.name] = (f"scale-down to {n} waits: {len(recent)} change(s) in the last hour "
                                    f"(at most {bound:g}, one kept for a scale-up)")
            n = current_n
        elif n > current_n:
            changed[p.pool.name] = f"up from {current_n}" + (" for the forecast" if sized > total * (1 + 1e-9)
                                                              else " for the demand")
        elif n < current_n:
            changed[p.pool.name] = f"down from {current_n}: the forecast allows it"
        ramp = (n > current_n and recent and p.pool.ready_replicas is not None
                and p.pool.ready_replicas < current_n)
        if n != current_n and not ramp:
            # a scale-up while the last one's replicas are still starting extends it: a ramp planned over
            # consecutive reconciliations is one scaling, not one per step
            recent.append(now)
        if recent:
            changes[p.pool.name] = tuple(recent)
        targets[p.pool.name] = step.state
        replicas[p.pool.name] = n

    serving = {p.name: replicas[p.name] if p.ready_replicas is None else min(replicas[p.name], p.ready_replicas)
               for p in pools}
    if not any(serving[p.pool.name] * p.capacity for p in planned):
        serving = replicas  # nothing planned serves yet: the shares the replicas will carry once ready
    shares = _shares(pools, planned, serving, held, total, held_load, settings.routing)
    moved = any(abs(shares[n] - previous.shares.get(n, 0.0)) >= SHARE_MOVE for n in names) \
        if previous.shares else False
    placements = [_placement(p, planned, replicas, serving, optimum, shares, total, held, changed.get(p.name))
                  for p in pools]
    fleet_cost = sum(replicas[p.name] * p.cost_per_hour for p in pools)
    cost_per_mtok = fleet_cost / (3600.0 * total) * 1e6 if total > 0 else None
    state = FleetState(targets=targets, replicas={p.pool.name: n for p, n in zip(planned, optimum, strict=True)},
                       shares=shares, history=history, changes=changes, tpot_scale=scales)
    reason = _reason(placements, total, cost_per_mtok, feasible, kept, settings, forecast)
    return FleetPlan(routing=settings.routing, pools=tuple(placements), demand_tokens_per_second=total,
                     cost_per_hour=fleet_cost, cost_per_mtok=cost_per_mtok, slo_feasible=feasible,
                     shares_moved=moved, reason=reason, state=state, forecast=forecast)


def _shares(pools: Sequence[FleetPool], planned: Sequence[_Planned], replicas: Mapping[str, int],
            held: Mapping[str, int], total: float, held_load: float, routing: Routing) -> dict[str, float]:
    if not routing.weighted:
        count = sum(replicas.values())
        if count == 0:
            return {p.name: 1.0 / len(pools) for p in pools}
        return {p.name: replicas[p.name] / count for p in pools}
    held_share = held_load / total if total > 0 else (1.0 if not planned else 0.0)
    if not planned and held:
        held_share = 1.0
    shares = {}
    held_count = sum(held.values())
    for name, n in held.items():
        shares[name] = held_share * n / held_count if held_count else 0.0
    # a backlogged pool takes less new traffic while the others have room for it
    room = sum(replicas[p.pool.name] * p.capacity_concurrency - (p.pool.requests_in_flight or 0.0) for p in planned)
    weight = {p.pool.name: replicas[p.pool.name] * p.capacity
              * (_drain_factor(p, replicas[p.pool.name]) if room > 0 else 1.0) for p in planned}
    capacity = sum(weight.values())
    for p in planned:
        if capacity > 0:
            shares[p.pool.name] = (1 - held_share) * weight[p.pool.name] / capacity
        else:
            count = sum(replicas[q.pool.name] for q in planned)
            shares[p.pool.name] = (1 - held_share) * replicas[p.pool.name] / count if count else 0.0
    spare = 1.0 - sum(shares.values())
    if spare > 1e-12 or not math.isclose(sum(shares.values()), 1.0):
        # Nothing planned can take load (no replicas): what is left goes to the held pools, else evenly.
        takers = [n for n in shares if shares[n] > 0] or list(shares)
        for n in takers:
            shares[n] += spare / len(takers)
    return {p.name: shares[p.name] for p in pools}


def _drain_factor(p: _Planned, serving: int) -> float:
    """1, or the fraction of its planned concurrency a backlogged pool holds: with twice the requests in flight
    its serving replicas are planned for, it takes half its capacity's share of new traffic until they drain
    (at least a quarter: the observation lags, and a pool starved of traffic drains faster than it shows)."""
    in_flight = p.pool.requests_in_flight
    planned = serving * p.capacity_concurrency
    if in_flight is None or not math.isfinite(in_flight) or in_flight <= planned or planned <= 0:
        return 1.0
    return max(planned / in_flight, 0.25)


def _placement(pool: FleetPool, planned: Sequence[_Planned], replicas: Mapping[str, int],
               serving: Mapping[str, int], optimum: Sequence[int], shares: Mapping[str, float], total: float,
               held: Mapping[str, int], changed: str | None = None) -> PoolPlacement:
    n, share = replicas[pool.name], shares[pool.name]
    ready = max(serving[pool.name], 1)
    load = share * total
    cost = cost_per_million_tokens(pool.price_per_gpu_hour, pool.gpus_per_replica, load / n) \
        if n and load / n > 0 else None
    entry = next((p for p in planned if p.pool.name == pool.name), None)
    pct = f"{share:.0%}"
    price = f"${cost:.3f}/Mtok" if cost is not None else "no load"
    if entry is None:
        return PoolPlacement(pool.name, n, held[pool.name], share, load, None, None, None, cost, False, False,
                             f"{pool.name}: not profiled yet, keeps {n} replica(s) (its own autoscaling) and "
                             f"takes {pct} ({price})")
    target = optimum[planned.index(entry)]
    c = entry.curve.concurrency_for(load / ready, entry.curve.last * 4) if n and load > 0 else None
    tpot = entry.curve.tpot_ms(c) if c else None
    bound = pool.gpu_bound
    full = n >= entry.hi and total > 0
    if entry.capacity <= 0:
        words = (f"{pool.name} cannot meet the SLO at one request per replica: held at {n} "
                 f"(minReplicas), takes {pct}")
    elif n == 0:
        words = f"{pool.name} runs no replicas" + (": others carry the load for less" if share == 0 else "")
    elif target <= entry.lo and entry.lo > 0 and n <= entry.lo:
        words = f"{pool.name} held at minReplicas ({n}): {price} at the load it gets ({pct})"
    else:
        words = f"{pool.name} takes {pct} at {price} ({n} replica(s))"
    if full:
        if bound is not None and bound <= pool.max_replicas:
            words += (f"; full: all {pool.gpus_available} GPUs its nodes have are taken "
                      f"({n} x {pool.gpus_per_replica})")
        else:
            words += f"; full at maxReplicas ({pool.max_replicas})"
    if changed:
        words += f"; {changed}"
    if n > target and not (changed and "waits" in changed):
        words += f"; scaling down to {target} after the stabilisation window"
    return PoolPlacement(pool.name, n, target, share, load, c, tpot, entry.capacity, cost, True, full, words)


def _reason(placements: Sequence[PoolPlacement], total: float, cost_per_mtok: float | None, feasible: bool,
            kept: bool, settings: FleetSettings, forecast: Forecast | None = None) -> str:
    head = (f"fleet ${cost_per_mtok:.3f}/Mtok at {total:.0f} tok/s ({settings.routing.value} routing)"
            if cost_per_mtok is not None else f"no demand ({settings.routing.value} routing)")
    if forecast is not None and forecast.tokens_per_second > total * (1 + 1e-9):
        head += f"; {forecast.words()}"
    if not feasible:
        idle = [p.name for p in placements if p.planned and (p.capacity_tokens_per_second or 0) <= 0]
        head += ("; the demand exceeds what every allowed replica holds within the SLO: every pool that can meet "
                 "it runs at its maximum" + (f" (not {', '.join(idle)}: it cannot meet the SLO at any load, so it "
                                            "stays at its minimum)" if idle else ""))
    elif kept:
        head += f"; previous placement kept (within {settings.min_gain_percent:g}% of the optimum)"
    ordered = sorted(placements, key=lambda p: -p.share)
    return head + ": " + "; ".join(p.reason for p in ordered)


def route_weights(shares: Mapping[str, float], scale: int = 1000) -> dict[str, int]:
    """HTTPRoute backendRefs weights for the shares: integers summing to `scale` (largest remainder), 0 for a
    pool that takes nothing."""
    if scale < 1:
        raise ValueError(f"scale must be >= 1 (got {scale})")
    total = sum(max(s, 0.0) for s in shares.values())
    if total <= 0:
        return {name: 0 for name in shares}
    raw = {name: max(s, 0.0) / total * scale for name, s in shares.items()}
    weights = {name: int(math.floor(v)) for name, v in raw.items()}
    rest = scale - sum(weights.values())
    for name in sorted(raw, key=lambda n: (-(raw[n] - weights[n]), n))[:rest]:
        weights[name] += 1
    return weights
