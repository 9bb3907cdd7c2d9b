"""Shared pieces of the security tests: the real operator (a `specpilot run` subprocess) against the
sandbox API server, with its own operator config and extra command-line arguments, and loopback HTTP
servers that play hostile metrics endpoints. Only loopback addresses are used."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from specpilot.sandbox.apiserver import SandboxApiServer
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


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class LoopbackServer:
    """An aiohttp server on a loopback address (127.0.0.1 unless given) that counts the requests it receives."""

    def __init__(self, handler: Handler, port: int = 0, host: str = "127.0.0.1") -> None:
        self.handler, self.port, self.host, self.requests = handler, port, host, []
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> LoopbackServer:
        async def counted(request: web.Request) -> web.StreamResponse:
            self.requests.append(request.path_qs)
            return await self.handler(request)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", counted)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
