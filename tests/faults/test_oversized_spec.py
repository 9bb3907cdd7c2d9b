"""A spec over 256 KB: the operator refuses to act on it (Valid=False naming the size and the fix, one
Event), kopf's last-handled annotation stays under the API server's 256 KiB annotation limit (the sandbox
enforces it), so no endless error loop; shrinking the spec brings the deployment back."""

from __future__ import annotations

import json

import pytest

from tests.faults.conftest import reconciled
from tests.operator.scenario import NAMESPACE, H100, condition, events, node, profiles, sdep

pytestmark = pytest.mark.operator


def _huge() -> dict:
    body = sdep()
    # 40 annotations of 7 KB in the serving pods' template: about 290 KB of spec, all of it well-formed.
    body["spec"]["serving"]["podOverrides"] = {"metadata": {"annotations": {
        f"example.com/note-{i}": "x" * 7000 for i in range(40)}}}
    assert len(json.dumps(body["spec"])) > 256 * 1024
    return body


async def test_a_spec_over_256_kb_is_refused_with_the_fix_and_recovers(sandbox, operators):
    op = operators()
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(_huge())
    valid = await sandbox.wait_for(lambda: (c := condition(sandbox, "Valid")) and c["status"] == "False" and c,
                                   timeout_s=30, what="Valid=False")
    assert valid["reason"] == "InvalidSpec" and "bytes as JSON" in valid["message"]
    assert "shorten lists and free-form fields" in valid["message"]
    await op.wait_periodic_runs(sandbox, 3)  # several reconciliations: still one Event, no profiles
    assert len(events(sandbox, "InvalidSpec")) == 1
    assert profiles(sandbox) == []
    obj = sandbox.get("speculativedeployments", NAMESPACE, "llama")
    annotations = obj["metadata"].get("annotations") or {}
    assert sum(len(k) + len(v) for k, v in annotations.items()) < 16 * 1024
    assert "digest" in annotations.get("specpilot.io/last-handled-configuration", "")
    assert "annotations: Too long" not in op.log()

    await sandbox.patch("speculativedeployments", NAMESPACE, "llama", {"spec": {"serving": {"podOverrides": None}}})
    await sandbox.wait_for(lambda: len(profiles(sandbox)) == 3, timeout_s=30, what="profiles after the fix")
    status = await reconciled(sandbox, phase="Profiling")
    assert (condition(sandbox, "Valid") or {}).get("status") == "True"
    assert status["phase"] == "Profiling"
