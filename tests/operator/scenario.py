"""Objects and moves the operator scenarios share: nodes, a deployment, the Job controller's part."""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime

from aiohttp import web

from specpilot.api import seal
from specpilot_sandbox.apiserver import SandboxApiServer

NAMESPACE = "team"

H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200"
A100 = "NVIDIA-A100-SXM4-80GB"


def node(name: str, product: str, pool_label: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product, "pool": pool_label,
                                              "nvidia.com/gpu.count": "8"}},
        "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


SDEP = {
    "apiVersion": "specpilot.io/v1alpha1",
    "kind": "SpeculativeDeployment",
    "metadata": {"name": "llama", "namespace": NAMESPACE},
    "spec": {
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct", "servedName": "llama"},
        "methods": [
            {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 4},
            {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "numSpeculativeTokens": 4},
        ],
        "gpuPools": [{"name": "h100", "nodeSelector": {"pool": "h100"}}],
        "profiling": {"concurrencyLevels": [1, 2, 4, 8, 16, 32, 64, 128], "requestsPerLevel": 32,
                      "maxParallelJobsPerPool": 2},
        "policy": {"tpotSloMs": 60, "minGainPercent": 5},
        "serving": {"minReplicas": 1, "maxReplicas": 4},
        "metrics": {"source": "pods", "intervalSeconds": 5, "windowSeconds": 30},
    },
}


def sdep(**spec_overrides) -> dict:
    body = copy.deepcopy(SDEP)
    body["spec"].update(copy.deepcopy(spec_overrides))
    return body


def profiles(api: SandboxApiServer) -> list[dict]:
    return api.objects("speculationprofiles", NAMESPACE)


def jobs(api: SandboxApiServer) -> list[dict]:
    return api.objects("jobs", NAMESPACE)


def status(api: SandboxApiServer, name: str = "llama") -> dict:
    return (api.get("speculativedeployments", NAMESPACE, name) or {}).get("status") or {}


def pools(api: SandboxApiServer, name: str = "llama") -> dict[str, dict]:
    """The deployment's pools in its status, by name."""
    return {p["name"]: p for p in status(api, name).get("pools") or []}


def condition(api: SandboxApiServer, type_: str, name: str = "llama") -> dict | None:
    return next((c for c in status(api, name).get("conditions", []) if c["type"] == type_), None)


def events(api: SandboxApiServer, reason: str | None = None) -> list[dict]:
    return [e for e in api.objects("events", NAMESPACE) if reason is None or e.get("reason") == reason]


async def fail_job(api: SandboxApiServer, job: dict, failed: int, final: bool) -> None:
    """Play the Job controller: count failed pods, and mark the Job Failed once backoff is exhausted."""
    status: dict = {"failed": failed}
    if final:
        status["conditions"] = [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                                 "message": "Job has reached the specified backoff limit"}]
    await api.patch("jobs", NAMESPACE, job["metadata"]["name"], {"status": status}, subresource="status")


async def complete_job(api: SandboxApiServer, job: dict, completed_at: datetime) -> None:
    """Play the Job controller for a Job whose pod exited 0 (whether or not it published a result)."""
    stamp = completed_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    await api.patch("jobs", NAMESPACE, job["metadata"]["name"], {"status": {
        "succeeded": 1, "completionTime": stamp,
        "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": stamp}]}},
        subresource="status")


def measured_status(sku: str, method: str | None, max_k: int = 4, seed: int = 0, noise: float = 0.0,
                    levels: list[int] | None = None, requests_per_level: int = 64) -> dict:
    """A Succeeded profile status as the benchmark Job writes it, from the twin (noise-free unless `noise`,
    the relative measurement noise per level; the same seed gives the baseline and a method the same draw),
    at `levels` (the profile spec's concurrencyLevels; default: the API default), `requests_per_level`
    requests each (the spec's requestsPerLevel: a level finishing more than it sent is refused)."""
    from specpilot.sim.synthetic import Scenario, synthetic_profiles

    extra = {"levels": tuple(levels)} if levels else {}
    baseline, method_profile = synthetic_profiles(
        Scenario(sku=sku, model_id="meta-llama/Llama-3.1-8B-Instruct", method=method or "eagle3", max_k=max_k),
        noise=noise, seed=seed, requests_per_level=requests_per_level, **extra)
    chosen = baseline if method is None else method_profile
    now = datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {**chosen.status.dump(), "startedAt": now, "completedAt": now}


async def publish_results(api: SandboxApiServer, sku: str, names: list[str] | None = None,
                          timeout_s: float = 30.0, noise: float = 0.0, seed: int = 0) -> list[str]:
    """Play the benchmark Jobs: write every (or the named) pending profile's result into its status.

    As a real Job would, each result is written only once the operator has created that profile's Job (so
    a profile queued behind `maxParallelJobsPerPool` is published when its turn comes), never before.
    """
    def pending() -> list[dict]:
        return [p for p in profiles(api) if p["spec"]["sku"] == sku
                and (names is None or p["metadata"]["name"] in names)
                and (p.get("status") or {}).get("phase") != "Succeeded"]

    done: list[str] = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    while pending():
        started = {j["metadata"]["name"] for j in jobs(api)}
        ready = [p for p in pending() if (p.get("status") or {}).get("jobName") in started]
        if not ready and asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for the Jobs of "
                               f"{[p['metadata']['name'] for p in pending()]}")
        for profile in ready:
            method = profile["spec"].get("method") or {}
            job = next(j for j in jobs(api) if j["metadata"]["name"] == profile["status"]["jobName"])
            result = measured_status(sku, method.get("method"), method.get("numSpeculativeTokens", 4), seed=seed,
                                     noise=noise, levels=profile["spec"]["concurrencyLevels"],
                                     requests_per_level=profile["spec"].get("requestsPerLevel", 64))
            await api.patch("speculationprofiles", NAMESPACE, profile["metadata"]["name"],
                            {"status": seal.sealed(result, job)}, subresource="status")
            done.append(profile["metadata"]["name"])
        await asyncio.sleep(0.1)
    return done


def deployment(api: SandboxApiServer, pool: str, name: str = "llama") -> dict | None:
    return api.get("deployments", NAMESPACE, f"{name}-{pool}")


def engine_args(deployment_obj: dict) -> list[str]:
    containers = deployment_obj["spec"]["template"]["spec"]["containers"]
    engine = next(c for c in containers if c["name"] == "engine")
    return engine.get("args") or []


def speculative_config(deployment_obj: dict) -> dict | None:
    """The engine container's --speculative-config, parsed; None when it serves without speculation."""
    import json

    args = engine_args(deployment_obj)
    for i, arg in enumerate(args):
        if arg == "--speculative-config":
            return json.loads(args[i + 1])
        if arg.startswith("--speculative-config="):
            return json.loads(arg.split("=", 1)[1])
    return None


async def play_deployment_controller(api: SandboxApiServer, stop: asyncio.Event) -> None:
    """Play the Deployment controller: every Deployment rolls out at once and all its replicas are ready."""
    while not stop.is_set():
        for dep in api.objects("deployments", NAMESPACE):
            meta, spec = dep["metadata"], dep.get("spec") or {}
            replicas = int(spec.get("replicas") or 1)
            wanted = {"observedGeneration": meta.get("generation", 1), "replicas": replicas,
                      "updatedReplicas": replicas, "readyReplicas": replicas, "availableReplicas": replicas}
            if {k: (dep.get("status") or {}).get(k) for k in wanted} != wanted:
                await api.patch("deployments", NAMESPACE, meta["name"], {"status": wanted}, subresource="status")
        await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def scraped_deployment(api: SandboxApiServer, port: int) -> AsyncIterator[None]:
    """An H100 node and the deployment "llama" whose pods' /metrics (on `port`) the operator scrapes, with the
    Deployment controller played while the block runs."""
    stop = asyncio.Event()
    controller = asyncio.create_task(play_deployment_controller(api, stop))
    try:
        await api.create(node("gpu-a", H100, "h100"))
        await api.create(sdep(serving={"minReplicas": 1, "maxReplicas": 2, "port": port},
                              metrics={"source": "pods", "intervalSeconds": 5, "windowSeconds": 30}))
        yield
    finally:
        stop.set()
        await controller


def serving_pod(deployment_obj: dict, name: str, ip: str, replicaset: dict | None = None) -> dict:
    """A Running pod of the Deployment at `ip`, as the kubelet would report it; controlled by `replicaset`
    (one of the Deployment's, see `replicaset_of`) when given, as the Deployment controller creates them."""
    labels = dict(deployment_obj["spec"]["template"]["metadata"]["labels"])
    metadata: dict = {"name": name, "namespace": NAMESPACE, "labels": labels}
    if replicaset is not None:
        labels["pod-template-hash"] = replicaset["metadata"]["labels"]["pod-template-hash"]
        metadata["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "controller": True,
                                        "name": replicaset["metadata"]["name"], "uid": replicaset["metadata"]["uid"]}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [{"name": "engine", "image": "vllm"}]},
            "status": {"phase": "Running", "podIP": ip}}


def replicaset_of(deployment_obj: dict, template_hash: str) -> dict:
    """A ReplicaSet `<deployment>-<hash>` controlled by the Deployment, as the Deployment controller makes."""
    meta = deployment_obj["metadata"]
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": f"{meta['name']}-{template_hash}", "namespace": NAMESPACE,
                         "labels": {**deployment_obj["spec"]["template"]["metadata"]["labels"],
                                    "pod-template-hash": template_hash},
                         "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "controller": True,
                                              "name": meta["name"], "uid": meta["uid"]}]},
            "spec": {"replicas": 1, "selector": deployment_obj["spec"]["selector"],
                     "template": deployment_obj["spec"]["template"]}}


async def create_serving_pod(api: SandboxApiServer, deployment_obj: dict, name: str, ip: str) -> dict:
    """Play the Deployment controller and the kubelet for one pod `<deployment>-<hash>-<suffix>`: its
    ReplicaSet (created once) and the Running pod it controls."""
    template_hash = name.removeprefix(deployment_obj["metadata"]["name"] + "-").split("-")[0]
    replicaset = replicaset_of(deployment_obj, template_hash)
    existing = api.get("replicasets", NAMESPACE, replicaset["metadata"]["name"])
    replicaset = existing or await api.create(replicaset)
    return await api.create(serving_pod(deployment_obj, name, ip, replicaset))


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class LoopbackServer:
    """An aiohttp server on a loopback address (127.0.0.1 unless given) that counts the requests it receives."""

    def __init__(self, handler: Handler, port: int = 0, host: str = "127.0.0.1") -> None:
        self.handler, self.port, self.host, self.requests = handler, port, host, []
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> LoopbackServer:
        async def counted(request: web.Request) -> web.StreamResponse:
            self.requests.append(request.path_qs)
            return await self.handler(request)

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", counted)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        self.port = self._runner.addresses[0][1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"
