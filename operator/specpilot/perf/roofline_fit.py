"""The roofline fit of decode step times: one model of a GPU's steps, fitted jointly to a method's runs.

`policy.surface` turns each measured run into decode step times d_k(b) at its levels (prefill taken out);
this module fits them together (least squares on relative error) with a roofline:

    d_k(b) = a_k + m_k * b + w * max(0, q_k * b / N - 1),    q_k = 1 + f * k verified tokens per sequence

a_k and m_k are each run's fixed and per-sequence costs (memory-bound weights, overheads, KV reads,
drafting), linear in k between the measured k >= 1, never drawn from k = 0 (a drafter costs a fixed amount
per step as soon as it runs). The last term is the compute-bound regime of the target's GEMMs: past
N verified tokens per step (a property of the GPU: FLOPS / bandwidth) a step grows by w / N per token,
with w = theta * a_0 the weight-streaming share of the baseline's fixed step cost (theta in 0.5..1). All
runs share N and w, so the K run, which turns compute-bound first (at q_K * b = N), places the knee for
every k, and the fit extrapolates beyond the last level the way a roofline does. Given (N, theta) the
model is linear; every pair on a grid is solved, and the fit averages the candidates' step times
weighted by their likelihood (Gaussian relative errors with the best fit's variance). With levels a
factor of two apart the knee is rarely pinned down by the data, and averaging over the knees the data
allows is steadier than committing to the best one.

N and theta belong to the GPU and the target model, so a pool's methods share them: `pool_roofline_priors`
gives each method what the others measured of them (their log-likelihood over the (knee, theta) grid) as a
prior, which the method's fit weighs in unless its own runs refuse it.

Pure arithmetic on numbers (numpy only): which runs and levels feed it, and whether the fit describes
them well enough to be used, is the surface's business.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "ROOFLINE_GRID_SHAPE",
    "RooflineCandidates",
    "RooflineFit",
    "fit_roofline",
    "k_weights",
    "pool_roofline_priors",
    "solve_roofline",
]

_WEIGHT_SHARE = (0.5, 1.0)
"""Range of theta, the weight-streaming share of the baseline's fixed step cost."""
_FIT_MIN_LEVELS = 4
"""Levels each run needs for the fit: two parameters of its own plus a share of the knee, with room to spare."""
_KNEE_GRID = np.geomspace(2.0, 65536.0, 301)
"""Candidate knees N (tokens per step), 3.5% apart; the baseline's first level must be memory-bound."""
_MAX_CANDIDATES = 64
"""Most likely (knee, theta) candidates kept in the average; the rest carry negligible weight."""
_THETAS = np.linspace(*_WEIGHT_SHARE, 6)
"""Candidate thetas."""
_ALL_KNEES = np.concatenate([_KNEE_GRID, [np.inf]])
"""Every candidate knee a fit may weigh (inf: the target never turns compute-bound)."""
ROOFLINE_GRID_SHAPE = (len(_ALL_KNEES), len(_THETAS))
"""Shape of a roofline's log-likelihood over the (knee, theta) grid (`RooflineFit.grid_log_likelihood`)."""
_UNLIKELY = -50.0
"""Log-likelihood given to a grid point a fit did not weigh (a knee below its first level, negative costs)."""
_SHARED_REJECT = 6.0
"""Log-likelihood a method's own data may lose to the shared (knee, theta) of its pool before the sharing is
refused for it (2 x 6 = 12 on a chi-square with the 2 shared parameters: about the 0.25% level)."""
_TIE_F_CRITICAL = 4.0
"""F statistic above which the data refuses per-sequence costs linear in k (about the 5% level)."""


def k_weights(measured: Sequence[int], k: int) -> tuple[int, int, float]:
    """Indices (into `measured`, ascending) of the measured k around k and the weight of the upper one.

    k = 0 is only ever itself; k > 0 lies between the nearest measured k >= 1 on each side."""
    if k in measured:
        i = measured.index(k)
        return i, i, 0.0
    below = max(i for i, kk in enumerate(measured) if 1 <= kk < k)
    above = min(i for i, kk in enumerate(measured) if kk > k)
    return below, above, (k - measured[below]) / (measured[above] - measured[below])


@dataclasses.dataclass(frozen=True, eq=False)
class RooflineFit:
    """Decode step times of every measured run from the joint fit (see the module), in seconds.

    The knee and theta are uncertain where levels are sparse, so the fit is a weighted average over the
    candidate (knee, theta) pairs the data allows, each weighted by its likelihood."""

    measured_k: tuple[int, ...]
    """k of the fitted runs, ascending (k=0 is the baseline)."""
    verified_tokens: tuple[float, ...]
    """q_k = 1 + f * k for k = 0..max_k."""
    weights: np.ndarray
    """(candidates,) likelihood weights, summing to 1."""
    fixed_s: np.ndarray
    """(candidates, runs) a_k per measured run."""
    per_sequence_s: np.ndarray
    """(candidates, runs) m_k per measured run."""
    knee_tokens: np.ndarray
    """(candidates,) N: verified tokens per step at which the target's GEMMs turn compute-bound (inf: none)."""
    weight_share: np.ndarray
    """(candidates,) theta: w = theta * a_0."""
    rms_relative_residual: float
    """Of the best candidate with free per-sequence costs: how well a roofline describes the data at all."""
    coefficients: np.ndarray | None = None
    """(candidates, 2 * runs) the fitted (a_k, m_k * batch_scale) pairs, as solved."""
    covariance: np.ndarray | None = None
    """(candidates, 2 * runs, 2 * runs) their covariance: the residual variance x (X'WX)^-1."""
    batch_scale: float = 1.0
    """The batch sizes' scale in the design (the largest level)."""
    residual_sd: float = 0.0
    """Estimated relative noise of one measured step time (from the residuals, per degree of freedom)."""
    grid_log_likelihood: np.ndarray | None = None
    """ROOFLINE_GRID_SHAPE: the data's own log-likelihood of every (knee, theta), relative to the best (0),
    before any shared prior; what this fit tells the other methods of its pool (`roofline_evidence`)."""
    shared_prior: str = "none"
    """"used" when the pool's shared (knee, theta) prior weighed in, "refused" when this run's data refused
    it, "none" when there was none."""

    def _rows(self, k: int, batch: float) -> np.ndarray:
        """(candidates, params) the design row of d_k(batch): d_k = row . coefficients per candidate."""
        lo, hi, w = k_weights(self.measured_k, k)
        rows = np.zeros((len(self.weights), len(self.measured_k) * 2))
        for index, share in ((lo, 1.0 - w), (hi, w)):
            rows[:, 2 * index] += share
            rows[:, 2 * index + 1] += share * batch / self.batch_scale
        rows[:, 0] += self.weight_share * np.maximum(0.0, self.verified_tokens[k] * batch / self.knee_tokens - 1.0)
        return rows

    def log_ratio_se(self, k: int, batch: float, decode_share: tuple[float, float] = (1.0, 1.0)) -> float | None:
        """Standard error of log(s_0 / s_k) at `batch` from the fit's uncertainty (delta method per candidate,
        plus the spread between candidates); `decode_share` = the decode steps' share of s_0 and s_k (prefill
        is not fitted). None when the fit carries no covariance."""
        if self.coefficients is None or self.covariance is None:
            return None
        x0, xk = self._rows(0, batch), self._rows(k, batch)
        d0 = np.einsum("cp,cp->c", x0, self.coefficients)
        dk = np.einsum("cp,cp->c", xk, self.coefficients)
        if np.any(d0 <= 0) or np.any(dk <= 0):
            return None
        u = decode_share[0] * x0 / d0[:, None] - decode_share[1] * xk / dk[:, None]
        within = np.einsum("cp,cpq,cq->c", u, self.covariance, u)
        log_ratio = decode_share[0] * np.log(d0) - decode_share[1] * np.log(dk)
        between = np.square(log_ratio - self.weights @ log_ratio)
        return float(math.sqrt(max(0.0, float(self.weights @ (within + between)))))

    def log_ratio_se_between(self, k_a: int, k_b: int, batch: float,
                             decode_share: tuple[float, float] = (1.0, 1.0)) -> float | None:
        """Standard error of log(d_a / d_b) at `batch` for any two k (log_ratio_se is k_a = 0), the decode
        steps' shares of s_a and s_b weighting each side as there."""
        if self.coefficients is None or self.covariance is None:
            return None
        xa, xb = self._rows(k_a, batch), self._rows(k_b, batch)
        da = np.einsum("cp,cp->c", xa, self.coefficients)
        db = np.einsum("cp,cp->c", xb, self.coefficients)
        if np.any(da <= 0) or np.any(db <= 0):
            return None
        u = decode_share[0] * xa / da[:, None] - decode_share[1] * xb / db[:, None]
        within = np.einsum("cp,cpq,cq->c", u, self.covariance, u)
        log_ratio = decode_share[0] * np.log(da) - decode_share[1] * np.log(db)
        between = np.square(log_ratio - self.weights @ log_ratio)
        return float(math.sqrt(max(0.0, float(self.weights @ (within + between)))))

    def decode_step_s(self, k: int, batch: float) -> float:
        return float(self.steps(k, np.asarray([batch], dtype=float))[0])

    def steps(self, k: int, batches: np.ndarray) -> np.ndarray:
        """d_k at each batch size, computed from the candidates."""
        lo, hi, w = k_weights(self.measured_k, k)
        fixed = (1.0 - w) * self.fixed_s[:, lo] + w * self.fixed_s[:, hi]
        per_sequence = (1.0 - w) * self.per_sequence_s[:, lo] + w * self.per_sequence_s[:, hi]
        excess = np.maximum(0.0, self.verified_tokens[k] * batches[None, :] / self.knee_tokens[:, None] - 1.0)
        return self.weights @ (fixed[:, None] + per_sequence[:, None] * batches[None, :]
                               + (self.weight_share * self.fixed_s[:, 0])[:, None] * excess)


def _per_sequence_tie(measured_k: Sequence[int]) -> np.ndarray:
    """(2 * runs, runs + 2) map from (a_0..a_r, m_0, delta) to (a_0, m_0, a_1, m_1, ...): m_k = m_0 + k * delta.

    A step's per-sequence cost is the sequence's KV reads (the same at every k), the per-token work on its
    1 + f * k verified tokens and the drafter's per-sequence work for k drafts: linear in k from the
    baseline's. The fixed costs stay free per run: speculation adds a fixed overhead as soon as it runs."""
    runs = len(measured_k)
    tie = np.zeros((2 * runs, runs + 2))
    for i, k in enumerate(measured_k):
        tie[2 * i, i] = 1.0
        tie[2 * i + 1, runs] = 1.0
        tie[2 * i + 1, runs + 1] = float(k)
    return tie


def fit_roofline(levels: Sequence[Sequence[float]], decode_s: Sequence[Sequence[float]],
                 measured_k: Sequence[int], verified_tokens: Sequence[float],
                 counts: Sequence[Sequence[int]] | None = None,
                 shared_prior: np.ndarray | None = None) -> RooflineFit | None:
    """Joint least-squares fit of the runs' decode step times (index 0 = the baseline); None when it cannot
    be fitted (a run with fewer than _FIT_MIN_LEVELS levels, or no physical solution).

    `counts`: measurements averaged into each value (default 1); a mean of n weighs n times one measurement.
    `shared_prior`: a log-likelihood over the (knee, theta) grid (ROOFLINE_GRID_SHAPE) from the other methods
    measured on the same GPU and model (`pool_roofline_priors`), added to this data's own; refused when this
    data finds the shared (knee, theta) unlikely (it loses more than _SHARED_REJECT)."""
    candidates = solve_roofline(levels, decode_s, measured_k, verified_tokens, counts)
    return None if candidates is None else candidates.fit(shared_prior)


def solve_roofline(levels: Sequence[Sequence[float]], decode_s: Sequence[Sequence[float]],
                   measured_k: Sequence[int], verified_tokens: Sequence[float],
                   counts: Sequence[Sequence[int]] | None = None) -> RooflineCandidates | None:
    """All (knee, theta) candidates of fit_roofline, solved, before they are weighed."""
    runs = len(measured_k)
    if any(len(set(lv)) < _FIT_MIN_LEVELS for lv in levels):
        return None
    b = np.concatenate([np.asarray(lv, dtype=float) for lv in levels])
    z = np.concatenate([np.asarray(v, dtype=float) for v in decode_s])
    run_of = np.concatenate([np.full(len(lv), i) for i, lv in enumerate(levels)])
    row_weight = (np.sqrt(np.concatenate([np.asarray(c, dtype=float) for c in counts]))
                  if counts is not None else np.ones(len(z)))
    n, params = len(z), 2 * runs
    if not np.all(np.isfinite(z)) or np.any(z <= 0):
        return None
    scale = float(b.max())
    base = np.zeros((n, params))
    base[np.arange(n), 2 * run_of] = 1.0
    base[np.arange(n), 2 * run_of + 1] = b / scale
    q = np.asarray([verified_tokens[k] for k in measured_k])[run_of] * b
    # every (knee, theta) candidate at once: the compute-bound term scales the baseline's fixed cost a_0
    on_grid = np.concatenate([_KNEE_GRID > b.min(), [True]])
    knees = _ALL_KNEES[on_grid]
    thetas = _THETAS
    excess = np.maximum(0.0, q[None, :] / knees[:, None] - 1.0)  # (knees, n)
    # Candidate (knee, theta)'s design is `base` with theta * excess[knee] added to a_0's column: a rank-one
    # change. Each candidate's normal equations are then the base's plus terms in theta and theta^2, built from
    # per-knee products instead of from a (knees, thetas, n, params) design, which was most of a fit's memory
    # traffic.
    weight = row_weight / z  # residuals relative to each value: the target z / z = 1, weighted by row_weight
    knee_column = excess * weight[None, :]  # (knees, n): the knee term's column, weighted
    theta = thetas[None, :, None, None]

    def solve(tie: np.ndarray):
        """Least squares in the parameters `tie` maps to (a_0, m_0, a_1, m_1, ...), every candidate at once."""
        plain = (base @ tie) * weight[:, None]  # (n, m): the weighted design without the knee term
        a0 = tie[0]  # where a_0's column goes among the parameters
        cross = (knee_column @ plain)[:, None, :, None] * a0[None, None, None, :]  # (knees, 1, m, m)
        gram = (plain.T @ plain)[None, None] + theta * (cross + np.swapaxes(cross, -1, -2)) \
            + np.square(theta) * np.einsum("kn,kn->k", knee_column, knee_column)[:, None, None, None] \
            * np.outer(a0, a0)[None, None]
        gram += np.eye(tie.shape[1]) * 1e-12 * np.trace(gram, axis1=-2, axis2=-1)[..., None, None]
        rhs = (plain.T @ row_weight)[None, None] + thetas[None, :, None] * (knee_column @ row_weight)[:, None, None] * a0
        coef = np.linalg.solve(gram, rhs[..., None])[..., 0]  # (knees, thetas, m)
        fitted = np.einsum("nm,ktm->ktn", plain, coef) \
            + thetas[None, :, None] * (coef @ a0)[..., None] * knee_column[:, None, :]
        sse = np.square(fitted - row_weight).sum(axis=-1)
        coef = coef @ tie.T
        feasible = np.all(coef[..., 0::2] > 0, axis=-1) & np.all(coef[..., 1::2] >= 0, axis=-1) & np.isfinite(sse)
        return coef, np.where(feasible, sse, np.inf).ravel(), gram

    tie = np.eye(params)  # free per-sequence costs, unless the tie below is kept
    coef, sse, gram = solve(tie)
    roofline_sse = float(sse.min())
    if runs >= 3:
        # Per-sequence costs linear in k (_per_sequence_tie) save a parameter per extra run, which matters
        # most for the k never run; kept unless the data says otherwise (F-test of the nested fits).
        tied = _per_sequence_tie(measured_k)
        tied_coef, tied_sse, tied_gram = solve(tied)
        tied_best = float(tied_sse.min())
        extra = params - tied.shape[1]
        dof = n - params - 2
        if np.isfinite(tied_best) and dof > 0 and (
                not np.isfinite(roofline_sse)
                or (tied_best - roofline_sse) / extra <= _TIE_F_CRITICAL * max(roofline_sse, 1e-300) / dof):
            tie, coef, sse, gram = tied, tied_coef, tied_sse, tied_gram
    if not np.isfinite(sse).any():
        return None
    if not math.isfinite(roofline_sse):
        roofline_sse = float(sse.min())
    reduced = tie.shape[1]
    best = float(sse.min())
    # likelihood of each candidate under Gaussian relative errors with the best fit's variance
    variance = max(best / max(n - reduced - 2, 1), 1e-12)
    own = -(sse - best) / (2.0 * variance)
    grid = np.full(ROOFLINE_GRID_SHAPE, _UNLIKELY)
    grid[on_grid] = np.maximum(own.reshape(len(knees), len(thetas)), _UNLIKELY)
    return RooflineCandidates(tuple(measured_k), tuple(verified_tokens), coef.reshape(-1, params), own,
                       gram.reshape(-1, reduced, reduced), tie, variance, np.repeat(knees, len(thetas)),
                       np.tile(thetas, len(knees)), on_grid, scale, math.sqrt(roofline_sse / n), grid)


@dataclasses.dataclass(frozen=True, eq=False)
class RooflineCandidates:
    """Every (knee, theta) candidate of a roofline fit, solved: what weighing them (with or without a pool's
    shared prior) needs. Transient: a fit keeps only the most likely _MAX_CANDIDATES."""

    measured_k: tuple[int, ...]
    verified_tokens: tuple[float, ...]
    coef: np.ndarray
    own: np.ndarray
    """Each candidate's log-likelihood relative to the best (-inf: infeasible)."""
    gram: np.ndarray
    tie: np.ndarray
    variance: float
    knees: np.ndarray
    thetas: np.ndarray
    on_grid: np.ndarray
    scale: float
    rms: float
    grid: np.ndarray

    def fit(self, shared_prior: np.ndarray | None = None) -> RooflineFit:
        """The fit: the most likely candidates, weighed by this data's likelihood times the shared prior's,
        or by this data's alone when there is none or this data refuses it."""
        own = self.own
        log_weights, used = own, "none"
        if shared_prior is not None and np.shape(shared_prior) == ROOFLINE_GRID_SHAPE:
            combined = own + np.asarray(shared_prior, dtype=float)[self.on_grid].ravel()
            if np.isfinite(combined).any():
                at = int(np.nanargmax(np.where(np.isfinite(combined), combined, -np.inf)))
                if own[at] >= -_SHARED_REJECT:
                    log_weights, used = combined - combined[at], "used"
                else:
                    used = "refused"
        weights = np.exp(log_weights)
        keep = np.argsort(weights)[::-1][:_MAX_CANDIDATES]
        keep = keep[weights[keep] > 1e-3 * weights[keep[0]]]
        weights = weights[keep] / weights[keep].sum()
        flat = self.coef[keep]
        covariance = self.variance * (self.tie @ np.linalg.inv(self.gram[keep]) @ self.tie.T)
        return RooflineFit(
            measured_k=self.measured_k,
            verified_tokens=self.verified_tokens,
            weights=weights,
            fixed_s=flat[:, 0::2],
            per_sequence_s=flat[:, 1::2] / self.scale,
            knee_tokens=self.knees[keep],
            weight_share=self.thetas[keep],
            rms_relative_residual=self.rms,
            coefficients=flat,
            covariance=covariance,
            batch_scale=self.scale,
            residual_sd=math.sqrt(self.variance),
            grid_log_likelihood=self.grid,
            shared_prior=used,
        )


def pool_roofline_priors(evidence: dict[str, np.ndarray | None]) -> dict[str, np.ndarray | None]:
    """Each method's shared (knee, theta) prior from what the other methods of its pool measured.

    The knee N (where the target's GEMMs turn compute-bound) and the weight-streaming share theta belong to
    the GPU and the target model, not to the drafter: every method of a pool serves the same model on the
    same GPU. Each method's runs say something of them (the K run turns compute-bound first, at N / q_K,
    and q_K differs by method), so a method's fit weighs in the others' evidence (`roofline_evidence`):
    the sum of their log-likelihoods over the (knee, theta) grid. None where no other method has any."""
    priors: dict[str, np.ndarray | None] = {}
    for key in evidence:
        others = [e for other, e in evidence.items() if other != key and e is not None]
        priors[key] = np.sum(others, axis=0) if others else None
    return priors
