"""The fleet simulator's observation/actuation connector for the operator's pool planner.

The operator's decision is one pure function, `policy.plan.plan_deployment`: a snapshot (spec, previous
status, profiles, each pool's latest `PoolObservation`, its Deployment's replicas and rollout, now) to the next
status and the actions that make it real (for a pool, `ApplyDeployment` with its `Serve`: method, K, schedule,
replicas). Around it sit connectors, as Dynamo's planner has one per platform: the Kubernetes one is the
controller (`controller.reconcile` reads Prometheus or the pods into a `PoolObservation` and applies `Serve` to
the pool's Deployment); this is the simulated one. It turns the simulator's `Observation` into the
`PoolObservation` the observer would report, and a `Serve` into the simulator's `Action` and engine `Mode`
(what vLLM does with the `--speculative-config` the Deployment would carry).

What the simulator does not model is left empty, as the observer reports it when unmeasured: acceptance
counters (so live-acceptance drift never triggers), generation throughput, TPOT percentiles, KV usage.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from ..api.schedule import k_at
from ..observe.model import PoolObservation
from ..policy.planner import Serve
from .fleet import Action, Mode, Observation

__all__ = ["EPOCH", "SimulatedConnector", "load_observation"]

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
"""Wall-clock time of the trace's second 0."""


@dataclasses.dataclass
class SimulatedConnector:
    """Observation in, actuation out, for one simulated pool.

    `modes` grows as the planner asks for engine configurations it has not asked for before; the fleet
    takes new modes up when they are first asked for. `off_name` names the engine without a drafter;
    `on_name` the first speculative configuration (later ones are named by method and K)."""

    max_num_seqs: int
    off_name: str = "no-sd"
    on_name: str | None = None
    epoch: datetime = EPOCH
    modes: dict[str, Mode] = dataclasses.field(default_factory=dict)
    _by_config: dict[tuple, str] = dataclasses.field(default_factory=dict)

    def at(self, t_s: float) -> datetime:
        return self.epoch + timedelta(seconds=t_s)

    def observe(self, observation: Observation) -> PoolObservation:
        """What the operator's observer would report of the fleet over the observation window."""
        return load_observation(observation.serving_replicas, observation.running_per_replica, observation.waiting,
                                self.at(observation.t_s), observation.window_s, observation.concurrency_histogram)

    def mode(self, serve: Serve) -> Mode:
        """The engine mode `serve` runs: the method's drafter loaded and vLLM's K at each batch size (its
        schedule, capped at K, gaps carrying the previous K), or the engine without a drafter."""
        if serve.method is None or not serve.num_speculative_tokens:
            config: tuple = (None,)
            k = (0,) * self.max_num_seqs
        else:
            top = serve.num_speculative_tokens
            if serve.schedule:
                k = tuple(k_at(serve.schedule, b, top) for b in range(1, self.max_num_seqs + 1))
            else:
                k = (top,) * self.max_num_seqs
            config = (serve.method.method, k)
        name = self._by_config.get(config)
        if name is None:
            if config == (None,):
                name = self.off_name
            elif self.on_name is not None and not any(m.speculative for m in self.modes.values()):
                name = self.on_name
            else:
                name = f"{serve.method.key} k={_k_words(k)}"
            self._by_config[config] = name
            self.modes[name] = Mode(name, config != (None,), k, method=config[0])
        return self.modes[name]

    def actuate(self, serve: Serve, current_replicas: int) -> Action:
        """The simulator's action for `serve`: its mode, and its replicas (the current ones when the planner
        leaves them to someone else)."""
        replicas = serve.replicas if serve.replicas is not None else current_replicas
        return Action(replicas, self.mode(serve).name)


def load_observation(serving: int, running_per_replica: float, waiting: float, at: datetime, window_s: float,
                     histogram: Sequence[tuple[float, float]], tokens_per_second: float | None = None,
                     tpot_p95_ms: float | None = None) -> PoolObservation:
    """A pool's load as the operator's observer reports it over a window (`waiting`: the pool's queued requests),
    without what a simulation does not measure (acceptance counters, KV usage; throughput and TPOT unless given)."""
    return PoolObservation(
        replicas_reporting=serving, running_per_replica=running_per_replica,
        waiting_per_replica=waiting / max(serving, 1), total_running=running_per_replica * serving,
        total_waiting=waiting, generation_tokens_per_second=tokens_per_second, tpot_p95_ms=tpot_p95_ms,
        acceptance_per_position=[], drafts_per_step=None, mean_acceptance_length=None, kv_cache_usage=None,
        observed_at=at, window_s=window_s, concurrency_histogram=list(histogram))


def _k_words(k: tuple[int, ...]) -> str:
    """`4` for a constant K, else ranges as the schedule summary writes them: `1-13:4,14-58:3,59+:0`."""
    if len(set(k)) == 1:
        return str(k[0])
    parts, start = [], 1
    for b in range(1, len(k) + 1):
        if b == len(k) or k[b] != k[b - 1]:
            parts.append(f"{start}-{b}:{k[b - 1]}" if b < len(k) else f"{start}+:{k[b - 1]}")
            start = b + 1
    return ",".join(parts)
