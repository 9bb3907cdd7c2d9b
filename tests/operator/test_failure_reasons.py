"""A benchmark Job that fails says why: the real operator, the sandbox kubelet running the Jobs' pods as local
processes (the bench, the engine supervisor, the simulated engine), and one deployment per way to fail: an
exception in the bench, an engine that exits, an engine container OOMKilled, an engine image that cannot be
pulled. Each profile's status message and the Warning Event carry the reason the pod's status gives."""

from __future__ import annotations

import asyncio

import pytest

from specpilot_sandbox.kubelet import Kubelet, SimSettings
from tests.operator.scenario import H100, NAMESPACE, events, node, profiles, sdep, status

pytestmark = pytest.mark.operator

SECRET = "hf_" + "s3cr3tT0kenValue1234"


def _deployment(name: str, **model) -> dict:
    body = sdep(methods=[{"method": "ngram", "numSpeculativeTokens": 2, "promptLookupMax": 4}],
                profiling={"concurrencyLevels": [1, 2], "requestsPerLevel": 4, "maxParallelJobsPerPool": 2,
                           "backoffLimit": 0})
    body["metadata"]["name"] = name
    body["spec"]["model"].update(model)
    return body


def _profiles_of(api, deployment: str) -> list[dict]:
    """The deployment's profiles (as its status lists them)."""
    names = {name for pool in status(api, deployment).get("pools") or []
             for name in (pool.get("profiles") or {}).get("names") or []}
    return [p for p in profiles(api) if p["metadata"]["name"] in names]


def _failed(api, deployment: str) -> dict | None:
    """The status of a Failed profile of the deployment's, or None."""
    return next((p["status"] for p in _profiles_of(api, deployment)
                 if (p.get("status") or {}).get("phase") == "Failed"), None)


async def test_a_failed_benchmark_job_says_why(sandbox, operator, tmp_path):
    kubelet = Kubelet(sandbox, sandbox.write_kubeconfig(tmp_path / "bench-kubeconfig", NAMESPACE), tmp_path / "work",
                      SimSettings(time_scale=4, startup_delay_s=1))
    (tmp_path / "work").mkdir()
    stop = asyncio.Event()
    task = asyncio.create_task(kubelet.run(stop, interval_s=0.2))
    try:
        await sandbox.create(node("gpu-a", H100, "h100"))
        # the bench's own exception: a custom workload whose file is not there
        bench = _deployment("bench-fails")
        bench["spec"]["profiling"]["workload"] = {"name": "custom", "file": {"name": "prompts", "key": "p.jsonl"}}
        await sandbox.create(bench)
        # the engine exits at start (the simulated engine refuses --max-num-seqs 0, as vLLM does), with a
        # secret on its command line, which its log echoes
        await sandbox.create(_deployment("engine-exits", extraArgs=["--max-num-seqs", "0",
                                                                     f"--hf-token-x={SECRET}"]))
        # the engine container's memory limit is below what the simulated engine takes: OOMKilled
        await sandbox.create(_deployment("engine-oom", resources={"limits": {"memory": "256Mi"}}))
        # an engine image the sandbox cannot pull: the pod never starts
        await sandbox.create(_deployment("image-pull", image="registry.invalid/vllm/vllm-openai:v0.32.0"))

        failed = await sandbox.wait_for(lambda: _failed(sandbox, "bench-fails"), timeout_s=120,
                                        what="the bench-fails profile Failed")
        assert ("the benchmark says: BenchmarkFailed: WorkloadError: --workload-file /workload/prompts.jsonl does "
                "not exist") in failed["message"], failed
        assert "bench container exited 1 (Error)" in failed["message"]

        failed = await sandbox.wait_for(lambda: _failed(sandbox, "engine-exits"), timeout_s=120,
                                        what="the engine-exits profile Failed")
        message = failed["message"]
        assert "EngineStartFailed" in message and "exited with code 1" in message, message
        # the engine's own words, quoted as its text, the secret scrubbed
        assert "--max-num-seqs must be >= 1 (got 0)" in message, message
        assert "(the engine container's own text, unverified): «" in message, message
        assert SECRET not in message and "s3cr3t" not in message

        failed = await sandbox.wait_for(lambda: _failed(sandbox, "engine-oom"), timeout_s=120,
                                        what="the engine-oom profile Failed")
        assert "engine container was OOMKilled (exit 137)" in failed["message"], failed
        assert "spec.model.resources.limits.memory" in failed["message"]

        # The image pull failure fails nothing yet (Kubernetes keeps trying until the Job's deadline): the
        # profile says why its pod does not start, and a Warning Event says it once.
        def not_starting():
            return next(((p.get("status") or {}).get("message") for p in _profiles_of(sandbox, "image-pull")
                         if (p.get("status") or {}).get("reason") == "PodNotStarting"), None)

        message = await sandbox.wait_for(not_starting, timeout_s=60, what="the image-pull profile's reason")
        assert "image registry.invalid/vllm/vllm-openai:v0.32.0 cannot be pulled" in message, message
        assert "spec.model.image" in message
        warning = await sandbox.wait_for(lambda: events(sandbox, "BenchmarkPodNotStarting"), timeout_s=30,
                                         what="a BenchmarkPodNotStarting Event")
        assert warning[0]["type"] == "Warning" and "cannot be pulled" in warning[0]["message"]

        # Every failure has its ProfilingFailed Warning Event with the same reason.
        def failure_events():
            found = events(sandbox, "ProfilingFailed")
            return found if len({e["involvedObject"]["name"] for e in found}) >= 3 else None

        found = await sandbox.wait_for(failure_events, timeout_s=30, what="ProfilingFailed Events of the three")
        by_deployment = {e["involvedObject"]["name"]: e["message"] for e in found}
        assert "WorkloadError" in by_deployment["bench-fails"]
        assert "--max-num-seqs must be >= 1" in by_deployment["engine-exits"]
        assert SECRET not in by_deployment["engine-exits"]
        assert "OOMKilled" in by_deployment["engine-oom"]
        assert all(e["type"] == "Warning" for e in found)
    except BaseException:
        for profile in profiles(sandbox):
            print("PROFILE", profile["metadata"]["name"], profile.get("status"))
        for dep in sandbox.objects("speculativedeployments", NAMESPACE):
            print("SDEP", dep["metadata"]["name"], (dep.get("status") or {}).get("conditions"))
        for log in sorted((tmp_path / "work").glob("*.log")):
            print("LOG", log.name, log.read_text()[-1500:])
        raise
    finally:
        stop.set()
        await task
        await kubelet.shutdown()
    assert kubelet.running_processes() == 0
