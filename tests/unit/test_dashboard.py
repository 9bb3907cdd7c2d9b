"""The Grafana dashboard the chart ships (charts/specpilot/dashboards/specpilot.json) and the chart objects that carry
it and the alert rules.

Offline: the dashboard's JSON is loaded, every PromQL query (panels, annotations, variables) is extracted and each
metric it names must be one the operator exports (controller.metrics) or one vLLM serves (specpilot.vllm_page),
so renaming a metric fails here; tests/operator/test_dashboard_queries.py runs the same queries against a real
Prometheus scraping the real operator. The chart renders the ConfigMap and the PrometheusRule only when their
values say so.
"""

from __future__ import annotations

import hashlib
import json
import re
import runpy
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from helm_tools import CHART_DIR, HelmTools, helm_tools  # noqa: F401  (helm_tools is a fixture)
from specpilot import vllm_page
from specpilot.controller.metrics import OperatorMetrics

DASHBOARD = CHART_DIR / "dashboards" / "specpilot.json"
CAPTURE = CHART_DIR.parents[1] / "docs" / "images" / "dashboard-data.json"
REGENERATE = ("regenerate the docs' picture: SPECPILOT_DASHBOARD_CAPTURE=docs/images/dashboard-data.json pytest "
              "tests/operator/test_dashboard_queries.py, then python scripts/render_dashboard.py "
              "docs/images/dashboard-data.json docs/images/dashboard.png")
RULES = CHART_DIR / "rules" / "specpilot-alerts.yaml"
GRAFANA_BUILTINS = {"__rate_interval", "__interval", "__range"}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def panels(board: dict) -> list[dict]:
    out = []
    for panel in board["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def queries(board: dict) -> list[str]:
    """Every PromQL expression of the dashboard: panel targets, annotations, query variables."""
    found = [t["expr"] for p in panels(board) for t in p.get("targets", [])]
    found += [a["expr"] for a in board["annotations"]["list"] if "expr" in a]
    found += [v["query"]["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    return found


def metric_names(expr: str) -> set[str]:
    """Metric names an expression selects: specpilot_*, vllm:* and the scrape's up."""
    names = set(re.findall(r"\b(specpilot_[a-z0-9_]+|vllm:[a-z0-9_:]+)", expr))
    if re.search(r"\bup\{", expr):
        names.add("up")
    return names


def exported_by_the_operator() -> set[str]:
    names = set()
    for family in OperatorMetrics().registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"]}.get(family.type, [""])
        names |= {family.name + suffix for suffix in suffixes}
    return names


def served_by_vllm() -> set[str]:
    names = {v for k, v in vars(vllm_page).items() if k.isupper() and isinstance(v, str) and v.startswith("vllm:")}
    return names | {f"{vllm_page.TPOT_SECONDS}_bucket", f"{vllm_page.TTFT_SECONDS}_bucket"}


def test_every_query_names_metrics_that_exist() -> None:
    known = exported_by_the_operator() | served_by_vllm() | {"up"}
    board = dashboard()
    assert len(queries(board)) >= 30
    for expr in queries(board):
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= known, f"{expr!r} names {sorted(names - known)}, which nothing exports"


def test_every_alert_rule_names_metrics_that_exist() -> None:
    known = exported_by_the_operator() | {"up"}
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            names = metric_names(rule["expr"])
            assert names and names <= known, f"{rule['alert']}: {sorted(names - known)}, which nothing exports"


def test_the_dashboard_shows_what_the_issue_asks_per_pool() -> None:
    """Each question a platform team asks has a panel that reads the metric answering it."""
    board = dashboard()
    by_title = {p["title"]: " ".join(t["expr"] for t in p.get("targets", [])) for p in panels(board)}
    wanted = {
        "Decision per pool": ["specpilot_decision_info", "specpilot_num_speculative_tokens",
                              "specpilot_crossover_concurrency"],
        "Speculation on/off": ["specpilot_speculation_enabled"],
        "Observed concurrency vs crossover": ["specpilot_observed_concurrency", "specpilot_crossover_concurrency"],
        "Goodput: output tokens/s": ["vllm:generation_tokens_total", "specpilot_observed_generation_tokens"],
        "TPOT p95": ["vllm:request_time_per_output_token_seconds_bucket", "specpilot_observed_tpot_p95_seconds",
                     "specpilot_tpot_slo_seconds"],
        "SLO attainment": ["specpilot_slo_attainment_ratio", "specpilot_slo_attainment_target_ratio"],
        "Acceptance at the first draft position: live vs profiled": [
            "vllm:spec_decode_num_accepted_tokens_per_pos_total", "specpilot_live_acceptance_rate",
            "specpilot_profiled_acceptance_rate"],
        "$ per million output tokens, with and without speculation": [
            "specpilot_cost_per_million_tokens_dollars", "specpilot_cost_per_million_tokens_without_sd_dollars"],
        "Replicas vs desired": ["specpilot_replicas", "specpilot_desired_replicas"],
        "Profiling Jobs": ["specpilot_profiling_jobs_total", "specpilot_profiles_failed"],
        "Reconcile latency": ["specpilot_reconcile_duration_seconds_bucket"],
        "Reconcile errors": ["specpilot_reconcile_errors_total"],
        "Traffic share per pool": ["specpilot_traffic_share"],
        "Fleet $ per million output tokens": ["specpilot_fleet_cost_per_million_tokens_dollars"],
    }
    for title, metrics in wanted.items():
        assert title in by_title, title
        for metric in metrics:
            assert metric in by_title[title], (title, metric)
    annotations = {a["name"]: a["expr"] for a in board["annotations"]["list"] if "expr" in a}
    assert "specpilot_decisions_total" in annotations["Decisions"]
    assert "specpilot_speculation_toggles_total" in annotations["Speculation toggles"]


def test_variables_scope_every_per_pool_query() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert {"datasource", "namespace", "deployment", "pool"} <= set(variables)
    assert variables["pool"]["multi"] and variables["pool"]["includeAll"]
    for expr in queries(board):
        used = set(re.findall(r"\$(\w+)", expr)) - {"1"}
        assert used <= set(variables) | GRAFANA_BUILTINS, f"{expr!r} uses undefined {sorted(used - set(variables))}"
        # A per-deployment series read without the deployment would mix deployments.
        if re.search(r"specpilot_(decision_info|speculation_enabled|observed_|replicas|cost_|live_|profiled_)", expr) \
                and "label_values" not in expr:
            assert 'deployment="$deployment"' in expr and 'namespace="$namespace"' in expr, expr
        if "vllm:" in expr:
            assert 'pod=~"$deployment-$pool-[a-z0-9]+-[a-z0-9]+"' in expr, expr


def test_panels_are_well_formed() -> None:
    board = dashboard()
    assert board["uid"] == "specpilot" and board["schemaVersion"] >= 36
    ids = [p["id"] for p in panels(board)]
    assert len(ids) == len(set(ids))
    for panel in panels(board):
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel.get("description"), panel["title"]
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
    # Panels never overlap: each grid cell belongs to one panel at most.
    cells: dict[tuple[int, int], str] = {}
    for panel in panels(board):
        g = panel["gridPos"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{panel['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = panel["title"]


# --- the chart -------------------------------------------------------------------------------------------------

def kinds(objects: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for obj in objects:
        out.setdefault(obj["kind"], []).append(obj)
    return out


@pytest.mark.helm
def test_both_are_off_by_default(helm_tools: HelmTools) -> None:
    objects = helm_tools.render()
    assert "PrometheusRule" not in kinds(objects)
    assert [c["metadata"]["name"] for c in kinds(objects)["ConfigMap"]] == ["sp-specpilot-config"]


@pytest.mark.helm
def test_the_dashboard_config_map_carries_the_json_for_the_sidecar(helm_tools: HelmTools) -> None:
    objects = helm_tools.render(set_values=["grafanaDashboard.enabled=true"])
    (config_map,) = [c for c in kinds(objects)["ConfigMap"] if c["metadata"]["name"] == "sp-specpilot-dashboard"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "specpilot-system"
    assert "annotations" not in config_map["metadata"]
    assert json.loads(config_map["data"]["specpilot.json"]) == dashboard()
    kubernetes_validate.validate(config_map, "1.34", strict=True)

    objects = helm_tools.render(set_values=[
        "grafanaDashboard.enabled=true", "grafanaDashboard.labels.grafana_dashboard=null",
        "grafanaDashboard.labels.team-dashboards=specpilot", "grafanaDashboard.folder=LLM serving",
        "grafanaDashboard.folderAnnotation=k8s-sidecar-target-directory", "grafanaDashboard.namespace=monitoring"])
    (config_map,) = [c for c in kinds(objects)["ConfigMap"] if c["metadata"]["name"] == "sp-specpilot-dashboard"]
    assert config_map["metadata"]["labels"]["team-dashboards"] == "specpilot"
    assert "grafana_dashboard" not in config_map["metadata"]["labels"]
    assert config_map["metadata"]["annotations"] == {"k8s-sidecar-target-directory": "LLM serving"}
    assert config_map["metadata"]["namespace"] == "monitoring"


@pytest.mark.helm
def test_the_prometheus_rule_is_the_rules_file_with_the_values_applied(helm_tools: HelmTools) -> None:
    source = yaml.safe_load(RULES.read_text())
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["prometheusRule"]
    # One source: with the default values the chart ships the rules file unchanged, and the file's own `for` and
    # severity are the values' defaults.
    (rule,) = kinds(helm_tools.render(set_values=["prometheusRule.enabled=true"]))["PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["spec"] == source
    alerts = [r for group in source["groups"] for r in group["rules"]]
    assert {a["alert"] for a in alerts} == set(values["alerts"])
    for alert in alerts:
        assert values["alerts"][alert["alert"]] == {"enabled": True, "for": alert["for"],
                                                    "severity": alert["labels"]["severity"]}

    (rule,) = kinds(helm_tools.render(set_values=[
        "prometheusRule.enabled=true", "prometheusRule.labels.release=kube-prometheus-stack",
        "prometheusRule.additionalAlertLabels.team=ml-platform", "prometheusRule.operatorJob=llm-operator",
        "prometheusRule.runbookBaseUrl=https://wiki.example.com/specpilot/runbooks",
        "prometheusRule.alerts.SpecpilotMetricsUnavailable.for=1h",
        "prometheusRule.alerts.SpecpilotMetricsUnavailable.severity=critical",
        "prometheusRule.alerts.SpecpilotDecisionsFlapping.enabled=false"]))["PrometheusRule"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    rendered = {r["alert"]: r for group in rule["spec"]["groups"] for r in group["rules"]}
    assert "SpecpilotDecisionsFlapping" not in rendered and len(rendered) == len(alerts) - 1
    assert rendered["SpecpilotMetricsUnavailable"]["for"] == "1h"
    assert rendered["SpecpilotMetricsUnavailable"]["labels"] == {"severity": "critical", "team": "ml-platform"}
    assert rendered["SpecpilotOperatorDown"]["expr"] == 'absent(up{job="llm-operator"} == 1)'
    for name, alert in rendered.items():
        assert alert["annotations"]["runbook_url"] == f"https://wiki.example.com/specpilot/runbooks#{name.lower()}"


@pytest.mark.helm
def test_the_service_monitor_keeps_the_operators_labels_and_names_the_job(helm_tools: HelmTools) -> None:
    """The rules and the dashboard read the SpeculativeDeployment's namespace from `namespace` and the operator's
    scrape as job="specpilot" (prometheusRule.operatorJob's default), whatever the release is called."""
    objects = helm_tools.render(set_values=["serviceMonitor.enabled=true"], release="llm-ops")
    (monitor,) = kinds(objects)["ServiceMonitor"]
    (service,) = kinds(objects)["Service"]
    assert service["metadata"]["labels"][monitor["spec"]["jobLabel"]] == "specpilot"
    assert monitor["spec"]["endpoints"][0]["honorLabels"] is True


@pytest.mark.helm
def test_helm_lint_passes_with_both_on(helm_tools: HelmTools) -> None:
    result = helm_tools.helm_run("lint", "--strict", CHART_DIR, "--set", "grafanaDashboard.enabled=true",
                                 "--set", "prometheusRule.enabled=true", "--set", "serviceMonitor.enabled=true")
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.helm
@pytest.mark.parametrize("assignment", ["prometheusRule.alerts.SpecpilotOperatorDwn.for=5m",
                                        "prometheusRule.alerts.SpecpilotOperatorDown.for=5 minutes",
                                        "grafanaDashboard.labelz.a=b"])
def test_the_schema_refuses_typos(helm_tools: HelmTools, assignment: str) -> None:
    result = helm_tools.template(set_values=["prometheusRule.enabled=true", assignment])
    assert result.returncode != 0 and "values don't meet the specifications of the schema" in result.stderr


def test_every_alert_has_a_runbook_section() -> None:
    docs = (Path(CHART_DIR).parents[1] / "docs" / "troubleshooting.md").read_text()
    headings = {line.removeprefix("### ").strip() for line in docs.splitlines() if line.startswith("### ")}
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            assert rule["alert"] in headings, f"docs/troubleshooting.md has no '### {rule['alert']}' section"
            assert rule["annotations"]["runbook_url"].endswith(f"docs/troubleshooting.md#{rule['alert'].lower()}")


def test_the_docs_picture_shows_this_dashboard(tmp_path: Path) -> None:
    """docs/images/dashboard.png is drawn from answers to this very dashboard's queries (its hash), one per panel
    query and annotation; and the renderer draws it."""
    capture = json.loads(CAPTURE.read_text())
    assert capture["dashboard_sha256"] == hashlib.sha256(DASHBOARD.read_bytes()).hexdigest(), REGENERATE
    board = dashboard()
    wanted = {f"{p['id']}/{t['refId']}" for p in panels(board) for t in p.get("targets", [])}
    wanted |= {f"annotation/{a['name']}" for a in board["annotations"]["list"] if "expr" in a}
    assert set(capture["answers"]) == wanted, REGENERATE
    assert all(capture["answers"].values())
    render = runpy.run_path(str(CHART_DIR.parents[1] / "scripts" / "render_dashboard.py"))["main"]
    render([str(CAPTURE), str(tmp_path / "dashboard.png")])
    assert (tmp_path / "dashboard.png").read_bytes().startswith(b"\x89PNG")


@pytest.mark.helm
def test_the_install_notes_name_the_dashboard_and_the_rules_when_on(helm_tools: HelmTools) -> None:
    def notes(*assignments: str) -> str:
        args = ["install", "sp", CHART_DIR, "--namespace", "specpilot-system", "--dry-run=client"]
        for assignment in assignments:
            args += ["--set", assignment]
        result = helm_tools.helm_run(*args)
        assert result.returncode == 0, result.stderr
        return result.stdout.split("NOTES:", 1)[1]

    on = notes("grafanaDashboard.enabled=true", "prometheusRule.enabled=true")
    assert "ConfigMap\n   sp-specpilot-dashboard in namespace specpilot-system" in on
    assert "PrometheusRule sp-specpilot holds the alerts" in on
    off = notes()
    assert "dashboard" not in off and "PrometheusRule" not in off
