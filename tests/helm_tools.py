"""Locates (and on first use bootstraps) the pinned helm and kubectl binaries for tests, and renders the chart.

scripts/bootstrap-tools.sh puts helm and kubectl into the git-ignored .tools/bin/; the session fixture
`helm_tools` runs it once when the binaries are missing, so `pytest -m helm` works on a fresh checkout.
"""

import dataclasses
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest
import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
TOOLS_BIN = REPO_ROOT / ".tools" / "bin"
BOOTSTRAP_SCRIPT = REPO_ROOT / "scripts" / "bootstrap-tools.sh"
CHART_DIR = REPO_ROOT / "charts" / "specpilot"
# Kubernetes version the chart is rendered and validated for.
KUBE_VERSION = "1.34.0"


@dataclasses.dataclass(frozen=True)
class HelmTools:
    helm: Path
    kubectl: Path

    def helm_run(self, *args: str | Path) -> subprocess.CompletedProcess[str]:
        """Runs helm with args; returns the finished process whatever its exit status."""
        return subprocess.run(
            [str(self.helm), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=120,
            env=_helm_env(),
        )

    def template(
        self,
        *,
        values_files: Sequence[Path] = (),
        set_values: Sequence[str] = (),
        namespace: str = "specpilot-system",
        release: str = "sp",
        include_crds: bool = False,
    ) -> subprocess.CompletedProcess[str]:
        """`helm template` of the chart (tests hooks included); check returncode before parsing stdout."""
        args: list[str | Path] = [
            "template", release, CHART_DIR, "--namespace", namespace, "--kube-version", KUBE_VERSION,
        ]
        for values_file in values_files:
            args += ["--values", values_file]
        for assignment in set_values:
            args += ["--set", assignment]
        if include_crds:
            args.append("--include-crds")
        return self.helm_run(*args)

    def render(self, **template_args) -> list[dict]:
        """Rendered objects of the chart; fails the test with helm's stderr when rendering fails."""
        result = self.template(**template_args)
        if result.returncode != 0:
            pytest.fail(f"helm template failed ({template_args}):\n{result.stderr}")
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _helm_env() -> dict[str, str]:
    # Keep helm's cache/config/data out of the user's home so tests never read a developer's repos or plugins.
    state_dir = REPO_ROOT / ".tools" / "helm-state"
    return {
        **os.environ,
        "HELM_CACHE_HOME": str(state_dir / "cache"),
        "HELM_CONFIG_HOME": str(state_dir / "config"),
        "HELM_DATA_HOME": str(state_dir / "data"),
    }


def ensure_tools() -> HelmTools:
    """Paths of helm and kubectl, running scripts/bootstrap-tools.sh first when either is missing."""
    tools = HelmTools(helm=TOOLS_BIN / "helm", kubectl=TOOLS_BIN / "kubectl")
    if tools.helm.is_file() and tools.kubectl.is_file():
        return tools
    result = subprocess.run(
        ["bash", str(BOOTSTRAP_SCRIPT)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHON": os.environ.get("PYTHON", sys.executable)},
    )
    if result.returncode != 0:
        pytest.fail(
            f"{BOOTSTRAP_SCRIPT.relative_to(REPO_ROOT)} failed (exit {result.returncode}); it needs PyPI to "
            f"download helm/kubectl:\n{result.stdout}\n{result.stderr}"
        )
    return tools


@pytest.fixture(scope="session")
def helm_tools() -> HelmTools:
    return ensure_tools()
