"""The real operator (a `specpilot run` subprocess) against the sandbox API server over HTTP.

The sandbox is kmock's KubernetesEmulator (see specpilot_sandbox.apiserver); the test plays kubectl
and the kubelet/Job controller by writing objects and statuses, then waits for the operator's answers.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from specpilot.api import seal
from specpilot_sandbox.apiserver import SandboxApiServer

NAMESPACE = "team"

RESULT_KEY = "sandbox-result-key-" + "0" * 32
"""The operator's result key in these tests (api.seal)."""


class OperatorProcess:
    """`python -m specpilot run` as a child process, with its log kept for failure messages."""

    def __init__(self, kubeconfig: Path, config: Path, log_path: Path, extra_args: list[str] | None = None) -> None:
        self.kubeconfig, self.config, self.log_path = kubeconfig, config, log_path
        self.extra_args = list(extra_args or ["--standalone"])
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        # The same result key on every start, as the chart's Secret gives it: a restarted operator still
        # accepts the results its earlier process sealed.
        env = {**os.environ, "PYTHONUNBUFFERED": "1", seal.KEY_ENV: RESULT_KEY}
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

    async def stop(self, grace_s: float = 10.0) -> int | None:
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

    def periodic_runs(self) -> int:
        """How many periodic reconciliations this operator has started, every process of it (the log is kept
        across restarts): kopf logs each run of the `periodic` timer at DEBUG, which --verbose keeps."""
        return self.log().count("Timer 'periodic' is invoked.")

    async def wait_periodic_runs(self, api: SandboxApiServer, runs: int = 2, timeout_s: float = 30.0) -> None:
        """Wait until `runs` more periodic reconciliations than now have run to their end: the evidence that a
        test's "nothing more happens" held for that long, instead of a fixed sleep. A timer run starts only
        after the one before it ended, so `runs` + 1 more starts."""
        before = self.periodic_runs()
        await api.wait_for(lambda: self.periodic_runs() >= before + runs + 1, timeout_s=timeout_s,
                           what=f"{runs} more periodic reconciliations")


@pytest.fixture
async def sandbox() -> AsyncIterator[SandboxApiServer]:
    async with SandboxApiServer() as api:
        await api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        yield api


@pytest.fixture
def operator_config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({
        "benchmarkImage": "ghcr.io/specpilot/specpilot-bench:test",
        "gpuPricesPerHour": {"H100-SXM": 2.5, "H200": 3.5},
        "reconcileIntervalSeconds": 0.5,
    }))
    return path


@pytest.fixture
async def operator(sandbox: SandboxApiServer, operator_config: Path, tmp_path: Path,
                   request: pytest.FixtureRequest) -> AsyncIterator[OperatorProcess]:
    kubeconfig = sandbox.write_kubeconfig(tmp_path / "kubeconfig", NAMESPACE)
    op = OperatorProcess(kubeconfig, operator_config, tmp_path / "operator.log")
    op.start()
    yield op
    await op.stop()
    if request.node.rep_call.failed if hasattr(request.node, "rep_call") else False:
        print(op.log()[-20000:])


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"rep_{rep.when}", rep)
