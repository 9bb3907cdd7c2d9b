"""specpilot-bench in cluster mode: reads the SpeculationProfile from the Kubernetes API, publishes its status.

The API is kmock's KubernetesEmulator over HTTP (the bench uses the real `kubernetes` client through a
kubeconfig); the engine is the real vLLM on the CPU. An EAGLE-3 candidate is profiled as a cluster profiles
it (the operator's profile and Job, the Job's own command line), and a SIGTERM in the middle of the sweep
must leave the profile Failed with the levels measured so far; the published object must pass the CRD schema.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from pathlib import Path

import kmock
import pytest
import yaml
from profile_checks import check_speculative_run
from specpilot.api import SpeculativeDeploymentSpec
from specpilot.api.profile import SpeculationProfile
from specpilot.api.validate import validate_custom_resource
from specpilot.config import OperatorConfig
from specpilot.policy.needs import profile_spec
from specpilot.manifests.benchmark import BENCH_CONTAINER, ENGINE_CONTAINER, benchmark_job
from specpilot.policy.refine import initial_levels, spent_levels
from specpilot_bench.engine import free_port

pytestmark = pytest.mark.vllm

RESOURCE = "specpilot.io/v1alpha1/speculationprofiles"
NAMESPACE = "profiling"
NAME = "cpu-baseline-test"


def _replaced(args: list[str], flag: str, value: str) -> list[str]:
    """`args` with `flag`'s value replaced (the pod's fixed loopback ports become free ones here)."""
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


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
    # The bench publishes what it measured; the phase, reason and attempts are the operator's (it fails the
    # profile from the Job's state), so the stored ones are untouched.
    assert (status["phase"], status.get("reason"), status["attempts"]) == ("Pending", None, 1)
    assert status["jobName"] == "bench-job-1"
    (run,) = status["runs"]
    measured = [p["concurrency"] for p in run["points"]]
    assert measured[:1] == [1] and len(measured) < 3
    assert status["engineStarts"] == 1 and status["kvCapacityTokens"] > 0
    # The same partial result was printed and written, saying why it stopped.
    printed = json.loads(stdout)[0]["status"]
    assert printed["phase"] == "Failed" and printed["reason"] == "Interrupted"
    assert json.loads(output.read_text())[0]["status"]["runs"][0]["points"] == run["points"]


async def test_eagle3_profile_measured_by_the_operators_job(api, tiny_models, cpu_engine_args, engine_env, tmp_path,
                                                           crds):
    # An eagle3 candidate with the tiny EAGLE-3 head, profiled on a CPU pool as the operator profiles it: its
    # SpeculationProfile spec, its benchmark Job, and that Job's two containers run as they are, each as its
    # own process with its own environment: the engine container's supervisor (one engine start at k=1, one
    # at K) and the bench, plus a kubeconfig, free loopback ports and the local paths a pod would not need.
    emulator, url = api
    spec = SpeculativeDeploymentSpec.model_validate({
        "model": {"id": str(tiny_models.target), "servedName": "tiny", "maxModelLen": 512,
                  "extraArgs": [a for a in cpu_engine_args if a not in ("--max-model-len", "512")]},
        "methods": [{"method": "eagle3", "model": str(tiny_models.eagle3), "numSpeculativeTokens": 3}],
        "gpuPools": [{"name": "cpu", "nodeSelector": {}, "sku": "cpu"}],
        "profiling": {"concurrencyLevels": [1, 2], "requestsPerLevel": 3,
                      "workload": {"name": "json-extraction", "outputLen": 24}},
    })
    config = OperatorConfig()
    measured = profile_spec(spec, "cpu", spec.methods[0], config)
    name = measured.object_name()
    emulator.objects[RESOURCE, NAMESPACE, name] = {
        **SpeculationProfile(metadata={"name": name, "namespace": NAMESPACE, "resourceVersion": "1"},
                             spec=measured).dump(),
        "status": {"phase": "Pending"},
    }
    job = benchmark_job(profile_name=name, namespace=NAMESPACE, profile_spec=measured, spec=spec,
                        pool=spec.gpu_pools[0], bench_image=config.benchmark_image,
                        owner={"apiVersion": "specpilot.io/v1alpha1", "kind": "SpeculationProfile", "name": name,
                               "uid": "u1"})
    containers = {c["name"]: c for c in job["spec"]["template"]["spec"]["containers"]}
    bench, engine = containers[BENCH_CONTAINER], containers[ENGINE_CONTAINER]
    logs = tmp_path / "logs"
    control, engine_port = free_port(), free_port()
    supervisor_args, engine_command = engine["args"][:engine["args"].index("--")], \
        engine["args"][engine["args"].index("--") + 1:]
    assert engine["command"][0] == engine_command[0] == "python3"
    supervisor_args = _replaced(_replaced(supervisor_args, "--listen", f"127.0.0.1:{control}"), "--log-dir", str(logs))
    engine_command = [sys.executable, *_replaced(engine_command[1:], "--port", str(engine_port))]
    supervisor = subprocess.Popen([sys.executable, "-m", "specpilot_bench", "engine-supervisor", *supervisor_args,
                                   "--", *engine_command], env=engine_env, stdout=subprocess.DEVNULL,
                                  stderr=(tmp_path / "supervisor.log").open("w"))
    bench_args = _replaced(_replaced(bench["args"], "--supervisor-url", f"http://127.0.0.1:{control}"),
                           "--engine-port", str(engine_port))
    command = [sys.executable, "-m", "specpilot_bench", *bench_args,
               "--kubeconfig", str(kubeconfig(tmp_path / "kubeconfig", url)),
               "--output", str(tmp_path / "result.json")]
    try:
        proc = await asyncio.to_thread(subprocess.run, command, env=engine_env, capture_output=True, text=True,
                                       timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:] + (tmp_path / "supervisor.log").read_text()[-3000:]
        assert await asyncio.to_thread(supervisor.wait, 60) == 0
    finally:
        if supervisor.poll() is None:
            supervisor.kill()

    stored = json.loads(json.dumps(emulator.objects[RESOURCE, NAMESPACE, name].raw))
    assert validate_custom_resource(crds["SpeculationProfile"], stored) == []
    assert stored["spec"]["method"]["method"] == "eagle3"
    status = stored["status"]
    assert status["phase"] == "Pending" and status["engineStarts"] == 2  # the operator decides the phase
    assert json.loads((tmp_path / "result.json").read_text())[0]["status"]["phase"] == "Succeeded"
    assert status["jobName"] == job["metadata"]["name"]
    runs = status["runs"]
    assert [r["numSpeculativeTokens"] for r in runs] == [1, 3]
    check_speculative_run(runs[0], 1)
    check_speculative_run(runs[1], 3)
    # A model drafter drafts at every request-step.
    assert runs[1]["acceptance"]["draftsPerStep"] > 0.8
    # Each engine ran the EAGLE-3 head at the run's K.
    for k in (1, 3):
        (log,) = logs.glob(f"*-k{k}.log")
        assert f"speculative_config=SpeculativeConfig(method='eagle3', model='{tiny_models.eagle3}', " \
               f"num_spec_tokens={k})" in log.read_text()


async def test_a_refinement_round_appends_a_repeated_level_to_a_real_profile(api, tiny_models, engine_env,
                                                                            tmp_path, crds):
    # issue 14: a baseline profile measured by the real engine, then a refinement round of the same Job
    # command (`--levels 2,3 --repeat 2 --append`) that measures level 2 again and level 3 (a batch size the
    # sweep did not list, where a change of k would lie), twice each on a fresh engine, and appends the
    # points to the stored run instead of replacing it.
    emulator, url = api
    name = "cpu-baseline-refined"
    emulator.objects[RESOURCE, NAMESPACE, name] = {
        "apiVersion": "specpilot.io/v1alpha1", "kind": "SpeculationProfile",
        "metadata": {"name": name, "namespace": NAMESPACE, "resourceVersion": "1"},
        "spec": {"model": {"id": str(tiny_models.target), "maxModelLen": 512}, "sku": "cpu",
                 "engineImage": "vllm-cpu:0.32.0", "concurrencyLevels": [1, 2], "requestsPerLevel": 3,
                 "workload": {"name": "json-extraction", "outputLen": 24}},
        "status": {"phase": "Pending", "attempts": 1},
    }
    common = [sys.executable, "-m", "specpilot_bench", "--profile-name", name, "--namespace", NAMESPACE,
              "--kubeconfig", str(kubeconfig(tmp_path / "kubeconfig", url)),
              "--engine-args", "--enforce-eager --max-num-seqs 8 --kv-cache-memory-bytes 67108864",
              "--log-dir", str(tmp_path / "logs"), "--no-calibration", "--engine-start-timeout", "240"]
    first = await asyncio.to_thread(subprocess.run, [*common, "--job-name", "bench-1"], env=engine_env,
                                    capture_output=True, text=True, timeout=400)
    assert first.returncode == 0, first.stderr[-3000:]
    before = json.loads(json.dumps(emulator.objects[RESOURCE, NAMESPACE, name].raw))["status"]
    assert before["phase"] == "Pending"  # the operator's to decide; the bench wrote its runs
    assert [p["concurrency"] for p in before["runs"][0]["points"]] == [1, 2]

    second = await asyncio.to_thread(
        subprocess.run, [*common, "--job-name", "refine-1", "--levels", "2,3", "--repeat", "2", "--append"],
        env=engine_env, capture_output=True, text=True, timeout=400)
    assert second.returncode == 0, second.stderr[-3000:]
    stored = json.loads(json.dumps(emulator.objects[RESOURCE, NAMESPACE, name].raw))
    assert validate_custom_resource(crds["SpeculationProfile"], stored) == []
    assert stored["spec"]["concurrencyLevels"] == [1, 2]  # the spec is the operator's: untouched
    status = stored["status"]
    assert status["phase"] == "Pending" and status["engineStarts"] == 2 and status["jobName"] == "refine-1"
    (run,) = status["runs"]
    points = run["points"]
    assert [p["concurrency"] for p in points] == [1, 2, 2, 3, 2, 3]  # interleaved
    assert points[:2] == before["runs"][0]["points"]  # what was there is kept as it was
    for point in points[2:]:  # max(3, 2 waves of c)
        assert point["completed"] == 2 * point["concurrency"] and point["outputThroughput"] > 0
    # The planner tells the sweep from the refinement by the spec's levels: 2 sweep levels, 4 points beyond.
    profile = SpeculationProfile.model_validate(stored)
    assert (initial_levels([profile]), spent_levels([profile])) == (2, 4)
