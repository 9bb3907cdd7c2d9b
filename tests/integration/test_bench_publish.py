"""specpilot-bench in cluster mode: reads the SpeculationProfile from the Kubernetes API, publishes its status.

The API is kmock's KubernetesEmulator over HTTP (the bench uses the real `kubernetes` client through a
kubeconfig); the engine is the real vLLM on the CPU. A SIGTERM in the middle of the sweep must leave the
profile Failed with the levels measured so far, and the published object must pass the CRD schema.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from pathlib import Path

import kmock
import pytest
import yaml
from specpilot.api.validate import validate_custom_resource

pytestmark = pytest.mark.vllm

RESOURCE = "specpilot.io/v1alpha1/speculationprofiles"
NAMESPACE = "profiling"
NAME = "cpu-baseline-test"


def kubeconfig(path: Path, server: str) -> Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": server}}],
        "users": [{"name": "bench", "user": {"token": "service-account-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "bench"}}],
    }))
    return path


@pytest.fixture
async def api():
    async with kmock.KubernetesEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.resources[RESOURCE] = {"kind": "SpeculationProfile", "namespaced": True, "subresources": ["status"]}
        yield emulator, str(server.url)


async def test_sigterm_mid_sweep_publishes_a_partial_failed_profile(api, tiny_models, engine_env, tmp_path, crds):
    emulator, url = api
    emulator.objects[RESOURCE, NAMESPACE, NAME] = {
        "apiVersion": "specpilot.io/v1alpha1", "kind": "SpeculationProfile",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "resourceVersion": "1"},
        "spec": {"model": {"id": str(tiny_models.target), "maxModelLen": 512}, "sku": "cpu",
                 "engineImage": "vllm-cpu:0.32.0", "concurrencyLevels": [1, 2, 4], "requestsPerLevel": 4,
                 "workload": {"name": "json-extraction", "outputLen": 48}},
        "status": {"phase": "Pending", "attempts": 1},
    }
    output = tmp_path / "result.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specpilot_bench", "--profile-name", NAME, "--namespace", NAMESPACE,
        "--kubeconfig", str(kubeconfig(tmp_path / "kubeconfig", url)), "--job-name", "bench-job-1",
        "--engine-args", "--enforce-eager --max-num-seqs 8 --kv-cache-memory-bytes 67108864",
        "--log-dir", str(tmp_path / "logs"), "--output", str(output), "--no-calibration",
        env=engine_env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    seen = []
    async with asyncio.timeout(300):
        while line := (await proc.stderr.readline()).decode():
            seen.append(line)
            if line.startswith("[specpilot-bench] k=0 c=1:"):
                proc.send_signal(signal.SIGTERM)
                break
        stdout, stderr = await proc.communicate()
    log = "".join(seen) + stderr.decode()
    assert proc.returncode == 143, log[-3000:]

    stored = json.loads(json.dumps(emulator.objects[RESOURCE, NAMESPACE, NAME].raw))
    assert validate_custom_resource(crds["SpeculationProfile"], stored) == []
    status = stored["status"]
    assert status["phase"] == "Failed" and status["reason"] == "Interrupted"
    assert status["jobName"] == "bench-job-1" and status["attempts"] == 1
    (run,) = status["runs"]
    measured = [p["concurrency"] for p in run["points"]]
    assert measured[:1] == [1] and len(measured) < 3
    assert status["engineStarts"] == 1 and status["kvCapacityTokens"] > 0
    # The same partial result was printed and written.
    assert json.loads(stdout)[0]["status"]["phase"] == "Failed"
    assert json.loads(output.read_text())[0]["status"]["runs"][0]["points"] == run["points"]
