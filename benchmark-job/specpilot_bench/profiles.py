"""Pure pieces of a profile: which engine starts it needs, their configs, and the resulting documents.

A method is measured at k=1 and at its maximum K (docs/decisions.md: the k=1..K line gives every
k in between); the baseline (k=0) is its own profile, shared by every method on the SKU. An optional
validation run at a middle k reports how far that interpolation is from a measurement.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError
from specpilot import specdec
from specpilot.api.base import format_validation_error
from specpilot.api.methods import CandidateMethod
from specpilot.api.profile import (
    Acceptance,
    LevelPoint,
    ProfilePhase,
    Run,
    SpeculationProfile,
    SpeculationProfileSpec,
    SpeculationProfileStatus,
    Validation,
)
from specpilot.api.schedule import ScheduleRange, from_vllm

SPECULATIVE_CONFIG_ANNOTATION = "specpilot.io/speculative-config"
"""Annotation holding the `--speculative-config` of the K run, schedule included (the spec has no schedule)."""

_TYPED_KEYS = {"method", "num_speculative_tokens", "model", "revision", "prompt_lookup_min", "prompt_lookup_max",
               "draft_tensor_parallel_size", "num_speculative_tokens_per_batch_size"}


def parse_speculative_config(text: str) -> tuple[CandidateMethod, list[ScheduleRange] | None]:
    """vLLM's `--speculative-config` JSON -> the candidate method and its schedule, if it has one."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--speculative-config must be a JSON object: {exc}") from exc
    if not isinstance(config, dict) or "method" not in config:
        raise ValueError('--speculative-config must be a JSON object with "method" (e.g. {"method": "ngram", '
                         '"num_speculative_tokens": 4})')
    extra = {k: v for k, v in config.items() if k not in _TYPED_KEYS}
    fields = {k: v for k, v in config.items() if k in _TYPED_KEYS - {"num_speculative_tokens_per_batch_size"}}
    try:
        method = CandidateMethod.model_validate({**fields, **({"extra_config": extra} if extra else {})})
        schedule = config.get("num_speculative_tokens_per_batch_size")
        ranges = from_vllm(schedule) if schedule else None
    except ValidationError as exc:
        raise ValueError(format_validation_error(exc, root="--speculative-config")) from exc
    if ranges:
        # Fail here, not after a baseline run: the same check speculative_config() applies.
        method.speculative_config(method.num_speculative_tokens, ranges)
    return method, ranges


def run_speculative_config(method: CandidateMethod, k: int, schedule: Sequence[ScheduleRange] | None) -> dict:
    """The engine's config for the run at k: the method's own, its schedule capped at k."""
    capped = [r.model_copy(update={"num_speculative_tokens": min(r.num_speculative_tokens, k)})
              for r in schedule] if schedule else None
    return method.speculative_config(k, capped)


def planned_ks(method: CandidateMethod | None, validate_k: int | None = None) -> list[int]:
    """The K of each engine start a profile needs: [0] for the baseline, else [1, K] (+ the validation k)."""
    if method is None:
        return [0]
    max_k = method.num_speculative_tokens
    if validate_k is not None and not 1 < validate_k < max_k:
        raise ValueError(f"--validate-k must lie strictly between 1 and the method's K {max_k} (got {validate_k})")
    ks = sorted({1, max_k} | ({validate_k} if validate_k else set()))
    return ks


def tokens_per_step(acceptance: Acceptance, k: int) -> float:
    """E_k of a measured acceptance (`specpilot.specdec.tokens_per_step`)."""
    return specdec.tokens_per_step(acceptance.per_position, acceptance.drafts_per_step, k)


def interpolated_output_throughput(t1: float, tk: float, acceptance: Acceptance, max_k: int, k: int) -> float:
    """Output throughput at k predicted from the k=1 and k=K runs at the same concurrency.

    Step time per request-batch s_k = c * E_k / T_k, linear in k between s_1 and s_K; T_k = c * E_k / s_k,
    so the concurrency cancels out.
    """
    e1, ek, em = tokens_per_step(acceptance, 1), tokens_per_step(acceptance, max_k), tokens_per_step(acceptance, k)
    s1, sk = e1 / t1, ek / tk
    sm = s1 + (sk - s1) * (k - 1) / (max_k - 1)
    return em / sm


def validation(run_1: Run, run_k: Run, run_m: Run) -> Validation | None:
    """Largest relative error of the interpolated throughput at the middle k over the levels all three measured."""
    acceptance = run_k.acceptance
    if acceptance is None:
        return None
    by_c = {c: (p1, pk) for c, p1, pk in ((p.concurrency, p, q) for p in run_1.points for q in run_k.points
                                          if p.concurrency == q.concurrency)}
    errors = []
    for point in run_m.points:
        pair = by_c.get(point.concurrency)
        if pair and min(pair[0].output_throughput, pair[1].output_throughput, point.output_throughput) > 0:
            predicted = interpolated_output_throughput(pair[0].output_throughput, pair[1].output_throughput,
                                                       acceptance, run_k.num_speculative_tokens,
                                                       run_m.num_speculative_tokens)
            errors.append(abs(predicted - point.output_throughput) / point.output_throughput)
    if not errors:
        return None
    return Validation(num_speculative_tokens=run_m.num_speculative_tokens, max_relative_error=max(errors))


def merge_runs(existing: Sequence[Run], new: Sequence[Run]) -> list[Run]:
    """Runs by K, a new measurement of a K replacing the old one (Jobs of one profile each publish theirs)."""
    by_k = {r.num_speculative_tokens: r for r in existing}
    by_k.update({r.num_speculative_tokens: r for r in new})
    return [by_k[k] for k in sorted(by_k)]


MAX_POINTS_PER_RUN = Run.model_fields["points"].metadata[0].max_length
"""The status schema's bound on a run's points (64): appending never publishes more."""


def capped_points(points: Sequence[LevelPoint], limit: int = MAX_POINTS_PER_RUN) -> list[LevelPoint]:
    """At most `limit` points, in order: while over, the oldest point of the level measured most often goes
    (every level keeps its newest measurement; a repeated level loses its oldest repeats first)."""
    kept = list(points)
    while len(kept) > limit:
        counts: dict[int, int] = {}
        for point in kept:
            counts[point.concurrency] = counts.get(point.concurrency, 0) + 1
        level = max(counts, key=lambda c: (counts[c], -c))
        if counts[level] < 2:
            kept = kept[len(kept) - limit:]
            break
        kept.pop(next(i for i, point in enumerate(kept) if point.concurrency == level))
    return kept


def append_runs(existing: Sequence[Run], new: Sequence[Run]) -> list[Run]:
    """Runs by K, a new run's points appended to the stored run of the same K (a refinement: repeated levels
    then count as more measurements in the planner's fit), capped at MAX_POINTS_PER_RUN; a K not stored yet
    is added. The run's acceptance is recomputed over all its points."""
    from .sweep import run_acceptance

    by_k = {r.num_speculative_tokens: r for r in existing}
    for run in new:
        old = by_k.get(run.num_speculative_tokens)
        if old is None:
            by_k[run.num_speculative_tokens] = run
            continue
        points = capped_points([*old.points, *run.points])
        walls = [w for w in (old.wall_s, run.wall_s) if w is not None]
        by_k[run.num_speculative_tokens] = old.model_copy(update={
            "points": points,
            "acceptance": (run_acceptance(points) or old.acceptance) if run.num_speculative_tokens else None,
            "wall_s": sum(walls) if walls else None,
        })
    return [by_k[k] for k in sorted(by_k)]


def finished_phase(runs: Sequence[Run], expected_ks: Sequence[int]) -> ProfilePhase:
    """Succeeded once every expected K has a run with points; Running while some are still to come."""
    measured = {r.num_speculative_tokens for r in runs if r.points}
    return ProfilePhase.SUCCEEDED if set(expected_ks) <= measured else ProfilePhase.RUNNING


def merged_status(current: dict[str, Any] | None, new: SpeculationProfileStatus,
                  expected_ks: Sequence[int], append: bool = False) -> SpeculationProfileStatus:
    """The status to publish over what the API holds: runs merged by K, engine starts added up, and the
    phase Succeeded only when all expected runs are in (a Failed new status stays Failed).

    `append` (a refinement round, `specpilot-bench --append`): the new runs' points are appended to the stored
    runs of the same K (`append_runs`) instead of replacing them, and a round that fails leaves a profile
    whose runs are complete Succeeded (its reason and message say what failed; the points it measured before
    failing are kept), so a failed refinement never takes a usable profile away from the planner."""
    old = SpeculationProfileStatus.model_validate(current or {})
    runs = append_runs(old.runs, new.runs) if append else merge_runs(old.runs, new.runs)
    complete = finished_phase(runs, expected_ks)
    if new.phase == ProfilePhase.FAILED.value and not (append and complete == ProfilePhase.SUCCEEDED):
        phase = new.phase
    else:
        phase = complete
    extra: dict[str, Any] = {}
    if append:
        extra = {"completed_at": new.completed_at or old.completed_at,
                 "reason": (f"refinement failed: {new.reason}"[:1024] if new.phase == ProfilePhase.FAILED.value
                            else old.reason if old.phase == ProfilePhase.SUCCEEDED.value else new.reason),
                 "message": new.message if new.phase == ProfilePhase.FAILED.value else old.message}
    return new.model_copy(update={
        **extra,
        "runs": runs,
        "phase": phase,
        "attempts": old.attempts,
        "job_name": new.job_name or old.job_name,
        "started_at": old.started_at or new.started_at,
        "engine_starts": (old.engine_starts or 0) + (new.engine_starts or 0),
        "hardware": new.hardware or old.hardware,
        "kv_capacity_tokens": new.kv_capacity_tokens or old.kv_capacity_tokens,
        "engine_version": new.engine_version or old.engine_version,
        "validation": new.validation or old.validation,
        # kept, not dropped: a merge patch leaves a stored field the publish omits, and the seal must cover it
        "bench_failure": new.bench_failure or old.bench_failure,
        "max_concurrency_measured": max(filter(None, [old.max_concurrency_measured, new.max_concurrency_measured]),
                                        default=None),
    })


def now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def profile_document(spec: SpeculationProfileSpec, status: SpeculationProfileStatus, *, name: str | None = None,
                     namespace: str | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """The SpeculationProfile object (camelCase, as the API server and `specpilot plan --profile` read it)."""
    metadata: dict[str, Any] = {"name": name or spec.object_name()}
    if namespace:
        metadata["namespace"] = namespace
    if annotations:
        metadata["annotations"] = dict(annotations)
    return SpeculationProfile(metadata=metadata, spec=spec, status=status).dump()
