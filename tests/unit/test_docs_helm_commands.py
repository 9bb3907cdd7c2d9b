"""Every `helm install` / `helm upgrade` command in README.md and docs/*.md renders the chart.

Each command in a code block (continuation lines joined) goes through `helm template` with the same release,
chart, namespace, --set/--set-string/--set-json and -f arguments, so a documented value the schema refuses (the
README once said `--set prometheusUrl=...` for `config.prometheusUrl`) fails here instead of on a user's cluster.
A values file the repository does not hold (a reader's own `my-values.yaml`) stands in as an empty one.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from docs_lines import fenced_lines
from helm_tools import CHART_DIR, KUBE_VERSION, REPO_ROOT, HelmTools, helm_tools  # noqa: F401  (a fixture)

pytestmark = pytest.mark.helm

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
# Flags of install/upgrade that change how a release is applied, not what renders; the number of arguments each takes.
APPLY_ONLY = {"--create-namespace": 0, "--install": 0, "-i": 0, "--wait": 0, "--atomic": 0, "--timeout": 1,
              "--dry-run": 0, "--reuse-values": 0, "--reset-values": 0}
RENDER_FLAGS = {"--set", "--set-string", "--set-json", "--set-file", "-f", "--values", "-n", "--namespace"}


def documented_commands() -> list[tuple[str, str]]:
    """(where, command) for each helm install/upgrade line inside a code block."""
    found = []
    for path in DOCS:
        for number, text in fenced_lines(path):
            if re.match(r"helm (install|upgrade)\b", text):
                found.append((f"{path.relative_to(REPO_ROOT)}:{number}", text))
    return found


def template_args(command: str, tmp_path: Path) -> list[str]:
    """The `helm template` arguments that render what `command` would install."""
    tokens = shlex.split(command)[2:]
    positional, flags = [], []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name, has_value, value = token.partition("=")
        if name in APPLY_ONLY:
            i += 1 + (APPLY_ONLY[name] if not has_value else 0)
            continue
        if name in RENDER_FLAGS:
            if not has_value:
                i += 1
                value = tokens[i]
            if name in {"-f", "--values"}:
                file = REPO_ROOT / value
                if not file.is_file():
                    file = tmp_path / Path(value).name
                    file.write_text("{}\n")
                value = str(file)
            flags += [name, value]
            i += 1
            continue
        assert not token.startswith("-"), f"unknown helm flag {token!r}: add it to this test"
        positional.append(token)
        i += 1
    release, chart = positional
    assert (REPO_ROOT / chart).resolve() == CHART_DIR, f"{chart} is not the repository's chart"
    return ["template", release, str(CHART_DIR), "--kube-version", KUBE_VERSION, *flags]


def test_the_docs_have_helm_commands() -> None:
    where = {w.split(":")[0] for w, _ in documented_commands()}
    assert {"README.md", "docs/helm.md"} <= where


@pytest.mark.parametrize(("where", "command"), documented_commands(), ids=[w for w, _ in documented_commands()])
def test_documented_helm_command_renders(helm_tools: HelmTools, where: str, command: str, tmp_path: Path) -> None:
    result = helm_tools.helm_run(*template_args(command, tmp_path))
    assert result.returncode == 0, f"{where}: `{command}` does not render:\n{result.stderr}"


def test_a_refused_value_fails(helm_tools: HelmTools, tmp_path: Path) -> None:
    """The check itself: the README's old line, which the values schema refuses."""
    command = ("helm install specpilot charts/specpilot -n specpilot-system --create-namespace "
               "--set prometheusUrl=http://prometheus-operated.monitoring.svc:9090")
    result = helm_tools.helm_run(*template_args(command, tmp_path))
    assert result.returncode != 0 and "prometheusUrl" in result.stderr
