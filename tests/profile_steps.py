"""One reconciliation's profiling half, for tests of the controller's profile executor: what `controller.reconcile`
does with profiles, without the pools. `read_profiles` reads, `policy.profiling.plan_profiling` (which
`policy.plan.plan_deployment` runs) plans, `execute_profiling` writes; returns profile name -> phase."""

from __future__ import annotations

from datetime import datetime

from specpilot.controller.profiles import execute_profiling, read_profiles
from specpilot.policy.profiling import plan_profiling


async def reconcile_profiles(ctx, spec, namespace: str, sdep_name: str, needed: list, profiles: dict[str, dict],
                             jobs: dict[str, dict], reprofile: str | None, now: datetime,
                             events: list) -> dict[str, str]:
    inputs, reads = await read_profiles(ctx, spec, namespace, needed, profiles, jobs, reprofile, now, events)
    plan = plan_profiling(inputs)
    await execute_profiling(ctx, spec, namespace, sdep_name, plan, reads, events)
    return dict(plan.states)
