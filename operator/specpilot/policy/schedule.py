"""The speculation schedule of one method: the best k at every batch size 1..max_batch_size, as vLLM ranges.

At each concurrency c: among the k whose TPOT meets the SLO, the one with the highest goodput G_k(c), taking
k > 0 only when it beats k = 0 by `min_gain_percent` (the noise guard). k = 0 here is the method's own engine
with speculation off: the drafter stays loaded (its prefill and KV share stay), because a deployment that
runs this schedule has no plain engine to fall back to. Whether to deploy the method at all rather than the
plain engine is the pool-level choice (policy.choose). When no k meets the SLO the k with the lowest TPOT is
taken and c is flagged. Single-point flips from measurement noise are then smoothed
away: a range takes a neighbour's k whenever that costs at most 0.5% goodput at each of its batch sizes.
The crossover concurrency is the largest c that still speculates when speculation is off everywhere above
it (None when speculation never runs, or still runs at max_batch_size).

A prior that noise must overturn: k does not rise with batch size. A step turns more compute-bound as the
batch grows, so verifying more drafts per sequence never gets cheaper there; a schedule whose k rises again
(`...,189-209:0,210+:1`, or `1-4:4,5-10:3,11-23:2,24-41:3,42+:4`) is almost always measurement noise. So
before smoothing, the per-batch choice is replaced by the best non-increasing schedule over the same
candidates (the same SLO and minimum-gain rules at each batch size; dynamic programming on the summed log
goodput) unless the data prove a rise: some batch size where the unconstrained k beats the constrained one
by more than PRIOR_Z standard errors of their goodput ratio (MethodSurface.ratio_se, about 97.7% one-sided).
Without the roofline fit there is no standard error, and the prior holds. `SchedulePlan.prior` says which.

`plan_from_runs` never raises on data: it returns a valid schedule or a plan with `ok=False` and the reason.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from ..api.deployment_spec import Policy
from ..api.profile import Run
from ..api.schedule import ScheduleRange, compress, schedule_problems
from .surface import MethodSurface, NotEnoughDataError, build_surface

MIN_GAIN_PERCENT = Policy.model_fields["min_gain_percent"].default
"""The noise guard when a caller names none: the API's default (spec.policy.minGainPercent), its one home."""

__all__ = ["SMOOTHING_TOLERANCE", "SchedulePlan", "plan_from_runs", "plan_schedule"]

SMOOTHING_TOLERANCE = 0.005
"""Largest goodput loss at any batch size that smoothing a flip away may cost."""
PRIOR_Z = 2.0
"""Standard errors by which a k rising with batch size must beat the best non-increasing schedule to stay
(the confidence the data need to overturn the prior; see the module)."""


@dataclasses.dataclass(frozen=True)
class SchedulePlan:
    """A method's schedule and what the surface predicts under it (index 0 of each tuple = batch size 1)."""

    ok: bool
    reason: str
    k_by_batch_size: tuple[int, ...] = ()
    ranges: tuple[ScheduleRange, ...] = ()
    crossover_concurrency: int | None = None
    goodput_tok_s: tuple[float, ...] = ()
    baseline_goodput_tok_s: tuple[float, ...] = ()
    """G_0: k = 0 on the method's engine (drafter loaded), what the noise guard compares against."""
    tpot_ms: tuple[float, ...] = ()
    slo_unmet_at: tuple[int, ...] = ()
    """Batch sizes where no k meets the TPOT SLO (the lowest-TPOT k is used there)."""
    surface: MethodSurface | None = None
    crossover_gain_se: float | None = None
    """Relative standard error of the predicted gain of the schedule's k over k = 0 at the crossover: how
    precisely the profile places it (None without a crossover or without the roofline fit)."""
    prior: str = "monotone"
    """How the prior that k does not rise with batch size was applied: "monotone" (the per-batch choice
    already did not rise), "imposed" (a rise the data did not prove was replaced), "overturned" (the data
    prove a rise, kept) or "unavailable" (no non-increasing schedule meets the SLO and minimum-gain rules)."""

    @property
    def num_speculative_tokens(self) -> int:
        """K to start the engine with: the schedule's largest k (0 when it never speculates)."""
        return max(self.k_by_batch_size, default=0)

    @property
    def max_batch_size(self) -> int:
        return len(self.k_by_batch_size)

    def k_at(self, batch_size: int) -> int:
        return self.k_by_batch_size[min(max(batch_size, 1), self.max_batch_size) - 1]

    def goodput_at(self, concurrency: float) -> float:
        return _at(self.goodput_tok_s, concurrency)

    def baseline_goodput_at(self, concurrency: float) -> float:
        return _at(self.baseline_goodput_tok_s, concurrency)

    def tpot_ms_at(self, concurrency: float) -> float:
        return _at(self.tpot_ms, concurrency)


def _at(values: Sequence[float], concurrency: float) -> float:
    """Linear interpolation of a per-batch-size tuple at a real concurrency, held at the ends."""
    x = min(max(concurrency, 1.0), float(len(values)))
    lo = int(math.floor(x))
    hi = min(lo + 1, len(values))
    w = x - lo
    return values[lo - 1] * (1.0 - w) + values[hi - 1] * w


def _finite(x: float) -> bool:
    return math.isfinite(x) and x > 0


def _best_k(goodput: dict[int, float], tpot: dict[int, float], slo_ms: float | None,
            min_gain: float) -> tuple[int, bool]:
    """Best k at one concurrency (from each k's goodput and TPOT there) and whether the SLO is met."""
    ks = sorted(goodput)
    valid = [k for k in ks if _finite(goodput[k]) and _finite(tpot[k])]
    if 0 not in valid:
        return 0, slo_ms is None or (_finite(tpot[0]) and tpot[0] <= slo_ms)
    feasible = [k for k in valid if slo_ms is None or tpot[k] <= slo_ms]
    if not feasible:
        return min(valid, key=lambda k: (tpot[k], k)), False
    best = max(feasible, key=lambda k: (goodput[k], -k))
    if best != 0 and 0 in feasible and goodput[best] < goodput[0] * (1.0 + min_gain):
        best = 0
    return best, True


def _smooth(dense: list[int], goodput_of: dict[int, list[float]], tolerance: float) -> list[int]:
    """Merge ranges into a neighbour whenever that costs <= tolerance goodput at each batch size they cover."""
    changed = True
    while changed:
        changed = False
        ranges = compress(dense, len(dense))
        # try the shortest ranges first: they are the likeliest noise
        for r in sorted(ranges, key=lambda r: (r.to_batch_size - r.from_batch_size, r.from_batch_size)):
            span = range(r.from_batch_size - 1, r.to_batch_size)
            neighbours = []
            if r.from_batch_size > 1:
                neighbours.append(dense[r.from_batch_size - 2])
            if r.to_batch_size < len(dense):
                neighbours.append(dense[r.to_batch_size])
            for k in sorted(set(neighbours), key=lambda k: -sum(goodput_of[k][i] for i in span)):
                if r.num_speculative_tokens == 0 and k > 0:
                    continue  # a range left without speculation by the noise guard stays so
                if all(goodput_of[k][i] >= goodput_of[r.num_speculative_tokens][i] * (1.0 - tolerance)
                       for i in span):
                    for i in span:
                        dense[i] = k
                    changed = True
                    break
            if changed:
                break
    return dense


def plan_schedule(surface: MethodSurface, tpot_slo_ms: float | None = None,
                  min_gain_percent: float = MIN_GAIN_PERCENT,
                  max_batch_size: int = 256, ks: Sequence[int] | None = None) -> SchedulePlan:
    """The schedule over batch sizes 1..max_batch_size from a surface (see the module for the rules)."""
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be >= 1 (got {max_batch_size})")
    available = surface.available_k()
    candidates = sorted(set(available if ks is None else [k for k in ks if k in available]) | {0})
    min_gain = max(0.0, min_gain_percent) / 100.0
    batch_sizes = range(1, max_batch_size + 1)
    raw_goodput = {k: [surface.goodput(k, c) for c in batch_sizes] for k in candidates}
    raw_tpot = {k: [surface.tpot_ms(k, c) for c in batch_sizes] for k in candidates}
    dense: list[int] = []
    unmet: list[int] = []
    for i, c in enumerate(batch_sizes):
        k, met = _best_k({k: v[i] for k, v in raw_goodput.items()}, {k: v[i] for k, v in raw_tpot.items()},
                         tpot_slo_ms, min_gain)
        dense.append(k)
        if not met:
            unmet.append(c)
    goodput_of = {k: [_safe(g) for g in values] for k, values in raw_goodput.items()}
    dense, prior = _monotone_prior(dense, surface, goodput_of, raw_tpot, tpot_slo_ms, min_gain, set(unmet))
    if tpot_slo_ms is None:
        dense = _smooth(dense, goodput_of, SMOOTHING_TOLERANCE)
    else:
        dense = _smooth_within_slo(dense, goodput_of, raw_tpot, tpot_slo_ms, set(unmet))
    ranges = compress(dense, max_batch_size)
    problems = schedule_problems(ranges, max_k=max(dense) if max(dense) > 0 else None)
    if problems:  # compress() output is valid by construction; this guards the invariant, not the data
        return SchedulePlan(ok=False, reason="internal schedule error: " + "; ".join(problems), surface=surface)
    crossover = _crossover(dense)
    goodput = tuple(goodput_of[k][i] for i, k in enumerate(dense))
    tpot = tuple(_safe(raw_tpot[k][i]) for i, k in enumerate(dense))
    reason = _describe(dense, crossover, unmet, tpot_slo_ms)
    return SchedulePlan(ok=True, reason=reason, k_by_batch_size=tuple(dense), ranges=tuple(ranges),
                        crossover_concurrency=crossover, goodput_tok_s=goodput,
                        baseline_goodput_tok_s=tuple(goodput_of[0]), tpot_ms=tpot, slo_unmet_at=tuple(unmet),
                        surface=surface,
                        crossover_gain_se=surface.speedup_se(dense[crossover - 1], crossover) if crossover else None,
                        prior=prior)


def _monotone_prior(dense: list[int], surface: MethodSurface, goodput_of: dict[int, list[float]],
                    tpot_of: dict[int, list[float]], slo_ms: float | None, min_gain: float,
                    unmet: set[int]) -> tuple[list[int], str]:
    """The per-batch choice `dense`, or the best non-increasing schedule unless the data prove the rise (see
    the module); with how the prior was applied."""
    if all(a >= b for a, b in zip(dense, dense[1:])):
        return dense, "monotone"
    ks = sorted(goodput_of)
    allowed: list[list[int]] = []
    for i, chosen in enumerate(dense):
        if (i + 1) in unmet:
            allowed.append([chosen])
            continue
        base = goodput_of[0][i] if 0 in goodput_of else 0.0
        options = [k for k in ks if goodput_of[k][i] > 0 and (slo_ms is None or tpot_of[k][i] <= slo_ms)
                   and (k == 0 or base <= 0 or goodput_of[k][i] >= base * (1.0 + min_gain))]
        allowed.append(options or [chosen])
    constrained = _best_non_increasing(allowed, goodput_of)
    if constrained is None:
        return dense, "unavailable"
    for i, (free, held) in enumerate(zip(dense, constrained)):
        if free == held:
            continue
        gain = math.log(goodput_of[free][i] / goodput_of[held][i]) if goodput_of[held][i] > 0 else math.inf
        se = surface.ratio_se(free, held, float(i + 1))
        if se is not None and gain > PRIOR_Z * se:
            return dense, "overturned"
    return constrained, "imposed"


def _best_non_increasing(allowed: Sequence[Sequence[int]], goodput_of: dict[int, list[float]]) -> list[int] | None:
    """The non-increasing k per batch size, each from its `allowed` list, with the largest summed log goodput
    (dynamic programming over (batch size, k)); None when no such schedule exists."""
    ks = sorted(goodput_of)
    best = {k: 0.0 for k in ks}  # best total for the prefix ending at k (k = the current batch size's choice)
    back: list[dict[int, int]] = []
    for i, options in enumerate(allowed):
        current: dict[int, float] = {}
        links: dict[int, int] = {}
        for k in options:
            # the previous batch size's k must be >= k
            previous = [(total, kk) for kk, total in best.items() if kk >= k and math.isfinite(total)]
            if not previous:
                continue
            total, kk = max(previous)
            current[k] = total + math.log(max(goodput_of[k][i], 1e-300))
            links[k] = kk
        if not current:
            return None
        best = current
        back.append(links)
    k = max(best, key=lambda kk: (best[kk], -kk))
    out = [k]
    for links in reversed(back[1:]):
        k = links[k]
        out.append(k)
    return out[::-1]


def _smooth_within_slo(dense: list[int], goodput_of: dict[int, list[float]], tpot_of: dict[int, list[float]],
                       slo_ms: float, unmet: set[int]) -> list[int]:
    """Smoothing that never trades a batch size meeting the SLO for one that breaks it."""
    masked = {k: [g if (i + 1) in unmet or tpot_of[k][i] <= slo_ms else 0.0
                  for i, g in enumerate(values)] for k, values in goodput_of.items()}
    return _smooth(dense, masked, SMOOTHING_TOLERANCE)


def _safe(x: float) -> float:
    return x if math.isfinite(x) and x > 0 else 0.0


def _crossover(dense: Sequence[int]) -> int | None:
    speculating = [c for c, k in enumerate(dense, start=1) if k > 0]
    if not speculating or speculating[-1] == len(dense):
        return None
    return speculating[-1]


def _describe(dense: Sequence[int], crossover: int | None, unmet: Sequence[int], slo_ms: float | None) -> str:
    if max(dense) == 0:
        text = "no k > 0 beats k = 0 on this engine by the minimum gain at any batch size"
    elif crossover is None:
        text = f"speculation pays at every batch size up to {len(dense)}"
    else:
        text = f"speculation off above {crossover} concurrent requests"
    if unmet:
        text += (f"; no k meets the {slo_ms:g} ms TPOT SLO at batch sizes {unmet[0]}-{unmet[-1]} "
                 f"(the lowest-TPOT k is used there)")
    return text


def plan_from_runs(baseline: Run | None, runs: Sequence[Run], model_drafter: bool = True,
                   tpot_slo_ms: float | None = None, min_gain_percent: float = MIN_GAIN_PERCENT,
                   max_batch_size: int = 256, shared_prior=None) -> SchedulePlan:
    """Build the surface and plan the schedule; a plan with ok=False names what data is missing.

    `shared_prior`: what the pool's other methods measured of the knee and weight share
    (`perf.roofline_fit.pool_roofline_priors`); `policy.choose.decide_pool` pools a pool's methods this way."""
    if baseline is None:
        return SchedulePlan(ok=False, reason="not enough data: no baseline run (K=0)")
    try:
        surface = build_surface(baseline, runs, model_drafter=model_drafter, shared_prior=shared_prior)
    except NotEnoughDataError as exc:
        return SchedulePlan(ok=False, reason=f"not enough data: {exc}")
    return plan_schedule(surface, tpot_slo_ms=tpot_slo_ms, min_gain_percent=min_gain_percent,
                         max_batch_size=max_batch_size)
