"""Starts a real Prometheus server on loopback for the observer's integration tests.

The `prometheus_server` fixture is a factory: give it scrape targets (address plus the `namespace` and
`pod` labels Kubernetes service discovery would attach) and it runs the `prometheus` binary on a free
port of 127.0.0.1 with a temporary config (1 s scrape interval) and TSDB, waits until /-/ready answers,
and stops it at teardown. Without the binary the tests fail and say how to install it
(scripts/install-prometheus.sh); select or deselect them with `-m prometheus`.

From an async test, start it with `await asyncio.to_thread(prometheus_server, targets)` so that the
exporters on the test's event loop keep answering scrapes while it starts.
"""

from __future__ import annotations

import dataclasses
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from typing import NoReturn
from pathlib import Path

import pytest
import yaml

INSTALL_HINT = "run scripts/install-prometheus.sh (installs Debian's prometheus package)"
READY_TIMEOUT_S = 30.0


@dataclasses.dataclass(frozen=True)
class ScrapeTarget:
    """One pod as Prometheus would discover it: where to scrape and the labels it gets."""

    address: str
    """host:port, e.g. 127.0.0.1:40123."""
    namespace: str
    pod: str


class PrometheusServer:
    """A `prometheus` process with its own config and TSDB under a temporary directory."""

    def __init__(self, targets: Sequence[ScrapeTarget], *, scrape_interval_s: float = 1.0) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail(f"no 'prometheus' binary on PATH: {INSTALL_HINT}", pytrace=False)
        self._binary = binary
        self._targets = list(targets)
        self._scrape_interval_s = scrape_interval_s
        self._directory = Path(tempfile.mkdtemp(prefix="specpilot-prometheus-"))
        self._process: subprocess.Popen | None = None
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"

    def config(self) -> dict:
        interval = f"{self._scrape_interval_s:g}s"
        return {
            "global": {"scrape_interval": interval, "scrape_timeout": interval, "evaluation_interval": interval},
            "scrape_configs": [{
                "job_name": "vllm",
                "metrics_path": "/metrics",
                "static_configs": [
                    {"targets": [target.address], "labels": {"namespace": target.namespace, "pod": target.pod}}
                    for target in self._targets
                ],
            }],
        }

    def start(self) -> PrometheusServer:
        config_path = self._directory / "prometheus.yml"
        config_path.write_text(yaml.safe_dump(self.config()))
        self._log_path = self._directory / "prometheus.log"
        with self._log_path.open("wb") as log:
            self._process = subprocess.Popen(
                [self._binary, f"--config.file={config_path}", f"--storage.tsdb.path={self._directory / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self._fail(f"prometheus exited with {self._process.returncode} while starting")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self._fail(f"prometheus was not ready at {self.url} within {READY_TIMEOUT_S:g} s")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        shutil.rmtree(self._directory, ignore_errors=True)

    def _fail(self, message: str) -> NoReturn:
        log = self._log_path.read_text(errors="replace")[-2000:] if self._log_path.exists() else ""
        self.stop()
        pytest.fail(f"{message}; its log ends:\n{log}", pytrace=False)


@pytest.fixture
def prometheus_server() -> Iterator[Callable[[Sequence[ScrapeTarget]], PrometheusServer]]:
    """Factory: `prometheus_server(targets)` -> a started PrometheusServer, stopped after the test."""
    started: list[PrometheusServer] = []

    def start(targets: Sequence[ScrapeTarget]) -> PrometheusServer:
        server = PrometheusServer(targets)
        started.append(server)
        return server.start()

    yield start
    for server in started:
        server.stop()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
