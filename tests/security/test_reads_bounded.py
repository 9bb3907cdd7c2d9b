"""One tenant's metrics endpoint cannot exhaust the operator that serves every namespace.

The real operator scrapes three hostile serving pods of its own (loopback addresses) and reads a hostile
Prometheus: a 200 MB /metrics page, a page whose `position` label says 3,000,000, a page that trickles one
byte at a time (slowloris), and a Prometheus answer of 64 MB. Each read is bounded (size, time, position),
MetricsTruncated says what was cut, no answer's text reaches a condition or an Event, and the operator's
peak RSS stays far below the chart's 512 Mi limit (it is printed: the figure docs/security.md quotes).
"""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import pytest
from aiohttp import web

from specpilot_sandbox.apiserver import SandboxApiServer
from specpilot_sandbox.exporter import VllmMetricsState, render_metrics
from tests.operator.scenario import (
    NAMESPACE,
    condition,
    create_serving_pod,
    deployment,
    events,
    sdep,
    scraped_deployment,
)
from tests.operator.scenario import LoopbackServer

pytestmark = pytest.mark.operator

SECRET = "INTERNAL-SECRET-TOKEN=s3cr3t"
"""Planted in every hostile answer: it must never come back in a condition or an Event."""
OVERSIZED_BYTES = 200 * 2**20
LIMIT_MIB = 4
RSS_CEILING_MB = 300
"""Far above what the bounded operator needs (it peaked near 130 MB here) and far below the 1.2 GB the
unbounded one reached on the same page; the chart's limit is 512 Mi."""


def valid_page() -> bytes:
    state = VllmMetricsState(model_name="llama")
    state.set_load(running=3, waiting=1)
    state.set_rates(request_steps_per_second=50, drafts_per_step=1.0, acceptance_per_position=[0.8, 0.6, 0.4, 0.3],
                    finished_requests_per_second=1)
    return render_metrics(state)


async def oversized(request: web.Request) -> web.StreamResponse:
    """A valid page, then 200 MB of comment lines carrying the secret, streamed without a Content-Length."""
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    await response.write(valid_page())
    line = f"# {SECRET} {'x' * 1000}\n".encode()
    chunk = line * (2**20 // len(line))
    sent = 0
    while sent < OVERSIZED_BYTES:
        await response.write(chunk)
        sent += len(chunk)
    await response.write_eof()
    return response


async def far_position(_: web.Request) -> web.Response:
    """A valid vLLM page whose per-position counter names draft position 3,000,000."""
    page = valid_page() + (b'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="llama",'
                           b'position="3000000"} 1.0\n')
    return web.Response(body=page, headers={"Content-Type": "text/plain"})


async def slowloris(request: web.Request) -> web.StreamResponse:
    """Headers at once, then one byte every half second, forever."""
    response = web.StreamResponse(headers={"Content-Type": "text/plain"})
    await response.prepare(request)
    for byte in (valid_page() + SECRET.encode()) * 1000:
        await response.write(bytes([byte]))
        await asyncio.sleep(0.5)
    return response


async def huge_prometheus(request: web.Request) -> web.StreamResponse:
    """A Prometheus that answers every query with 64 MB of JSON (declared, so it is refused unread)."""
    series = ('{"metric":{"pod":"' + SECRET + '"},"value":[1,"1"]},').encode()
    count = 64 * 2**20 // len(series)
    head, tail = b'{"status":"success","data":{"resultType":"vector","result":[', b'{"metric":{},"value":[1,"1"]}]}}'
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.content_length = len(head) + len(series) * count + len(tail)
    await response.prepare(request)
    await response.write(head)
    for _ in range(count // 1024):
        await response.write(series * 1024)
    await response.write(series * (count % 1024) + tail)
    return response


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM in /proc")


async def test_hostile_metrics_endpoints_are_read_within_bounds(sandbox: SandboxApiServer, operators):
    port = 29000 + random.randint(0, 999)
    base = f"127.0.{random.randint(1, 250)}"
    pods = {"llama-h100-5f6c7-big": (f"{base}.2", oversized), "llama-h100-5f6c7-far": (f"{base}.3", far_position),
            "llama-h100-5f6c7-slow": (f"{base}.4", slowloris)}
    servers = [LoopbackServer(handler, port, host=ip) for ip, handler in pods.values()]
    async with LoopbackServer(huge_prometheus) as prometheus, servers[0], servers[1], servers[2]:
        op = operators({"prometheusUrl": prometheus.url, "metricsReadLimits": {"scrapeTimeoutSeconds": 2}})
        async with scraped_deployment(sandbox, port):
            prom = sdep(metrics={"source": "prometheus", "intervalSeconds": 5, "windowSeconds": 30})
            prom["metadata"]["name"] = "viaprom"
            await sandbox.create(prom)
            serving = await sandbox.wait_for(lambda: deployment(sandbox, "h100"), what="the serving Deployment")
            for name, (ip, _) in pods.items():
                await create_serving_pod(sandbox, serving, name, ip)

            def cut(name: str) -> str | None:
                found = condition(sandbox, "MetricsTruncated", name)
                return found["message"] if found and found["status"] == "True" else None

            def all_three_cut() -> str | None:
                message = cut("llama") or ""
                return message if all(pod in message for pod in pods) else None

            message = await sandbox.wait_for(all_three_cut, timeout_s=90, what="MetricsTruncated naming every pod")
            assert f"pod llama-h100-5f6c7-big: /metrics answer over the {LIMIT_MIB} MiB limit" in message
            assert "pod llama-h100-5f6c7-far: 1 position label(s) outside 0..3" in message
            assert "pod llama-h100-5f6c7-slow: /metrics no complete answer within 2 s" in message
            # The page that was only out of range still counts, and its acceptance has K=4 positions at most.
            available = condition(sandbox, "MetricsAvailable", "llama")
            assert available["status"] == "True", available
            observed = next(iter(sandbox.get("speculativedeployments", NAMESPACE, "llama")["status"]["pools"]))
            assert len(observed["observed"]["acceptancePerPosition"]) <= 4

            prom_cut = await sandbox.wait_for(lambda: cut("viaprom"), timeout_s=60, what="Prometheus cut")
            assert f"over the {LIMIT_MIB} MiB limit (metricsReadLimits.maxResponseBytes): not read" in prom_cut
            assert (condition(sandbox, "MetricsAvailable", "viaprom") or {}).get("status") == "False"

            peak = peak_rss_mb(op.pid)
            print(f"operator peak RSS under the hostile endpoints: {peak:.0f} MB")
            assert peak < RSS_CEILING_MB
            assert op.proc is not None and op.proc.poll() is None, "the operator must still run"
            for name in ("llama", "viaprom"):
                status = sandbox.get("speculativedeployments", NAMESPACE, name)["status"]
                assert SECRET not in str(status)
            await sandbox.wait_for(lambda: events(sandbox, "MetricsTruncated"), what="a MetricsTruncated Event")
            assert all(SECRET not in (e.get("message") or "") for e in events(sandbox))
