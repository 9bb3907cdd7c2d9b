"""The sandbox API server serves the Gateway API Inference Extension's InferencePool and the Gateway API's
HTTPRoute once their CRDs are installed (404 before, as a cluster without them answers), and refuses what their
schemas and CEL rules refuse with 422 naming the field; the sandbox's gateway routes an installed route."""

from __future__ import annotations

import asyncio
import copy
import random
from pathlib import Path

import aiohttp
import pytest

from specpilot_sandbox.apiserver import SandboxApiServer
from specpilot_sandbox.kubelet import Kubelet, SimSettings
from specpilot_sandbox.router import Router
from tests.operator.scenario import H100, NAMESPACE, node

pytestmark = pytest.mark.operator

POOLS_PATH = f"/apis/inference.networking.k8s.io/v1/namespaces/{NAMESPACE}/inferencepools"
ROUTES_PATH = f"/apis/gateway.networking.k8s.io/v1/namespaces/{NAMESPACE}/httproutes"

POOL = {
    "apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
    "metadata": {"name": "llama-h100", "namespace": NAMESPACE},
    "spec": {"selector": {"matchLabels": {"app": "llama", "pool": "h100"}}, "targetPorts": [{"number": 8000}],
             "endpointPickerRef": {"name": "llama-epp", "port": {"number": 9002}}},
}


def route(*backend_refs: dict) -> dict:
    return {"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
            "metadata": {"name": "llama", "namespace": NAMESPACE},
            "spec": {"parentRefs": [{"name": "inference"}, {"name": "public", "namespace": "gateway-system",
                                                            "sectionName": "http"}],
                     "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                                "backendRefs": list(backend_refs)}]}}


def pool_ref(name: str, weight: int) -> dict:
    return {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": name, "weight": weight}


async def send(api: SandboxApiServer, method: str, path: str, body: dict | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
    async with aiohttp.ClientSession() as session, session.request(method, api.url + path, json=body,
                                                                   headers=headers) as response:
        return response.status, await response.json(content_type=None)


def causes(body: dict) -> dict[str, str]:
    assert body["kind"] == "Status" and body["reason"] == "Invalid" and body["code"] == 422, body
    return {c["field"]: c["message"] for c in body["details"]["causes"]}


async def test_without_their_crds_the_resources_answer_404_and_once_installed_they_are_served(sandbox):
    for path, obj in ((POOLS_PATH, POOL), (ROUTES_PATH, route(pool_ref("llama-h100", 1)))):
        assert (await send(sandbox, "GET", path))[0] == 404
        code, body = await send(sandbox, "POST", path, obj)
        assert (code, body["reason"]) == (404, "NotFound")  # nothing stored: the resource stays unknown
        assert (await send(sandbox, "GET", path))[0] == 404

    await sandbox.install_inference_extension()
    await sandbox.install_gateway_api()
    await sandbox.install_inference_extension()  # again: nothing changes
    crds = {c["metadata"]["name"] for c in sandbox.objects("customresourcedefinitions")}
    assert {"inferencepools.inference.networking.k8s.io", "httproutes.gateway.networking.k8s.io"} <= crds
    for path in (POOLS_PATH, ROUTES_PATH):
        code, body = await send(sandbox, "GET", path)
        assert code == 200 and body["items"] == []
    created = await sandbox.create(POOL)
    assert created["metadata"]["uid"] and sandbox.get("inferencepools", NAMESPACE, "llama-h100")["spec"] == POOL["spec"]


def _invalid(change) -> dict:
    pool = copy.deepcopy(POOL)
    change(pool["spec"])
    return pool


@pytest.mark.parametrize("pool, field, words", [
    (_invalid(lambda s: s.pop("endpointPickerRef")), "spec.endpointPickerRef", "Required value"),
    (_invalid(lambda s: s.pop("selector")), "spec.selector", "Required value"),
    (_invalid(lambda s: s.update(targetPorts=[{"number": 0}])), "spec.targetPorts[0].number", "minimum of 1"),
    (_invalid(lambda s: s.update(targetPorts=[{"number": 70000}])), "spec.targetPorts[0].number",
     "maximum of 65535"),
    (_invalid(lambda s: s.update(targetPorts=[])), "spec.targetPorts", "should be non-empty"),
    (_invalid(lambda s: s.update(targetPorts=[{"number": 8000 + i} for i in range(9)])), "spec.targetPorts",
     "more than the 8 allowed"),
    (_invalid(lambda s: s.update(targetPorts=[{"number": 8000}, {"number": 8000}])), "spec.targetPorts",
     "port number must be unique"),
    (_invalid(lambda s: s["endpointPickerRef"].update(failureMode="FailSometimes")),
     "spec.endpointPickerRef.failureMode", "is not one of ['FailOpen', 'FailClose']"),
    (_invalid(lambda s: s["endpointPickerRef"].pop("port")), "spec.endpointPickerRef", "port is required"),
    (_invalid(lambda s: s.update(endpointPickerRef={"kind": "Service", "name": "llama-epp"})),
     "spec.endpointPickerRef", "port is required"),
    (_invalid(lambda s: s.update(appProtocol="grpc")), "spec.appProtocol", "is not one of"),
    (_invalid(lambda s: s["selector"].update(matchExpressions=[])), "spec.selector.matchExpressions",
     "unknown field"),
])
async def test_an_invalid_inference_pool_is_refused_naming_the_field(sandbox, pool, field, words):
    await sandbox.install_inference_extension()
    code, body = await send(sandbox, "POST", POOLS_PATH, pool)
    assert code == 422
    assert words in causes(body)[field], body["details"]["causes"]
    assert sandbox.objects("inferencepools", NAMESPACE) == []


async def test_valid_inference_pools_are_stored_with_what_the_schema_allows(sandbox):
    await sandbox.install_inference_extension()
    full = copy.deepcopy(POOL)
    full["metadata"]["name"] = "llama-h200"
    full["spec"].update(appProtocol="kubernetes.io/h2c", targetPorts=[{"number": 8000 + i} for i in range(8)])
    full["spec"]["endpointPickerRef"].update(group="", kind="Service", failureMode="FailOpen")
    not_a_service = copy.deepcopy(POOL)
    not_a_service["metadata"]["name"] = "llama-a100"
    not_a_service["spec"]["endpointPickerRef"] = {"group": "example.com", "kind": "Picker", "name": "p"}
    for pool in (POOL, full, not_a_service):
        code, body = await send(sandbox, "POST", POOLS_PATH, pool)
        assert code in (200, 201), body
    assert {p["metadata"]["name"] for p in sandbox.objects("inferencepools", NAMESPACE)} == {
        "llama-h100", "llama-h200", "llama-a100"}


async def test_an_inference_pool_status_is_written_through_its_subresource_and_validated(sandbox):
    await sandbox.install_inference_extension()
    await sandbox.create({**POOL, "status": {"parents": []}})
    assert "status" not in sandbox.get("inferencepools", NAMESPACE, "llama-h100")  # a create leaves status out
    accepted = {"type": "Accepted", "status": "True", "reason": "Accepted", "message": "",
                "lastTransitionTime": "2026-01-01T00:00:00Z"}
    status_path = f"{POOLS_PATH}/llama-h100/status"
    code, body = await send(sandbox, "PATCH", status_path,
                            {"status": {"parents": [{"parentRef": {"kind": "Gateway"}, "conditions": [accepted]}]}})
    assert code == 422 and causes(body)["status.parents[0].parentRef.name"] == "Required value"
    parent = {"parentRef": {"name": "inference"}, "controllerName": "example.com/gateway", "conditions": [accepted]}
    code, body = await send(sandbox, "PATCH", status_path, {"status": {"parents": [parent]}})
    assert code == 200, body
    assert sandbox.get("inferencepools", NAMESPACE, "llama-h100")["status"]["parents"] == [parent]


@pytest.mark.parametrize("backend_refs, field, words", [
    ([pool_ref("llama-h100", 1_000_001)], "spec.rules[0].backendRefs[0].weight", "maximum of 1000000"),
    ([pool_ref("llama-h100", -1)], "spec.rules[0].backendRefs[0].weight", "minimum of 0"),
    ([pool_ref(f"llama-{i}", 1) for i in range(17)], "spec.rules[0].backendRefs", "more than the 16 allowed"),
    ([{"name": "llama-h100", "weight": 1}], "spec.rules[0].backendRefs[0]", "Must have port for Service reference"),
    ([{**pool_ref("llama-h100", 1), "wieght": 1}], "spec.rules[0].backendRefs[0].wieght", "did you mean `weight`?"),
])
async def test_an_invalid_http_route_is_refused_naming_the_field(sandbox, backend_refs, field, words):
    await sandbox.install_gateway_api()
    code, body = await send(sandbox, "POST", ROUTES_PATH, route(*backend_refs))
    assert code == 422
    assert words in causes(body)[field], body["details"]["causes"]


async def test_the_gateway_routes_an_installed_route_to_the_ready_pods_of_its_pools(sandbox):
    await sandbox.install_inference_extension()
    await sandbox.install_gateway_api()
    a100 = copy.deepcopy(POOL)
    a100["metadata"]["name"] = "llama-a100"
    a100["spec"]["selector"]["matchLabels"]["pool"] = "a100"
    for pool in (POOL, a100):
        await sandbox.create(pool)
    for n, (name, pool, ready) in enumerate((("llama-h100-1", "h100", True), ("llama-a100-1", "a100", True),
                                             ("llama-a100-2", "a100", False), ("mistral-1", "h100-mistral", True))):
        await sandbox.create({"apiVersion": "v1", "kind": "Pod",
                              "metadata": {"name": name, "namespace": NAMESPACE,
                                           "labels": {"app": "llama", "pool": pool}},
                              "spec": {"containers": [{"name": "engine", "image": "vllm"}]},
                              "status": {"phase": "Running", "podIP": f"10.0.0.{n + 1}",
                                         "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})
    router = Router(sandbox, NAMESPACE, "llama", seed=1)
    assert router.pick().status == 404  # no route yet
    await sandbox.create(route(pool_ref("llama-h100", 700), pool_ref("llama-a100", 300)))
    picks = [router.pick() for _ in range(1000)]
    assert {p.endpoint.pod for p in picks} == {"llama-h100-1", "llama-a100-1"}
    assert 0.6 < sum(p.backend.name == "llama-h100" for p in picks) / len(picks) < 0.8

    await sandbox.patch("httproutes", NAMESPACE, "llama", {"spec": {"rules": [{"backendRefs": [
        pool_ref("llama-h100", 0), pool_ref("llama-a100", 1)]}]}})
    assert {router.pick().endpoint.pod for _ in range(100)} == {"llama-a100-1"}  # the route is read at each pick


async def test_the_kubelets_serving_pods_are_endpoints_of_a_service_and_an_inference_pool(sandbox, tmp_path: Path):
    """A pod the sandbox's kubelet runs for a Deployment is Ready and carries its engine container's named port,
    so a Service (targetPort: http) and an InferencePool over its labels both route to it."""
    await sandbox.install_inference_extension()
    await sandbox.install_gateway_api()
    port = 29000 + random.randint(0, 999)
    labels = {"app": "llama", "pool": "h100"}
    await sandbox.create(node("gpu-h100", H100, "h100"))
    await sandbox.create({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "llama-h100", "namespace": NAMESPACE},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"nodeSelector": {"pool": "h100"}, "containers": [{
                "name": "engine", "image": "vllm/vllm-openai", "args": ["--port", str(port)],
                "ports": [{"name": "http", "containerPort": port}]}]}}}})
    await sandbox.create({"apiVersion": "v1", "kind": "Service",
                          "metadata": {"name": "llama-h100", "namespace": NAMESPACE},
                          "spec": {"selector": labels, "ports": [{"name": "http", "port": 80, "targetPort": "http"}]}})
    pool = copy.deepcopy(POOL)
    pool["spec"]["targetPorts"] = [{"number": port}]
    await sandbox.create(pool)
    await sandbox.create(route({"name": "llama-h100", "port": 80, "weight": 1}, pool_ref("llama-h100", 1)))
    (tmp_path / "work").mkdir()
    kubelet = Kubelet(sandbox, sandbox.write_kubeconfig(tmp_path / "kubeconfig", NAMESPACE), tmp_path / "work",
                      SimSettings(time_scale=4, startup_delay_s=1))
    stop = asyncio.Event()
    task = asyncio.create_task(kubelet.run(stop, interval_s=0.2))
    try:
        router = Router(sandbox, NAMESPACE, "llama")
        backends = await sandbox.wait_for(
            lambda: (found := router.backends()) and all(b.endpoints for b in found) and found, timeout_s=60,
            what="the kubelet's pod as an endpoint of the Service and of the InferencePool")
        served = kubelet.serving_endpoints(NAMESPACE, "llama-h100")
        assert len(served) == 1 and [[e.url for e in b.endpoints] for b in backends] == [served, served]
    finally:
        stop.set()
        await task
        await kubelet.shutdown()
    assert kubelet.running_processes() == 0
