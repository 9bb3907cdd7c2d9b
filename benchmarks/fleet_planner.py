"""Decide time of the fleet planner (policy.fleet) for 10 GPU pools; exit 1 when the target is missed.

Ten pools with different prices, GPUs per replica, TPOT curves (9 levels, 1..256), min/max replicas and GPU
bounds, under both routing modes, at demands from a trickle to more than the fleet holds, each decision
chained to the previous one (its state: the demand history the forecast reads, the replica changes of the last
hour) as the operator chains them, sized to the default 99% SLO attainment. Target: p99 decide time < 50 ms (the
slowest is printed too; on a shared host it carries the scheduler's noise).

Run: python benchmarks/fleet_planner.py [--decisions 400] [--pools 10]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta

from specpilot.policy.fleet import CurvePoint, FleetDemand, FleetPool, FleetSettings, Routing, plan_fleet

TARGET_MS = 50.0
LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def pools(count: int, rng: random.Random) -> list[FleetPool]:
    result = []
    for i in range(count):
        base, slope = rng.uniform(5, 18), rng.uniform(0.004, 0.04)
        tp = rng.choice((1, 1, 2, 4))
        lo = rng.choice((0, 0, 1, 2))
        result.append(FleetPool(
            f"pool{i}", rng.uniform(0.8, 6.0), tp, lo, lo + rng.randint(4, 64),
            tuple(CurvePoint(c, base * (1 + slope * c), 40 + 3 * c) for c in LEVELS),
            gpus_available=rng.choice((None, 8, 16, 64)), current_replicas=lo))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=400)
    parser.add_argument("--pools", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    fleet = pools(args.pools, rng)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    times = {routing: [] for routing in Routing}
    for routing in Routing:
        settings = FleetSettings(routing=routing, tpot_slo_ms=40.0, ttft_slo_ms=1500.0)
        state = None
        for i in range(args.decisions):
            demand = FleetDemand(10 ** rng.uniform(2, 6), requests_in_flight=rng.uniform(0, 2000))
            start = time.perf_counter()
            plan = plan_fleet(fleet, demand, settings, state, now + timedelta(seconds=15 * i))
            elapsed = (time.perf_counter() - start) * 1e3
            times[routing].append(elapsed)
            state = plan.state
    worst_p99 = 0.0
    for routing, values in times.items():
        values.sort()
        p99 = values[int(0.99 * (len(values) - 1))]
        worst_p99 = max(worst_p99, p99)
        print(f"{routing.value:8s} {args.pools} pools, {len(values)} decisions: median "
              f"{statistics.median(values):.2f} ms, p99 {p99:.2f} ms, max {values[-1]:.2f} ms")
    ok = worst_p99 < TARGET_MS
    print(f"p99 decide time {worst_p99:.2f} ms (target < {TARGET_MS:g} ms): {'met' if ok else 'MISSED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
