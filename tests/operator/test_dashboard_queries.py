"""Every query of the chart's Grafana dashboard returns data from a real Prometheus scraping the real operator and
a serving pod's vLLM-named metrics.

The operator (`specpilot run`, metrics on a loopback port) runs a SpeculativeDeployment against the sandbox API
server through its life: profiled, decided, served with speculation at low load (live acceptance observed), then
speculation toggled off at high load (the restart strategy), with one reconciliation failing on a refused status
write. Prometheus (Debian's binary) scrapes the operator as job "specpilot" with honor_labels, as the chart's
ServiceMonitor does, and the pod's exporter with the namespace and pod labels Kubernetes discovery gives. Then each
panel's, annotation's and variable's query runs as Grafana would run it (range queries over the test's span, the
table's instant queries at its end) with the variables set to that deployment, and must return data: a metric
renamed on either side, or a label a query expects and nobody exports, fails here.

With SPECPILOT_DASHBOARD_CAPTURE=FILE the answers are also written to FILE, from which
scripts/render_dashboard.py draws the dashboard's picture for the docs (docs/images/dashboard.png).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import re
import time
from pathlib import Path

import aiohttp
import pytest
from prometheus_server import PrometheusServer, ScrapeTarget

from specpilot.observe.exporter import VllmMetricsState, start_exporter
from tests.operator.conftest import NAMESPACE, OperatorProcess
from tests.operator.scenario import (
    H100,
    condition,
    create_serving_pod,
    deployment,
    node,
    play_deployment_controller,
    publish_results,
    sdep,
    status,
)

pytestmark = [pytest.mark.operator, pytest.mark.prometheus]

DASHBOARD = Path(__file__).resolve().parents[2] / "charts" / "specpilot" / "dashboards" / "specpilot.json"
PORT = 29000 + random.randint(0, 999)
POD = "llama-h100-7d9f8-a1b2c"
VARIABLES = {"namespace": NAMESPACE, "deployment": "llama", "pool": "h100", "operator_job": "specpilot",
             "__rate_interval": "15s"}
WAIT_S = 90.0
CAPTURE_ENV = "SPECPILOT_DASHBOARD_CAPTURE"


class ScrapingPrometheus(PrometheusServer):
    """The tests' Prometheus with a second job: the operator, scraped as the chart's ServiceMonitor does."""

    def __init__(self, targets: list[ScrapeTarget], operator_address: str) -> None:
        super().__init__(targets)
        self.operator_address = operator_address

    def config(self) -> dict:
        config = super().config()
        config["scrape_configs"].append({
            "job_name": "specpilot", "honor_labels": True, "metrics_path": "/metrics",
            "static_configs": [{"targets": [self.operator_address],
                                "labels": {"namespace": "specpilot-system", "pod": "specpilot-5d8c7b9f6-x2x4q"}}]})
        return config


def substitute(expr: str) -> str:
    return re.sub(r"\$(\w+)", lambda m: VARIABLES.get(m.group(1), m.group(0)), expr)


async def ask(session: aiohttp.ClientSession, url: str, endpoint: str, **params: str) -> list:
    async with session.get(f"{url}/api/v1/{endpoint}", params=params) as response:
        body = await response.json()
    assert body.get("status") == "success", f"{endpoint} {params}: {body}"
    return body["data"]["result"] if isinstance(body["data"], dict) else body["data"]


def has_data(result: list) -> bool:
    def finite(value: str) -> bool:
        return value not in ("NaN", "+Inf", "-Inf")

    return any(finite(v) for series in result for _, v in series.get("values", [])) or \
        any(finite(series["value"][1]) for series in result if "value" in series)


async def wait_for_series(session: aiohttp.ClientSession, url: str, query: str) -> None:
    deadline = asyncio.get_running_loop().time() + WAIT_S
    while asyncio.get_running_loop().time() < deadline:
        if has_data(await ask(session, url, "query", query=query)):
            return
        await asyncio.sleep(0.5)
    pytest.fail(f"Prometheus had no data for {query} within {WAIT_S:g} s")


def pool_status(api) -> dict:
    return next(iter(status(api).get("pools") or [{}]))


async def test_every_dashboard_query_returns_data(sandbox, operator_config, tmp_path):
    from specpilot_bench.engine import free_port

    board = json.loads(DASHBOARD.read_text())
    metrics_port = free_port()
    operator = OperatorProcess(sandbox.write_kubeconfig(tmp_path / "kubeconfig", NAMESPACE), operator_config,
                               tmp_path / "operator.log",
                               ["--standalone", "--metrics-port", str(metrics_port), "--metrics-address", "127.0.0.1"])
    state = VllmMetricsState(model_name="llama")
    ip = f"127.0.{random.randint(1, 250)}.{random.randint(2, 250)}"
    runner, _ = await start_exporter(state, host=ip, port=PORT)
    controller_stop = asyncio.Event()
    controller = asyncio.create_task(play_deployment_controller(sandbox, controller_stop))
    prometheus = ScrapingPrometheus([ScrapeTarget(f"{ip}:{PORT}", NAMESPACE, POD)], f"127.0.0.1:{metrics_port}")
    operator.start()
    try:
        await asyncio.to_thread(prometheus.start)
        started = time.time()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            # One reconciliation fails on a refused status write: the error counter gets a series.
            refused = sandbox.refuse("speculativedeployments", "llama", subresource="status", times=1)
            await sandbox.create(node("gpu-a", H100, "h100"))
            # Data parallel 2: vLLM ignores a per-batch-size schedule, so the restart strategy toggles speculation.
            await sandbox.create(sdep(
                model={"id": "meta-llama/Llama-3.1-8B-Instruct", "dataParallelSize": 2},
                methods=[{"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 4}],
                policy={"tpotSloMs": 15, "hysteresis": {"bandPercent": 20, "minDwellSeconds": 1,
                                                        "cooldownSeconds": 2}},
                serving={"minReplicas": 1, "maxReplicas": 4, "port": PORT, "scaleDownStabilizationSeconds": 0},
                metrics={"source": "pods", "intervalSeconds": 5, "windowSeconds": 30}))
            await sandbox.wait_for(lambda: len(sandbox.objects("speculationprofiles", NAMESPACE)) == 2,
                                   timeout_s=WAIT_S, what="baseline and ngram profiles")
            await publish_results(sandbox, "H100-SXM")
            await sandbox.wait_for(lambda: (pool_status(sandbox).get("decision") or {}).get("method"),
                                   what="a decision")
            assert refused.hits == 1
            crossover = pool_status(sandbox)["decision"]["crossoverConcurrency"]
            await sandbox.wait_for(lambda: (condition(sandbox, "RolledOut") or {}).get("status") == "True",
                                   what="RolledOut=True")
            await create_serving_pod(sandbox, deployment(sandbox, "h100"), POD, ip)

            # Low load, speculating, acceptance well below the profile's: the live and profiled series both exist.
            profiled = next(p for p in sandbox.objects("speculationprofiles", NAMESPACE) if p["spec"].get("method"))
            acceptance = max(profiled["status"]["runs"], key=lambda r: r["numSpeculativeTokens"])["acceptance"]
            state.set_load(running=max(1.0, crossover * 0.3), waiting=0, kv_cache_usage=0.2)
            state.set_rates(request_steps_per_second=50, drafts_per_step=acceptance["draftsPerStep"],
                            acceptance_per_position=[p * 0.9 for p in acceptance["perPosition"]],
                            finished_requests_per_second=2, tpot_s=0.012)
            for query in ("specpilot_live_acceptance_rate", "specpilot_observed_tpot_p95_seconds",
                          "specpilot_reconcile_errors_total"):
                await wait_for_series(session, prometheus.url, query)

            # High load: the restart strategy turns speculation off by a rollout (a toggle) and scales up.
            state.set_load(running=crossover * 1.6, waiting=2)
            await sandbox.wait_for(lambda: pool_status(sandbox).get("speculationEnabled") is False, timeout_s=WAIT_S,
                                   what="speculation off above the band")
            await wait_for_series(session, prometheus.url, "specpilot_speculation_toggles_total")
            await wait_for_series(session, prometheus.url, "specpilot_speculation_enabled == 0")

            end = time.time()
            # Steps back from the end, so the last evaluation is at `end`: after every series waited for above.
            steps = int((end - started) // 2) + 1
            span = {"start": f"{end - 2 * steps:.3f}", "end": f"{end:.3f}", "step": "2"}
            checked = []
            answers: dict[str, list] = {}
            for panel in [p for top in board["panels"] for p in (top, *top.get("panels", []))]:
                for target in panel.get("targets", []):
                    query = substitute(target["expr"])
                    if target.get("instant"):
                        result = await ask(session, prometheus.url, "query", query=query, time=f"{end:.3f}")
                    else:
                        result = await ask(session, prometheus.url, "query_range", query=query, **span)
                    assert has_data(result), f"panel {panel['title']!r}: no data for {query}"
                    checked.append(query)
                    answers[f"{panel['id']}/{target['refId']}"] = result
            for annotation in board["annotations"]["list"]:
                if "expr" in annotation:
                    query = substitute(annotation["expr"])
                    result = await ask(session, prometheus.url, "query_range", query=query, **span)
                    assert has_data(result), f"annotation {annotation['name']!r}: no data for {query}"
                    checked.append(query)
                    answers[f"annotation/{annotation['name']}"] = result
            for variable in board["templating"]["list"]:
                if variable["type"] != "query":
                    continue
                match = re.fullmatch(r"label_values\((.+), (\w+)\)", variable["query"]["query"])
                assert match, variable["query"]["query"]
                values = await ask(session, prometheus.url, f"label/{match[2]}/values",
                                   **{"match[]": substitute(match[1]), "start": span["start"], "end": span["end"]})
                assert VARIABLES[variable["name"]] in values, (variable["name"], values)
            assert len(checked) >= 30
            if os.environ.get(CAPTURE_ENV):
                Path(os.environ[CAPTURE_ENV]).write_text(json.dumps({
                    "dashboard_sha256": hashlib.sha256(DASHBOARD.read_bytes()).hexdigest(),
                    "variables": VARIABLES, "start": float(span["start"]), "end": end, "answers": answers}))
    finally:
        controller_stop.set()
        await controller
        await runner.cleanup()
        code = await operator.stop()
        prometheus.stop()
        if code not in (0, None, -15):
            print(operator.log()[-20000:])
