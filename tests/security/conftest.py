"""Shared pieces of the security tests: the real operator (a `specpilot run` subprocess) against the
sandbox API server, with its own operator config and extra command-line arguments; vLLM's own argument parser
(`vllm_parser`). Hostile metrics endpoints are `tests.operator.scenario.LoopbackServer`s; only loopback
addresses are used."""

from __future__ import annotations

import json
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
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


VLLM_PARSE = """
import json, sys, contextlib, io
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
def parse(base, extra, dests):
    parser = make_arg_parser(FlexibleArgumentParser())
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            ns = parser.parse_args(base + extra)
    except BaseException as exc:
        return {"error": type(exc).__name__}
    return {d: repr(getattr(ns, d, None)) for d in dests}
print("READY", flush=True)
for line in sys.stdin:
    base, cases, dests = json.loads(line)
    with contextlib.redirect_stdout(io.StringIO()):
        answer = {"base": parse(base, [], dests), "cases": [parse(base, c, dests) for c in cases]}
    print("RESULT " + json.dumps(answer), flush=True)
"""
"""vLLM's own argument parser, in a subprocess (importing vLLM pulls in torch, seconds of CPU): one line of JSON
[base args, cases, dests] in, one `RESULT` line out per request, each case parsed by a fresh parser."""


class VllmParser:
    """One subprocess with vLLM imported that parses engine command lines as `vllm serve` would, for every test
    of the session that asks (importing vLLM once instead of once per test)."""

    def __init__(self) -> None:
        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([sys.executable, "-c", VLLM_PARSE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr)
        self._read("READY", timeout_s=300)

    def _read(self, prefix: str, timeout_s: float) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([self.proc.stdout], [], [], remaining)[0]:
                raise TimeoutError(f"vLLM's parser gave no {prefix} line within {timeout_s:.0f} s")
            line = self.proc.stdout.readline().decode(errors="replace")
            if not line:
                self._stderr.seek(0)
                raise AssertionError(f"vLLM's parser exited {self.proc.wait()}: "
                                     f"{self._stderr.read().decode(errors='replace')[-3000:]}")
            if line.startswith(prefix):
                return line[len(prefix):].strip()

    def parse(self, base: list[str], cases: list[list[str]], dests: list[str]) -> tuple[dict, list[dict]]:
        """`base` alone and `base` + each case as vLLM reads them: each dest's value (repr), or {"error": ...}
        where vLLM refuses the line."""
        assert self.proc.stdin is not None
        self.proc.stdin.write((json.dumps([base, cases, dests]) + "\n").encode())
        self.proc.stdin.flush()
        out = json.loads(self._read("RESULT ", timeout_s=300))
        return out["base"], out["cases"]

    def close(self) -> None:
        # Killed rather than asked to exit: it holds nothing, and an interpreter with torch loaded takes
        # seconds to shut down.
        self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()
        self._stderr.close()


@pytest.fixture(scope="session")
def vllm_parser() -> Iterator[VllmParser]:
    parser = VllmParser()
    yield parser
    parser.close()
