"""The API server goes away for longer than kopf's retry budget (its error back-offs sum to 54 s) and comes
back: the operator (restarted, as the kubelet would, if it exited) carries on where it was, with no
duplicate Jobs and no lost result."""

from __future__ import annotations

import asyncio

import kopf
import pytest

from tests.faults.conftest import SKU, assert_no_duplicate_jobs, reconciled
from tests.operator.scenario import H100, jobs, node, profiles, publish_results, sdep

pytestmark = [pytest.mark.operator, pytest.mark.slow]

OUTAGE_S = sum(kopf.OperatorSettings().networking.error_backoffs) + 6


async def test_the_api_server_gone_past_kopfs_retry_budget(sandbox, operators):
    op = operators()
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep())
    await sandbox.wait_for(lambda: len(jobs(sandbox)) == 2, timeout_s=30, what="the first two Jobs")
    first = await publish_results(sandbox, SKU, names=[p["metadata"]["name"] for p in profiles(sandbox)
                                                        if (p.get("status") or {}).get("jobName")][:1])

    await sandbox.go_away()
    restarts = 0
    for _ in range(int(OUTAGE_S)):
        await asyncio.sleep(1)
        if op.proc.poll() is not None:  # the kubelet restarts an operator that exited
            restarts += 1
            op.start()
    await sandbox.come_back()

    await publish_results(sandbox, SKU, timeout_s=120)
    status = await reconciled(sandbox, timeout_s=120)
    assert status["phase"] == "Serving"
    assert_no_duplicate_jobs(sandbox)
    assert all(p["status"]["phase"] == "Succeeded" for p in profiles(sandbox))
    assert first[0] in {p["metadata"]["name"] for p in profiles(sandbox)}
    print(f"operator restarts during the outage: {restarts}")
