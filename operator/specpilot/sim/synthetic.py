"""Synthetic SpeculationProfiles from the digital twin, measured the way the benchmark Job measures them.

Only the profiled levels are "measured" (the API default levels, 1..256): a baseline profile with one K=0
run, and a method profile with runs at k=1 and at the method's maximum K, each level's throughput,
latencies and speculative-decoding counters taken from `Twin.benchmark_point` with optional log-normal
noise from a seeded generator. `true_curves` gives the twin's noise-free goodput and TPOT at every
concurrency and k, to score decisions made from the noisy profiles.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np

from .. import specdec
from ..api.deployment_spec import DEFAULT_CONCURRENCY_LEVELS, DEFAULT_ENGINE_IMAGE, Workload
from ..api.methods import CandidateMethod, method_family
from ..api.profile import (
    Acceptance,
    LatencyStats,
    LevelPoint,
    ProfilePhase,
    ProfileTarget,
    Run,
    SpeculationProfile,
    SpeculationProfileSpec,
    SpeculationProfileStatus,
)
from ..perf import DEFAULT_CATALOG, Twin, resolve_model

__all__ = ["PROMPT_TOKENS", "Scenario", "TrueCurves", "synthetic_profiles", "true_curves"]

PROMPT_TOKENS = {"sharegpt": 256, "humaneval": 160, "json-extraction": 1024, "random": 1024}
"""Mean prompt length assumed per workload (random takes the scenario's prompt_len)."""

_FIXED_TIME = datetime(2026, 1, 1, tzinfo=UTC)


@dataclasses.dataclass(frozen=True)
class Scenario:
    """One (SKU, model, method, workload) to synthesise; `method` is a vLLM method name (eagle3, ngram, ...)."""

    sku: str
    model_id: str
    method: str
    workload: str = "sharegpt"
    max_k: int = 4
    tensor_parallel_size: int = 1
    output_len: int = 256
    prompt_len: int | None = None
    """Prompt tokens per request; the workload's typical length when unset."""

    @property
    def prompt_tokens(self) -> int:
        return self.prompt_len or PROMPT_TOKENS.get(self.workload, 256)

    def twin(self, speculative: bool = True) -> Twin:
        """The twin of the pool's engine: with the method's drafter loaded, or the plain baseline engine."""
        gpu = DEFAULT_CATALOG.resolve(self.sku)
        model = resolve_model(self.model_id)
        if not speculative:
            return Twin(gpu, model, self.tensor_parallel_size, workload=self.workload)
        return Twin(gpu, model, self.tensor_parallel_size, method=method_family(self.method),
                    workload=self.workload)

    def candidate(self) -> CandidateMethod:
        drafter = self.twin().drafter
        return CandidateMethod(method=self.method, model=drafter.name if drafter is not None else None,
                               num_speculative_tokens=self.max_k)

    def label(self) -> str:
        return f"{self.sku}/{self.model_id.rsplit('/', 1)[-1]}/{self.method}/{self.workload}"


def _point(twin: Twin, scenario: Scenario, concurrency: int, k: int, rng: np.random.Generator | None,
           noise: float, requests: int) -> LevelPoint:
    m = twin.benchmark_point(concurrency, k, scenario.prompt_tokens, scenario.output_len, rng=rng, noise=noise,
                             num_requests=requests)
    running = min(concurrency, max(1, twin.max_concurrency(scenario.prompt_tokens + scenario.output_len)))
    # peak usage: the running requests near their full length (what holds admission back when requests wait)
    peak_context = scenario.prompt_tokens + scenario.output_len
    spec = {}
    if k > 0:
        spec = {"num_drafts": m["num_drafts"], "num_draft_tokens": m["num_draft_tokens"],
                "num_accepted_tokens": m["num_accepted_tokens"], "accepted_per_position": m["accepted_per_position"]}
    return LevelPoint(
        concurrency=concurrency,
        completed=requests,
        duration_s=requests / m["request_throughput"],
        request_throughput=m["request_throughput"],
        output_throughput=m["output_throughput_tok_s"],
        ttft_ms=LatencyStats(mean=m["ttft_ms"], p50=m["ttft_ms"]),
        tpot_ms=LatencyStats(mean=m["tpot_ms"], p50=m["tpot_ms"]),
        itl_ms=LatencyStats(mean=m["itl_ms"], p50=m["itl_ms"]),
        generation_tokens=requests * scenario.output_len,
        mean_running=float(running),
        mean_waiting=float(concurrency - running),
        kv_cache_usage=min(1.0, running * peak_context / twin.kv_capacity_tokens()),
        **spec,
    )


def _run(twin: Twin, scenario: Scenario, k: int, levels: Sequence[int], rng: np.random.Generator | None,
         noise: float, requests: int) -> Run:
    points = [_point(twin, scenario, c, k, rng, noise, requests) for c in levels]
    acceptance = None
    if k > 0:
        drafts = sum(p.num_drafts for p in points)
        accepted = sum(p.num_accepted_tokens for p in points)
        per_position = specdec.acceptance_per_position(
            drafts, [sum(p.accepted_per_position[j] for p in points) for j in range(k)])
        drafts_per_step = specdec.drafts_per_request_step(drafts, sum(p.generation_tokens for p in points), accepted,
                                                          sum(p.completed for p in points))
        acceptance = Acceptance(per_position=per_position, drafts_per_step=drafts_per_step,
                                mean_acceptance_length=specdec.mean_acceptance_length(drafts, accepted))
    return Run(num_speculative_tokens=k, points=points, acceptance=acceptance)


def _profile(scenario: Scenario, method: CandidateMethod | None, runs: list[Run], levels: Sequence[int],
             kv_capacity_tokens: int, requests: int) -> SpeculationProfile:
    workload = Workload(name=scenario.workload, output_len=scenario.output_len,
                        input_len=scenario.prompt_tokens if scenario.workload == "random" else None)
    spec = SpeculationProfileSpec(
        model=ProfileTarget(id=scenario.model_id, tensor_parallel_size=scenario.tensor_parallel_size),
        method=method, sku=scenario.sku, engine_image=DEFAULT_ENGINE_IMAGE, workload=workload,
        concurrency_levels=list(levels), requests_per_level=requests)
    status = SpeculationProfileStatus(
        phase=ProfilePhase.SUCCEEDED, engine_version="synthetic", started_at=_FIXED_TIME, completed_at=_FIXED_TIME,
        runs=runs, kv_capacity_tokens=kv_capacity_tokens, max_concurrency_measured=max(levels),
        engine_starts=len(runs))
    return SpeculationProfile(metadata={"name": spec.object_name()}, spec=spec, status=status)


def synthetic_profiles(scenario: Scenario, noise: float = 0.05, seed: int = 0,
                       levels: Sequence[int] = tuple(DEFAULT_CONCURRENCY_LEVELS),
                       requests_per_level: int = 64) -> tuple[SpeculationProfile, SpeculationProfile]:
    """(baseline profile with a K=0 run, method profile with runs at k=1 and k=max_k), Succeeded.

    `noise` is the sigma of log-normal noise on each level's step and prefill times (0 for exact values).
    """
    rng = np.random.default_rng(seed)
    base_twin = scenario.twin(speculative=False)
    method_twin = scenario.twin()
    baseline = _profile(scenario, None, [_run(base_twin, scenario, 0, levels, rng, noise, requests_per_level)],
                        levels, base_twin.kv_capacity_tokens(), requests_per_level)
    ks = sorted({1, scenario.max_k})
    method = _profile(scenario, scenario.candidate(),
                      [_run(method_twin, scenario, k, levels, rng, noise, requests_per_level) for k in ks],
                      levels, method_twin.kv_capacity_tokens(), requests_per_level)
    return baseline, method


@dataclasses.dataclass(frozen=True)
class TrueCurves:
    """The twin's noise-free goodput (output tokens/s) and TPOT (ms) per k, at concurrency 1..max_concurrency."""

    goodput_tok_s: dict[int, tuple[float, ...]]
    """k -> values at concurrency 1, 2, ...; k=0 is the method's engine with speculation off."""
    tpot_ms: dict[int, tuple[float, ...]]
    baseline_goodput_tok_s: tuple[float, ...]
    """The engine without the method loaded (no drafter memory): what no speculation at all gives."""
    kv_max_concurrency: int
    """Requests of the scenario's length whose KV cache fits in the method's engine."""

    def oracle_k(self, concurrency: int) -> int:
        return max(self.goodput_tok_s, key=lambda k: (self.goodput_tok_s[k][concurrency - 1], -k))


def true_curves(scenario: Scenario, max_concurrency: int = 256) -> TrueCurves:
    """Noise-free curves of the scenario for k = 0..max_k at every concurrency 1..max_concurrency."""
    twin = scenario.twin()
    base = scenario.twin(speculative=False)
    prompt, output = scenario.prompt_tokens, scenario.output_len
    goodput: dict[int, tuple[float, ...]] = {}
    tpot: dict[int, tuple[float, ...]] = {}
    for k in range(scenario.max_k + 1):
        points = [twin.benchmark_point(c, k, prompt, output) for c in range(1, max_concurrency + 1)]
        goodput[k] = tuple(p["output_throughput_tok_s"] for p in points)
        tpot[k] = tuple(p["tpot_ms"] for p in points)
    baseline = tuple(base.benchmark_point(c, 0, prompt, output)["output_throughput_tok_s"]
                     for c in range(1, max_concurrency + 1))
    return TrueCurves(goodput, tpot, baseline, twin.max_concurrency(prompt + output))
