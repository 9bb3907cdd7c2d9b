"""The fault suite: the real operator (a `specpilot run` subprocess, started by the security suite's
`operators` fixture) against the sandbox API server, which can refuse writes (`SandboxApiServer.refuse`),
go away (`go_away`/`come_back`), and refuses what a real API server refuses (NaN in JSON, annotations over
256 KiB). Every test ends with the resource reconciled and its status true."""

from __future__ import annotations

import math

from specpilot_sandbox.apiserver import SandboxApiServer
from tests.operator.conftest import pytest_runtest_makereport, sandbox  # noqa: F401 (fixtures and the hook, shared)
from tests.operator.scenario import NAMESPACE, condition, deployment, events, jobs, profiles, status
from tests.security.conftest import operators  # noqa: F401 (the fixture, shared)

SKU = "H100-SXM"


def finite(value) -> bool:
    """Whether a JSON-like value holds only finite numbers."""
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(finite(v) for v in value.values())
    if isinstance(value, list):
        return all(finite(v) for v in value)
    return True


async def reconciled(api: SandboxApiServer, phase: str | None = "Serving", timeout_s: float = 90.0,
                     name: str = "llama") -> dict:
    """Wait until the deployment's last reconciliation ran to its end for its current generation (and its
    phase is `phase`); its status."""
    def done() -> dict | None:
        obj = api.get("speculativedeployments", NAMESPACE, name) or {}
        cond = condition(api, "Reconciled", name) or {}
        current = obj.get("status") or {}
        if cond.get("status") == "True" and current.get("observedGeneration") == \
                obj["metadata"].get("generation") and (phase is None or current.get("phase") == phase):
            return current
        return None

    result = await api.wait_for(done, timeout_s=timeout_s,
                                what=f"Reconciled=True for the current generation, phase {phase}")
    assert finite(result)
    return result


def assert_no_duplicate_jobs(api: SandboxApiServer) -> None:
    """One benchmark Job per profile at most, and every Job belongs to a live profile."""
    from specpilot.manifests.names import LABEL_PROFILE

    owners = [j["metadata"]["labels"].get(LABEL_PROFILE) for j in jobs(api)]
    assert len(owners) == len(set(owners)), owners


__all__ = ["SKU", "assert_no_duplicate_jobs", "condition", "deployment", "events", "finite", "profiles",
           "reconciled", "status"]
