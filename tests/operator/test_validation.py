"""An invalid SpeculativeDeployment gets a condition and one Event naming the field; nothing crashes."""

from __future__ import annotations

import pytest

from tests.operator.scenario import NAMESPACE, condition, events, profiles, sdep

pytestmark = pytest.mark.operator


async def test_invalid_resource_gets_condition_and_event_not_a_crash(sandbox, operator):
    bad = sdep(gpuPools=[{"name": "h100", "nodeSelector": {"pool": "h100"}, "pricePerGpuHour": -3}])
    bad["spec"]["methods"][1].pop("model")
    await sandbox.create(bad, validate=False)  # the CRD refuses it; stored before its rules (an upgrade)

    valid = await sandbox.wait_for(lambda: condition(sandbox, "Valid"), what="the Valid condition")
    assert valid["status"] == "False"
    assert valid["reason"] == "InvalidSpec"
    assert "spec.gpuPools[0].pricePerGpuHour" in valid["message"]
    assert "spec.methods[1]: method eagle3 needs `model`" in valid["message"]
    warning = await sandbox.wait_for(lambda: events(sandbox, "InvalidSpec"), what="an InvalidSpec Event")
    assert warning[0]["type"] == "Warning"
    assert "pricePerGpuHour" in warning[0]["message"]

    await operator.wait_periodic_runs(sandbox, 3)  # several reconciliations: still one Event, no profiles, alive
    assert len(events(sandbox, "InvalidSpec")) == 1
    assert profiles(sandbox) == []
    assert operator.proc.poll() is None
    assert (sandbox.get("speculativedeployments", NAMESPACE, "llama")["status"]["phase"]) == "Failed"

    fixed = sdep()
    await sandbox.patch("speculativedeployments", NAMESPACE, "llama", {"spec": fixed["spec"]})
    await sandbox.wait_for(lambda: (condition(sandbox, "Valid") or {}).get("status") == "True",
                           what="Valid=True after the fix")
