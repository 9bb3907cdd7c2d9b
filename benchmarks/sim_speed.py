"""Speed of the fleet simulator and the diurnal policy comparison; exit 1 when a target is missed.

1. A 24-hour diurnal day (40-200 req/s, Llama-3.1-8B on H100-SXM, ShareGPT lengths) on 8 replicas under
   specpilot (the operator's pool planner at every 15 s control step), on one core - target < 60 s.
2. `specpilot simulate`'s default comparison (a diurnal day compressed into 3 hours, 4 replicas, 1-8 when
   autoscaling): does specpilot+autoscale beat every fixed policy on $/Mtok at equal or better SLO
   attainment?

Run: python benchmarks/sim_speed.py [--hours 24] [--skip-comparison]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # one core, as the target says

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

from specpilot.sim.cli import DEFAULT_METHODS, DEFAULT_MODEL, DEFAULT_TRACE  # noqa: E402
from specpilot.sim.fleet import FleetConfig, FleetSetup, engine_tables, simulate  # noqa: E402
from specpilot.sim.policies import Candidate, PlanningInputs, build_policies, profile_and_decide_pool  # noqa: E402
from specpilot.sim.report import Comparison, table_rows, verdict  # noqa: E402
from specpilot.sim.traces import DiurnalTrace, parse_trace  # noqa: E402

TARGET_S = 60.0


def time_day(hours: float) -> tuple[float, object]:
    setup = FleetSetup(DEFAULT_MODEL, "H100-SXM")
    trace = DiurnalTrace(duration_s=hours * 3600, peak_rps=200, trough_rps=40, period_s=hours * 3600)
    inputs = PlanningInputs(setup, (Candidate("eagle3", 4),), replicas=8, max_replicas=8, slo_tpot_ms=15)
    planning = profile_and_decide_pool(inputs, trace)
    policy = next(p for p in build_policies(inputs, planning) if p.name == "specpilot")  # the operator's planner
    config = FleetConfig()
    engine_tables(setup, config, None, 0)  # the step tables are built once per engine, outside the timing
    engine_tables(setup, config, planning.chosen.method, planning.chosen.num_speculative_tokens)
    start = time.perf_counter()
    result = simulate(policy, trace, setup, config, slo_tpot_ms=15, max_replicas=8)
    return time.perf_counter() - start, result


def comparison() -> Comparison:
    setup = FleetSetup(DEFAULT_MODEL, "H100-SXM")
    trace = parse_trace(DEFAULT_TRACE)
    candidates = tuple(Candidate.parse(m) for m in DEFAULT_METHODS.split(","))
    inputs = PlanningInputs(setup, candidates, replicas=4, max_replicas=8, slo_tpot_ms=15)
    start = time.perf_counter()
    planning = profile_and_decide_pool(inputs, trace)
    policies = build_policies(inputs, planning)
    results = [simulate(p, trace, setup, slo_tpot_ms=15, max_replicas=8) for p in policies]
    return Comparison(inputs, trace, planning, results, {p.name: p.description for p in policies},
                      time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=24.0, help="simulated hours of the timed run (default 24)")
    parser.add_argument("--skip-comparison", action="store_true")
    args = parser.parse_args()

    seconds, result = time_day(args.hours)
    print(f"{args.hours:g} h diurnal (40-200 req/s) on 8 replicas: {seconds:.1f} s "
          f"({result.requests_arrived:,} requests, {result.output_tok_s:,.0f} output tok/s, "
          f"{args.hours * 3600 / seconds:,.0f}x real time) - target < {TARGET_S:g} s: "
          f"{'met' if seconds < TARGET_S else 'MISSED'}")
    ok = seconds < TARGET_S
    if not args.skip_comparison:
        comp = comparison()
        rows = table_rows(comp)
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        print(f"\n{comp.trace.describe()}; decision: {comp.planning.dynamic.decision.reason}")
        for row in rows:
            print("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths))))
        v = verdict(comp.results)
        print(f"\n{v.words()} ({comp.seconds:.1f} s)")
        ok = ok and v.beats_all
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
