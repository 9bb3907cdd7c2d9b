"""Shared fixtures: the repository root, the generated CRDs, example resources, a busy core."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent


ENGINE_FILES = frozenset({"test_bench_vllm.py", "test_bench_publish.py", "test_operator_engine_args.py"})
"""Tests that start the real vLLM CPU engine: it takes both cores while it loads and serves."""
CHAIN = "the real-engine files, one after another"
DEMO = "the headless demo, last"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under `pytest -n N --dist loadfile` (scripts/test.sh) each file runs on one worker (its module fixtures
    once), beside the files other workers run, except two units. The real-engine files run as one chain on one
    worker, sent first as the longest (each engine takes both cores while it loads and serves, so two at once
    would only slow both). The headless demo is sent last, to whichever worker frees up first once every other
    file is out: its simulated engines measure on virtual clocks that a host running two real engines and the
    rest of the suite stretches (a client reading its chunks late stamps them late), so it runs beside the last
    engine tests and the tail of the other files only. xdist's own `loadgroup` cannot build the chain: it renames
    node ids the way pytest 9 no longer reads."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class Chained(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            if path.startswith("tests/demo/"):
                return DEMO
            return CHAIN if path.rsplit("/", 1)[-1] in ENGINE_FILES else path

        def _assign_work_unit(self, node) -> None:
            if CHAIN in self.workqueue:
                self.workqueue.move_to_end(CHAIN, last=False)
            if DEMO in self.workqueue:
                self.workqueue.move_to_end(DEMO, last=True)
            super()._assign_work_unit(node)

    return Chained(config, log)


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
