"""The demo's fidelity check: a profile measured on the simulated GPUs against the host-free replay of its runs."""

from __future__ import annotations

import pytest
from specpilot.api.profile import LevelPoint, Run, SpeculationProfileSpec, SpeculationProfileStatus
from specpilot_sandbox.demo.report import fidelity_lines
from specpilot_sandbox.demo.run import DemoResult, pool_fidelity
from specpilot_sandbox.fidelity import FIDELITY_BOUND_PERCENT, profile_fidelity

SPEC = {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "sku": "H100-SXM", "engineImage": "vllm/vllm-openai:v0.32.0",
        "method": {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "numSpeculativeTokens": 2},
        "workload": {"name": "sharegpt", "outputLen": 16}, "concurrencyLevels": [1, 8], "requestsPerLevel": 4}


def _profile(throughputs: dict[tuple[int, int], float]) -> dict:
    runs = []
    for k in sorted({k for k, _ in throughputs}):
        points = [LevelPoint(concurrency=c, output_throughput=v) for (kk, c), v in sorted(throughputs.items()) if kk == k]
        runs.append(Run(num_speculative_tokens=k, points=points))
    status = SpeculationProfileStatus(phase="Succeeded", runs=runs)
    spec = SpeculationProfileSpec.model_validate(SPEC)
    return {"metadata": {"name": "h100-eagle3"}, "spec": spec.model_dump(by_alias=True, exclude_none=True),
            "status": status.model_dump(by_alias=True, exclude_none=True)}


def _twin_figures() -> dict[tuple[int, int], float]:
    probe = profile_fidelity(_profile({(k, c): 1.0 for k in (1, 2) for c in (1, 8)}))
    return {(level.num_speculative_tokens, level.concurrency): level.twin_tokens_per_s for level in probe.levels}


def test_a_profile_that_measured_the_twin_is_faithful_and_one_that_did_not_is_named():
    twin = _twin_figures()
    assert twin[(2, 1)] > twin[(1, 1)] > 0  # more speculation pays at batch 1 on the twin
    exact = profile_fidelity(_profile(twin))
    assert abs(exact.worst.error_percent) < 1e-6 and len(exact.levels) == 4
    slow = dict(twin)
    slow[(1, 8)] *= 0.9  # a host that stretched the k=1 level at 8 by 10%
    off = profile_fidelity(_profile(slow))
    assert off.worst.num_speculative_tokens == 1 and off.worst.concurrency == 8
    assert off.worst.error_percent == pytest.approx(-10.0)


def test_the_demo_refuses_results_beyond_the_bound_and_says_what_to_do():
    twin = _twin_figures()
    pools = [{"name": "h100", "sku": "H100-SXM"}]
    good = DemoResult(fidelity=pool_fidelity([_profile(twin)], pools))
    assert good.faithful and good.fidelity["h100"].worst_percent == pytest.approx(0.0, abs=1e-6)
    assert not any("NOT valid" in line for line in fidelity_lines(good))
    skewed = {key: value * (1.12 if key == (2, 8) else 1.0) for key, value in twin.items()}
    bad = DemoResult(fidelity=pool_fidelity([_profile(skewed)], pools))
    assert not bad.faithful
    assert bad.fidelity["h100"].worst_percent == pytest.approx(12.0, abs=0.01)
    assert bad.fidelity["h100"].worst_percent > FIDELITY_BOUND_PERCENT
    assert "K=2 at concurrency 8" in bad.fidelity["h100"].where
    lines = fidelity_lines(bad)
    assert "NOT valid" in lines[-1] and "--time-scale" in lines[-1]


def test_a_refinement_point_between_the_sweeps_levels_is_not_replayed():
    twin = _twin_figures()
    refined = _profile({**twin, (1, 5): twin[(1, 8)] * 0.5})  # a change of k's batch size, measured on its own
    fidelity = profile_fidelity(refined)
    assert {(level.num_speculative_tokens, level.concurrency) for level in fidelity.levels} == set(twin)
    assert abs(fidelity.worst.error_percent) < 1e-6
