"""Every values file under charts/*/ci/ (what chart-testing installs) renders a chart whose operator config
the operator loads: the operator exits at start on a config it cannot read (the ci/ values' `maxAgeHours: 0`,
documented as "never by age", once made it exit). New ci/ files are picked up without editing this test."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from helm_tools import REPO_ROOT, HelmTools, helm_tools  # noqa: F401  (helm_tools is a fixture)

pytestmark = pytest.mark.helm

CI_VALUES = sorted(REPO_ROOT.glob("charts/*/ci/*.yaml"))


def test_there_are_ci_values_to_exercise():
    assert CI_VALUES


@pytest.mark.parametrize("values_file", CI_VALUES, ids=[str(p.relative_to(REPO_ROOT)) for p in CI_VALUES])
def test_ci_values_render_an_operator_config_the_operator_loads(helm_tools: HelmTools, values_file: Path,
                                                                tmp_path: Path) -> None:
    from specpilot.config import OperatorConfig, load_config

    objects = helm_tools.render(values_files=[values_file])
    (config_map,) = [o for o in objects if o["kind"] == "ConfigMap" and "config.yaml" in (o.get("data") or {})]
    path = tmp_path / "config.yaml"
    path.write_text(config_map["data"]["config.yaml"])
    config = load_config(path)
    assert isinstance(config, OperatorConfig)
    # What the values file sets under `config:` is what the operator reads (nothing dropped on the way).
    wanted = (yaml.safe_load(values_file.read_text()) or {}).get("config") or {}
    rendered = yaml.safe_load(config_map["data"]["config.yaml"]) or {}
    assert _within(wanted, rendered)
    assert OperatorConfig.model_validate(rendered) == config


def _within(wanted, rendered) -> bool:
    """Whether every value `wanted` sets is in `rendered` (maps merge with the chart's defaults, as helm does;
    an empty string or null means "the default")."""
    if isinstance(wanted, dict):
        return isinstance(rendered, dict) and all(
            v in ("", None) or _within(v, rendered.get(k)) for k, v in wanted.items())
    return wanted == rendered
