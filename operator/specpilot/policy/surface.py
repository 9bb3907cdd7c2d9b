"""The goodput surface of one speculative method on one pool: goodput and TPOT for every k and concurrency.

Built from measured runs exactly as docs/decisions.md and the design's model say: the baseline run (K=0)
gives T0(c), the method's runs at k=1 and at its maximum K give T1(c) and TK(c), and the K run's counters
give per-position acceptance p_j and the drafts per request-step f. Then

    E_k = 1 + f * sum_{j<=k} p_j
    s_0(c) = c / T0(c),  s_1(c) = c * E_1 / T1(c),  s_K(c) = c * E_K / TK(c)
    s_k(c) for 1 < k < K: linear in k between s_1 and s_K (between any measured k, when more were run)
    G_k(c) = c * E_k / s_k(c),  TPOT_k(c) = s_k(c) / E_k

The line in k starts at k=1, never at k=0: a drafter costs a fixed amount per step as soon as it runs.

Between measured concurrency levels step times are interpolated linearly in c: a decode step is affine in
the batch size within a regime (memory- or compute-bound), so the line is exact there and slightly
pessimistic across a regime change; interpolating in log c instead bent every step curve upward between
levels and under-predicted goodput by 2-5% halfway between powers of two on the twin. Below the first
level the first step time is held. Beyond the last level a step time grows along the straight line through
the last two levels (decode steps are affine in batch size once compute-bound), and the speedup of any k
is capped at its value at the last level, so the planner never speculates more eagerly beyond the data
than at its edge.

Latency: the per-token time above is a mean over the whole request (it includes the share of prefills
that run inside decode steps). For the TPOT SLO each run's measured TPOT tail (an estimate of p95 from p90
and p99, else p90, else p50) is divided by that mean at each level, and the ratio scales the model's
per-token time: the SLO is checked against a measured tail, the choice between k against the model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from ..api.profile import LevelPoint, Run

__all__ = [
    "MethodSurface",
    "NotEnoughDataError",
    "RunCurve",
    "acceptance_drift",
    "BaselineSurface",
    "acceptance_from_run",
    "build_baseline",
    "build_surface",
    "with_live_acceptance",
]


class NotEnoughDataError(ValueError):
    """The runs do not hold enough valid measurements to build a surface; the message says what is missing."""


def _finite_positive(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


def _tail_tpot_ms(point: LevelPoint) -> float | None:
    """Estimate of the p95 TPOT of a level: midway between p90 and p99, else p90, else p50, else the mean."""
    stats = point.tpot_ms
    p90, p99 = stats.p90, stats.p99
    if _finite_positive(p90) and _finite_positive(p99):
        return (p90 + p99) / 2.0
    for value in (p90, stats.p50, stats.mean):
        if _finite_positive(value):
            return float(value)
    return None


def _batch_size(point: LevelPoint) -> int:
    """The batch the engine ran at a level: the concurrency, or the mean running requests when requests
    waited (KV cache full), since the step time belongs to the batch that actually ran."""
    running = point.mean_running
    if (point.mean_waiting or 0) >= 1 and _finite_positive(running) and running < point.concurrency:
        return max(1, round(running))
    return point.concurrency


@dataclasses.dataclass(frozen=True, slots=True)
class RunCurve:
    """One run reduced to what the surface needs: per level, seconds per output token and the TPOT tail ratio.

    A level is placed at the batch size the engine ran (see `_batch_size`)."""

    num_speculative_tokens: int
    levels: tuple[int, ...]
    seconds_per_token: tuple[float, ...]
    """b / T: mean time between output tokens of one request at batch size b, in seconds."""
    tail_ratio: tuple[float, ...]
    """Measured TPOT tail / (c / T(c)) per level (1.0 where the level has no latency figures)."""
    prefill_s: float | None = None
    """Median over levels without waiting requests of TTFT - ITL / 2: one request's prefill time."""
    output_tokens: float | None = None
    """Median output tokens per request (generation tokens / completed requests)."""

    @classmethod
    def from_run(cls, run: Run) -> RunCurve | None:
        """The valid levels of a run (positive finite throughput), duplicates averaged; None when none are valid."""
        by_level: dict[int, list[tuple[float, float | None]]] = {}
        prefills: list[float] = []
        outputs: list[float] = []
        for point in run.points:
            throughput = point.output_throughput
            if not (isinstance(point.concurrency, int) and point.concurrency >= 1 and _finite_positive(throughput)):
                continue
            batch = _batch_size(point)
            per_token_s = batch / throughput
            if not _finite_positive(per_token_s):
                continue
            tail = _tail_tpot_ms(point)
            ttft, itl = point.ttft_ms.p50, point.itl_ms.p50
            if (point.mean_waiting or 0) < 1 and _finite_positive(ttft) and _finite_positive(itl) and ttft > itl / 2:
                prefills.append((ttft - itl / 2) / 1e3)
            if point.generation_tokens and point.completed:
                outputs.append(point.generation_tokens / point.completed)
            ratio = tail / (per_token_s * 1e3) if tail is not None else None
            by_level.setdefault(batch, []).append(
                (per_token_s, ratio if ratio is not None and _finite_positive(ratio) else None))
        if not by_level:
            return None
        levels = tuple(sorted(by_level))
        seconds = []
        ratios = []
        for level in levels:
            values = by_level[level]
            seconds.append(float(np.mean([v[0] for v in values])))
            measured = [v[1] for v in values if v[1] is not None]
            ratios.append(float(np.mean(measured)) if measured else 1.0)
        return cls(run.num_speculative_tokens, levels, tuple(seconds), tuple(ratios),
                   float(np.median(prefills)) if prefills else None,
                   float(np.median(outputs)) if outputs else None)


def acceptance_from_run(run: Run, model_drafter: bool) -> tuple[list[float], float]:
    """Per-position acceptance p_j and drafts per request-step f of a speculative run.

    From the counters when the points carry them (p_j = sum accepted_per_position[j] / sum num_drafts;
    f = drafts / request-steps, request-steps = generation tokens - accepted tokens - requests, because each
    request's first token comes from its prefill), else from `run.acceptance`. A model drafter proposes at
    every step, so f = 1 for it whatever the counters say. p is clipped to [0, 1] and made non-increasing.
    """
    drafts = accepted = generation = completed = 0
    per_position: list[int] = []
    counted = False
    for point in run.points:
        if not point.num_drafts:
            continue
        counted = True
        drafts += point.num_drafts
        accepted += point.num_accepted_tokens or sum(point.accepted_per_position)
        if point.generation_tokens:
            generation += point.generation_tokens
            completed += point.completed
        for j, value in enumerate(point.accepted_per_position):
            if j >= len(per_position):
                per_position.append(0)
            per_position[j] += value
    if counted and per_position:
        p = [value / drafts for value in per_position]
        request_steps = generation - accepted - completed
        f = drafts / request_steps if generation and request_steps > 0 else None
    elif run.acceptance is not None and run.acceptance.per_position:
        p = list(run.acceptance.per_position)
        f = run.acceptance.drafts_per_step
    else:
        return [], 1.0
    if model_drafter or f is None or not _finite_positive(f):
        f = 1.0
    clean: list[float] = []
    previous = 1.0
    for value in p[: run.num_speculative_tokens or len(p)]:
        value = min(previous, max(0.0, value if math.isfinite(value) else 0.0))
        clean.append(value)
        previous = value
    return clean, min(1.0, f)


def _tokens_per_step(per_position: Sequence[float], drafts_per_step: float, max_k: int) -> tuple[float, ...]:
    """E_0..E_max_k; positions past the measured ones accept nothing."""
    out = [1.0]
    for k in range(1, max_k + 1):
        p = per_position[k - 1] if k - 1 < len(per_position) else 0.0
        out.append(out[-1] + drafts_per_step * p)
    return tuple(out)


class _StepCurve:
    """Step time known at levels: linear in c between them (exact where steps are affine in batch size),
    held below the first level, extended along the last two levels' line beyond the last."""

    __slots__ = ("levels", "values", "slope")

    def __init__(self, levels: Sequence[int], values: Sequence[float]) -> None:
        self.levels = np.asarray(levels, dtype=float)
        self.values = np.asarray(values, dtype=float)
        if len(levels) >= 2:
            self.slope = max(0.0, (self.values[-1] - self.values[-2]) / (self.levels[-1] - self.levels[-2]))
        else:
            # one level: assume the throughput is already saturated there (step time grows with c)
            self.slope = self.values[-1] / self.levels[-1]

    def __call__(self, c: float) -> float:
        last = self.levels[-1]
        if c > last:
            return float(self.values[-1] + self.slope * (c - last))
        return float(np.interp(c, self.levels, self.values))


class _LogCurve:
    """A ratio known at levels; linear in log c between them, held beyond the ends."""

    __slots__ = ("log_levels", "values")

    def __init__(self, levels: Sequence[int], values: Sequence[float]) -> None:
        self.log_levels = np.log(np.asarray(levels, dtype=float))
        self.values = np.asarray(values, dtype=float)

    def __call__(self, c: float) -> float:
        return float(np.interp(math.log(c), self.log_levels, self.values))


@dataclasses.dataclass(frozen=True)
class MethodSurface:
    """Goodput and TPOT of one method for k = 0..max_k at any concurrency c >= 1.

    `step_s(k, c)` is the time of one engine step per request-batch as the model defines it; goodput is in
    output tokens per second of the replica; TPOT in milliseconds (the measured tail, see the module).
    """

    max_k: int
    per_position: tuple[float, ...]
    drafts_per_step: float
    tokens_per_step: tuple[float, ...]
    """E_0..E_max_k."""
    measured_k: tuple[int, ...]
    """k of the method's runs used (k=0 is the baseline)."""
    levels: tuple[int, ...]
    """Concurrency levels measured by the baseline and every method run used."""
    curves: tuple[RunCurve, ...]
    """Baseline first, then the method's runs by k."""
    drafter_prefill_s: float = 0.0
    """Prefill time a loaded drafter adds to each request, paid even where the schedule says k=0."""
    output_tokens: float = 256.0
    """Output tokens per request of the measurement (spreads the drafter's prefill over decode steps)."""
    notes: tuple[str, ...] = ()
    """What the surface had to assume (missing runs, extrapolation), in words."""

    def __post_init__(self) -> None:
        step_curves = []
        tail_curves = []
        for curve in self.curves:
            e = self.tokens_per_step[curve.num_speculative_tokens]
            step_curves.append(_StepCurve(curve.levels, [s * e for s in curve.seconds_per_token]))
            tail_curves.append(_LogCurve(curve.levels, curve.tail_ratio))
        object.__setattr__(self, "_step_curves", tuple(step_curves))
        object.__setattr__(self, "_tail_curves", tuple(tail_curves))
        object.__setattr__(self, "_cache", {})

    @property
    def last_level(self) -> int:
        return self.levels[-1]

    def _bracket(self, k: int) -> tuple[int, int, float]:
        """Indices of the measured curves around k and the weight of the upper one."""
        ks = [curve.num_speculative_tokens for curve in self.curves]
        if k in ks:
            i = ks.index(k)
            return i, i, 0.0
        # k > 0 not measured: between the nearest measured k >= 1 on each side (never from k=0)
        below = max((i for i, kk in enumerate(ks) if 1 <= kk < k), key=lambda i: ks[i])
        above = min((i for i, kk in enumerate(ks) if kk > k), key=lambda i: ks[i])
        return below, above, (k - ks[below]) / (ks[above] - ks[below])

    def _raw_step_s(self, k: int, c: float) -> float:
        lo, hi, w = self._bracket(k)
        s_lo = self._step_curves[lo](c)
        if k == 0:
            # the method's engine at k=0 still prefills with its drafter (the baseline engine has none)
            return s_lo + c * self.drafter_prefill_s / self.output_tokens
        return s_lo if w == 0.0 else (1.0 - w) * s_lo + w * self._step_curves[hi](c)

    def baseline_goodput(self, c: float) -> float:
        """Goodput of the baseline engine (no drafter loaded) at concurrency c."""
        self._check(0, c)
        return c / self._step_curves[0](c)

    def step_s(self, k: int, c: float) -> float:
        """s_k(c), with the speedup of k > 0 capped beyond the last measured level at its value there."""
        self._check(k, c)
        key = (k, c)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        step = self._raw_step_s(k, c)
        if k > 0 and c > self.last_level:
            edge = self.last_level
            edge_speedup = self.tokens_per_step[k] * self._raw_step_s(0, edge) / self._raw_step_s(k, edge)
            floor = self.tokens_per_step[k] * self._raw_step_s(0, c) / edge_speedup
            step = max(step, floor)
        self._cache[key] = step
        return step

    def goodput(self, k: int, c: float) -> float:
        """G_k(c): output tokens per second of the method's engine at concurrency c with k drafts per step."""
        return c * self.tokens_per_step[k] / self.step_s(k, c)

    def speedup(self, k: int, c: float) -> float:
        """G_k(c) / G_0(c), both on the method's engine."""
        return self.goodput(k, c) / self.goodput(0, c)

    def tpot_ms(self, k: int, c: float) -> float:
        """TPOT_k(c) = s_k(c) / E_k, scaled to the measured tail (p95 estimate), in milliseconds."""
        lo, hi, w = self._bracket(k)
        ratio = self._tail_curves[lo](c)
        if w:
            ratio = (1.0 - w) * ratio + w * self._tail_curves[hi](c)
        return self.step_s(k, c) / self.tokens_per_step[k] * ratio * 1e3

    def mean_acceptance_length(self) -> float:
        """E_K: tokens per step at the largest k."""
        return self.tokens_per_step[self.max_k]

    def available_k(self) -> tuple[int, ...]:
        """The k the surface can speak for: 0, and 1..max_k when a k=1 run exists, else only measured k."""
        if 1 in self.measured_k:
            return tuple(range(self.max_k + 1))
        return (0, *self.measured_k)

    def _check(self, k: int, c: float) -> None:
        if k not in self.available_k():
            raise ValueError(f"k must be one of {self.available_k()} for this surface (got {k})")
        if not c >= 1:
            raise ValueError(f"concurrency must be >= 1 (got {c})")


def build_surface(baseline: Run, runs: Sequence[Run], model_drafter: bool = True) -> MethodSurface:
    """The surface from a baseline run (K=0) and a method's runs (K=1 and K=max at least; others refine k).

    Raises NotEnoughDataError naming what is missing: no valid baseline levels, no valid speculative run,
    no acceptance figures in the largest run.
    """
    base = RunCurve.from_run(baseline)
    if base is None:
        raise NotEnoughDataError("the baseline run (K=0) has no level with a positive output throughput")
    notes: list[str] = []
    spec_curves: dict[int, RunCurve] = {}
    for run in runs:
        if run.num_speculative_tokens < 1:
            continue
        curve = RunCurve.from_run(run)
        if curve is None:
            notes.append(f"the K={run.num_speculative_tokens} run has no valid level: ignored")
            continue
        spec_curves[run.num_speculative_tokens] = curve
    if not spec_curves:
        raise NotEnoughDataError("no speculative run (K>=1) has a level with a positive output throughput")
    max_k = max(spec_curves)
    largest = next(r for r in runs if r.num_speculative_tokens == max_k)
    per_position, drafts_per_step = acceptance_from_run(largest, model_drafter)
    if not per_position:
        raise NotEnoughDataError(
            f"the K={max_k} run carries no acceptance: it needs numDrafts and acceptedPerPosition on its "
            f"points, or status.runs[].acceptance.perPosition")
    if 1 not in spec_curves and max_k > 1:
        notes.append(f"no k=1 run: only k=0 and the measured k {sorted(spec_curves)} are considered")
    common = set(base.levels)
    for curve in spec_curves.values():
        common &= set(curve.levels)
    levels = tuple(sorted(common)) or tuple(sorted(set(base.levels) | {c for cv in spec_curves.values()
                                                                        for c in cv.levels}))
    if not common:
        notes.append("the runs share no concurrency level: compared by interpolation only")
    measured = tuple(sorted(spec_curves))
    drafter_prefill_s, output_tokens = _drafter_prefill(base, list(spec_curves.values()), model_drafter, notes)
    return MethodSurface(
        max_k=max_k,
        per_position=tuple(per_position),
        drafts_per_step=drafts_per_step,
        tokens_per_step=_tokens_per_step(per_position, drafts_per_step, max_k),
        measured_k=measured,
        levels=levels,
        curves=(base, *(spec_curves[k] for k in measured)),
        drafter_prefill_s=drafter_prefill_s,
        output_tokens=output_tokens,
        notes=tuple(notes),
    )


def _drafter_prefill(base: RunCurve, spec: list[RunCurve], model_drafter: bool,
                     notes: list[str]) -> tuple[float, float]:
    """(prefill seconds a drafter adds per request, output tokens per request) from TTFT and ITL.

    Only model drafters prefill; n-gram and suffix matching cost nothing there. Without latency figures the
    drafter's prefill is taken as free and the notes say so.
    """
    outputs = [c.output_tokens for c in (base, *spec) if c.output_tokens]
    output_tokens = float(np.median(outputs)) if outputs else 256.0
    if not model_drafter:
        return 0.0, output_tokens
    spec_prefills = [c.prefill_s for c in spec if c.prefill_s is not None]
    if base.prefill_s is None or not spec_prefills:
        notes.append("no TTFT/ITL figures: the drafter's prefill cost at k=0 is taken as zero")
        return 0.0, output_tokens
    return max(0.0, float(np.median(spec_prefills)) - base.prefill_s), output_tokens


def with_live_acceptance(surface: MethodSurface, per_position: Sequence[float],
                         drafts_per_step: float) -> MethodSurface:
    """The same surface with E_k recomputed from live acceptance, keeping the measured step times."""
    clean: list[float] = []
    previous = 1.0
    for value in list(per_position)[: surface.max_k]:
        value = min(previous, max(0.0, float(value) if math.isfinite(value) else 0.0))
        clean.append(value)
        previous = value
    f = drafts_per_step if _finite_positive(drafts_per_step) else surface.drafts_per_step
    f = min(1.0, f)
    new_e = _tokens_per_step(clean, f, surface.max_k)
    # keep step times: seconds-per-token of each run scale by E_old / E_new so that c * E / T stays put
    curves = []
    for curve in surface.curves:
        k = curve.num_speculative_tokens
        scale = surface.tokens_per_step[k] / new_e[k]
        curves.append(dataclasses.replace(curve, seconds_per_token=tuple(s * scale for s in curve.seconds_per_token)))
    return dataclasses.replace(surface, per_position=tuple(clean), drafts_per_step=f, tokens_per_step=new_e,
                               curves=tuple(curves))


def acceptance_drift(surface: MethodSurface, per_position: Sequence[float], drafts_per_step: float) -> float:
    """Relative change of E_K (mean acceptance length at the largest k) from the profile to live acceptance."""
    live = with_live_acceptance(surface, per_position, drafts_per_step)
    return (live.mean_acceptance_length() - surface.mean_acceptance_length()) / surface.mean_acceptance_length()


@dataclasses.dataclass(frozen=True)
class BaselineSurface:
    """Goodput and TPOT of the baseline engine (no speculation, no drafter) at any concurrency c >= 1."""

    curve: RunCurve

    def __post_init__(self) -> None:
        object.__setattr__(self, "_step", _StepCurve(self.curve.levels, self.curve.seconds_per_token))
        object.__setattr__(self, "_tail", _LogCurve(self.curve.levels, self.curve.tail_ratio))

    @property
    def levels(self) -> tuple[int, ...]:
        return self.curve.levels

    def goodput(self, c: float) -> float:
        """Output tokens per second of the replica."""
        return c / self._step(c)

    def tpot_ms(self, c: float) -> float:
        """Per-token time scaled to the measured TPOT tail, in milliseconds."""
        return self._step(c) * self._tail(c) * 1e3


def build_baseline(baseline: Run) -> BaselineSurface:
    """The baseline engine's curves; NotEnoughDataError when the run has no valid level."""
    curve = RunCurve.from_run(baseline)
    if curve is None:
        raise NotEnoughDataError("the baseline run (K=0) has no level with a positive output throughput")
    return BaselineSurface(curve)
