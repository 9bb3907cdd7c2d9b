"""policy.ttftSloMs: a method whose profiled TTFT p95 at the operating load exceeds the SLO is infeasible."""

from __future__ import annotations

from datetime import UTC, datetime

from specpilot.api.deployment_spec import Policy
from specpilot.policy.choose import decide_pool
from specpilot.policy.load_checks import _ttft_p95_at
from specpilot.sim.synthetic import Scenario, synthetic_profiles

NOW = datetime(2026, 1, 1, tzinfo=UTC)
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def _pool():
    profiles, candidates, baseline = {}, [], None
    for method in ("eagle3", "ngram"):
        baseline, profile = synthetic_profiles(Scenario("H100-SXM", MODEL, method, "sharegpt"), noise=0.0)
        profiles[profile.spec.method.key] = profile
        candidates.append(profile.spec.method)
    return baseline, profiles, candidates


def test_a_generous_slo_changes_nothing_and_a_tight_one_turns_speculation_off():
    baseline, profiles, candidates = _pool()
    free = decide_pool(Policy(), candidates, baseline, profiles, 2.5, 1, now=NOW).decision
    generous = decide_pool(Policy(ttft_slo_ms=1e6), candidates, baseline, profiles, 2.5, 1, now=NOW).decision
    assert free.method == generous.method == "eagle3"
    tight = decide_pool(Policy(ttft_slo_ms=0.001), candidates, baseline, profiles, 2.5, 1, now=NOW)
    assert tight.decision.method is None
    notes = {r.key: r.note for r in tight.candidates}
    assert "exceeds policy.ttftSloMs 0.001 ms" in notes["eagle3"] and "TTFT p95" in notes["ngram"]


def test_the_method_over_the_slo_gives_way_to_one_within_it():
    baseline, profiles, candidates = _pool()
    eagle = profiles["eagle3"]
    for run in eagle.status.runs:
        if run.num_speculative_tokens:
            for point in run.points:
                point.ttft_ms.p90, point.ttft_ms.p99 = 4000.0, 6000.0
    plan = decide_pool(Policy(ttft_slo_ms=2000), candidates, baseline, profiles, 2.5, 1, now=NOW)
    assert plan.decision.method == "ngram"
    assert "TTFT p95 5000 ms" in next(r.note for r in plan.candidates if r.key == "eagle3")


def test_ttft_is_interpolated_between_levels_and_clamped_at_the_ends():
    baseline, _, _ = _pool()
    run = baseline.status.run(0)
    levels = sorted(p.concurrency for p in run.points)
    first = next(p for p in run.points if p.concurrency == levels[0]).ttft_ms.p50
    last = next(p for p in run.points if p.concurrency == levels[-1]).ttft_ms.p50
    assert _ttft_p95_at(run, 0.5) == first and _ttft_p95_at(run, 10_000) == last
    a, b = levels[1], levels[2]
    va = next(p for p in run.points if p.concurrency == a).ttft_ms.p50
    vb = next(p for p in run.points if p.concurrency == b).ttft_ms.p50
    assert abs(_ttft_p95_at(run, (a + b) / 2) - (va + vb) / 2) < 1e-9
