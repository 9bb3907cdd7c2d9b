"""How each placement policy of the fleet simulator (`sim.mixed`) decides at a control tick.

- `OperatorPlacement`: specpilot (`specpilot`, `specpilot-service`, and the `oracle`, which is told the demand
  instead of forecasting it). The operator's own decision, `policy.plan.plan_deployment`, on a
  `sim.cluster.VirtualCluster` of the whole fleet: one SpeculativeDeployment whose pools are the scenario's, on
  nodes with the pools' GPUs, with the profiles the simulator measured on the twin accepted. At each tick it gets
  the pools' observations as the operator's observer reports them and how many replicas of each pool serve, and it
  returns what the plan applied: each pool's replicas and engine configuration (its `Serve`: method, K, schedule),
  the traffic shares (`status.pools[].trafficShare`), the fleet's planned $/Mtok and reason. Nothing of the
  decision is the simulator's: every pool's planner (decision, schedule, re-decision on load), fleet placement,
  its demand (the pools' observed output tokens/s plus requests in flight), forecast, lead time (measured from the
  Deployments' readiness), TPOT calibration and keep-or-swap rule are the operator's, carried in the status.
- `EvenSplit`: today's alternative (`even-split`, `even-split-hpa`), a reference, not specpilot: one Service (an
  even split per pod) and every pool scaled alone by `policy.replicas.plan_replicas` on the load the split gives
  it (`policy.fleet.even_split_replicas`), engines on each pool's decision.
- `NoSdOptimiser`: an SD-unaware cost optimiser (`cost-optimal-no-sd`, AIBrix-style), a reference: the fleet
  planner's cost search (`policy.fleet.plan_fleet`) with free weights on the pools' curves without speculation,
  served without speculation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta

from ..api.deployment_spec import SpeculativeDeploymentSpec
from ..api.deployment_status import PoolStatus
from ..observe.model import PoolObservation
from ..policy.fleet import FleetDemand, FleetPool, FleetSettings, FleetState, Routing, even_split_replicas, plan_fleet
from ..policy.placement import pool_curve
from ..policy.plan import ApplyDeployment
from ..policy.planner import Serve
from ..policy.pools import GPU_PRODUCT_LABEL
from ..policy.replicas import ReplicaState, plan_replicas
from .cluster import VirtualCluster
from .connector import SimulatedConnector, load_observation
from .fleet import Mode
from .joining import JOINING_LABEL as POOL_LABEL

__all__ = ["EvenSplit", "NoSdOptimiser", "OperatorPlacement", "PoolReading", "Tick", "fleet_spec"]


@dataclasses.dataclass(frozen=True)
class PoolReading:
    """What one pool's metrics show at a tick, over the observation window."""

    tokens_per_second: float
    """Output tokens/s of the requests the pool was sent (its arrivals x the mean output length)."""
    running: float
    """Running requests summed over the serving replicas."""
    waiting: float
    serving: int
    """Replicas serving (ready)."""
    rolling_out: bool = False
    concurrency_histogram: tuple[tuple[float, float], ...] = ()
    tpot_p95_ms: float | None = None


@dataclasses.dataclass(frozen=True)
class Tick:
    """What a placement decided at one tick."""

    replicas: dict[str, int]
    shares: dict[str, float]
    cost_per_mtok: float | None
    reason: str
    modes: dict[str, str]
    """Pool -> the engine mode its replicas run (a name in the placement's `modes(pool)`)."""


def fleet_spec(pools: Sequence[dict], model_id: str, tensor_parallel_size: int, candidates: Sequence[dict],
               routing: Routing, slo_tpot_ms: float, slo_ttft_ms: float | None) -> SpeculativeDeploymentSpec:
    """The SpeculativeDeployment of a simulated fleet: `pools` (name, sku, price, min and max replicas), each on the
    nodes labelled with its name; `candidates` as the spec lists them; internal autoscaling under `routing`; the
    profiles it finds are accepted as measured, so refinement is off (`refineBudgetPercent: 0`)."""
    return SpeculativeDeploymentSpec.model_validate({
        "model": {"id": model_id, "tensorParallelSize": tensor_parallel_size},
        "gpuPools": [{"name": p["name"], "nodeSelector": {POOL_LABEL: p["name"]},
                      "pricePerGpuHour": p["price"], "minReplicas": p["min"], "maxReplicas": p["max"]}
                     for p in pools],
        "methods": list(candidates),
        "profiling": {"refineBudgetPercent": 0},
        "policy": {"tpotSloMs": slo_tpot_ms, **({"ttftSloMs": slo_ttft_ms} if slo_ttft_ms else {})},
        "serving": {"autoscaling": "internal", "routing": routing.value,
                    "minReplicas": 0, "maxReplicas": max(p["max"] for p in pools),
                    **({"gateway": {"parentRefs": [{"name": "gateway"}]}} if routing == Routing.GATEWAY else {})}})


class OperatorPlacement:
    """specpilot's placement: `plan_deployment` on a virtual cluster of the fleet (see the module's docstring)."""

    def __init__(self, spec: SpeculativeDeploymentSpec, skus: Mapping[str, str], gpus: Mapping[str, int],
                 profiles: Mapping[str, dict[str, dict]], max_num_seqs: int, window_s: float) -> None:
        """`skus`, `gpus`: each pool's GPU type and GPUs; `profiles`: each pool's profile bodies by key (baseline and
        the candidates'); `window_s`: the metrics window each observation covers."""
        self.cluster = VirtualCluster(spec=spec, name="fleet")
        self.skus, self.gpus, self.profiles = dict(skus), dict(gpus), dict(profiles)
        self.connectors = {p.name: SimulatedConnector(max_num_seqs) for p in spec.gpu_pools}
        self.window_s = window_s
        self.mode_of: dict[str, str] = {}
        self.lead_time_s: float | None = None

    # --- the simulated cluster --------------------------------------------------------------------------------

    def join(self, pool: str) -> None:
        """The pool's node appears, its profiles measured and accepted: it is placed from the next tick."""
        self.cluster.add_node(f"{pool}-node", {POOL_LABEL: pool, GPU_PRODUCT_LABEL: self.skus[pool]},
                              self.gpus[pool])
        self.cluster.accept(pool, self.profiles[pool])

    def joined(self, pool: str) -> bool:
        return any(n.labels.get(POOL_LABEL) == pool for n in self.cluster.nodes)

    def warm(self, history: Sequence[tuple[datetime, float]], lead_time_s: float | None) -> None:
        """A deployment that has served before the trace: its metrics hold `history` (what the operator reads from
        Prometheus when its status keeps none), and each pool's scale-up lead time was measured (`lead_time_s`,
        None: not yet)."""
        self.cluster.demand_history = tuple(history)
        self.lead_time_s = lead_time_s

    def modes(self, pool: str) -> dict[str, Mode]:
        return self.connectors[pool].modes

    def start(self, now: datetime, tokens_per_second: float, histograms: Mapping[str, Sequence[tuple[float, float]]],
              interval_s: float) -> Tick:
        """The deployment as the trace finds it, one that has served that load for long: reconciled before the
        trace to create its Deployments, then on what its metrics show at the trace's start (`tokens_per_second`
        of demand spread over the pools that run, each pool's running requests per replica as `histograms`, what
        its Prometheus history shows) until it asks for no more than runs, every replica ready; then the trace's
        first tick. `interval_s`: the control interval."""
        before = [now - timedelta(seconds=interval_s * k) for k in (3, 2, 1)]
        self.cluster.reconcile(before[0])
        for at in (*before[1:], now):
            for pool, deployment in self.cluster.deployments.items():
                self.cluster.set_ready(pool, int(deployment["spec"]["replicas"]))
            tick = self.step(at, self._warm_readings(tokens_per_second, histograms), None)
        # the replicas found running were asked for long ago: no scale-up is pending, none counts as a recent
        # change; each pool's start-up took the lead time known
        lead = [self.lead_time_s] if self.lead_time_s is not None else []
        self.cluster.status.pools = [p.model_copy(update={
            "scale_up_started_at": None, "scale_up_to": None, "scale_up_lead_times": lead, "fleet_changes": []})
            for p in self.cluster.status.pools]
        return tick

    def _warm_readings(self, tokens_per_second: float,
                       histograms: Mapping[str, Sequence[tuple[float, float]]]) -> dict[str, PoolReading]:
        serving = {pool: int(d["spec"]["replicas"]) for pool, d in self.cluster.deployments.items()}
        running_pools = max(sum(1 for n in serving.values() if n > 0), 1)
        readings = {}
        for pool, replicas in serving.items():
            histogram = tuple(histograms.get(pool) or ()) if replicas else ()
            running = replicas * sum(c * w for c, w in histogram)
            readings[pool] = PoolReading(tokens_per_second / running_pools if replicas else 0.0, running, 0.0,
                                         replicas, concurrency_histogram=histogram)
        return readings

    def step(self, now: datetime, readings: Mapping[str, PoolReading], told: float | None) -> Tick:
        """One reconciliation on the pools' readings (`told`: the demand the oracle is told, tokens/s)."""
        for pool, reading in readings.items():
            if pool in self.cluster.deployments:
                self.cluster.set_ready(pool, reading.serving, reading.rolling_out)
            self.cluster.observe(pool, self._observation(reading, now))
        self.cluster.forecast_tokens_per_second = told
        plan = self.cluster.reconcile(now)
        for action in plan.of(ApplyDeployment):
            self.mode_of[action.pool] = self.connectors[action.pool].mode(action.serve).name
        replicas, shares = {}, {}
        statuses = {p.name: p for p in plan.status.pools}
        for pool in self.connectors:
            deployment = self.cluster.deployments.get(pool)
            replicas[pool] = int(deployment["spec"]["replicas"]) if deployment and self.joined(pool) else 0
            status = statuses.get(pool)
            shares[pool] = status.traffic_share if status is not None and status.traffic_share is not None else None
        shares = _shares(shares, replicas, readings)
        fleet = plan.status.fleet
        self.mode_of = {pool: self.mode_of.get(pool) or self.connectors[pool].mode(_OFF).name
                        for pool in self.connectors}
        return Tick(replicas, shares, fleet.cost_per_mtok if fleet is not None else None,
                    fleet.reason if fleet is not None else "one pool", dict(self.mode_of))

    def pools(self) -> list[FleetPool]:
        """The pools as the fleet planner last saw them (their decided curves), for a fluid model of the fleet."""
        statuses = {p.name: p for p in self.cluster.status.pools}
        views = []
        for pool in self.cluster.spec.gpu_pools:
            status = statuses.get(pool.name) or PoolStatus(name=pool.name)
            views.append(FleetPool(pool.name, pool.price_per_gpu_hour, self.cluster.spec.model.tensor_parallel_size,
                                   0, pool.max_replicas or 0, pool_curve(status),
                                   status.capacity_concurrency_per_replica))
        return views

    def _observation(self, reading: PoolReading, now: datetime) -> PoolObservation:
        serving = max(reading.serving, 0)
        return load_observation(serving, reading.running / serving if serving else 0.0, reading.waiting, now,
                                self.window_s, reading.concurrency_histogram, reading.tokens_per_second,
                                reading.tpot_p95_ms)


_OFF = Serve(method=None, num_speculative_tokens=None, schedule=None, replicas=0)
"""The engine without a drafter: the mode of a pool that serves nothing yet."""


def _shares(planned: Mapping[str, float | None], replicas: Mapping[str, int],
            readings: Mapping[str, PoolReading]) -> dict[str, float]:
    """The traffic split as routing makes it real: the plan's shares where it placed the fleet; else (one Service,
    no placement yet) an even split per serving pod."""
    if any(s is not None for s in planned.values()):
        total = sum(s or 0.0 for s in planned.values())
        return {n: (s or 0.0) / total if total > 0 else 0.0 for n, s in planned.items()}
    return per_pod_split(replicas, {n: min(replicas[n], readings[n].serving) if n in readings else replicas[n]
                                    for n in replicas})


def per_pod_split(replicas: Mapping[str, int], serving: Mapping[str, int]) -> dict[str, float]:
    """One Service's split: each pool's share is its part of the serving pods (of the replicas asked for while none
    serves; even while there are none)."""
    count = sum(serving.values()) or sum(replicas.values())
    basis = serving if sum(serving.values()) else replicas
    return {n: basis[n] / count if count else 1 / len(replicas) for n in replicas}


@dataclasses.dataclass
class EvenSplit:
    """Today's routing (a reference): one Service, every pool autoscaled alone on the share it gets."""

    pools: Sequence[FleetPool]
    settings: FleetSettings
    mode_names: Mapping[str, str]
    windows: dict[str, ReplicaState] = dataclasses.field(default_factory=dict)
    current: dict[str, int] = dataclasses.field(default_factory=dict)

    def step(self, first: bool, now: datetime, pools: Sequence[FleetPool], demand: FleetDemand,
             ready: Mapping[str, int]) -> Tick:
        wanted = even_split_replicas(pools, demand, self.settings)
        for v in pools:
            window = self.windows.get(v.name, ReplicaState())
            current = self.current.get(v.name, wanted[v.name]) if not first else wanted[v.name]
            step = plan_replicas(window, float(wanted[v.name]), current, 1.0, 100.0, min(max(v.lower, 1), v.upper),
                                 v.upper, self.settings.scale_down_stabilization_seconds, now)
            self.windows[v.name], self.current[v.name] = step.state, step.replicas
        serving = {n: min(c, ready.get(n, c)) if not first else c for n, c in self.current.items()}
        return Tick(dict(self.current), per_pod_split(self.current, serving), None, "even split",
                    dict(self.mode_names))


@dataclasses.dataclass
class NoSdOptimiser:
    """An SD-unaware cost optimiser (a reference): the fleet planner's search on curves without speculation."""

    settings: FleetSettings
    mode_names: Mapping[str, str]
    state: FleetState | None = None

    def step(self, now: datetime, pools: Sequence[FleetPool], demand: FleetDemand) -> Tick:
        result = plan_fleet(pools, demand, self.settings, self.state, now)
        self.state = result.state
        return Tick({p.name: p.replicas for p in result.pools}, {p.name: p.share for p in result.pools},
                    result.cost_per_mtok, result.reason, dict(self.mode_names))
