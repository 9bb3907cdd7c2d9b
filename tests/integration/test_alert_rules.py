"""The chart's alert rules through promtool (Debian's prometheus package ships it beside the server).

The PrometheusRule is rendered by helm with the default values and its groups written as a rule file; `promtool
check rules` checks it and `promtool test rules` runs alert_rules/specpilot-alerts.test.yaml against it: synthetic
series for every alert, each evaluated where it must fire (exact labels and annotations, runbook links included)
and where it must not.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from helm_tools import CHART_DIR, HelmTools, helm_tools  # noqa: F401  (helm_tools is a fixture)

pytestmark = [pytest.mark.prometheus, pytest.mark.helm]

UNIT_TESTS = Path(__file__).parent / "alert_rules" / "specpilot-alerts.test.yaml"
SOURCE = CHART_DIR / "rules" / "specpilot-alerts.yaml"


def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("no 'promtool' on PATH: run scripts/install-prometheus.sh (Debian's prometheus package ships it)",
                    pytrace=False)
    return binary


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool(), *map(str, args)], capture_output=True, text=True, timeout=120, cwd=cwd)


@pytest.fixture
def rendered_rules(helm_tools: HelmTools, tmp_path: Path) -> Path:  # noqa: F811
    objects = helm_tools.render(set_values=["prometheusRule.enabled=true"])
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rule["spec"], sort_keys=False))
    return path


def alert_names() -> set[str]:
    return {r["alert"] for group in yaml.safe_load(SOURCE.read_text())["groups"] for r in group["rules"]}


def test_promtool_accepts_the_source_and_the_rendered_rules(rendered_rules: Path) -> None:
    for path in (SOURCE, rendered_rules):
        result = run("check", "rules", path)
        assert result.returncode == 0, result.stdout + result.stderr
        assert f"SUCCESS: {len(alert_names())} rules found" in result.stdout


def test_promtool_unit_tests_pass(rendered_rules: Path) -> None:
    shutil.copy(UNIT_TESTS, rendered_rules.parent / UNIT_TESTS.name)
    result = run("test", "rules", UNIT_TESTS.name, cwd=rendered_rules.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_promtool_unit_tests_fail_when_a_rule_breaks(rendered_rules: Path) -> None:
    """The unit tests see a rule change: a threshold moved from half the profile's acceptance to a tenth."""
    rules = rendered_rules.read_text()
    rendered_rules.write_text(rules.replace("0.5 * specpilot_profiled", "0.1 * specpilot_profiled"))
    shutil.copy(UNIT_TESTS, rendered_rules.parent / UNIT_TESTS.name)
    result = run("test", "rules", UNIT_TESTS.name, cwd=rendered_rules.parent)
    assert result.returncode != 0 and "SpecpilotAcceptanceDrift" in result.stdout + result.stderr


def test_every_alert_is_tested_firing_and_quiet() -> None:
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in yaml.safe_load(UNIT_TESTS.read_text())["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert firing == alert_names()
    assert quiet == alert_names()
