"""Mistakes a user makes at the command line end in one line that names the fix, not a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from specpilot.controller.cli import cluster_unreachable_message
from specpilot_sandbox.demo.cli import output_problem


def _specpilot(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    script = Path(sys.executable).parent / "specpilot"
    return subprocess.run([str(script), *args], capture_output=True, text=True, timeout=120, env=env)


def test_run_without_a_cluster_says_so_in_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    done = _specpilot("run", "--kubeconfig", str(missing))
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    assert str(missing) in lines[0] and "KUBECONFIG" in lines[0]


def test_cluster_message_names_the_source_and_the_fix() -> None:
    text = cluster_unreachable_message("/k/config", ValueError("Invalid kube-config file.\nmore"))
    assert "/k/config: Invalid kube-config file." in text
    assert "more" not in text
    assert "--kubeconfig" in text and "specpilot demo" in text


def test_demo_output_that_cannot_be_written_is_found_before_the_run(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    problem = output_problem(blocker / "out")
    assert problem is not None and "--out" in problem
    writable = tmp_path / "out" / "demo"
    assert output_problem(writable) is None
    assert writable.is_dir() and not list(writable.iterdir())


def test_demo_refuses_an_unwritable_output_without_running(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = _specpilot("demo", "--fast", "--out", str(blocker / "out"))
    assert done.returncode == 2
    assert "cannot write its report" in done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr


WITHOUT_THE_SANDBOX = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "specpilot_sandbox":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Block())
from specpilot.cli import main
sys.exit(main(sys.argv[1:]))
"""
"""`specpilot` where the sandbox distribution (sandbox/) is not installed, as in the operator image."""


def test_demo_without_the_sandbox_package_names_the_install_in_one_line(tmp_path: Path) -> None:
    for args in (["demo", "--fast", "--out", str(tmp_path / "out")], ["demo"], ["demo", "--help"]):
        done = subprocess.run([sys.executable, "-c", WITHOUT_THE_SANDBOX, *args], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2, (args, done.stderr)
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert lines == ["specpilot demo needs the sandbox package (specpilot-sandbox), which this install lacks: "
                         "pip install -e ./sandbox in a checkout (bash scripts/setup.sh installs it)"], done.stderr
        assert not done.stdout and not (tmp_path / "out").exists()
    listed = subprocess.run([sys.executable, "-c", WITHOUT_THE_SANDBOX, "--help"], capture_output=True, text=True,
                            timeout=120)
    assert listed.returncode == 0 and "demo" in listed.stdout and "pip install -e ./sandbox" in listed.stdout
    wrong = subprocess.run([sys.executable, "-c", WITHOUT_THE_SANDBOX, "crds", "--no-such-option"],
                           capture_output=True, text=True, timeout=120)
    assert wrong.returncode == 2 and "unrecognized arguments: --no-such-option" in wrong.stderr


def test_malloc_arenas_are_capped_unless_the_environment_says_otherwise(monkeypatch) -> None:
    from specpilot.controller import cli

    calls = []

    class Libc:
        def mallopt(self, param, value):
            calls.append((param, value))
            return 1

    monkeypatch.setattr(cli.ctypes, "CDLL", lambda name: Libc())
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert cli.limit_malloc_arenas() is True
    assert calls == [(-8, cli.MALLOC_ARENAS)]
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert cli.limit_malloc_arenas() is False and len(calls) == 1
