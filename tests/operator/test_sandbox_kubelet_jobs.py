"""The sandbox kubelet runs benchmark Jobs as the Job controller would: their deadline included."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from specpilot_sandbox.kubelet import Kubelet, SimSettings
from tests.operator.scenario import NAMESPACE

pytestmark = pytest.mark.operator


def _job(name: str, deadline_s: int | None, backoff_limit: int = 3) -> dict:
    spec = {"backoffLimit": backoff_limit,
            "template": {"spec": {"containers": [{"name": "bench", "image": "specpilot-bench:test", "args": []}]}}}
    if deadline_s is not None:
        spec["activeDeadlineSeconds"] = deadline_s
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": spec}


async def test_a_job_past_its_active_deadline_is_stopped_and_fails_for_good(sandbox, tmp_path, monkeypatch):
    """A benchmark that hangs: past activeDeadlineSeconds (simulated seconds: 2 at time scale 2 is one wall
    second) its process is stopped and the Job is Failed with DeadlineExceeded, though retries were left; a
    Job without a deadline keeps running."""
    started: dict[str, subprocess.Popen] = {}

    def hang(job: dict) -> subprocess.Popen:
        started[job["metadata"]["name"]] = process = subprocess.Popen(
            [sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
        return process

    kubelet = Kubelet(sandbox, tmp_path / "kubeconfig", tmp_path, SimSettings(time_scale=2))
    monkeypatch.setattr(kubelet, "_spawn_job", hang)
    await sandbox.create(_job("hangs", deadline_s=2))
    await sandbox.create(_job("no-deadline", deadline_s=None))
    stop = asyncio.Event()
    task = asyncio.create_task(kubelet.run(stop, interval_s=0.1))
    try:
        def failed():
            job = sandbox.get("jobs", NAMESPACE, "hangs")
            return next((c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == "Failed"), None)

        condition = await sandbox.wait_for(failed, timeout_s=30, what="the Job past its deadline failed")
        assert condition["reason"] == "DeadlineExceeded" and condition["status"] == "True"
        status = sandbox.get("jobs", NAMESPACE, "hangs")["status"]
        assert status["active"] == 0 and status["failed"] == 1
        assert started["hangs"].wait(timeout=10) is not None  # its process was stopped
        assert started["no-deadline"].poll() is None
        assert not (sandbox.get("jobs", NAMESPACE, "no-deadline").get("status") or {}).get("conditions")
        assert len(started) == 2  # the failed Job was not started again
    finally:
        stop.set()
        await task
        await kubelet.shutdown()
    assert kubelet.running_processes() == 0


async def test_a_benchmark_pod_runs_as_two_processes_and_only_the_bench_gets_the_token(sandbox, tmp_path,
                                                                                        monkeypatch):
    """The kubelet runs the engine container's supervisor and the bench container as separate processes, each
    with its own environment: the result token reaches the bench's and never the engine's (a tenant's engine
    code reads its own process's environment and its parent's, nothing else)."""
    from specpilot.api import seal
    from specpilot.api.deployment_spec import SpeculativeDeploymentSpec
    from specpilot.manifests.benchmark import benchmark_job
    from tests.conftest import load_example
    from tests.unit.test_manifests_objects import profile_spec_for

    spec = SpeculativeDeploymentSpec.model_validate(load_example("minimal.yaml")["spec"])
    profile = profile_spec_for(spec, spec.methods[0])
    job = benchmark_job(profile_name="p", namespace=NAMESPACE, profile_spec=profile, spec=spec,
                        pool=spec.gpu_pools[0], bench_image="bench:1", result_token="t0k3n",
                        owner={"apiVersion": "specpilot.io/v1alpha1", "kind": "SpeculationProfile", "name": "p",
                               "uid": "u"})
    spawned: list[tuple[list[str], dict[str, str]]] = []
    kubelet = Kubelet(sandbox, tmp_path / "kubeconfig", tmp_path, SimSettings(time_scale=2))
    monkeypatch.setattr(kubelet, "_spawn", lambda command, log_name, **env: spawned.append((command, env)) or
                        subprocess.Popen([sys.executable, "-c", "pass"]))
    kubelet._spawn_job(job)
    (engine, engine_env), (bench, bench_env) = spawned
    assert engine[2:4] == ["specpilot_bench", "engine-supervisor"]
    assert engine[engine.index("--") + 1:][1:3] == ["-m", "specpilot_sandbox.engine"]
    assert bench[2] == "specpilot_bench" and "engine-supervisor" not in bench
    assert seal.TOKEN_ENV not in engine_env and bench_env[seal.TOKEN_ENV] == "t0k3n"
    # both on the Job's own pod IP: the bench reaches the supervisor and the engine where they listen
    listen = engine[engine.index("--listen") + 1]
    assert bench[bench.index("--supervisor-url") + 1] == f"http://{listen}"
    host = listen.rpartition(":")[0]
    assert engine[engine.index("--host") + 1] == host and host != "127.0.0.1"
