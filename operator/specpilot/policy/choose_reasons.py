"""A pool's method decision (policy.choose) in words: the Decision record of the row chosen, with the reason
that says what it beats, by how much, at which load, and what the deploy test weighed; and the decision when
there is none to make from profiles yet."""

from __future__ import annotations

from datetime import datetime

from ..api.deployment_spec import Objective, Strategy
from ..api.deployment_status import Decision
from ..api.schedule import summary
from .comparison import CandidatePlan, DeployCase, PoolPlan, WeighedLoad

__all__ = ["decision_for", "no_data", "percent_over"]


def percent_over(a: float, b: float) -> str:
    return f"{(a / b - 1) * 100:+.0f}%"


def _signed(share: float) -> str:
    """A share in percent with its sign, one decimal (+0.0% for a rounding residue of either sign)."""
    percent = round(share * 100, 1)
    return f"{percent if percent != 0 else 0.0:+.1f}%"


def _se(value: float | None) -> str:
    return "" if value is None else f" (±{value * 100:.1f}%)"


def _deploy_words(case: DeployCase, load: WeighedLoad) -> str:
    """What the deploy test weighed, in words: the gain where the plan speculates, the cost where it does not."""
    where = (f"at {case.points_on} of {case.points} levels" if load.per_level
             else f"over {case.share_on:.0%} of the load")
    words = f"{_signed(case.gain_where_on)}{_se(case.gain_where_on_se)} where it speculates ({where})"
    if case.share_on < 1.0 - 1e-9:
        words += f", {_signed(-case.cost_where_off)}{_se(case.cost_where_off_se)} where it is scheduled off"
    if case.held is not None:
        words += ("; as the first sweep decided: refinement moved neither by more than its uncertainty")
    return words


def decision_for(chosen: CandidatePlan, rows: list[CandidatePlan], base_expected: float, load: WeighedLoad,
                 source: str, now: datetime, objective: str, min_gain_percent: float) -> Decision:
    baseline = rows[0]
    load_words = load.words
    ranked = sorted((r for r in rows[1:] if r.ready and r.expected_goodput_tok_s),
                    key=lambda r: -r.expected_goodput_tok_s)
    not_ready = [r.key for r in rows[1:] if not r.ready]
    tail = f"; not ready: {', '.join(not_ready)}" if not_ready else ""
    if chosen is baseline:
        if ranked:
            best = ranked[0]
            reason = (f"no speculation: the best candidate, {best.key}, gets "
                      f"{percent_over(best.expected_goodput_tok_s, base_expected)} goodput at the {load_words}")
            case = best.deploy
            if case is not None and case.share_on > 0:
                reason += f": {_deploy_words(case, load)}"
            elif case is not None:
                reason += ", where its schedule never speculates"
            if min_gain_percent > 0.1 and best.expected_goodput_tok_s > base_expected:
                reason += (f" (a method must beat no speculation by {min_gain_percent:g}% where it speculates, "
                           f"net of what it costs where it is off)")
            reason += tail
        else:
            reason = f"no speculation: no candidate has a usable profile yet{tail}"
        return Decision(method=None, num_speculative_tokens=0, schedule=[], schedule_summary="",
                        strategy=Strategy.DYNAMIC, crossover_concurrency=None,
                        cost_per_mtok_with_sd=baseline.cost_per_mtok, cost_per_mtok_without_sd=baseline.cost_per_mtok,
                        expected_speedup=1.0, source="profile" if ranked else "none", reason=reason, decided_at=now)
    others = [r for r in ranked if r.key != chosen.key]
    if others:
        lead = (f"{chosen.key} beats {others[0].key} by "
                f"{(chosen.expected_goodput_tok_s / others[0].expected_goodput_tok_s - 1) * 100:.0f}% goodput")
    else:
        lead = f"{chosen.key} is the only ready candidate"
    reason = (f"{lead} at the {load_words} ({percent_over(chosen.expected_goodput_tok_s, base_expected)} "
              f"over no speculation")
    if chosen.deploy is not None and (load.per_level or chosen.deploy.held is not None):
        reason += f": {_deploy_words(chosen.deploy, load)}"
    reason += ")"
    if objective == Objective.COST.value and chosen.cost_per_mtok:
        reason += f", ${chosen.cost_per_mtok:.3g}/Mtok"
    if chosen.crossover_concurrency is not None:
        reason += f"; SD off above {chosen.crossover_concurrency} concurrent requests"
        if chosen.crossover_gain_se is not None:
            reason += f" (its gain there known to ±{chosen.crossover_gain_se * 100:.1f}%)"
    if chosen.strategy == Strategy.RESTART:
        reason += f"; restart strategy: k={chosen.num_speculative_tokens}, toggled by rollout around the crossover"
    reason += tail
    dynamic = chosen.strategy == Strategy.DYNAMIC
    ranges = list(chosen.schedule.ranges) if dynamic and chosen.schedule else []
    return Decision(method=chosen.key, num_speculative_tokens=chosen.num_speculative_tokens, schedule=ranges,
                    schedule_summary=summary(ranges) if ranges else "", strategy=chosen.strategy,
                    crossover_concurrency=chosen.crossover_concurrency,
                    crossover_uncertainty_percent=chosen.crossover_uncertainty_percent,
                    cost_per_mtok_with_sd=chosen.cost_per_mtok, cost_per_mtok_without_sd=baseline.cost_per_mtok,
                    expected_speedup=chosen.expected_goodput_tok_s / base_expected, source=source, reason=reason,
                    decided_at=now)


def no_data(now: datetime, reason: str) -> PoolPlan:
    return PoolPlan(decision=Decision(method=None, source="none", reason=reason, decided_at=now),
                    candidates=(), capacity_concurrency_per_replica=None)
