"""The goodput surface of one speculative method on one pool: goodput and TPOT for every k and concurrency.

Built from measured runs as docs/decisions.md and the design's model say: the baseline run (K=0) gives
T0(c), the method's runs at k=1 and at its maximum K give T1(c) and TK(c), and the K run's counters give
per-position acceptance p_j and the drafts per request-step f, so E_k = 1 + f * sum_{j<=k} p_j.

A closed-loop level at batch size b serves one request per b / R seconds (R requests/s); a request takes
n_k = (out - 1) / E_k decode steps (its first token comes from its prefill) plus its share of prefill:

    b / R_k(b) = n_k * d_k(b) + b * t_prefill

t_prefill (seconds per request, per engine) comes from TTFT - ITL / 2 at the lowest levels; the decode
step time d_k(b) of each run is what is left. Separating the prefill matters: folded into a "step time"
it scales with E_k, which is not linear in k, and a middle k would look several percent faster than it is.

Decode step times are fitted jointly across the runs with a roofline whose knee (N verified tokens per
step, where the target's GEMMs turn compute-bound) and weight share belong to the GPU and the target
model: `specpilot.perf.roofline_fit` holds the model and the fit. A pool's methods share N and theta, so
`pool_surfaces` fits each method with what the others measured of them (their log-likelihood over the
(knee, theta) grid, the shared baseline's share taken out) as a prior, unless the method's own runs refuse it.

The fit is used when it describes the data (RMS relative residual <= FIT_MAX_RMS); otherwise (too few
levels, or hardware that does not follow the roofline) decode step times are interpolated linearly in c
between levels, linearly in k between measured k >= 1, and extended beyond the last level along the last
two levels' line. In both cases the speedup of any k beyond the last measured level is capped at its value
there. The surface's notes say which was used.

    s_k(c) = c * E_k / G_k(c) = ((out - 1) * d_k(c) + E_k * c * t_prefill) / out    step time per batch
    G_k(c) = c * E_k / s_k(c),  TPOT_k(c) = s_k(c) / E_k

k = 0 on the method's engine uses the baseline's decode steps with the method engine's prefill (a loaded
draft model still prefills every prompt). For the TPOT SLO each run's measured TPOT tail (an estimate of
p95 from p90 and p99, else p90, else p50) is divided by that mean at each level, and the ratio scales the
model's per-token time: the SLO is checked against a measured tail, the choice between k against the model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from .. import specdec
from ..api.profile import LevelPoint, Run
from ..perf.roofline_fit import RooflineCandidates, RooflineFit, k_weights, pool_roofline_priors, solve_roofline

__all__ = [
    "FIT_MAX_RMS",
    "BaselineSurface",
    "MethodSurface",
    "NotEnoughDataError",
    "RunCurve",
    "acceptance_from_run",
    "build_baseline",
    "build_surface",
    "pool_surfaces",
    "with_live_acceptance",
]

FIT_MAX_RMS = 0.10
"""Largest RMS relative residual of the roofline fit for it to be used (5% measurement noise gives ~4%)."""
_PREFILL_LEVELS = 3
"""Lowest levels whose TTFT - ITL/2 estimates a request's prefill (higher levels mix others' prefills in)."""
_MEDIAN_SE_FACTOR = 1.25
"""Standard error of a median over that of a mean of the same normal samples (sqrt(pi / 2))."""
SE_CALIBRATION = 1.3
"""The fit's own standard error of a speedup, scaled to the error actually seen where speculation stops
paying: against the digital twin's truth (54 scenarios x 24 noise draws, where the true gain is within 5%),
the RMS error runs 1.36x, 1.29x and 1.28x the fit's standard error at 2%, 5% and 10% noise per level (the
fit's own figure does not count choosing between the tied and free per-sequence costs, nor the bias of the
tie where it is kept within the noise; benchmarks/decision_quality.py prints the calibration)."""
_DEFAULT_OUTPUT_TOKENS = 256.0
_TABLE_BATCH_SIZES = 512
"""Whole concurrencies at which step times and TPOT are tabulated per k (schedules cover 1..max_num_seqs)."""


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


KV_FULL = 0.9
"""Peak KV-cache usage from which requests waiting at a level mean the cache held the batch down."""


def _batch_size(point: LevelPoint) -> int:
    """The batch the engine ran at a level: the concurrency, or the mean running requests when requests
    waited because the KV cache was full (peak usage >= KV_FULL, or preemptions), since the step time belongs
    to the batch that actually ran. Requests also wait briefly while a level's first wave is admitted (the
    step's token budget takes so many prompts at a time), and a short level's mean running count includes
    its ramp up and drain: with the cache far from full the level stays at its concurrency, as the other
    runs' levels do, so that all runs are compared at the same batch sizes."""
    running = point.mean_running
    waited = (point.mean_waiting or 0) >= 1 and _finite_positive(running) and running < point.concurrency
    cache_full = point.kv_cache_usage is None or point.kv_cache_usage >= KV_FULL or bool(point.preemptions)
    if waited and cache_full:
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
    """One request's prefill time: median of TTFT - ITL / 2 over the lowest levels without waiting requests."""
    output_tokens: float | None = None
    """Median output tokens per request (generation tokens / completed requests)."""
    counts: tuple[int, ...] = ()
    """Measurements averaged into each level (a level measured again counts more in the fit); all 1 if empty."""
    prefill_samples: int = 0
    """Levels `prefill_s` is the median of."""

    @classmethod
    def from_run(cls, run: Run) -> RunCurve | None:
        """The valid levels of a run (positive finite throughput), duplicates averaged; None when none are valid."""
        by_level: dict[int, list[tuple[float, float | None]]] = {}
        prefills: list[tuple[int, float]] = []
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
                prefills.append((point.concurrency, (ttft - itl / 2) / 1e3))
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
        # at higher levels other requests' prefills run between a request's decode steps and inflate ITL
        lowest = sorted(prefills)[:_PREFILL_LEVELS]
        return cls(run.num_speculative_tokens, levels, tuple(seconds), tuple(ratios),
                   float(np.median([p for _, p in lowest])) if lowest else None,
                   float(np.median(outputs)) if outputs else None,
                   tuple(len(by_level[level]) for level in levels), len(lowest))


def acceptance_from_run(run: Run, model_drafter: bool) -> tuple[list[float], float]:
    """Per-position acceptance p_j and drafts per request-step f of a speculative run.

    From the counters when the points carry them (p_j = sum accepted_per_position[j] / sum num_drafts;
    f = drafts / request-steps, request-steps = generation tokens - accepted tokens - requests, because each
    request's first token comes from its prefill: `specpilot.specdec`, the definition the
    benchmark Job and live observation share), else from `run.acceptance`. A model drafter proposes at
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
        p = specdec.acceptance_per_position(drafts, per_position)
        f = specdec.drafts_per_request_step(drafts, generation, accepted, completed) if generation else None
    elif run.acceptance is not None and run.acceptance.per_position:
        p = list(run.acceptance.per_position)
        f = run.acceptance.drafts_per_step
    else:
        return [], 1.0
    if model_drafter or f is None or not _finite_positive(f):
        f = 1.0
    return _non_increasing(p[: run.num_speculative_tokens or len(p)]), min(1.0, f)


def _non_increasing(values: Sequence[float]) -> list[float]:
    clean: list[float] = []
    previous = 1.0
    for value in values:
        value = min(previous, max(0.0, float(value) if math.isfinite(value) else 0.0))
        clean.append(value)
        previous = value
    return clean


def pool_surfaces(methods: dict[str, tuple[Run, Sequence[Run], bool]]
                  ) -> dict[str, MethodSurface | NotEnoughDataError]:
    """The surfaces of a pool's methods, each fitted with what the others measured of the shared knee and
    weight share (`pool_roofline_priors`). `methods`: key -> (baseline run, the method's runs, whether the
    method has a drafter model); each value is the surface, or the error naming what data is missing."""
    alone: dict[str, tuple[MethodSurface, RooflineCandidates | None] | NotEnoughDataError] = {}
    for key, (baseline, runs, model_drafter) in methods.items():
        try:  # a method alone in its pool has no one to tell: no evidence to compute
            alone[key] = _build_surface(baseline, runs, model_drafter, evidence=len(methods) > 1)
        except NotEnoughDataError as exc:
            alone[key] = exc
    priors = pool_roofline_priors({key: built[0].roofline_evidence if isinstance(built, tuple) else None
                                   for key, built in alone.items()})
    return {key: _with_shared_prior(*built, priors.get(key)) if isinstance(built, tuple) else built
            for key, built in alone.items()}


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
        return float(self.many(np.asarray([c], dtype=float))[0])

    def many(self, cs: np.ndarray) -> np.ndarray:
        beyond = self.values[-1] + self.slope * (cs - self.levels[-1])
        return np.where(cs > self.levels[-1], beyond, np.interp(cs, self.levels, self.values))


class _LogCurve:
    """A ratio known at levels; linear in log c between them, held beyond the ends."""

    __slots__ = ("log_levels", "values")

    def __init__(self, levels: Sequence[int], values: Sequence[float]) -> None:
        self.log_levels = np.log(np.asarray(levels, dtype=float))
        self.values = np.asarray(values, dtype=float)

    def __call__(self, c: float) -> float:
        return float(np.interp(math.log(c), self.log_levels, self.values))

    def many(self, cs: np.ndarray) -> np.ndarray:
        return np.interp(np.log(cs), self.log_levels, self.values)


@dataclasses.dataclass(frozen=True)
class MethodSurface:
    """Goodput and TPOT of one method for k = 0..max_k at any concurrency c >= 1.

    `step_s(k, c)` is the time of one engine step per request-batch as the model defines it (decode step
    plus the step's share of prefill); goodput is in output tokens per second of the replica; TPOT in
    milliseconds (the measured tail, see the module).
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
    decode_s: tuple[tuple[float, ...], ...]
    """Measured decode step time d_k(b) per curve and level (prefill taken out), seconds."""
    fit: RooflineFit | None = None
    """The joint roofline fit of the decode steps; None when the measured points are interpolated instead."""
    baseline_prefill_s: float = 0.0
    """One request's prefill on the baseline engine (0 when unknown: it is then inside the decode steps)."""
    prefill_s: float = 0.0
    """One request's prefill on the method's engine, drafter included, paid even where the schedule says k=0."""
    output_tokens: float = _DEFAULT_OUTPUT_TOKENS
    """Output tokens per request of the measurement (spreads prefill over decode steps)."""
    prefill_samples: int = 0
    """Levels `prefill_s` is the median of (0: no prefill figure)."""
    notes: tuple[str, ...] = ()
    """What the surface had to assume (missing runs, interpolation instead of the fit), in words."""
    roofline_evidence: np.ndarray | None = None
    """What the method's own runs say of the pool's (knee, theta), the baseline's share taken out (the pool's
    methods share one baseline): log-likelihood over ROOFLINE_GRID_SHAPE; None without the fit."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "_decode_curves",
                           tuple(_StepCurve(curve.levels, d) for curve, d in zip(self.curves, self.decode_s,
                                                                                    strict=True)))
        object.__setattr__(self, "_tail_curves", tuple(_LogCurve(c.levels, c.tail_ratio) for c in self.curves))
        object.__setattr__(self, "_cache", {})
        object.__setattr__(self, "_available", frozenset(self.available_k()))

    @property
    def last_level(self) -> int:
        return self.levels[-1]

    @property
    def drafter_prefill_s(self) -> float:
        """Prefill time the method's engine adds to each request over the baseline engine."""
        return max(0.0, self.prefill_s - self.baseline_prefill_s)

    def decode_step_s(self, k: int, c: float) -> float:
        """d_k(c): one decode step at batch c with k drafts per sequence, prefill excluded, in seconds."""
        self._check(k, c)
        return float(self._decode_many(k, np.asarray([c], dtype=float))[0])

    def _decode_many(self, k: int, cs: np.ndarray) -> np.ndarray:
        if self.fit is not None:
            return self.fit.steps(k, cs)
        lo, hi, w = k_weights(self.measured_k, k)
        d_lo = self._decode_curves[lo].many(cs)
        return d_lo if w == 0.0 else (1.0 - w) * d_lo + w * self._decode_curves[hi].many(cs)

    def _raw_steps(self, k: int, cs: np.ndarray) -> np.ndarray:
        out = self.output_tokens
        return ((out - 1.0) * self._decode_many(k, cs) + self.tokens_per_step[k] * cs * self.prefill_s) / out

    def _steps(self, k: int, cs: np.ndarray) -> np.ndarray:
        """s_k at concurrencies cs, with the speedup of k > 0 capped beyond the last measured level at its
        value there."""
        steps = self._raw_steps(k, cs)
        if k > 0 and cs.max() > self.last_level:
            edge = np.asarray([float(self.last_level)])
            edge_speedup = self._raw_steps(0, edge)[0] / self._raw_steps(k, edge)[0]
            floor = self._raw_steps(0, cs) / edge_speedup
            steps = np.where(cs > self.last_level, np.maximum(steps, floor), steps)
        return steps

    def _tail_ratios(self, k: int, cs: np.ndarray) -> np.ndarray:
        lo, hi, w = k_weights(self.measured_k, k)
        ratio = self._tail_curves[lo].many(cs)
        return ratio if w == 0.0 else (1.0 - w) * ratio + w * self._tail_curves[hi].many(cs)

    def _table(self, k: int) -> tuple[list[float], list[float]]:
        """(s_k, TPOT_k in ms) at whole concurrencies 1.._TABLE_BATCH_SIZES, computed once per k."""
        table = self._cache.get(k)
        if table is None:
            cs = np.arange(1.0, _TABLE_BATCH_SIZES + 1.0)
            steps = self._steps(k, cs)
            tpot = steps / self.tokens_per_step[k] * self._tail_ratios(k, cs) * 1e3
            table = (steps.tolist(), tpot.tolist())
            self._cache[k] = table
        return table

    def baseline_goodput(self, c: float) -> float:
        """Goodput of the baseline engine (no drafter loaded) at concurrency c."""
        self._check(0, c)
        out = self.output_tokens
        return c * out / ((out - 1.0) * self.decode_step_s(0, c) + c * self.baseline_prefill_s)

    def step_s(self, k: int, c: float) -> float:
        """s_k(c), with the speedup of k > 0 capped beyond the last measured level at its value there."""
        self._check(k, c)
        if c <= _TABLE_BATCH_SIZES and c == int(c):
            return self._table(k)[0][int(c) - 1]
        return float(self._steps(k, np.asarray([c], dtype=float))[0])

    def goodput(self, k: int, c: float) -> float:
        """G_k(c): output tokens per second of the method's engine at concurrency c with k drafts per step."""
        return c * self.tokens_per_step[k] / self.step_s(k, c)

    def speedup(self, k: int, c: float) -> float:
        """G_k(c) / G_0(c), both on the method's engine."""
        return self.goodput(k, c) / self.goodput(0, c)

    def speedup_se(self, k: int, c: float) -> float | None:
        """Relative standard error of speedup(k, c) from the measurement noise the roofline fit sees (its
        residuals), scaled by SE_CALIBRATION; None without the fit (interpolated steps carry no estimate of
        their noise)."""
        self._check(k, c)
        if self.fit is None or k == 0:
            return None if self.fit is None else 0.0
        out = self.output_tokens

        def decode_share(kk: int) -> float:
            decode = (out - 1.0) * self.decode_step_s(kk, c)
            return decode / (decode + self.tokens_per_step[kk] * c * self.prefill_s)

        shares = (decode_share(0), decode_share(k))
        steps = self.fit.log_ratio_se(k, c, shares)
        if steps is None or not self.prefill_samples:
            return None if steps is None else SE_CALIBRATION * steps
        # prefill is a median of a few levels (1.25: a median's efficiency) with the steps' noise; it weighs
        # on k=0 and k differently (a request of k spends fewer decode steps per prefill)
        prefill_sd = _MEDIAN_SE_FACTOR * self.fit.residual_sd / math.sqrt(self.prefill_samples)
        return SE_CALIBRATION * math.sqrt(steps ** 2 + ((shares[1] - shares[0]) * prefill_sd) ** 2)

    def plain_ratio_se(self, c: float) -> float | None:
        """Relative standard error of goodput(0, c) / baseline_goodput(c): k = 0 on the method's engine against
        the plain engine, which differ only in the drafter's prefill (0 when the method adds none, as n-gram
        and suffix matching), scaled by SE_CALIBRATION; None without the fit. What keeping the method loaded
        where its schedule is off costs is known to this (policy.choose)."""
        self._check(0, c)
        if self.prefill_s == self.baseline_prefill_s:
            return 0.0
        if self.fit is None or not self.prefill_samples:
            return None
        decode = (self.output_tokens - 1.0) * self.decode_step_s(0, c)
        method_share = c * self.prefill_s / (decode + c * self.prefill_s)
        plain_share = c * self.baseline_prefill_s / (decode + c * self.baseline_prefill_s)
        # each prefill is a median of a few levels of its own runs (independent measurements)
        method_sd = _MEDIAN_SE_FACTOR * self.fit.residual_sd / math.sqrt(self.prefill_samples)
        plain_sd = _MEDIAN_SE_FACTOR * self.fit.residual_sd / math.sqrt(self.curves[0].prefill_samples or 1)
        return SE_CALIBRATION * math.hypot(method_share * method_sd, plain_share * plain_sd)

    def ratio_se(self, k_a: int, k_b: int, c: float) -> float | None:
        """Relative standard error of G_a(c) / G_b(c) for any two k (speedup_se is k_b = 0), scaled by
        SE_CALIBRATION; 0 for the same k, None without the fit. What the schedule's prior on k and the
        refinement planner (policy.refine) weigh a difference between two k against."""
        self._check(k_a, c)
        self._check(k_b, c)
        if self.fit is None:
            return None
        if k_a == k_b:
            return 0.0
        if k_b == 0:
            return self.speedup_se(k_a, c)
        if k_a == 0:
            return self.speedup_se(k_b, c)
        out = self.output_tokens

        def decode_share(kk: int) -> float:
            decode = (out - 1.0) * self.decode_step_s(kk, c)
            return decode / (decode + self.tokens_per_step[kk] * c * self.prefill_s)

        steps = self.fit.log_ratio_se_between(k_a, k_b, c, (decode_share(k_a), decode_share(k_b)))
        return None if steps is None else SE_CALIBRATION * steps

    def tpot_ms(self, k: int, c: float) -> float:
        """TPOT_k(c) = s_k(c) / E_k, scaled to the measured tail (p95 estimate), in milliseconds."""
        self._check(k, c)
        if c <= _TABLE_BATCH_SIZES and c == int(c):
            return self._table(k)[1][int(c) - 1]
        cs = np.asarray([c], dtype=float)
        return float(self._steps(k, cs)[0] / self.tokens_per_step[k] * self._tail_ratios(k, cs)[0] * 1e3)

    def mean_acceptance_length(self) -> float:
        """E_K: tokens per step at the largest k."""
        return self.tokens_per_step[self.max_k]

    def available_k(self) -> tuple[int, ...]:
        """The k the surface can speak for: 0, and 1..max_k when a k=1 run exists, else only measured k."""
        if 1 in self.measured_k:
            return tuple(range(self.max_k + 1))
        return tuple(self.measured_k)

    def _check(self, k: int, c: float) -> None:
        if k not in self._available:
            raise ValueError(f"k must be one of {self.available_k()} for this surface (got {k})")
        if not c >= 1:
            raise ValueError(f"concurrency must be >= 1 (got {c})")


def build_surface(baseline: Run, runs: Sequence[Run], model_drafter: bool = True,
                  shared_prior: np.ndarray | None = None) -> MethodSurface:
    """The surface from a baseline run (K=0) and a method's runs (K=1 and K=max at least; others refine k).

    `shared_prior`: what the pool's other methods say of the knee and weight share (`pool_roofline_priors`
    over their surfaces' `roofline_evidence`); the fit weighs it in unless this method's runs refuse it.

    Raises NotEnoughDataError naming what is missing: no valid baseline levels, no valid speculative run,
    no acceptance figures in the largest run.
    """
    surface, candidates = _build_surface(baseline, runs, model_drafter)
    return _with_shared_prior(surface, candidates, shared_prior)


def _with_shared_prior(surface: MethodSurface, candidates: RooflineCandidates | None,
                       shared_prior: np.ndarray | None) -> MethodSurface:
    """The surface with its fit's candidates weighed with the pool's shared prior as well (none: as it is)."""
    if shared_prior is None or candidates is None or surface.fit is None:
        return surface
    fit = candidates.fit(shared_prior)
    notes = surface.notes
    if fit.shared_prior == "refused":
        notes = (*notes, "the knee and weight share the pool's other methods measured do not fit this "
                         "method's runs: fitted on its own runs alone")
    return dataclasses.replace(surface, fit=fit, notes=notes)


def _build_surface(baseline: Run, runs: Sequence[Run], model_drafter: bool, evidence: bool = True
                   ) -> tuple[MethodSurface, RooflineCandidates | None]:
    """build_surface without a shared prior, and the fit's solved candidates (None without the fit), which
    a pool's prior re-weighs without solving again. `evidence`: whether to say what the runs tell the pool's
    other methods (`roofline_evidence`; it costs a fit of the baseline alone)."""
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
    measured = (0, *sorted(spec_curves))
    curves = (base, *(spec_curves[k] for k in measured[1:]))
    tokens_per_step = specdec.tokens_per_step_curve(per_position, drafts_per_step, max_k)
    outputs = [c.output_tokens for c in curves if c.output_tokens and c.output_tokens >= 2]
    output_tokens = float(np.median(outputs)) if outputs else _DEFAULT_OUTPUT_TOKENS
    baseline_prefill, prefill = _prefills(base, curves[1:], model_drafter, notes)
    decode = [_decode_steps(c, tokens_per_step[c.num_speculative_tokens], output_tokens,
                            baseline_prefill if i == 0 else prefill) for i, c in enumerate(curves)]
    if any(min(d) <= 0 for d in decode):
        notes.append("TTFT says prefill takes longer than a whole request: prefill is left inside the steps")
        baseline_prefill = prefill = 0.0
        decode = [_decode_steps(c, tokens_per_step[c.num_speculative_tokens], output_tokens, 0.0)
                  for c in curves]
    if prefill <= 0:
        prefill_samples = 0
    elif not model_drafter or prefill == baseline_prefill:
        prefill_samples = base.prefill_samples
    else:
        prefill_samples = sum(c.prefill_samples for c in curves[1:] if c.prefill_s is not None)
    verified = tuple(specdec.verified_tokens_per_step(drafts_per_step, k) for k in range(max_k + 1))
    counts = [c.counts or (1,) * len(c.levels) for c in curves]
    candidates = solve_roofline([c.levels for c in curves], decode, measured, verified, counts)
    fit = candidates.fit() if candidates is not None else None
    told = None
    if fit is None:
        notes.append("too few levels for the roofline fit: step times interpolated between measured levels")
    elif fit.rms_relative_residual > FIT_MAX_RMS:
        notes.append(f"the roofline fit misses the measurements by {fit.rms_relative_residual:.0%} RMS: step "
                     f"times interpolated between measured levels")
        fit = None
    elif evidence:
        alone = solve_roofline([base.levels], [decode[0]], (0,), verified, [counts[0]])
        told = fit.grid_log_likelihood - (alone.grid if alone is not None else 0.0)
    return MethodSurface(
        max_k=max_k,
        per_position=tuple(per_position),
        drafts_per_step=drafts_per_step,
        tokens_per_step=tokens_per_step,
        measured_k=measured,
        levels=levels,
        curves=curves,
        decode_s=tuple(tuple(d) for d in decode),
        fit=fit,
        baseline_prefill_s=baseline_prefill,
        prefill_s=prefill,
        output_tokens=output_tokens,
        prefill_samples=prefill_samples,
        notes=tuple(notes),
        roofline_evidence=told,
    ), (candidates if fit is not None else None)


def _decode_steps(curve: RunCurve, tokens_per_step: float, output_tokens: float, prefill_s: float) -> list[float]:
    """d(b) = (out * b / T - b * t_prefill) * E / (out - 1) at each level of a run."""
    return [(output_tokens * s - b * prefill_s) * tokens_per_step / (output_tokens - 1.0)
            for b, s in zip(curve.levels, curve.seconds_per_token, strict=True)]


def _prefills(base: RunCurve, spec: Sequence[RunCurve], model_drafter: bool,
              notes: list[str]) -> tuple[float, float]:
    """(baseline engine's, method engine's) prefill seconds per request from TTFT and ITL.

    Both 0 when either is unknown (prefill then stays folded into the step times, which is exact at the
    measured k and slightly flatters a middle k). n-gram and suffix matching add no prefill.
    """
    spec_prefills = [c.prefill_s for c in spec if c.prefill_s is not None]
    if base.prefill_s is None or not spec_prefills:
        notes.append("no TTFT/ITL figures: prefill is left inside the step times and a drafter's prefill at "
                     "k=0 is taken as zero")
        return 0.0, 0.0
    if not model_drafter:
        return base.prefill_s, base.prefill_s
    return base.prefill_s, max(base.prefill_s, float(np.median(spec_prefills)))


def with_live_acceptance(surface: MethodSurface, per_position: Sequence[float],
                         drafts_per_step: float) -> MethodSurface:
    """The same surface with E_k recomputed from live acceptance, keeping the measured decode step times."""
    clean = _non_increasing(list(per_position)[: surface.max_k])
    f = drafts_per_step if _finite_positive(drafts_per_step) else surface.drafts_per_step
    f = min(1.0, f)
    return dataclasses.replace(surface, per_position=tuple(clean), drafts_per_step=f,
                               tokens_per_step=specdec.tokens_per_step_curve(clean, f, surface.max_k))


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
        """Per-token time scaled to the measured tail, in milliseconds."""
        return self._step(c) * self._tail(c) * 1e3


def build_baseline(baseline: Run) -> BaselineSurface:
    """The baseline engine's curves; NotEnoughDataError when the run has no valid level."""
    curve = RunCurve.from_run(baseline)
    if curve is None:
        raise NotEnoughDataError("the baseline run (K=0) has no level with a positive output throughput")
    return BaselineSurface(curve)
