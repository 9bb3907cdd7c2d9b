"""SIGKILL of the operator at random moments (mid-profiling, mid-decision, mid-rollout), restarted as the
kubelet would: no duplicate benchmark Jobs or serving Deployments, no published result lost or measured again,
and the deployment ends reconciled and Serving."""

from __future__ import annotations

import asyncio
import os
import random

import pytest

from tests.faults.conftest import SKU, assert_no_duplicate_jobs, reconciled
from tests.operator.scenario import (H100, H200, NAMESPACE, jobs, node, play_deployment_controller, profiles,
                                     publish_results, sdep)

pytestmark = [pytest.mark.operator, pytest.mark.slow]

KILLS = 8


async def test_sigkill_at_random_moments_loses_nothing_and_duplicates_nothing(sandbox, operators):
    seed = int(os.environ.get("SPECPILOT_FAULT_SEED") or random.randrange(1 << 30))
    rng = random.Random(seed)
    print(f"SIGKILL moments drawn with SPECPILOT_FAULT_SEED={seed}")
    stop = asyncio.Event()
    controller = asyncio.create_task(play_deployment_controller(sandbox, stop))
    try:
        await sandbox.create(node("gpu-a", H100, "h100"))
        await sandbox.create(node("gpu-b", H200, "h200"))
        await sandbox.create(sdep(gpuPools=[{"name": "h100", "nodeSelector": {"pool": "h100"}},
                                            {"name": "h200", "nodeSelector": {"pool": "h200"}}]))
        published: dict[str, str] = {}
        for _ in range(KILLS):
            op = operators()
            deadline = asyncio.get_running_loop().time() + rng.uniform(1.0, 4.0)
            while asyncio.get_running_loop().time() < deadline:
                # Play one benchmark Job at a time, so results arrive between kills as well as before them.
                started = {j["metadata"]["name"] for j in jobs(sandbox)}
                ready = [p for p in profiles(sandbox) if p["metadata"]["name"] not in published
                         and (p.get("status") or {}).get("jobName") in started]
                if ready:
                    name = ready[0]["metadata"]["name"]
                    await publish_results(sandbox, ready[0]["spec"]["sku"], names=[name])
                    published[name] = ""
                await asyncio.sleep(0.05)
            op.proc.kill()
            op.proc.wait()
            assert_no_duplicate_jobs(sandbox)
            for p in profiles(sandbox):  # a published result is never thrown away by a restarted operator
                name = p["metadata"]["name"]
                if name in published:
                    completed = (p.get("status") or {}).get("completedAt", "")
                    assert (p.get("status") or {}).get("phase") == "Succeeded", name
                    assert published[name] in ("", completed), name
                    published[name] = completed

        print(f"results published between kills: {len(published)} of {len(profiles(sandbox))} profiles")
        operators()
        for sku in (SKU, "H200"):
            await publish_results(sandbox, sku, timeout_s=120)
        status = await reconciled(sandbox, timeout_s=120)
        assert status["phase"] == "Serving"
        assert_no_duplicate_jobs(sandbox)
        assert len(profiles(sandbox)) == 6 and all(p["status"]["phase"] == "Succeeded" for p in profiles(sandbox))
        names = [d["metadata"]["name"] for d in sandbox.objects("deployments", NAMESPACE)]
        assert sorted(names) == ["llama-h100", "llama-h200"]
        for p in profiles(sandbox):
            if published.get(p["metadata"]["name"]):
                assert p["status"]["completedAt"] == published[p["metadata"]["name"]]
    finally:
        stop.set()
        await controller
