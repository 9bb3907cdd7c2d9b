"""The schedule's prior (issue 14): k does not rise with batch size unless the data prove it."""

from __future__ import annotations

from specpilot.policy.schedule import PRIOR_Z, _best_non_increasing, _monotone_prior, plan_from_runs
from specpilot.sim.synthetic import Scenario, synthetic_profiles


def _rises(ks) -> bool:
    return any(b > a for a, b in zip(ks, ks[1:]))


def test_a_noisy_rise_back_to_speculation_is_held_down():
    # 5% noise on this profile makes the per-batch choice turn SD off at 89 and on again (k=1) from 162
    scenario = Scenario("A100-80GB-SXM", "meta-llama/Llama-3.1-8B-Instruct", "draft_model", "json-extraction")
    baseline, method = synthetic_profiles(scenario, noise=0.05, seed=0)
    plan = plan_from_runs(baseline.status.run(0), method.status.runs, min_gain_percent=2, max_batch_size=256)
    assert plan.ok and plan.prior == "imposed"
    assert not _rises(plan.k_by_batch_size)
    assert plan.crossover_concurrency is not None  # SD stays off above it, once


def test_noise_free_profiles_never_need_the_prior():
    for method in ("eagle3", "draft_model", "ngram"):
        scenario = Scenario("H100-SXM", "Qwen/Qwen3-8B", method, "json-extraction")
        baseline, method_profile = synthetic_profiles(scenario, noise=0.0, seed=0)
        plan = plan_from_runs(baseline.status.run(0), method_profile.status.runs,
                              model_drafter=method != "ngram", min_gain_percent=2, max_batch_size=256)
        assert plan.prior == "monotone" and not _rises(plan.k_by_batch_size)


def test_the_best_non_increasing_schedule_maximises_summed_log_goodput():
    goodput = {0: [1.0, 1.0, 1.0, 1.0], 1: [1.5, 1.2, 0.9, 1.1], 2: [2.0, 1.1, 0.5, 0.5]}
    allowed = [[0, 1, 2]] * 4
    assert _best_non_increasing(allowed, goodput) == [2, 1, 0, 0]
    # a batch size that allows only a higher k than its predecessor can: no such schedule
    assert _best_non_increasing([[0], [2]], goodput) is None


class _Surface:
    def __init__(self, se: float | None) -> None:
        self.se = se

    def ratio_se(self, a: int, b: int, c: float) -> float | None:
        return self.se


def test_a_rise_stays_only_when_the_data_prove_it():
    goodput = {0: [1.0] * 4, 1: [1.3, 1.2, 1.0, 1.10]}
    tpot = {0: [10.0] * 4, 1: [8.0] * 4}
    dense = [1, 1, 0, 1]  # the rise at batch 4 gains 10% over k=0
    held, how = _monotone_prior(list(dense), _Surface(0.10 / PRIOR_Z + 0.01), goodput, tpot, None, 0.02, set())
    assert (held, how) == ([1, 1, 0, 0], "imposed")
    kept, how = _monotone_prior(list(dense), _Surface(0.01), goodput, tpot, None, 0.02, set())
    assert (kept, how) == (dense, "overturned")
    held, how = _monotone_prior(list(dense), _Surface(None), goodput, tpot, None, 0.02, set())
    assert how == "imposed"  # no standard error (no roofline fit): nothing proves the rise
