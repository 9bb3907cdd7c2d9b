"""specpilot-bench (the benchmark Job's load generator: vLLM's own client) against the simulated engine.

The simulated engine runs as the demo's kubelet starts it (`python -m specpilot_sandbox.engine`, EAGLE-3
on H100-SXM, 10x faster than real time); the bench measures it as a sidecar at three concurrency levels.
The profile it writes must be a valid SpeculationProfile whose acceptance matches the twin's prior and
whose throughput grows with concurrency, as it would on the GPU the twin stands for.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from specpilot.api.validate import validate_custom_resource
from specpilot.perf import acceptance_profile

pytestmark = pytest.mark.vllm  # the bench's load generator is vllm.benchmarks

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
SPECULATIVE_CONFIG = json.dumps({"method": "eagle3", "num_speculative_tokens": 3,
                                 "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"})
LEVELS = [1, 4, 16]


@pytest.fixture(scope="module")
def simulated_engine(tmp_path_factory):
    """The engine's base URL; the process is stopped with SIGTERM afterwards and must exit 0."""
    log_path = tmp_path_factory.mktemp("engine") / "engine.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "specpilot_sandbox.engine", "--model", MODEL, "--port", "0",
             "--speculative-config", SPECULATIVE_CONFIG, "--sku", "H100-SXM", "--time-scale", "10",
             "--startup-delay-s", "5", "--seed", "1"],
            stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        base_url = _wait_for_listening(log_path, proc)
        yield base_url
    finally:
        proc.terminate()
        assert proc.wait(30) == 0, log_path.read_text()[-3000:]


def _wait_for_listening(log_path: Path, proc: subprocess.Popen) -> str:
    import time

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in log_path.read_text().splitlines():
            if "listening on " in line:
                return line.rsplit("listening on ", 1)[1].strip()
        assert proc.poll() is None, log_path.read_text()
        time.sleep(0.1)
    raise AssertionError(f"the simulated engine did not start: {log_path.read_text()}")


@pytest.fixture(scope="module")
def profile(simulated_engine, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("bench") / "profile.yaml"
    proc = subprocess.run(
        [sys.executable, "-m", "specpilot_bench", "--engine-url", simulated_engine, "--model", MODEL,
         "--speculative-config", SPECULATIVE_CONFIG, "--sku", "H100-SXM", "--levels", ",".join(map(str, LEVELS)),
         "--requests-per-level", "32", "--output-len", "128", "--workload", "sharegpt", "--no-calibration",
         "--no-early-stop", "--engine-start-timeout", "60", "--output", str(out)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    docs = list(yaml.safe_load_all(out.read_text()))
    assert len(docs) == 1
    return docs[0]


def test_profile_is_a_valid_speculation_profile(profile, crds):
    assert validate_custom_resource(crds["SpeculationProfile"], profile) == []
    status = profile["status"]
    # a sidecar Job measures the one K its engine runs; the profile's k=1 run comes from another Job
    assert status["phase"] == "Running" and "reason" not in status
    assert "specpilot.sim" in status["engineVersion"]
    assert status["kvCapacityTokens"] > 100_000  # an 8B model on an 80 GB GPU
    (run,) = status["runs"]
    assert run["numSpeculativeTokens"] == 3
    assert [p["concurrency"] for p in run["points"]] == LEVELS
    for point in run["points"]:
        assert point["completed"] == 32 and point["failed"] == 0
        assert sum(point["acceptedPerPosition"]) == point["numAcceptedTokens"]
        assert point["numDraftTokens"] == 3 * point["numDrafts"]


def test_measured_acceptance_matches_the_twins_prior(profile):
    acceptance = profile["status"]["runs"][0]["acceptance"]
    prior = acceptance_profile("eagle3", "sharegpt", 3)
    assert acceptance["perPosition"] == pytest.approx(list(prior.per_position), abs=0.05)
    assert acceptance["draftsPerStep"] == pytest.approx(1.0, abs=0.02)
    assert acceptance["meanAcceptanceLength"] == pytest.approx(prior.tokens_per_step(3), abs=0.15)


def test_throughput_rises_with_concurrency(profile):
    throughput = [p["outputThroughput"] for p in profile["status"]["runs"][0]["points"]]
    assert throughput == sorted(throughput) and throughput[-1] > 2 * throughput[0]
