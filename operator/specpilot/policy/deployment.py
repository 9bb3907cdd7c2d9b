"""The deployment's roll-up of its pools (pure): phase and progress from its profiles, the one-line decision
summary, the concurrency its replicas see, and its cost per token (the fleet's when placed across pools, else the
cheapest decided pool's)."""

from __future__ import annotations

from datetime import datetime

from ..api.deployment_status import HISTORY_LIMIT, HistoryEntry, PoolStatus, SpeculativeDeploymentStatus
from ..api.schedule import summary as schedule_summary
from .events import Event
from .profiling import Rollup

__all__ = ["decision_changed", "decision_summary", "decision_text", "fleet_capacity", "summarize"]


def summarize(status: SpeculativeDeploymentStatus, counted: Rollup, generation: int | None) -> None:
    """Fill the deployment-level fields of `status` (its pools and fleet already planned)."""
    status.phase = counted.phase
    status.progress = counted.progress
    status.observed_generation = generation
    status.decision_summary = decision_summary(status.pools)
    observed = [p.observed.concurrency for p in status.pools if p.observed and p.observed.concurrency is not None]
    status.observed_concurrency = round(sum(observed) / len(observed), 2) if observed else None
    costs = [p.decision.cost_per_mtok_with_sd for p in status.pools
             if p.decision and p.decision.cost_per_mtok_with_sd]
    status.cost_per_mtok = round(min(costs), 4) if costs else None
    if status.fleet is not None and status.fleet.cost_per_mtok is not None:
        status.cost_per_mtok = status.fleet.cost_per_mtok


def decision_text(pool: PoolStatus) -> str:
    d = pool.decision
    if d is None:
        return "pending"
    if not d.method:
        return "off"
    if d.schedule:
        return f"{d.method}[{schedule_summary(d.schedule)}]"
    return f"{d.method}[k={d.num_speculative_tokens},{'on' if pool.speculation_enabled else 'off'}]"


def decision_summary(pools: list[PoolStatus]) -> str:
    return " ".join(f"{p.name}={decision_text(p)}" for p in pools)


def decision_changed(status: SpeculativeDeploymentStatus, old: PoolStatus, pool: PoolStatus,
                     now: datetime) -> Event | None:
    """A new method or schedule of `pool` goes to the deployment's bounded history; returns its DecisionChanged
    Event (None: the decision stands)."""
    new_method = pool.decision.method if pool.decision else None
    if new_method == (old.decision.method if old.decision else None) and not (
            pool.decision and old.decision and pool.decision.schedule_summary != old.decision.schedule_summary):
        return None
    change = f"{decision_text(old)} -> {decision_text(pool)}"
    reason = pool.decision.reason if pool.decision else ""
    entry = HistoryEntry(time=now, pool=pool.name, change=change, reason=reason)
    status.history = [*status.history, entry][-HISTORY_LIMIT:]
    return Event("Normal", "DecisionChanged", f"pool {pool.name}: {change}: {reason}")


def fleet_capacity(status: SpeculativeDeploymentStatus, was_short: bool) -> tuple[tuple[bool, str, str] | None,
                                                                              Event | None]:
    """Condition FleetCapacity from the fleet's placement: whether every allowed replica together holds the
    observed demand within the SLO (None: no placement, fewer than two pools or no demand seen), and one
    Warning Event when it starts falling short."""
    fleet = status.fleet
    if fleet is None or fleet.slo_feasible is None:
        return None, None
    if fleet.slo_feasible:
        return (True, "WithinCapacity", "the fleet's placement holds the observed demand within the SLO"), None
    message = (f"{fleet.reason}. Raise spec.serving.maxReplicas or a pool's maxReplicas, add GPU nodes to the pools, "
               f"or loosen the SLO")
    return (False, "DemandBeyondCapacity", message), \
        (None if was_short else Event("Warning", "FleetCapacityShort", message))
