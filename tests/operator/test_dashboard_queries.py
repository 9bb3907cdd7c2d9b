"""Every query of the chart's Grafana dashboard returns data from a real Prometheus scraping the real operator and
a serving pod's vLLM-named metrics.

The operator (`specpilot run`, metrics on a loopback port) runs a SpeculativeDeployment with two pools (so the fleet
placement shares traffic between them) against the sandbox API server through its life: profiled, decided, served
with speculation at low load (live acceptance observed), then speculation toggled off at high load (the restart
strategy), with one reconciliation failing on a refused status write. Prometheus (Debian's binary) scrapes the
operator as job "specpilot" with honor_labels, as the chart's ServiceMonitor does, and each pod's exporter with the
namespace and pod labels Kubernetes discovery gives. Then each
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

from specpilot_sandbox.exporter import VllmMetricsState, start_exporter
from tests.operator.conftest import NAMESPACE, OperatorProcess
from tests.operator.scenario import (
    H100,
    H200,
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
# pool -> (node's GPU product, SKU, its one serving pod)
POOLS = {"h100": (H100, "H100-SXM", "llama-h100-7d9f8-a1b2c"), "h200": (H200, "H200", "llama-h200-5c6d7-d3e4f")}
# As Grafana writes them with both pools selected (a multi-value variable becomes a regex alternation).
VARIABLES = {"namespace": NAMESPACE, "deployment": "llama", "pool": "(h100|h200)", "operator_job": "specpilot",
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


def pool_status(api, pool: str) -> dict:
    return next((p for p in status(api).get("pools") or [] if p["name"] == pool), {})


async def test_every_dashboard_query_returns_data(sandbox, operator_config, tmp_path):
    from specpilot_bench.engine import free_port

    board = json.loads(DASHBOARD.read_text())
    metrics_port = free_port()
    operator = OperatorProcess(sandbox.write_kubeconfig(tmp_path / "kubeconfig", NAMESPACE), operator_config,
                               tmp_path / "operator.log",
                               ["--standalone", "--metrics-port", str(metrics_port), "--metrics-address", "127.0.0.1"])
    states, runners, ips = {}, [], {}
    for pool in POOLS:
        states[pool] = VllmMetricsState(model_name="llama")
        ips[pool] = f"127.0.{random.randint(1, 250)}.{random.randint(2, 250)}"
        runners.append((await start_exporter(states[pool], host=ips[pool], port=PORT))[0])
    controller_stop = asyncio.Event()
    controller = asyncio.create_task(play_deployment_controller(sandbox, controller_stop))
    prometheus = ScrapingPrometheus([ScrapeTarget(f"{ips[pool]}:{PORT}", NAMESPACE, pod)
                                     for pool, (_, _, pod) in POOLS.items()], f"127.0.0.1:{metrics_port}")
    operator.start()
    try:
        await asyncio.to_thread(prometheus.start)
        started = time.time()
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
            # One reconciliation fails on a refused status write: the error counter gets a series.
            refused = sandbox.refuse("speculativedeployments", "llama", subresource="status", times=1)
            for pool, (product, _, _) in POOLS.items():
                await sandbox.create(node(f"gpu-{pool}", product, pool))
            # Data parallel 2: vLLM ignores a per-batch-size schedule, so the restart strategy toggles speculation.
            # Two pools: the fleet placement shares the load between them.
            await sandbox.create(sdep(
                model={"id": "meta-llama/Llama-3.1-8B-Instruct", "dataParallelSize": 2},
                methods=[{"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 4}],
                gpuPools=[{"name": pool, "nodeSelector": {"pool": pool}} for pool in POOLS],
                policy={"tpotSloMs": 15, "hysteresis": {"bandPercent": 20, "minDwellSeconds": 1,
                                                        "cooldownSeconds": 2}},
                serving={"minReplicas": 1, "maxReplicas": 4, "port": PORT, "scaleDownStabilizationSeconds": 0},
                metrics={"source": "pods", "intervalSeconds": 5, "windowSeconds": 30}))
            await sandbox.wait_for(lambda: len(sandbox.objects("speculationprofiles", NAMESPACE)) == 2 * len(POOLS),
                                   timeout_s=WAIT_S, what="baseline and ngram profiles of each pool")
            for _, sku, _ in POOLS.values():
                await publish_results(sandbox, sku)
            await sandbox.wait_for(lambda: all((pool_status(sandbox, pool).get("decision") or {}).get("method")
                                               for pool in POOLS), what="a decision per pool")
            assert refused.hits == 1
            await sandbox.wait_for(lambda: (condition(sandbox, "RolledOut") or {}).get("status") == "True",
                                   what="RolledOut=True")
            crossover = {pool: pool_status(sandbox, pool)["decision"]["crossoverConcurrency"] for pool in POOLS}
            for pool, (_, _, pod) in POOLS.items():
                await create_serving_pod(sandbox, deployment(sandbox, pool), pod, ips[pool])

            # Low load, speculating, acceptance below the profile's: the live and profiled series both exist.
            for pool, (_, sku, _) in POOLS.items():
                profiled = next(p for p in sandbox.objects("speculationprofiles", NAMESPACE)
                                if p["spec"].get("method") and p["spec"]["sku"] == sku)
                acceptance = max(profiled["status"]["runs"], key=lambda r: r["numSpeculativeTokens"])["acceptance"]
                states[pool].set_load(running=max(1.0, crossover[pool] * 0.3), waiting=0, kv_cache_usage=0.2)
                states[pool].set_rates(request_steps_per_second=50, drafts_per_step=acceptance["draftsPerStep"],
                                       acceptance_per_position=[p * 0.9 for p in acceptance["perPosition"]],
                                       finished_requests_per_second=2, tpot_s=0.012)
            for query in ("specpilot_live_acceptance_rate", "specpilot_observed_tpot_p95_seconds",
                          "specpilot_reconcile_errors_total", "specpilot_traffic_share",
                          "specpilot_fleet_cost_per_million_tokens_dollars"):
                await wait_for_series(session, prometheus.url, query)

            # High load: the restart strategy turns speculation off by a rollout (a toggle) and scales up.
            for pool in POOLS:
                states[pool].set_load(running=crossover[pool] * 1.6, waiting=2)
            await sandbox.wait_for(lambda: any(pool_status(sandbox, pool).get("speculationEnabled") is False
                                               for pool in POOLS), timeout_s=WAIT_S,
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
                wanted = set(POOLS) if variable["name"] == "pool" else {VARIABLES[variable["name"]]}
                assert wanted <= set(values), (variable["name"], values)
            assert len(checked) >= 30
            if os.environ.get(CAPTURE_ENV):
                Path(os.environ[CAPTURE_ENV]).write_text(json.dumps({
                    "dashboard_sha256": hashlib.sha256(DASHBOARD.read_bytes()).hexdigest(),
                    "variables": VARIABLES, "start": float(span["start"]), "end": end, "answers": answers}))
    finally:
        controller_stop.set()
        await controller
        for runner in runners:
            await runner.cleanup()
        code = await operator.stop()
        prometheus.stop()
        if code not in (0, None, -15):
            print(operator.log()[-20000:])
