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


def test_version_prints_the_installed_distributions_version() -> None:
    from importlib.metadata import version

    done = _specpilot("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"specpilot {version('specpilot')}\n"
    assert done.stderr == ""


# ----- an API server that does not answer: one line per retry, not aiohttp's tracebacks -----

def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # closed on leaving: nothing listens there


def test_run_against_a_server_that_does_not_answer_prints_one_line_per_retry(tmp_path: Path) -> None:
    import os
    import queue
    import threading
    import time

    server = f"https://127.0.0.1:{_free_port()}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{server}", insecure-skip-tls-verify: true}}}}]
users: [{{name: u, user: {{token: t}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    script = Path(sys.executable).parent / "specpilot"
    proc = subprocess.Popen([str(script), "run", "--kubeconfig", str(kubeconfig), "--liveness-port", "0",
                             "--metrics-port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in proc.stderr:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    seen: list[str] = []
    retries: list[str] = []
    deadline = time.monotonic() + 90
    try:
        while len(retries) < 2:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))  # queue.Empty past the deadline
            assert line is not None, "specpilot run exited:\n" + "\n".join(seen)
            seen.append(line)
            if "retrying" in line:
                retries.append(line)
    finally:
        proc.kill()
        proc.wait(timeout=30)
    text = "\n".join(seen)
    assert "Traceback" not in text and "ClientConnectorError" not in text, text
    for n, line in enumerate(retries, start=1):
        assert f"cannot reach the Kubernetes API server at {server} (connection refused); retrying in 1s " \
               f"(attempt {n} of 9); check the kubeconfig's server and context (--kubeconfig, --context" in line, line
    assert not any(line[:1].isspace() for line in seen), text  # no continuation lines (a traceback's, a repr's)


def _record(message: str, name: str = "kopf._core.reactor.observation", exc: BaseException | None = None):
    import logging

    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    return logging.LogRecord(name, logging.ERROR, __file__, 1, message, (), exc_info)


REFUSED = ("ClientConnectorError(ConnectionKey(host='k', port=6443, is_ssl=True, ssl=True, proxy=None, "
           "proxy_auth=None, proxy_headers_hash=None, server_hostname=None), ConnectionRefusedError(111, "
           "\"Connect call failed ('k', 6443)\"))")


def _lines():
    from specpilot.controller.cli import UnreachableServerLines

    return UnreachableServerLines("https://k:6443", "FIX", (1, 1, 2))


def test_each_failed_attempt_is_one_warning_and_the_same_attempt_once() -> None:
    import logging

    lines = _lines()
    first = _record(f"Request attempt #1/9 failed; will retry: GET https://k:6443/api -> {REFUSED}")
    assert lines.filter(first)
    assert first.getMessage() == ("cannot reach the Kubernetes API server at https://k:6443 (connection refused); "
                                  "retrying in 1s (attempt 1 of 9); FIX")
    assert first.levelno == logging.WARNING
    # kopf's /apis lookup fails in the same attempt: the same line, dropped
    assert not lines.filter(_record(f"Request attempt #1/9 failed; will retry: GET https://k:6443/apis -> {REFUSED}"))
    third = _record(f"Request attempt #3/9 failed; will retry: GET https://k:6443/apis -> {REFUSED}")
    assert lines.filter(third) and "retrying in 2s (attempt 3 of 9)" in third.getMessage()
    last = _record(f"Request attempt #9/9 failed; escalating: GET https://k:6443/api -> {REFUSED}")
    assert lines.filter(last) and last.levelno == logging.ERROR
    assert last.getMessage() == ("cannot reach the Kubernetes API server at https://k:6443 (connection refused); "
                                 "giving up after 9 attempts; FIX")
    dns = _record("Request attempt #2/9 failed; will retry: GET https://nowhere:6443/api -> ClientConnectorDNSError("
                  "ConnectionKey(host='nowhere'), gaierror(-2, 'Name or service not known'))")
    assert lines.filter(dns) and dns.getMessage().startswith(
        "cannot reach the Kubernetes API server at https://nowhere:6443 (its host name does not resolve)")


def test_a_task_that_gave_up_on_the_server_is_one_line_and_other_errors_show_fully() -> None:
    import aiohttp

    lines = _lines()

    def raised(exc: BaseException) -> BaseException:
        try:
            raise exc
        except BaseException as caught:
            return caught

    refused = raised(aiohttp.ClientOSError(111, "Connect call failed ('k', 6443)"))
    refused.__cause__ = ConnectionRefusedError(111, "Connect call failed")
    failed = _record("Resource observer has failed: Cannot connect to host k:6443", name="kopf._core.reactor.running",
                     exc=refused)
    assert lines.filter(failed)
    assert failed.exc_info is None
    assert failed.getMessage() == ("Resource observer has failed: cannot reach the Kubernetes API server at "
                                   "https://k:6443 (connection refused)")
    # Anything else passes as it came: an HTTP error's attempt, another exception with its traceback.
    forbidden = "Request attempt #1/9 failed; will retry: GET https://k:6443/api -> APIForbiddenError('forbidden')"
    record = _record(forbidden)
    assert lines.filter(record) and record.getMessage() == forbidden
    bug = _record("Handler 'x' failed with an exception", name="kopf.objects", exc=raised(ValueError("bug")))
    assert lines.filter(bug) and bug.exc_info is not None and bug.getMessage() == "Handler 'x' failed with an exception"
    ours = _record(f"Request attempt #1/9 failed; will retry: GET https://k:6443/api -> {REFUSED}", name="specpilot")
    assert lines.filter(ours) and ours.getMessage().startswith("Request attempt #1/9")


def test_the_operators_own_requests_name_the_server_and_the_cause() -> None:
    import asyncio

    import pytest

    from specpilot.controller.kube import Connection, Kube, Unreachable

    server = f"http://127.0.0.1:{_free_port()}"

    async def get() -> None:
        kube = Kube(Connection(server=server))
        try:
            await kube.get("pods", "default", "x")
        finally:
            await kube.close()

    with pytest.raises(Unreachable) as raised:
        asyncio.run(get())
    assert str(raised.value) == (f"cannot reach the Kubernetes API server at {server} (connection refused) on GET "
                                 f"/api/v1/namespaces/default/pods/x")
