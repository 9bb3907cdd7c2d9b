"""The benchmark pod's engine container: the engine supervisor starts the engine the bench asks for (only among
the runs its own arguments allow), and the bench measures it over loopback without handing it anything.

The engine here is the sandbox's simulated one (fast, no GPU); the real vLLM engine under the supervisor is
tests/integration/test_bench_vllm.py's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from specpilot.api import seal

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
NGRAM = {"method": "ngram", "num_speculative_tokens": 3}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _call(url: str, method: str = "GET", body: bytes | None = None) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _wait_for(url: str, process: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text()[-3000:]
        try:
            _call(url)
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer: {log.read_text()[-3000:]}")


@pytest.fixture
def supervisor(tmp_path):
    """Start an engine supervisor over the simulated engine; yields (supervisor URL, engine port, env, log)."""
    control, engine_port = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k != seal.TOKEN_ENV}
    env.update(PYTHONUNBUFFERED="1", SPECPILOT_SIM_CLOCK_FILE=str(tmp_path / "engine.clock"))
    log = tmp_path / "supervisor.log"
    configs = [a for k in (1, 3) for a in ("--config-for-k", f"{k}={json.dumps({**NGRAM, 'num_speculative_tokens': k})}")]
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "specpilot_bench", "engine-supervisor", "--listen", f"127.0.0.1:{control}",
             "--log-dir", str(tmp_path / "engine-logs"), "--idle-exit-s", "120", *configs, "--",
             sys.executable, "-m", "specpilot_sandbox.engine", "--model", MODEL, "--host", "127.0.0.1",
             "--port", str(engine_port), "--sku", "H100-SXM", "--time-scale", "20", "--startup-delay-s", "1"],
            stdout=out, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{control}"
    try:
        _wait_for(f"{url}/healthz", process, log)
        yield url, engine_port, env, log, process
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(30)


def test_the_supervisor_starts_only_the_runs_its_arguments_allow(supervisor):
    url, engine_port, _, _, _ = supervisor
    status, answer = _call(f"{url}/engine", "PUT", json.dumps({"k": 2}).encode())
    assert status == 400 and "[0, 1, 3]" in answer["error"]
    status, answer = _call(f"{url}/engine", "PUT", json.dumps({"k": "3; rm -rf /"}).encode())
    assert status == 400
    status, answer = _call(f"{url}/engine", "PUT", b"{" + b" " * 4096 + b"}")
    assert status == 400 and "at most 1024" in answer["error"]
    status, answer = _call(f"{url}/engine", "PUT", json.dumps({"k": 3}).encode())
    assert status == 200 and answer["k"] == 3 and answer["running"]
    status, answer = _call(f"{url}/engine", "DELETE")
    assert status == 200 and not answer["running"]


def test_the_bench_measures_the_supervised_engine_and_shuts_it_down(supervisor, tmp_path):
    url, engine_port, env, log, process = supervisor
    out = tmp_path / "profiles.json"
    bench_env = {**env, "SPECPILOT_BENCH_DISABLE_VLLM": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "specpilot_bench", "--supervisor-url", url, "--engine-port", str(engine_port),
         "--model", MODEL, "--speculative-config", json.dumps(NGRAM), "--skip-baseline", "--levels", "1,2",
         "--requests-per-level", "4", "--output-len", "32", "--no-calibration", "--sku", "H100-SXM",
         "--output", str(out)], env=bench_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    [profile] = json.loads(out.read_text())
    status = profile["status"]
    assert status["phase"] == "Succeeded" and status["engineStarts"] == 2
    assert [r["numSpeculativeTokens"] for r in status["runs"]] == [1, 3]
    assert all(p["outputThroughput"] > 0 for r in status["runs"] for p in r["points"])
    # the bench said it was done: the supervisor stopped the engine and exited 0, so the pod completes
    assert process.wait(30) == 0, log.read_text()[-3000:]


def test_an_engine_that_dies_fails_the_run_with_its_log(tmp_path):
    control = _free_port()
    log = tmp_path / "supervisor.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "specpilot_bench", "engine-supervisor", "--listen", f"127.0.0.1:{control}",
             "--log-dir", str(tmp_path / "engine-logs"), "--", sys.executable, "-c",
             "print('no such model here'); raise SystemExit(3)"], stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{control}"
    try:
        _wait_for(f"{url}/healthz", process, log)
        proc = subprocess.run(
            [sys.executable, "-m", "specpilot_bench", "--supervisor-url", url, "--engine-port", str(_free_port()),
             "--model", MODEL, "--levels", "1", "--no-calibration", "--sku", "H100-SXM",
             "--engine-start-timeout", "60", "--output", str(tmp_path / "out.json")],
            capture_output=True, text=True, timeout=120, env={**os.environ, "SPECPILOT_BENCH_DISABLE_VLLM": "1"})
        assert proc.returncode == 1
        [profile] = json.loads((tmp_path / "out.json").read_text())
        assert profile["status"]["reason"] == "EngineStartFailed"
        assert "exited with code 3" in profile["status"]["message"]
        assert "no such model here" in profile["status"]["message"]
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(30)


def test_a_supervisor_the_bench_stopped_calling_exits(tmp_path):
    control = _free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "specpilot_bench", "engine-supervisor", "--listen", f"127.0.0.1:{control}",
         "--idle-exit-s", "1", "--", sys.executable, "-c", "import time; time.sleep(600)"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert process.wait(60) == 1
    finally:
        if process.poll() is None:
            process.kill()
