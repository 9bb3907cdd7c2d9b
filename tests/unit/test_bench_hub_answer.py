"""The Hugging Face Hub's answer reaches the operator from above a failed engine's log tail: vLLM wraps the Hub's
error (its HTTP status, the repository) in transformers' and its own, a traceback later, so the engine supervisor
keeps those lines beside the tail (in GET /engine and in its termination message) and the bench puts them in its
sealed account, whose first line stays the bench's own however long the engine's log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from specpilot.api.profile import SpeculationProfileSpec
from specpilot.policy.model_access import hub_refusal
from specpilot_bench.cli import bounded_account
from specpilot_bench.supervisor import TERMINATION_BYTES, Supervisor
from tests.unit.test_bench_supervisor import MODEL, _free_port, _wait_for

# How vLLM's log ends when the Hub has no such repository: huggingface_hub's error with the status, two chained
# tracebacks, transformers' OSError without it.
HUB_LINES = ["huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error.",
             f"Repository Not Found for url: https://huggingface.co/{MODEL}/resolve/main/config.json."]
FRAMES = [f'  File "/usr/local/lib/python3.12/dist-packages/vllm/engine/arg_utils.py", line {n}, in create_engine_config'
          f"\n    {'x' * 150}" for n in range(30)]
ENGINE_LOG = "\n".join([
    "INFO 12-08 00:10:56 [api_server.py:1] vLLM API server version 0.32.0", *HUB_LINES,
    "", "The above exception was the direct cause of the following exception:", "", "Traceback (most recent call last):",
    *FRAMES,
    f"OSError: {MODEL} is not a local folder and is not a valid model identifier listed on "
    "'https://huggingface.co/models'",
    "If this is a private repository, make sure to pass a token having permission to this repo either by logging in "
    "with `hf auth login` or by passing `token=<your_token>`"])
PROFILE = SpeculationProfileSpec.model_validate({"model": {"id": MODEL}, "sku": "H100-SXM",
                                                 "engineImage": "vllm/vllm-openai:v0.32.0", "concurrencyLevels": [1]})


def _engine_printing(tmp_path: Path, text: str) -> list[str]:
    """An engine command line that prints `text` and exits 1."""
    source = tmp_path / "engine-output.txt"
    source.write_text(text)
    return [sys.executable, "-c", f"import sys; sys.stdout.write(open({str(source)!r}).read()); raise SystemExit(1)"]


def test_the_supervisor_keeps_the_hubs_answer_from_above_the_tail(tmp_path):
    termination = tmp_path / "termination-log"
    termination.write_bytes(b"")  # the kubelet creates it before the container starts
    supervisor = Supervisor(_engine_printing(tmp_path, ENGINE_LOG), {}, tmp_path / "logs", termination)
    supervisor.start(0)
    supervisor.process.wait(30)
    state = supervisor.state()
    assert state["exitCode"] == 1
    assert HUB_LINES[0] not in state["logTail"]  # scrolled out of the tail
    assert state["hubAnswer"].splitlines() == HUB_LINES
    message = termination.read_text()
    assert len(message.encode()) <= TERMINATION_BYTES
    # the Hub's answer first, then as much of the tail as fits: its end
    assert message.startswith("the engine for k=0 exited with code 1; the Hugging Face Hub's answer, earlier in its "
                              "log:\n" + "\n".join(HUB_LINES) + "\nits log ends with:\n"), message[:500]
    assert message.endswith("or by passing `token=<your_token>`")
    refused = hub_refusal([message], PROFILE)
    assert (refused.reason, refused.status) == ("ModelNotFound", 404)
    # without those lines the status is lost
    assert hub_refusal([state["logTail"]], PROFILE).status is None

    supervisor.start(0)  # a new start says only what its own engine says
    assert supervisor.state()["hubAnswer"] == ""
    supervisor.stop()


def test_an_engine_without_the_hubs_answer_reports_its_tail_alone(tmp_path):
    termination = tmp_path / "termination-log"
    termination.write_bytes(b"")
    supervisor = Supervisor(_engine_printing(tmp_path, "ValueError: --max-num-seqs must be >= 1 (got 0)"), {},
                            tmp_path / "logs", termination)
    supervisor.start(0)
    supervisor.process.wait(30)
    assert supervisor.state()["hubAnswer"] == ""
    assert termination.read_text().startswith("the engine for k=0 exited with code 1:\n$ ")


def test_the_benchs_account_keeps_its_own_first_line_whole():
    engine = "\n".join(f"«the operator says: line {n}» " + "y" * 200 for n in range(100))
    account = bounded_account("the engine for k=1 exited with code 1 before it became ready\n" + engine)
    assert len(account) <= 8000
    assert account.splitlines()[0] == "the engine for k=1 exited with code 1 before it became ready"
    assert account.endswith(engine[-100:])
    assert bounded_account("one line") == "one line"


def test_a_failed_start_carries_the_hubs_answer_to_the_profile(tmp_path):
    """The bench against the supervisor, as in the Job's pod: its account (status.benchFailure) holds the Hub's
    lines and enough of the tail, and the operator reads the HTTP status from it."""
    control = _free_port()
    log = tmp_path / "supervisor.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "specpilot_bench", "engine-supervisor", "--listen", f"127.0.0.1:{control}",
             "--log-dir", str(tmp_path / "engine-logs"), "--", *_engine_printing(tmp_path, ENGINE_LOG)],
            stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{control}"
    try:
        _wait_for(f"{url}/healthz", process, log)
        started = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "specpilot_bench", "--supervisor-url", url, "--engine-port", str(_free_port()),
             "--model", MODEL, "--levels", "1", "--no-calibration", "--sku", "H100-SXM",
             "--engine-start-timeout", "60", "--output", str(tmp_path / "out.json")],
            capture_output=True, text=True, timeout=120, env={**os.environ, "SPECPILOT_BENCH_DISABLE_VLLM": "1"})
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert time.monotonic() - started < 60
        [profile] = json.loads((tmp_path / "out.json").read_text())
        failure = profile["status"]["benchFailure"]
        assert failure["reason"] == "EngineStartFailed"
        lines = failure["message"].splitlines()
        assert lines[0] == "the engine for k=0 exited with code 1 before it became ready"
        assert lines[1:4] == ["Engine log lines with the Hugging Face Hub's answer, from above its end:", *HUB_LINES]
        refused = hub_refusal([failure["message"]], PROFILE)
        assert (refused.reason, refused.status, refused.model) == ("ModelNotFound", 404, MODEL)
    finally:
        if process.poll() is None:
            process.terminate()
        process.wait(30)
