"""Shared pieces of the security tests: the real operator (a `specpilot run` subprocess) against the
sandbox API server, with its own operator config and extra command-line arguments, and loopback HTTP
servers that play hostile metrics endpoints. Only loopback addresses are used."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import yaml
from aiohttp import web

from specpilot.sandbox.apiserver import SandboxApiServer
from tests.operator.scenario import NAMESPACE

OPERATOR_TOKEN = "operator"
"""The bearer token the operator's kubeconfig carries: how the recorded requests tell it from the test's."""


class Operator:
    """`python -m specpilot run` against the sandbox, its log kept in a file."""

    def __init__(self, api: SandboxApiServer, workdir: Path, config: dict, extra_args: list[str] | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.kubeconfig = api.write_kubeconfig(workdir / "kubeconfig", NAMESPACE, token=OPERATOR_TOKEN)
        self.config = workdir / "config.yaml"
        self.config.write_text(yaml.safe_dump({"benchmarkImage": "ghcr.io/specpilot/specpilot-bench:test",
                                               "reconcileIntervalSeconds": 0.5, **config}))
        self.log_path = workdir / "operator.log"
        self.extra_args = list(extra_args or ["--standalone"])
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "specpilot", "run", "--kubeconfig", str(self.kubeconfig),
                 "--namespace", NAMESPACE, "--liveness-port", "0", "--metrics-port", "0",
                 "--config", str(self.config), "--verbose", *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT, env=env)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def stop(self, grace_s: float = 30.0) -> int | None:
        """SIGTERM, wait up to grace_s for the exit (as the kubelet would), then kill; the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            for _ in range(int(grace_s * 10)):
                if self.proc.poll() is not None:
                    break
                await asyncio.sleep(0.1)
            else:
                self.proc.kill()
                self.proc.wait()
        code, self.proc = self.proc.returncode, None
        return code

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
async def sandbox() -> AsyncIterator[SandboxApiServer]:
    async with SandboxApiServer() as api:
        await api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        yield api


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
