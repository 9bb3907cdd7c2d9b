"""Malformed, NaN, ±Inf and negative metrics from a serving pod and from Prometheus: nothing non-finite or
negative reaches the status (which the API server would refuse: JSON has no NaN), the deployment stays
reconciled, and a source that gives nothing usable is reported as MetricsAvailable=False naming it, with an
Event. The answers' text never reaches a condition or an Event."""

from __future__ import annotations

import asyncio
import random
import re

import pytest
from aiohttp import web

from specpilot_sandbox.exporter import VllmMetricsState, render_metrics
from tests.faults.conftest import finite, reconciled
from tests.operator.scenario import (NAMESPACE, LoopbackServer, condition, create_serving_pod, deployment, events,
                                     publish_results, scraped_deployment, sdep, status)

pytestmark = pytest.mark.operator

SECRET = "PLANTED-IN-THE-ANSWER"


def hostile_page(running: str = "3.0") -> bytes:
    """A vLLM page whose running gauge says `running`, whose waiting gauge is -7, whose token counter is +Inf,
    whose KV usage is 1e308 and whose draft counter is -Inf."""
    state = VllmMetricsState(model_name="llama")
    state.set_load(running=3, waiting=1)
    state.set_rates(request_steps_per_second=50, drafts_per_step=1.0, acceptance_per_position=[0.8, 0.6, 0.4, 0.3],
                    finished_requests_per_second=1)
    page = render_metrics(state).decode()
    for metric, value in (("vllm:num_requests_running", running), ("vllm:num_requests_waiting", "-7"),
                          ("vllm:generation_tokens_total", "+Inf"), ("vllm:kv_cache_usage_perc", "1e308"),
                          ("vllm:spec_decode_num_drafts_total", "-Inf")):
        page = re.sub(rf"^({re.escape(metric)}\{{[^}}]*\}}) .*$", rf"\1 {value}", page, flags=re.M)
    return page.encode()


ROUND_GAP_S = 2.0
"""A query this long after the one before it begins a new observation (the operator's are 5 s apart at least)."""

MODES = {
    "not-json": lambda: web.Response(text=f"<html>{SECRET}</html>", content_type="application/json"),
    "no-result-list": lambda: web.json_response({"status": "success", "data": {"result": SECRET}}),
    "infinite": lambda: web.json_response({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"pod": SECRET}, "value": [1, "+Inf"]}, {"metric": {}, "value": [1, "-Inf"]}]}}),
    "negative": lambda: web.json_response({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {}, "value": [1, "-42"]}]}}),
}


async def test_hostile_numbers_from_pods_and_prometheus_never_reach_the_status(sandbox, operators):
    port = 30000 + random.randint(0, 999)
    ip = f"127.0.{random.randint(1, 250)}.{random.randint(2, 250)}"
    mode = {"now": "not-json", "running": "NaN"}

    async def pod(_: web.Request) -> web.Response:
        return web.Response(body=hostile_page(mode["running"]), headers={"Content-Type": "text/plain"})

    queued: list[str] = []
    """Answers to give the coming observations of the Prometheus source, one each, in turn."""
    rounds: list[str] = []
    """Per observation of the Prometheus source (a burst of queries every intervalSeconds), its answer."""
    last_query = [float("-inf")]

    async def prometheus(_: web.Request) -> web.Response:
        now = asyncio.get_running_loop().time()
        if now - last_query[0] > ROUND_GAP_S:  # a new observation: the next answer in line, if any
            if queued:
                mode["now"] = queued.pop(0)
            rounds.append(mode["now"])
        last_query[0] = now
        return MODES[mode["now"]]()

    async with LoopbackServer(prometheus) as prom, LoopbackServer(pod, port, host=ip):
        operators({"prometheusUrl": prom.url})
        async with scraped_deployment(sandbox, port):
            # Profiles of its own (another model): the two deployments' profiling does not interleave.
            viaprom = sdep(metrics={"source": "prometheus", "intervalSeconds": 5, "windowSeconds": 30},
                           model={"id": "meta-llama/Llama-3.1-8B", "servedName": "llama"})
            viaprom["metadata"]["name"] = "viaprom"
            await sandbox.create(viaprom)
            await sandbox.wait_for(lambda: len(sandbox.objects("speculationprofiles", NAMESPACE)) == 6,
                                   what="three profiles of each deployment")
            await publish_results(sandbox, "H100-SXM", timeout_s=90)
            for name in ("llama", "viaprom"):
                await sandbox.wait_for(lambda name=name: status(sandbox, name).get("phase") == "Serving",
                                       timeout_s=60, what=f"{name} Serving")
            serving = await sandbox.wait_for(lambda: deployment(sandbox, "h100"), what="the serving Deployment")
            await create_serving_pod(sandbox, serving, "llama-h100-5f6c7-a1b2c", ip)

            # A page whose running gauge is NaN is no vLLM page: MetricsAvailable=False names the pod, one Event.
            unavailable = await sandbox.wait_for(
                lambda: (c := condition(sandbox, "MetricsAvailable")) and c["status"] == "False"
                and "llama-h100-5f6c7-a1b2c" in c["message"] and c, timeout_s=60,
                what="MetricsAvailable=False naming the pod with the NaN page")
            assert "llama-h100-5f6c7-a1b2c" in unavailable["message"]
            assert [e for e in events(sandbox, "MetricsUnavailable") if e["involvedObject"]["name"] == "llama"]
            assert finite(status(sandbox))
            await reconciled(sandbox)

            # Running readable, the rest negative or infinite: observed, and nothing unphysical is kept.
            mode["running"] = "3.0"
            await sandbox.wait_for(lambda: (condition(sandbox, "MetricsAvailable") or {}).get("status") == "True",
                                   timeout_s=60, what="MetricsAvailable=True")
            # (the status that says so holds that observation: the next comes intervalSeconds later)
            current = status(sandbox)
            assert finite(current)
            for pool in current.get("pools") or []:
                observed = pool.get("observed") or {}
                assert all(v >= 0 for v in observed.values() if isinstance(v, (int, float)))
            assert (current.get("observedConcurrency") or 0) >= 0
            await reconciled(sandbox, phase=None)

            # Prometheus: each broken answer in turn is reported, never echoed, never raised out of a reconcile.
            # The operator asks at most every intervalSeconds: each answer is given to one whole observation, and
            # the status is read once the next observation began (the reconciliation that read it has ended).
            first = len(rounds)
            queued.extend(MODES)
            for i, name in enumerate(MODES):
                await sandbox.wait_for(lambda i=i: len(rounds) >= first + i + 2, timeout_s=30,
                                       what=f"the observation after the one answered {name}")
                assert rounds[first + i] == name
                current = status(sandbox, "viaprom")
                assert finite(current), name
                assert SECRET not in str(current), name
                assert (condition(sandbox, "Reconciled", "viaprom") or {}).get("status") == "True", name
            available = condition(sandbox, "MetricsAvailable", "viaprom")
            assert available["status"] == "False" and prom.url in available["message"]
            warnings = [e for e in events(sandbox) if e["involvedObject"]["name"] == "viaprom"
                        and e["type"] == "Warning"]
            assert warnings and all(SECRET not in e["message"] for e in warnings)
