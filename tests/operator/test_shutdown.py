"""A stopped operator stops cleanly: no timer left orphaned, no HTTP session left open.

SIGTERM arrives while a timer is mid-reconciliation (scraping a pod that takes seconds to answer): kopf
used to give it a few event-loop cycles, log "Timer ... did not exit in time. Leaving it orphaned." and
exit under it, and Python then reported the scrape's session as "Unclosed connector".
"""

from __future__ import annotations

import asyncio
import random

import pytest
from aiohttp import web

from specpilot_sandbox.exporter import VllmMetricsState, render_metrics
from tests.operator.scenario import LoopbackServer, create_serving_pod, deployment, scraped_deployment

pytestmark = pytest.mark.operator


async def test_sigterm_mid_scrape_exits_without_orphans_or_open_sessions(sandbox, operator):
    scraping, sigterm_received = asyncio.Event(), asyncio.Event()
    state = VllmMetricsState(model_name="llama")
    state.set_load(running=2)

    async def slow_metrics(_: web.Request) -> web.Response:
        # The page is answered only once the operator has logged SIGTERM: the signal surely arrives mid-scrape
        # (within the operator's 5 s scrape timeout), however long the start-up took.
        scraping.set()
        await asyncio.wait_for(sigterm_received.wait(), timeout=10)
        return web.Response(body=render_metrics(state), headers={"Content-Type": "text/plain"})

    ip = f"127.0.{random.randint(1, 250)}.{random.randint(2, 250)}"
    async with LoopbackServer(slow_metrics, 30000 + random.randint(0, 999), host=ip) as server:
        port = server.port
        async with scraped_deployment(sandbox, port):
            serving = await sandbox.wait_for(lambda: deployment(sandbox, "h100"), what="the serving Deployment")
            await create_serving_pod(sandbox, serving, "llama-h100-6b7c8-d9e0f", ip)
            await asyncio.wait_for(scraping.wait(), timeout=60)
            process = operator.proc
            stopping = asyncio.create_task(operator.stop())
            await sandbox.wait_for(lambda: "Signal SIGTERM is received" in operator.log(), timeout_s=10,
                                   what="the operator to log the SIGTERM")
            sigterm_received.set()
            await stopping
            assert process.returncode == 0, operator.log()[-5000:]
            log = operator.log()
            assert "Signal SIGTERM is received" in log
            assert "did not exit in time" not in log and "Leaving it orphaned" not in log
            assert "Unclosed connector" not in log and "Unclosed client session" not in log
