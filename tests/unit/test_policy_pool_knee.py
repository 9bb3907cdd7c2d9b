"""A pool's methods share the target's knee and weight share: each method's roofline fit weighs in what the
others measured of them (`pool_surfaces`), unless its own runs refuse it."""

from __future__ import annotations

import math

import numpy as np

from specpilot.api.deployment_spec import Policy
from specpilot.policy.choose import decide_pool
from specpilot.policy.schedule import plan_schedule
from specpilot.perf.roofline_fit import _ALL_KNEES, ROOFLINE_GRID_SHAPE, pool_roofline_priors
from specpilot.policy.surface import MethodSurface, build_surface, pool_surfaces
from specpilot.sim.synthetic import Scenario, synthetic_profiles

METHODS = ("eagle3", "draft_model", "ngram")


def _pool(seed: int, sku: str = "H100-SXM", noise: float = 0.05):
    """The pool's shared baseline run and each method's (baseline, runs, model drafter)."""
    baseline = None
    methods = {}
    for method in METHODS:
        scenario = Scenario(sku, "meta-llama/Llama-3.1-8B-Instruct", method, "sharegpt")
        base, profile = synthetic_profiles(scenario, noise=noise, seed=seed)
        baseline = baseline or base.status.run(0)
        methods[method] = (baseline, profile.status.runs, method != "ngram")
    return methods


def _true_knee(sku: str = "H100-SXM") -> float:
    twin = Scenario(sku, "meta-llama/Llama-3.1-8B-Instruct", "eagle3", "sharegpt").twin()
    return twin._target.weight_s / twin._target.gemm_s_per_token


def _knee_spread(surface: MethodSurface) -> float:
    """Standard deviation of log N over the fit's (finite-knee) candidates, weighted by their likelihood."""
    fit = surface.fit
    finite = np.isfinite(fit.knee_tokens)
    weights = fit.weights[finite] / fit.weights[finite].sum()
    logs = np.log(fit.knee_tokens[finite])
    return float(math.sqrt(weights @ np.square(logs - weights @ logs)))


def test_each_method_gets_the_sum_of_the_others_evidence_never_its_own():
    a, b, c = (np.full(ROOFLINE_GRID_SHAPE, v) for v in (-1.0, -2.0, -4.0))
    priors = pool_roofline_priors({"a": a, "b": b, "c": c, "none": None})
    assert np.allclose(priors["a"], -6.0) and np.allclose(priors["b"], -5.0) and np.allclose(priors["c"], -3.0)
    assert np.allclose(priors["none"], -7.0)
    assert pool_roofline_priors({"alone": a}) == {"alone": None}
    assert pool_roofline_priors({"a": a, "b": None})["a"] is None


def test_pooling_narrows_the_knee_each_method_weighs():
    """The others' evidence narrows the knees each method's fit weighs (what the benchmark measures it buys:
    benchmarks/decision_quality.py with and without --no-shared-knee)."""
    for seed in range(3):
        methods = _pool(seed)
        pooled = pool_surfaces(methods)
        for key, (baseline, runs, drafter) in methods.items():
            alone = build_surface(baseline, runs, model_drafter=drafter)
            assert alone.fit is not None and alone.fit.shared_prior == "none"
            assert alone.roofline_evidence is not None and alone.roofline_evidence.shape == ROOFLINE_GRID_SHAPE
            assert pooled[key].fit.shared_prior == "used"
            assert _knee_spread(pooled[key]) < _knee_spread(alone)


def test_a_method_whose_runs_refuse_the_shared_knee_is_fitted_on_its_own_and_says_so():
    methods = _pool(0)
    baseline, runs, drafter = methods["eagle3"]
    alone = build_surface(baseline, runs, model_drafter=drafter)
    wrong = np.full(ROOFLINE_GRID_SHAPE, -1000.0)
    triple = int(np.argmin(np.abs(np.log(_ALL_KNEES / (3 * _true_knee())))))
    wrong[triple, :] = 0.0  # all the weight on three times the GPU's knee, which these runs cannot fit
    refused = build_surface(baseline, runs, model_drafter=drafter, shared_prior=wrong)
    assert refused.fit.shared_prior == "refused"
    assert any("fitted on its own runs alone" in note for note in refused.notes)
    assert np.allclose(refused.fit.weights, alone.fit.weights)
    for c in (1, 32, 128, 256):
        assert refused.speedup(1, c) == alone.speedup(1, c)


def test_a_method_without_a_fit_neither_gives_nor_takes_evidence():
    methods = _pool(1)
    baseline, runs, drafter = methods["ngram"]
    few = [run.model_copy(update={"points": run.points[:3]}) for run in runs]  # 3 levels: no roofline fit
    methods["ngram"] = (baseline, few, drafter)
    pooled = pool_surfaces(methods)
    assert isinstance(pooled["ngram"], MethodSurface) and pooled["ngram"].fit is None
    assert pooled["ngram"].roofline_evidence is None
    assert pooled["eagle3"].fit.shared_prior == "used"  # from the draft model alone


def test_decide_pool_plans_each_candidate_on_the_pooled_fit():
    """The pool's decision plans each candidate on the fit pool_surfaces gives, not on its own runs alone
    (on this draw at least one method's schedule differs between the two)."""
    methods = _pool(2)
    pooled = pool_surfaces(methods)
    candidates, profiles, baseline_profile = [], {}, None
    for method in METHODS:
        scenario = Scenario("H100-SXM", "meta-llama/Llama-3.1-8B-Instruct", method, "sharegpt")
        base, profile = synthetic_profiles(scenario, noise=0.05, seed=2)
        baseline_profile = baseline_profile or base
        candidates.append(scenario.candidate())
        profiles[scenario.candidate().key] = profile
    plan = decide_pool(Policy(min_gain_percent=0), candidates, baseline_profile, profiles,
                       price_per_gpu_hour=1.0, gpus_per_replica=1, max_batch_size=256)
    rows = {row.method: row for row in plan.candidates if row.method}
    differs = False
    for method, (baseline, runs, drafter) in methods.items():
        assert rows[method].ready and rows[method].strategy.value == "dynamic"
        decided = [rows[method].schedule.k_at(c) for c in range(1, 257)]
        assert decided == [plan_schedule(pooled[method], None, 0, 256).k_at(c) for c in range(1, 257)]
        alone = plan_schedule(build_surface(baseline, runs, model_drafter=drafter), None, 0, 256)
        differs = differs or decided != [alone.k_at(c) for c in range(1, 257)]
    assert differs


def test_a_method_alone_in_its_pool_is_fitted_as_before():
    methods = _pool(3)
    baseline, runs, drafter = methods["eagle3"]
    pooled = pool_surfaces({"eagle3": (baseline, runs, drafter)})["eagle3"]
    alone = build_surface(baseline, runs, model_drafter=drafter)
    assert pooled.fit.shared_prior == "none" and pooled.roofline_evidence is None
    assert np.allclose(pooled.fit.weights, alone.fit.weights)
    assert [pooled.speedup(1, c) for c in (8, 64, 256)] == [alone.speedup(1, c) for c in (8, 64, 256)]
