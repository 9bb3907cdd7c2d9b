"""Shared fixtures: the repository root, the generated CRDs, example resources, a busy core."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def busy_core():
    """Another process keeps one core busy for the test's duration (a busy host)."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield
    hog.kill()
    hog.wait()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def crds() -> dict[str, dict]:
    """Kind -> CRD object, as committed in crds/."""
    out = {}
    for path in sorted((REPO / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        out[crd["spec"]["names"]["kind"]] = crd
    return out


def load_example(name: str) -> dict:
    return yaml.safe_load((REPO / "examples" / name).read_text())
