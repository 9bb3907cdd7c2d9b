"""The layers, checked by a tool: the import-linter contracts in pyproject.toml (`[tool.importlinter]`) hold, and
a wrong import breaks them (so a contract cannot pass for checking nothing)."""

from __future__ import annotations

from pathlib import Path

import importlinter.api  # noqa: F401  (configures import-linter: its graph builder, its config readers)
from importlinter.application import use_cases
from importlinter.application.app_config import settings

CONFIG = str(Path(__file__).resolve().parents[2] / "pyproject.toml")


def _lint(capsys) -> tuple[bool, str]:
    """Every contract checked on a fresh graph (no cache written): passed, and the report `lint-imports` prints."""
    passed = use_cases.lint_imports(config_filename=CONFIG, cache_dir=None, no_logo=True)
    return passed, capsys.readouterr().out


def test_the_layer_contracts_hold(capsys):
    passed, report = _lint(capsys)
    assert passed, report
    assert "0 broken" in report


class _WithImports:
    """The real graph builder, plus imports the code does not have."""

    def __init__(self, builder, imports: list[tuple[str, str]]) -> None:
        self.builder, self.imports = builder, imports

    def build(self, **options):
        graph = self.builder.build(**options)
        for importer, imported in self.imports:
            graph.add_import(importer=importer, imported=imported, line_number=1, line_contents=f"import {imported}")
        return graph


def test_a_wrong_import_breaks_its_contract(capsys):
    wrong = [
        ("specpilot_bench.loadgen", "specpilot_sandbox.clock"),  # the import running back up the layers
        ("specpilot.cli", "specpilot_sandbox.apiserver"),  # the command line's one way in is the demo's dispatch
        ("specpilot.policy.planner", "kopf"),
        ("specpilot.controller.kube", "kmock"),
        ("specpilot.perf.twin", "kubernetes"),
        ("specpilot.sim.mixed", "specpilot.controller.reconcile"),  # the simulator decides through policy/ only
    ]
    builder = settings.GRAPH_BUILDER
    settings.configure(GRAPH_BUILDER=_WithImports(builder, wrong))
    try:
        passed, report = _lint(capsys)
    finally:
        settings.configure(GRAPH_BUILDER=builder)
    assert not passed
    assert "Contracts: 0 kept, 6 broken." in report, report
    for importer, imported in wrong:
        assert f"{importer} -> {imported}" in report, report


def test_controller_functions_stay_thin():
    """The controller reads, calls pure code and writes: no function of controller/ has more than 60 lines of its
    own (a nested function's lines count for the nested one). A longer one holds a decision that belongs in
    policy/, or I/O that wants a name of its own."""
    import ast

    controller = Path(__file__).resolve().parents[2] / "operator" / "specpilot" / "controller"
    long = []
    for path in sorted(controller.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                nested = sum(n.end_lineno - n.lineno + 1 for n in ast.walk(node)
                             if n is not node and isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
                own = node.end_lineno - node.lineno + 1 - nested
                if own > 60:
                    long.append(f"{path.name}:{node.lineno} {node.name}: {own} lines")
    assert not long, "\n".join(long)
