"""Decision quality of the schedule planner against the digital twin's truth; exit 1 when a target is missed.

For every scenario (SKU x model x method x workload) a baseline and a method profile are synthesised the way
the benchmark Job measures them (levels 1..128, k=1 and k=max runs, 5% log-normal noise, seeded), the
planner builds a schedule from them, and the schedule is scored on the twin's noise-free goodput at every
concurrency 1..256 (the batch size is capped at the KV capacity, as in the engine):

- worst ratio to the per-concurrency oracle (best k at that concurrency) - target >= 0.97,
- mean ratio to the oracle over concurrency - target >= 0.99,
- worst ratio to no speculation on the same engine - target >= 0.99.

The worst ratio is also reported within the profiled range (1..128) and beyond it (129..256), where the
planner extrapolates. Finally `specpilot plan` is timed on 20 profiles (target < 1 s).

Run: python benchmarks/decision_quality.py [--noise 0.05] [--seeds 1] [--min-gain 2]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml

from specpilot.policy.schedule import plan_from_runs
from specpilot.sim.synthetic import Scenario, synthetic_profiles, true_curves

SKUS = ("H100-SXM", "A100-80GB-SXM", "L40S")
MODELS = ("meta-llama/Llama-3.1-8B-Instruct", "Qwen/Qwen3-8B")
METHODS = ("eagle3", "draft_model", "ngram")
WORKLOADS = ("sharegpt", "humaneval", "json-extraction")
MAX_CONCURRENCY = 256
PROFILED_MAX = 128


def score(scenario: Scenario, noise: float, seed: int, min_gain_percent: float) -> dict[str, float]:
    truth = true_curves(scenario, MAX_CONCURRENCY)
    baseline, method = synthetic_profiles(scenario, noise=noise, seed=seed)
    plan = plan_from_runs(baseline.status.run(0), method.status.runs,
                          model_drafter=scenario.method != "ngram", min_gain_percent=min_gain_percent,
                          max_batch_size=MAX_CONCURRENCY)
    if not plan.ok:
        raise SystemExit(f"{scenario.label()}: planner returned no schedule: {plan.reason}")
    to_oracle, to_off = [], []
    for c in range(1, MAX_CONCURRENCY + 1):
        k = plan.k_at(min(c, truth.kv_max_concurrency))
        got = truth.goodput_tok_s[k][c - 1]
        to_oracle.append(got / max(curve[c - 1] for curve in truth.goodput_tok_s.values()))
        to_off.append(got / truth.goodput_tok_s[0][c - 1])
    return {
        "worst": min(to_oracle), "mean": statistics.fmean(to_oracle), "vs_off": min(to_off),
        "worst_in": min(to_oracle[:PROFILED_MAX]), "worst_beyond": min(to_oracle[PROFILED_MAX:]),
        "worst_at": to_oracle.index(min(to_oracle)) + 1,
    }


def time_plan(profiles_dir: Path) -> float:
    from specpilot.cli import main

    files = sorted(str(p) for p in profiles_dir.glob("*.yaml"))
    start = time.perf_counter()
    main(["plan", "--profile", *files, "-o", "json"] + ["--min-gain", "2"])
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--noise", type=float, default=0.05)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--min-gain", type=float, default=2.0, help="the policy's minGainPercent (default 2)")
    args = parser.parse_args()

    rows = []
    for sku, model, method, workload in itertools.product(SKUS, MODELS, METHODS, WORKLOADS):
        scenario = Scenario(sku, model, method, workload)
        for seed in range(args.seeds):
            rows.append((scenario.label(), seed, score(scenario, args.noise, seed, args.min_gain)))
    print(f"{'scenario':<58}{'seed':>5}{'worst':>7}{'@c':>5}{'mean':>7}{'vs off':>8}{'<=128':>7}{'>128':>7}")
    for label, seed, s in sorted(rows, key=lambda r: r[2]["worst"]):
        print(f"{label:<58}{seed:>5}{s['worst']:>7.3f}{s['worst_at']:>5}{s['mean']:>7.3f}{s['vs_off']:>8.3f}"
              f"{s['worst_in']:>7.3f}{s['worst_beyond']:>7.3f}")
    n = len(rows)
    misses = {
        "worst >= 0.97": sum(s["worst"] < 0.97 for *_, s in rows),
        "mean >= 0.99": sum(s["mean"] < 0.99 for *_, s in rows),
        "vs no-SD >= 0.99": sum(s["vs_off"] < 0.99 for *_, s in rows),
    }
    print(f"\n{n} scenario runs, noise {args.noise:g}, minGain {args.min_gain:g}%")
    print(f"mean of mean ratios {statistics.fmean(s['mean'] for *_, s in rows):.4f}; "
          f"worst within 1..{PROFILED_MAX}: {min(s['worst_in'] for *_, s in rows):.3f}; "
          f"worst beyond: {min(s['worst_beyond'] for *_, s in rows):.3f}")
    for target, missed in misses.items():
        print(f"target {target}: missed in {missed}/{n}")

    with tempfile.TemporaryDirectory() as tmp:
        count = write_plan_inputs(Path(tmp))
        with contextlib.redirect_stdout(io.StringIO()):
            seconds = time_plan(Path(tmp))
    print(f"specpilot plan on {count} profiles: {seconds:.2f} s (target < 1 s)")
    return 1 if any(misses.values()) or seconds >= 1.0 else 0


if __name__ == "__main__":
    sys.exit(main())
