"""The sandbox kubelet runs benchmark Jobs as the Job controller would: their deadline included."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from specpilot.sandbox.kubelet import Kubelet, SimSettings
from tests.operator.scenario import NAMESPACE

pytestmark = pytest.mark.operator


def _job(name: str, deadline_s: int | None, backoff_limit: int = 3) -> dict:
    spec = {"backoffLimit": backoff_limit, "template": {"spec": {"containers": [{"name": "bench", "args": []}]}}}
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
