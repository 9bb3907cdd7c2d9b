"""Shared pieces of the security tests: the real operator (a `specpilot run` subprocess) against the
sandbox API server, with its own operator config and extra command-line arguments. Hostile metrics
endpoints are `tests.operator.scenario.LoopbackServer`s; only loopback addresses are used."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import yaml

from specpilot_sandbox.apiserver import SandboxApiServer
from tests.operator.conftest import OperatorProcess, sandbox  # noqa: F401 (the fixture, shared)
from tests.operator.scenario import NAMESPACE

OPERATOR_TOKEN = "operator"
"""The bearer token the operator's kubeconfig carries: how the recorded requests tell it from the test's."""


class Operator(OperatorProcess):
    """The operator suite's process, with its own operator config (a dict) and command-line arguments."""

    def __init__(self, api: SandboxApiServer, workdir: Path, config: dict, extra_args: list[str] | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        config_path = workdir / "config.yaml"
        config_path.write_text(yaml.safe_dump({"benchmarkImage": "ghcr.io/specpilot/specpilot-bench:test",
                                               "reconcileIntervalSeconds": 0.5, **config}))
        super().__init__(api.write_kubeconfig(workdir / "kubeconfig", NAMESPACE, token=OPERATOR_TOKEN),
                         config_path, workdir / "operator.log", extra_args)

    async def stop(self, grace_s: float = 30.0) -> int | None:
        return await super().stop(grace_s)


@pytest.fixture
async def operators(sandbox: SandboxApiServer, tmp_path: Path,
                    request: pytest.FixtureRequest) -> AsyncIterator[Callable[..., Operator]]:
    """Starts operators (config dict, extra args) against the sandbox; stops them all at the end."""
    started: list[Operator] = []

    def start(config: dict | None = None, extra_args: list[str] | None = None) -> Operator:
        op = Operator(sandbox, tmp_path / f"operator-{len(started)}", config or {}, extra_args)
        op.start()
        started.append(op)
        return op

    yield start
    for op in started:
        await op.stop()
    if getattr(request.node, "rep_call", None) is not None and request.node.rep_call.failed:
        for op in started:
            print(op.log()[-20000:])


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
