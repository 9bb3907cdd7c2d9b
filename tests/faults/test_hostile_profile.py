"""A hostile (or broken) profile result: a run with K beyond the method's numSpeculativeTokens. The profile is
failed with the bound it breaks, the deployment says so (a ProfilingFailed Event, Profiled=False, phase
Degraded) and stays reconciled, serving what the other profiles support; re-profiling brings it back."""

from __future__ import annotations

import copy

import pytest

import tests.operator.scenario as scenario
from tests.faults.conftest import SKU, reconciled
from tests.operator.scenario import H100, NAMESPACE, condition, deployment, events, node, profiles, sdep, status

pytestmark = pytest.mark.operator

honest = scenario.measured_status


def beyond_k(sku: str, method: str | None, max_k: int = 4, *args, **kwargs) -> dict:
    """ngram's result with one more run at K=8, beyond the method's numSpeculativeTokens (4)."""
    result = honest(sku, method, max_k, *args, **kwargs)
    if method == "ngram":
        extra = copy.deepcopy(max(result["runs"], key=lambda r: r["numSpeculativeTokens"]))
        extra["numSpeculativeTokens"] = 8
        result["runs"].append(extra)
    return result


async def test_a_run_with_k_beyond_the_methods_fails_that_profile_only(sandbox, operators, monkeypatch):
    operators()
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep())
    await sandbox.wait_for(lambda: len(profiles(sandbox)) == 3, timeout_s=30, what="three profiles")
    monkeypatch.setattr(scenario, "measured_status", beyond_k)
    await scenario.publish_results(sandbox, SKU, timeout_s=90)

    def ngram_profile() -> dict:
        return next(p for p in profiles(sandbox) if (p["spec"].get("method") or {}).get("method") == "ngram")

    failed = await sandbox.wait_for(lambda: (ngram_profile().get("status") or {}).get("phase") == "Failed"
                                    and ngram_profile()["status"], timeout_s=60, what="the ngram profile Failed")
    message = " ".join(str(c.get("message", "")) for c in failed.get("conditions") or []) + str(failed)
    assert "numSpeculativeTokens is 8, more than the method's 4" in message, message
    warning = await sandbox.wait_for(lambda: events(sandbox, "ProfilingFailed"), timeout_s=30,
                                     what="a ProfilingFailed Event")
    assert any("ngram" in e["message"] and "ImplausibleResult" in e["message"] for e in warning)
    # The other method's profile still serves.
    await sandbox.wait_for(lambda: ((status(sandbox).get("pools") or [{}])[0].get("decision") or {}).get("method")
                           == "eagle3", timeout_s=60, what="eagle3 decided on the pool")
    await reconciled(sandbox, phase="Degraded")
    assert (condition(sandbox, "Profiled") or {}).get("status") == "False"
    assert deployment(sandbox, "h100") is not None

    # Re-profiled with an honest result: everything Succeeded, the deployment Serving.
    monkeypatch.setattr(scenario, "measured_status", honest)
    await sandbox.patch("speculativedeployments", NAMESPACE, "llama",
                        {"metadata": {"annotations": {"specpilot.io/reprofile": "after-the-fix"}}})
    await sandbox.wait_for(lambda: (ngram_profile().get("status") or {}).get("phase") not in ("Failed", "Succeeded"),
                           timeout_s=60, what="the ngram profile measured again")
    await scenario.publish_results(sandbox, SKU, timeout_s=90)
    await reconciled(sandbox, phase="Serving")
