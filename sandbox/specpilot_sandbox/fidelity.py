"""How faithfully a profile measured on the simulated GPUs holds the twin's figures.

A benchmark Job in the sandbox measures a simulated engine on a virtual clock (`sandbox.clock`), so what it
measures should be what the engine's own scheduler computes for the same requests without any host at all:
`engine_core.closed_loop_level` replays each run of the profile (the same engine configuration, the same
prompts in the same order, the same warm-up before each level, the levels one after another on one engine)
and gives the output throughput the profile should show at each level. The worst relative gap over the
profile's points is its fidelity error; the demo reports it per pool and refuses to present decisions made
from profiles beyond `FIDELITY_BOUND_PERCENT`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from specpilot.api.profile import SpeculationProfileSpec, SpeculationProfileStatus

from .engine import build_config, make_core, tokenize
from .engine_core import closed_loop_level

__all__ = ["FIDELITY_BOUND_PERCENT", "LevelFidelity", "ProfileFidelity", "profile_fidelity"]

FIDELITY_BOUND_PERCENT = 5.0
"""A profile whose output throughput at some level is further than this from the twin's is not trusted."""


@dataclass(frozen=True)
class LevelFidelity:
    num_speculative_tokens: int
    concurrency: int
    measured_tokens_per_s: float
    twin_tokens_per_s: float

    @property
    def error_percent(self) -> float:
        return 100.0 * (self.measured_tokens_per_s / self.twin_tokens_per_s - 1.0)


@dataclass
class ProfileFidelity:
    name: str
    sku: str
    method: str
    levels: list[LevelFidelity] = field(default_factory=list)

    @property
    def worst(self) -> LevelFidelity | None:
        return max(self.levels, key=lambda level: abs(level.error_percent), default=None)


def _engine_argv(spec: SpeculationProfileSpec, k: int, workload: str) -> list[str]:
    """The simulated engine's arguments for the run at k, as the bench and the sandbox's kubelet launch it."""
    from specpilot_bench.profiles import run_speculative_config

    argv = ["--model", spec.model.id, "--sku", spec.sku, "--workload", workload]
    if spec.model.max_model_len:
        argv += ["--max-model-len", str(spec.model.max_model_len)]
    if spec.engine is not None:
        if spec.engine.gpu_memory_utilization is not None:
            argv += ["--gpu-memory-utilization", str(spec.engine.gpu_memory_utilization)]
        argv += list(spec.engine.extra_args)
    if k and spec.method is not None:
        argv += ["--speculative-config", json.dumps(run_speculative_config(spec.method, k, None))]
    return argv


def profile_fidelity(profile: dict, *, workload: str = "sharegpt") -> ProfileFidelity:
    """Replays every run of a SpeculationProfile object (as stored in the API) on the twin; see the module."""
    from specpilot_bench.cli import level_prompts
    from specpilot_bench.sweep import default_warmup

    spec = SpeculationProfileSpec.model_validate(profile["spec"])
    status = SpeculationProfileStatus.model_validate(profile.get("status") or {})
    method = str(getattr(spec.method.method, "value", spec.method.method)) if spec.method else "baseline"
    out = ProfileFidelity(name=profile["metadata"]["name"], sku=spec.sku, method=method)
    prompts = level_prompts(spec)
    output_len = spec.workload.output_len
    for run in status.runs:
        config = build_config(_engine_argv(spec, run.num_speculative_tokens, workload))
        room = config.max_model_len - output_len
        core = make_core(config)
        swept: set[int] = set()
        for point in run.points:
            if point.concurrency in swept or point.concurrency not in prompts:
                continue  # a refinement round's point (a repeat, or a change of k's batch size between the
                # sweep's levels), measured on an engine of its own: not this replay's
            swept.add(point.concurrency)
            lens = [min(room, max(1, len(tokenize(p.text)))) for p in prompts[point.concurrency]]
            warmup = default_warmup(point.concurrency)
            closed_loop_level(core, lens[:1] * warmup, output_len, warmup)
            twin = closed_loop_level(core, lens, output_len, point.concurrency)
            out.levels.append(LevelFidelity(run.num_speculative_tokens, point.concurrency,
                                            point.output_throughput, twin.output_throughput))
    return out
