"""Decision quality of the schedule planner against the digital twin's truth; exit 1 when a target is missed.

For every scenario (SKU x model x method x workload) and seed, a baseline and a method profile are
synthesised the way the benchmark Job measures them (the profiled levels, k=1 and k=max runs, 5% log-normal
noise on every level's step and prefill time), the planner builds a schedule from them, and the schedule is
scored on the twin's noise-free goodput at every concurrency 1..256 (the engine's batch is capped at the
KV capacity, as in the engine):

- worst: the lowest ratio to the per-concurrency oracle (the best k at that concurrency on the method's
  engine) - target >= 0.97;
- mean: the mean of that ratio over concurrency - target >= 0.99;
- vs no-SD: the lowest ratio to no speculation - target >= 0.99. No-SD is the plain engine without the
  drafter loaded (the twin's baseline engine). Where no k on the method's engine reaches it (a loaded draft
  model still prefills every prompt and takes KV memory), the schedule cannot either: the bar there is the
  oracle, min(no-SD, oracle). How far the drafter alone costs is shown separately ("drafter") - that is
  decide_pool's trade-off (method vs no speculation over the load), not the schedule's.

The table shows each scenario's worst seed; the summary counts scenario-seeds missing each target, for the
chosen levels and minimum gain and for the alternatives (the API default levels, powers of two to 128, 19
denser levels; minimum gain 1, 2 and 5%). Below the summary, where the misses are: what the schedule chose
against the oracle there, the concurrency region, the method, how precisely the profile gives the gain of
k=1 over k=0 near the crossover, and how many vs-no-SD misses the minimum gain forgoes by design.
`specpilot plan` on 20 profiles is timed at the end (target < 1 s).

Run: python benchmarks/decision_quality.py [--noise 0.05] [--seeds 3] [--min-gain 2] [--levels 1,2,...]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import io
import itertools
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from specpilot.api.deployment import DEFAULT_CONCURRENCY_LEVELS
from specpilot.policy.schedule import SMOOTHING_TOLERANCE, plan_from_runs
from specpilot.sim.synthetic import Scenario, TrueCurves, synthetic_profiles, true_curves

SKUS = ("H100-SXM", "A100-80GB-SXM", "L40S")
MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B")
METHODS = ("eagle3", "draft_model", "ngram")
WORKLOADS = ("sharegpt", "humaneval", "json-extraction")
MAX_CONCURRENCY = 256
LEVELS_TO_128 = (1, 2, 4, 8, 16, 32, 64, 128)
"""Powers of two to 128 (the API default before 48, 96, 192 and 256 were added)."""
LEVELS_DENSE = (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256)
"""19 levels, denser where the crossovers lie (32..256): what measuring more levels buys."""
TARGETS = {"worst": 0.97, "mean": 0.99, "vs_no_sd": 0.99}


@dataclasses.dataclass(frozen=True)
class Score:
    worst: float
    worst_at: int
    mean: float
    vs_no_sd: float
    drafter: float
    """Lowest ratio of the oracle to no-SD: below 1 where the loaded drafter costs more than any k gains."""
    worst_k: tuple[int, int] = (0, 0)
    """(planned k, oracle k) at `worst_at`."""
    vs_no_sd_at: int = 1
    vs_no_sd_k: tuple[int, int] = (0, 0)
    """(planned k, oracle k) at `vs_no_sd_at`, the concurrency of the lowest ratio to min(no-SD, oracle)."""
    vs_no_sd_guarded: bool = False
    """At `vs_no_sd_at` the schedule keeps k=0 and the oracle's true gain over k=0 is within the minimum
    gain and the smoothing tolerance: forgone by design (k=0 on a drafter-loaded engine is below no-SD)."""
    gain_errors: tuple[float, ...] = ()
    """log(estimated / true) of G_1 / G_0 at the concurrencies (within the KV capacity) where the true gain of
    k=1 over k=0 is within -5..+5%: the precision the decision at the crossover rests on."""

    def misses(self) -> dict[str, bool]:
        return {name: getattr(self, name) < bar for name, bar in TARGETS.items()}


def score(scenario: Scenario, truth: TrueCurves, noise: float, seed: int, min_gain_percent: float,
          levels: tuple[int, ...]) -> Score:
    baseline, method = synthetic_profiles(scenario, noise=noise, seed=seed, levels=levels)
    plan = plan_from_runs(baseline.status.run(0), method.status.runs,
                          model_drafter=scenario.method != "ngram", min_gain_percent=min_gain_percent,
                          max_batch_size=MAX_CONCURRENCY)
    if not plan.ok:
        raise SystemExit(f"{scenario.label()}: planner returned no schedule: {plan.reason}")
    to_oracle, to_off, drafter, ks, errors = [], [], [], [], []
    for c in range(1, MAX_CONCURRENCY + 1):
        true_gain = truth.goodput_tok_s[1][c - 1] / truth.goodput_tok_s[0][c - 1]
        if c <= truth.kv_max_concurrency and abs(true_gain - 1.0) <= 0.05 and plan.surface is not None:
            errors.append(math.log(plan.surface.speedup(1, c) / true_gain))
        planned = plan.k_at(min(c, truth.kv_max_concurrency))
        got = truth.goodput_tok_s[planned][c - 1]
        oracle = max(curve[c - 1] for curve in truth.goodput_tok_s.values())
        no_sd = truth.baseline_goodput_tok_s[c - 1]
        to_oracle.append(got / oracle)
        to_off.append(got / min(no_sd, oracle))
        drafter.append(oracle / no_sd)
        ks.append((planned, truth.oracle_k(c)))
    worst = min(to_oracle)
    worst_at = to_oracle.index(worst) + 1
    vs_at = to_off.index(min(to_off)) + 1
    oracle_gain = max(curve[vs_at - 1] for curve in truth.goodput_tok_s.values()) / truth.goodput_tok_s[0][vs_at - 1]
    margin = (1.0 + min_gain_percent / 100.0) * (1.0 + SMOOTHING_TOLERANCE)
    guarded = ks[vs_at - 1][0] == 0 and oracle_gain <= margin
    return Score(worst, worst_at, statistics.fmean(to_oracle), min(to_off), min(drafter), ks[worst_at - 1],
                 vs_at, ks[vs_at - 1], guarded, tuple(errors))


def evaluate(truths: dict[Scenario, TrueCurves], noise: float, seeds: int, min_gain_percent: float,
             levels: tuple[int, ...]) -> dict[tuple[Scenario, int], Score]:
    return {(scenario, seed): score(scenario, truth, noise, seed, min_gain_percent, levels)
            for scenario, truth in truths.items() for seed in range(seeds)}


def summary(scores: dict[tuple[Scenario, int], Score]) -> str:
    n = len(scores)
    missed = {name: sum(s.misses()[name] for s in scores.values()) for name in TARGETS}
    mean_of_means = statistics.fmean(s.mean for s in scores.values())
    worst = min(s.worst for s in scores.values())
    return (f"missed worst>=0.97 {missed['worst']:>3}/{n}, mean>=0.99 {missed['mean']:>3}/{n}, "
            f"vs no-SD>=0.99 {missed['vs_no_sd']:>3}/{n}; lowest worst {worst:.3f}, mean of means {mean_of_means:.4f}")


def _region(c: int, levels: tuple[int, ...]) -> str:
    if c > levels[-1]:
        return f"c>{levels[-1]} (beyond the profiled levels)"
    return "c 1-32" if c <= 32 else "c 33-128" if c <= 128 else "c 129-256"


def _kind(planned: int, oracle: int) -> str:
    if planned == 0:
        return "SD off, oracle on"
    if oracle == 0:
        return "SD on, oracle off"
    return "k too low" if planned < oracle else "k too high"


def breakdown(scores: dict[tuple[Scenario, int], Score], levels: tuple[int, ...]) -> str:
    """Where the scenario-seeds missing the worst and vs-no-SD targets miss them: what the schedule chose
    against the oracle at the concurrency of the miss, the concurrency region, and the method."""
    lines = []
    worst = [(sc, s) for (sc, _), s in scores.items() if s.misses()["worst"]]
    vs = [(sc, s) for (sc, _), s in scores.items() if s.misses()["vs_no_sd"]]
    for title, misses, at, k_of in (("worst", worst, lambda s: s.worst_at, lambda s: s.worst_k),
                                    ("vs no-SD", vs, lambda s: s.vs_no_sd_at, lambda s: s.vs_no_sd_k)):
        if not misses:
            continue
        by_kind = collections.Counter(_kind(*k_of(s)) for _, s in misses)
        by_region = collections.Counter(_region(at(s), levels) for _, s in misses)
        by_method = collections.Counter(sc.method for sc, _ in misses)
        lines.append(f"  {title} misses ({len(misses)}): "
                     + ", ".join(f"{name} {n}" for name, n in by_kind.most_common()) + "; "
                     + ", ".join(f"{name} {n}" for name, n in by_region.most_common()) + "; "
                     + ", ".join(f"{name} {n}" for name, n in by_method.most_common()))
    errors = sorted(abs(e) for s in scores.values() for e in s.gain_errors)
    if errors:
        rms = math.sqrt(statistics.fmean(e * e for e in errors))
        lines.append(f"  estimated gain of k=1 over k=0 where the true gain is within 5%: RMS error {rms:.1%}, "
                     f"95th percentile {errors[int(0.95 * (len(errors) - 1))]:.1%}, largest {errors[-1]:.1%} "
                     f"({len(errors)} concurrencies)")
    guarded = sum(s.vs_no_sd_guarded for _, s in vs)
    if vs:
        lines.append(f"  vs no-SD misses where k=0 was kept and the oracle's true gain over it is within the "
                     f"minimum gain plus the smoothing tolerance (forgone by design): {guarded}")
    return "\n".join(lines)


def time_plan(profiles_dir: Path) -> float:
    from specpilot.cli import main

    files = sorted(str(p) for p in profiles_dir.glob("*.yaml"))
    start = time.perf_counter()
    main(["plan", "--profile", *files, "-o", "json"])
    return time.perf_counter() - start


def write_plan_inputs(directory: Path) -> int:
    """20 profiles: 4 SKU/model groups x (baseline + 4 methods)."""
    count = 0
    for sku, model in itertools.product(("H100-SXM", "A100-80GB-SXM"), MODELS):
        for method in ("eagle3", "draft_model", "ngram", "suffix"):
            baseline, profile = synthetic_profiles(Scenario(sku, model, method), noise=0.05, seed=count)
            (directory / f"{count:02d}.yaml").write_text(yaml.safe_dump(profile.dump()))
            count += 1
        (directory / f"{count:02d}.yaml").write_text(yaml.safe_dump(baseline.dump()))
        count += 1
    return count


def _levels(text: str) -> tuple[int, ...]:
    levels = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    if not levels or levels[0] < 1:
        raise argparse.ArgumentTypeError(f"--levels needs positive integers, e.g. 1,2,4 (got {text!r})")
    return levels


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--noise", type=float, default=0.05, help="sigma of the log-normal noise (default 0.05)")
    parser.add_argument("--seeds", type=int, default=3, help="noise draws per scenario (default 3)")
    parser.add_argument("--min-gain", type=float, default=2.0, help="the policy's minGainPercent (default 2)")
    parser.add_argument("--levels", type=_levels, default=tuple(DEFAULT_CONCURRENCY_LEVELS),
                        help="profiled concurrency levels (default: the API default, "
                             f"{','.join(map(str, DEFAULT_CONCURRENCY_LEVELS))})")
    parser.add_argument("--no-alternatives", action="store_true", help="skip the summary of other settings")
    args = parser.parse_args()

    truths = {scenario: true_curves(scenario, MAX_CONCURRENCY)
              for scenario in itertools.starmap(Scenario, itertools.product(SKUS, MODELS, METHODS, WORKLOADS))}
    scores = evaluate(truths, args.noise, args.seeds, args.min_gain, args.levels)
    print(f"levels {','.join(map(str, args.levels))}; noise {args.noise:g}; minGain {args.min_gain:g}%; "
          f"{args.seeds} seed(s) per scenario, each scenario's worst seed shown")
    print(f"{'scenario':<62}{'worst':>7}{'@c':>5}{'mean':>7}{'vs no-SD':>10}{'drafter':>9}")
    by_scenario: dict[Scenario, list[Score]] = {}
    for (scenario, _), s in scores.items():
        by_scenario.setdefault(scenario, []).append(s)
    for scenario, runs in sorted(by_scenario.items(), key=lambda item: min(s.worst for s in item[1])):
        worst = min(runs, key=lambda s: s.worst)
        print(f"{scenario.label():<62}{worst.worst:>7.3f}{worst.worst_at:>5}{min(s.mean for s in runs):>7.3f}"
              f"{min(s.vs_no_sd for s in runs):>10.3f}{worst.drafter:>9.3f}")
    print(f"\n{summary(scores)}")
    text = breakdown(scores, args.levels)
    if text:
        print(f"where the misses are (at each scenario-seed's lowest ratio):\n{text}")

    if not args.no_alternatives:
        print("\nother settings (same noise and seeds):")
        level_sets = list(dict.fromkeys((tuple(DEFAULT_CONCURRENCY_LEVELS), LEVELS_TO_128, LEVELS_DENSE)))
        for levels, min_gain in itertools.product(level_sets, (1.0, 2.0, 5.0)):
            if (levels, min_gain) == (args.levels, args.min_gain):
                continue
            label = f"levels 1..{levels[-1]} ({len(levels)}), minGain {min_gain:g}%"
            print(f"  {label:<34}{summary(evaluate(truths, args.noise, args.seeds, min_gain, levels))}")

    with tempfile.TemporaryDirectory() as tmp:
        count = write_plan_inputs(Path(tmp))
        with contextlib.redirect_stdout(io.StringIO()):
            seconds = time_plan(Path(tmp))
    print(f"\nspecpilot plan on {count} profiles: {seconds:.2f} s (target < 1 s)")
    missed = any(any(s.misses().values()) for s in scores.values())
    return 1 if missed or seconds >= 1.0 else 0


if __name__ == "__main__":
    sys.exit(main())
