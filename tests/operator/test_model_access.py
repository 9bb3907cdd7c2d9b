"""A benchmark Job whose engine the Hugging Face Hub refuses the model fails its profile at once and says why: the
real operator, the sandbox kubelet running the Jobs' pods as local processes, and in the engine container the
simulated engine behind a fake Hub (tests/operator/hub_engine.py loads the model's and the drafter's config with
transformers first, as vLLM does, so the errors are the libraries' own). The Hub answers as huggingface.co does: 401
GatedRepo for a gated model asked without a token, 404 RepoNotFound for a repository that does not exist.

The profile's message and its ProfilingFailed Event name the model, the HTTP status and the field that fixes it;
the Job is deleted after its first attempt instead of spending its retries on the same refusal."""

from __future__ import annotations

import asyncio
import json
import os
from collections import Counter
from collections.abc import AsyncIterator

import pytest
from aiohttp import web

import specpilot_sandbox.kubelet
from specpilot_sandbox.kubelet import Kubelet, SimSettings
from tests.conftest import REPO
from tests.operator.scenario import H100, NAMESPACE, events, jobs, node, profiles, sdep, status

pytestmark = pytest.mark.operator

pytest.importorskip("transformers")

GATED = "meta-llama/Llama-3.1-8B-Instruct"
MISSING_DRAFTER = "acme/no-such-eagle3"


async def _hub(request: web.Request) -> web.Response:
    """huggingface.co's answers to a download (huggingface_hub reads the error code and message headers)."""
    if f"/{GATED}/" in request.path:
        return web.json_response({"error": "gated"}, status=401, headers={
            "X-Error-Code": "GatedRepo", "X-Error-Message": f"Access to model {GATED} is restricted. You must have "
                                                            "access to it and be authenticated to access it. Please log in."})
    return web.json_response({"error": "Repository not found"}, status=404, headers={
        "X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"})


@pytest.fixture
async def hub() -> AsyncIterator[str]:
    """The fake Hub's URL (HF_ENDPOINT)."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", _hub)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def _deployment(name: str, model: str, methods: list[dict]) -> dict:
    body = sdep(methods=methods, profiling={"concurrencyLevels": [1, 2], "requestsPerLevel": 4,
                                            "maxParallelJobsPerPool": 2, "backoffLimit": 2})
    body["metadata"]["name"] = name
    body["spec"]["model"] = {"id": model}
    return body


def _profiles_of(api, deployment: str) -> list[dict]:
    names = {name for pool in status(api, deployment).get("pools") or []
             for name in (pool.get("profiles") or {}).get("names") or []}
    return [p for p in profiles(api) if p["metadata"]["name"] in names]


async def test_a_model_the_hub_refuses_fails_its_profile_at_once_naming_the_fix(sandbox, operator, hub, tmp_path,
                                                                                 monkeypatch):
    # The engine containers' processes inherit this environment (the sandbox kubelet's).
    monkeypatch.setenv("HF_ENDPOINT", hub)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr(specpilot_sandbox.kubelet, "ENGINE_MODULE", "tests.operator.hub_engine")
    # A target model on a local folder, which loads without the Hub, so that its drafter is the one refused.
    local = tmp_path / "models" / "open-8b"
    local.mkdir(parents=True)
    (local / "config.json").write_text(json.dumps({"model_type": "llama"}))

    kubelet = Kubelet(sandbox, sandbox.write_kubeconfig(tmp_path / "bench-kubeconfig", NAMESPACE), tmp_path / "work",
                      SimSettings(time_scale=4, startup_delay_s=1))
    (tmp_path / "work").mkdir()
    pods_started: Counter[str] = Counter()
    spawn = kubelet._spawn_job

    def counting(job: dict):
        pods_started[job["metadata"]["name"]] += 1
        return spawn(job)

    monkeypatch.setattr(kubelet, "_spawn_job", counting)
    stop = asyncio.Event()
    task = asyncio.create_task(kubelet.run(stop, interval_s=0.2))
    try:
        await sandbox.create(node("gpu-a", H100, "h100"))
        await sandbox.create(_deployment("gated", GATED, [{"method": "ngram", "numSpeculativeTokens": 2}]))
        await sandbox.create(_deployment("drafter", str(local), [{"method": "eagle3", "model": MISSING_DRAFTER,
                                                                   "numSpeculativeTokens": 2}]))

        def failed(deployment: str, count: int) -> list[dict] | None:
            found = [p for p in _profiles_of(sandbox, deployment) if (p.get("status") or {}).get("phase") == "Failed"]
            return found if len(found) >= count else None

        # Both of the gated model's profiles (the baseline and ngram): access denied, HTTP 401, the token's field.
        for profile in await sandbox.wait_for(lambda: failed("gated", 2), timeout_s=120,
                                              what="the gated model's two profiles Failed"):
            said = profile["status"]
            assert said["reason"] == "ModelAccessDenied", said
            message = said["message"]
            assert message.startswith(f"the engine could not download the model {GATED} from Hugging Face "
                                      "(HTTP 401): it is gated, and the engine had no valid token: set "
                                      "spec.model.hfTokenSecretRef to a Secret"), message
            assert "kubectl create secret generic hf-token --from-literal=token=hf_..." in message
            assert "not retried (its Job is deleted)" in message and "specpilot.io/reprofile" in message
            # the bench's account follows, the engine's own words quoted as its text
            assert "the benchmark says: EngineStartFailed" in message and "(unverified): «" in message
            assert said["attempts"] == 1

        # The drafter that does not exist: not found, HTTP 404 (from above the log's tail), its own field.
        [profile] = await sandbox.wait_for(lambda: failed("drafter", 1), timeout_s=120,
                                           what="the drafter's profile Failed")
        said = profile["status"]
        assert said["reason"] == "ModelNotFound", said
        assert said["message"].startswith(
            f"the engine could not download the drafter {MISSING_DRAFTER} of method eagle3 from Hugging Face (HTTP "
            f"404): no such repository: check spec.methods[].model of method eagle3"), said["message"]

        # One ProfilingFailed Warning per failed profile, the operator's words first.
        def failure_events():
            found = [e for e in events(sandbox, "ProfilingFailed")]
            return found if len(found) >= 3 else None

        found = await sandbox.wait_for(failure_events, timeout_s=30, what="three ProfilingFailed Events")
        gated = [e["message"] for e in found if e["involvedObject"]["name"] == "gated"]
        assert len(gated) == 2 and all(e["type"] == "Warning" for e in found)
        for message in gated:
            assert f"ModelAccessDenied: the engine could not download the model {GATED}" in message, message
            assert "(HTTP 401)" in message and "spec.model.hfTokenSecretRef" in message
        [drafter] = [e["message"] for e in found if e["involvedObject"]["name"] == "drafter"]
        assert f"ModelNotFound: the engine could not download the drafter {MISSING_DRAFTER}" in drafter
        assert "(HTTP 404)" in drafter and "spec.methods[].model of method eagle3" in drafter

        # Each refused Job ran one pod and was deleted: no retry spent on what cannot succeed.
        refused = {p["status"].get("jobName") for p in failed("gated", 2) + failed("drafter", 1)}
        await sandbox.wait_for(lambda: not refused & {j["metadata"]["name"] for j in jobs(sandbox)}, timeout_s=30,
                               what="the refused Jobs deleted")
        assert all(pods_started[name] == 1 for name in refused), pods_started

        # The drafter's deployment still measures its baseline: the target loads, only the drafter was refused.
        def baseline_measured():
            return [p for p in _profiles_of(sandbox, "drafter") if (p.get("status") or {}).get("phase") == "Succeeded"]

        [baseline] = await sandbox.wait_for(baseline_measured, timeout_s=120, what="the drafter's baseline measured")
        assert "method" not in baseline["spec"]

        # The token is set: the spec changed, so the profiles the Hub refused are measured again, unasked.
        await sandbox.patch("speculativedeployments", NAMESPACE, "gated",
                            {"spec": {"model": {"hfTokenSecretRef": {"name": "hf-token"}}}})
        remeasured = await sandbox.wait_for(
            lambda: (found := [e for e in events(sandbox, "Reprofiling") if "the spec changed since the Hugging "
                               "Face Hub refused the model (ModelAccessDenied)" in e["message"]]) and found,
            timeout_s=60, what="the refused profiles measured again after the spec changed")
        assert {e["involvedObject"]["name"] for e in remeasured} == {"gated"}
    except BaseException:
        for profile in profiles(sandbox):
            print("PROFILE", profile["metadata"]["name"], profile.get("status"))
        for dep in sandbox.objects("speculativedeployments", NAMESPACE):
            print("SDEP", dep["metadata"]["name"], (dep.get("status") or {}).get("conditions"))
        for log in sorted((tmp_path / "work").glob("*.log")):
            print("LOG", log.name, log.read_text()[-3000:])
        raise
    finally:
        stop.set()
        await task
        await kubelet.shutdown()
    assert kubelet.running_processes() == 0
