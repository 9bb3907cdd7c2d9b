"""The sandbox API server's fault injection: refused writes, an outage, and what a real API server refuses."""

from __future__ import annotations

import aiohttp
import pytest

from specpilot_sandbox.apiserver import ANNOTATIONS_LIMIT, Fault, SandboxApiServer

pytestmark = pytest.mark.operator

POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "team"}}


async def test_refused_writes_answer_the_status_code_until_allowed(sandbox: SandboxApiServer):
    fault = sandbox.refuse("pods", "p", code=413)
    with pytest.raises(RuntimeError, match="HTTP 413.*RequestEntityTooLarge"):
        await sandbox.create(POD)
    assert fault.hits == 1 and sandbox.get("pods", "team", "p") is None
    sandbox.allow(fault)
    await sandbox.create(POD)
    only_status = sandbox.refuse("pods", "p", subresource="status", times=1)
    await sandbox.patch("pods", "team", "p", {"metadata": {"labels": {"a": "b"}}})  # the object itself passes
    with pytest.raises(RuntimeError, match="HTTP 422"):
        await sandbox.patch("pods", "team", "p", {"status": {"phase": "Running"}}, subresource="status")
    await sandbox.patch("pods", "team", "p", {"status": {"phase": "Running"}}, subresource="status")  # times=1
    assert only_status.hits == 1 and isinstance(only_status, Fault)


async def test_non_finite_json_and_oversized_annotations_are_refused(sandbox: SandboxApiServer):
    await sandbox.create(POD)
    async with aiohttp.ClientSession() as session:
        async with session.patch(f"{sandbox.url}/api/v1/namespaces/team/pods/p",
                                 data='{"status": {"x": NaN}}',
                                 headers={"Content-Type": "application/merge-patch+json"}) as response:
            assert response.status == 400
    big = {"metadata": {"annotations": {f"k{i}": "v" * 60_000 for i in range(5)}}}
    assert sum(60_000 + 2 for _ in range(5)) > ANNOTATIONS_LIMIT
    with pytest.raises(RuntimeError, match="Too long: must have at most 262144 bytes"):
        await sandbox.patch("pods", "team", "p", big)


async def test_the_api_server_goes_away_and_comes_back_with_its_objects(sandbox: SandboxApiServer):
    await sandbox.create(POD)
    await sandbox.go_away()
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientConnectorError):
            await session.get(f"{sandbox.url}/api/v1/namespaces/team/pods/p")
    await sandbox.come_back()
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{sandbox.url}/api/v1/namespaces/team/pods/p") as response:
            assert response.status == 200
