"""A tenant cannot make the operator GET a URL of their choosing, nor read what such a URL answers.

`spec.metrics.prometheusUrl` is the tenant's; the operator reads from its own network position. A URL not
on the admin's allow-list is refused with a condition naming the field and the fix, and no request reaches
it. A URL that is allowed but answers an error has its body kept out of conditions and Events.
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from specpilot_sandbox.apiserver import SandboxApiServer
from tests.operator.scenario import H100, NAMESPACE, condition, deployment, events, node, play_deployment_controller, sdep
from tests.operator.scenario import LoopbackServer

pytestmark = pytest.mark.operator

SECRET = "INTERNAL-SECRET-TOKEN=s3cr3t"


async def internal_service(_: web.Request) -> web.Response:
    """What only the operator's network position can reach: an error page carrying a secret."""
    return web.Response(status=500, text=f"{SECRET}\n" * 20, reason="Internal Server Error")


async def serve(sandbox: SandboxApiServer, url: str) -> None:
    await sandbox.create(node("gpu-a", H100, "h100"))
    await sandbox.create(sdep(metrics={"source": "prometheus", "prometheusUrl": url, "intervalSeconds": 5,
                                       "windowSeconds": 30}))
    await sandbox.wait_for(lambda: deployment(sandbox, "h100"), what="the serving Deployment")


def everything_said(sandbox: SandboxApiServer) -> str:
    """Every word the operator wrote where the tenant can read it: the status and the Events."""
    body = sandbox.get("speculativedeployments", NAMESPACE, "llama") or {}
    return str(body.get("status")) + "".join(e.get("message") or "" for e in events(sandbox))


async def test_a_url_off_the_allow_list_is_refused_and_never_contacted(sandbox: SandboxApiServer, operators):
    stop = asyncio.Event()
    controller = asyncio.create_task(play_deployment_controller(sandbox, stop))
    async with LoopbackServer(internal_service) as target, LoopbackServer(internal_service) as admins:
        # The admin's own Prometheus is configured; the allow-list is empty (the default).
        operator = operators({"prometheusUrl": admins.url})
        try:
            await serve(sandbox, f"{target.url}/api/v1/query?x=")
            refused = await sandbox.wait_for(
                lambda: (condition(sandbox, "MetricsAvailable") or {}).get("reason") == "PrometheusUrlNotAllowed"
                and condition(sandbox, "MetricsAvailable"), timeout_s=30, what="the refusal")
            assert refused["status"] == "False"
            assert "spec.metrics.prometheusUrl is refused" in refused["message"]
            assert "allowedPrometheusUrls is empty" in refused["message"]
            assert "Remove spec.metrics.prometheusUrl" in refused["message"]
            warning = await sandbox.wait_for(lambda: events(sandbox, "PrometheusUrlNotAllowed"), what="the Event")
            assert warning[0]["type"] == "Warning"
            # Several reconciliations later (each would have observed), nothing reached either server: the
            # tenant's URL is refused, and the admin's is not substituted silently for it.
            # (A reconciliation with nothing to change sends no request: kopf's log of each timer run counts them.)
            await operator.wait_periodic_runs(sandbox, 4)
            assert target.requests == []
            assert admins.requests == []
        finally:
            stop.set()
            await controller


async def test_an_allowed_url_that_answers_an_error_is_not_echoed(sandbox: SandboxApiServer, operators):
    stop = asyncio.Event()
    controller = asyncio.create_task(play_deployment_controller(sandbox, stop))
    async with LoopbackServer(internal_service) as target:
        operators({"allowedPrometheusUrls": [f"{target.url}/tenants/*"]})
        try:
            await serve(sandbox, f"{target.url}/tenants/team")
            failed = await sandbox.wait_for(
                lambda: (condition(sandbox, "MetricsAvailable") or {}).get("status") == "False"
                and condition(sandbox, "MetricsAvailable"), timeout_s=30, what="MetricsAvailable=False")
            assert target.requests and all(r.startswith("/tenants/team/api/v1/") for r in target.requests)
            assert "HTTP 500" in failed["message"] and "not shown" in failed["message"]
            await sandbox.wait_for(lambda: events(sandbox, "MetricsUnavailable"), what="the Warning Event")
            said = everything_said(sandbox)
            assert SECRET not in said and "INTERNAL" not in said
        finally:
            stop.set()
            await controller
