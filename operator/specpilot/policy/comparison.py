"""The comparison a pool's method choice is made from (policy.choose): one row per candidate and the baseline
(`CandidatePlan`), what deploying each changes against no speculation (`DeployCase`), the load the rows are
weighed over (`WeighedLoad`), and the outcome (`PoolPlan`). Pure data, shared by the selection, its reason's
words (policy.choose_reasons) and the capacity and load checks (policy.load_checks)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..api.deployment_spec import Strategy
from ..api.deployment_status import Decision
from .schedule import SchedulePlan

__all__ = ["CandidatePlan", "DeployCase", "PoolPlan", "WeighedLoad", "gain_margin"]


@dataclasses.dataclass(frozen=True)
class DeployCase:
    """What deploying a method changes against no speculation, over the weighed load (see `choose._deploy_case`).

    Each load point is on (the plan speculates there) or off (scheduled off: the method stays loaded, so the
    engine pays the drafter's prefill and its share of KV memory). `gain` is the weighted gain over no
    speculation where on, `cost` the weighted loss where off, both as shares of the total weight, with
    standard errors (None where the surface has no estimate of its noise)."""

    gain: float
    gain_se: float | None
    cost: float
    cost_se: float | None
    share_on: float
    """Share of the weight where the plan speculates."""
    points_on: int
    points: int
    held: bool | None = None
    """The first sweep's verdict, held because refinement moved neither figure beyond its uncertainty
    (`choose._held`); None: the verdict is this case's own."""

    @property
    def net(self) -> float:
        """The weighted mean gain over no speculation: what deploying changes, all in all."""
        return self.gain - self.cost

    @property
    def gain_where_on(self) -> float:
        """The mean gain where the plan speculates (0 where it never does)."""
        return self.gain / self.share_on if self.share_on > 0 else 0.0

    @property
    def gain_where_on_se(self) -> float | None:
        return None if self.gain_se is None or self.share_on <= 0 else self.gain_se / self.share_on

    @property
    def cost_where_off(self) -> float:
        """The mean loss where the plan is off (0 where it is never off)."""
        off = 1.0 - self.share_on
        return self.cost / off if off > 1e-12 else 0.0

    @property
    def cost_where_off_se(self) -> float | None:
        off = 1.0 - self.share_on
        return None if self.cost_se is None else (self.cost_se / off if off > 1e-12 else 0.0)

    def pays(self, margin: float) -> bool:
        """The deploy test: the gain where the plan speculates beats the cost where it does not by `margin`
        (the minimum gain, a share) of the load it speculates on; no gain anywhere never pays, ties stay off."""
        if self.share_on <= 0:
            return False
        return self.held if self.held is not None else self.net > margin * self.share_on

    def loses(self, margin: float) -> bool:
        """A served method goes when no speculation beats it by `margin` over the whole load: the hysteresis
        band, wider than the deploy test's, so that a load swaying around the crossover rolls no pods."""
        return (1.0 + self.net) * (1.0 + margin) < 1.0


@dataclasses.dataclass(frozen=True)
class CandidatePlan:
    """One row of the comparison: a candidate (or the baseline) on this pool."""

    key: str
    method: str | None
    ready: bool
    note: str = ""
    strategy: Strategy = Strategy.DYNAMIC
    num_speculative_tokens: int = 0
    schedule: SchedulePlan | None = None
    crossover_concurrency: int | None = None
    crossover_gain_se: float | None = None
    """Relative standard error of the gain at the crossover (see SchedulePlan.crossover_gain_se)."""
    kv_max_concurrency: int | None = None
    expected_goodput_tok_s: float | None = None
    cost_per_mtok: float | None = None
    capacity_concurrency: float | None = None
    tpot_ms_at: Callable[[float], float] | None = dataclasses.field(default=None, compare=False, repr=False)
    """TPOT (ms) the option runs at with c concurrent requests per replica: what the replica planner scales
    the observed demand by (policy.planner)."""
    deploy: DeployCase | None = None
    """What deploying the option changes against no speculation over the weighed load (the deploy test)."""

    @property
    def crossover_uncertainty_percent(self) -> float | None:
        """crossover_gain_se in percent, as the decision and the plan report it."""
        return None if self.crossover_gain_se is None else round(self.crossover_gain_se * 100, 2)


@dataclasses.dataclass(frozen=True)
class PoolPlan:
    """The decision for a pool, the table behind it and the SLO-feasible concurrency per replica."""

    decision: Decision
    candidates: tuple[CandidatePlan, ...]
    capacity_concurrency_per_replica: float | None


@dataclasses.dataclass(frozen=True)
class WeighedLoad:
    """The load a decision weighs: (concurrency per replica, weight) points, and how it was known."""

    points: tuple[tuple[float, float], ...]
    words: str
    per_level: bool = False
    """No load known: the points are the first sweep's levels, each weighing alike on the relative gain."""


def gain_margin(min_gain_percent: float) -> float:
    """Factor by which a method must beat no speculation: the minimum gain, 0.1% at least (ties stay off)."""
    return 1.0 + max(1e-3, min_gain_percent / 100.0)

