"""The sandbox API server refuses what a real one's schemas refuse, on every write: a custom resource against its
CRD (schema, structure, CEL), a built-in object against its kind's OpenAPI schema; 422 Invalid with each field in
`details.causes`, nothing stored, no watch event. What an update leaves as it was is let through (ratcheting)."""

from __future__ import annotations

import copy

import aiohttp
import pytest

from specpilot.controller.kube import resource_path
from specpilot_sandbox.apiserver import SandboxApiServer
from tests.conftest import load_example

NAMESPACE = "team"


@pytest.fixture
async def api():
    async with SandboxApiServer() as server:
        await server.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        yield server


async def _send(api: SandboxApiServer, method: str, path: str, body, content_type: str = "application/merge-patch+json"):
    headers = {"Content-Type": content_type} if method == "PATCH" else {}
    async with aiohttp.ClientSession() as session, session.request(method, api.url + path, json=body,
                                                                   headers=headers) as response:
        return response.status, await response.json(content_type=None)


def _profile() -> dict:
    doc = copy.deepcopy(load_example("speculationprofile-h100-baseline.yaml"))
    doc["metadata"]["namespace"] = NAMESPACE
    return doc


def _deployment() -> dict:
    doc = copy.deepcopy(load_example("minimal.yaml"))
    doc["metadata"]["namespace"] = NAMESPACE
    return doc


def _fields(body: dict) -> list[str]:
    assert body["kind"] == "Status" and body["reason"] == "Invalid" and body["code"] == 422, body
    return [c["field"] for c in body["details"]["causes"]]


async def test_a_profile_status_with_a_string_where_the_crd_says_number_is_refused(api):
    profile = _profile()
    status = profile.pop("status")
    await api.create(profile)
    name = profile["metadata"]["name"]
    path = resource_path("speculationprofiles", NAMESPACE, name, "status")

    bad = copy.deepcopy(status)
    bad["runs"][0]["points"][0]["outputThroughput"] = "lots"
    code, body = await _send(api, "PATCH", path, {"status": bad})
    assert code == 422
    assert _fields(body) == ["status.runs[0].points[0].outputThroughput"]
    assert body["details"]["kind"] == "SpeculationProfile" and body["details"]["name"] == name
    assert "'lots' is not of type 'number'" in body["message"]
    assert "status" not in api.get("speculationprofiles", NAMESPACE, name)  # nothing stored

    code, _ = await _send(api, "PATCH", path, {"status": status})
    assert code == 200
    assert api.get("speculationprofiles", NAMESPACE, name)["status"]["runs"] == status["runs"]


async def test_a_json_patch_and_a_replace_are_judged_by_the_object_they_would_store(api):
    profile = _profile()
    await api.create(profile)
    name = profile["metadata"]["name"]
    # a status is written through /status only (the create dropped it, as the API server does)
    await api.patch("speculationprofiles", NAMESPACE, name, {"status": profile["status"]}, subresource="status")
    path = resource_path("speculationprofiles", NAMESPACE, name, "status")
    op = [{"op": "replace", "path": "/status/runs/0/points/0/concurrency", "value": "1"}]
    code, body = await _send(api, "PATCH", path, op, "application/json-patch+json")
    assert code == 422 and _fields(body) == ["status.runs[0].points[0].concurrency"]
    stored = api.get("speculationprofiles", NAMESPACE, name)
    replaced = copy.deepcopy(stored)
    replaced["spec"]["sku"] = 7
    code, body = await _send(api, "PUT", resource_path("speculationprofiles", NAMESPACE, name), replaced)
    assert code == 422 and "spec.sku" in _fields(body)
    assert api.get("speculationprofiles", NAMESPACE, name)["spec"]["sku"] == stored["spec"]["sku"]


async def test_a_custom_resource_is_refused_at_create_naming_each_field(api):
    doc = _deployment()
    doc["spec"]["profiling"] = {"concurrencyLevels": ["one"], "requestsPerLevel": -1}
    doc["spec"]["serving"] = {"minReplica": 2}
    code, body = await _send(api, "POST", resource_path("speculativedeployments", NAMESPACE), doc)
    assert code == 422
    fields = _fields(body)
    assert "spec.profiling.concurrencyLevels[0]" in fields and "spec.profiling.requestsPerLevel" in fields
    assert "spec.serving.minReplica" in fields
    assert "did you mean `minReplicas`?" in body["message"]
    assert api.objects("speculativedeployments", NAMESPACE) == []


async def test_a_cel_rule_refuses_a_write(api):
    doc = _deployment()
    doc["spec"]["model"]["extraArgs"] = ["--tensor-parallel-size=8"]
    code, body = await _send(api, "POST", resource_path("speculativedeployments", NAMESPACE), doc)
    assert code == 422 and "engine flag specpilot owns" in body["message"]


async def test_a_built_in_object_with_a_wrong_type_is_refused(api):
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j", "namespace": NAMESPACE}, "spec": {
        "template": {"spec": {"restartPolicy": "Never", "securityContext": {"runAsUser": "0"},
                              "containers": [{"name": "c", "image": "busybox"}]}}}}
    code, body = await _send(api, "POST", resource_path("jobs", NAMESPACE), job)
    assert code == 422
    assert _fields(body) == ["spec.template.spec.securityContext.runAsUser"]
    assert body["details"]["kind"] == "Job" and body["details"]["group"] == "batch"
    job["spec"]["template"]["spec"]["securityContext"]["runAsUser"] = 1000
    code, _ = await _send(api, "POST", resource_path("jobs", NAMESPACE), job)
    assert code == 201 or code == 200
    code, body = await _send(api, "PATCH", resource_path("jobs", NAMESPACE, "j"), {"spec": {"parallelism": "2"}})
    assert code == 422 and _fields(body) == ["spec.parallelism"]
    code, body = await _send(api, "PATCH", resource_path("jobs", NAMESPACE, "j", "status"), {"status": {"active": "1"}})
    assert code == 422 and _fields(body) == ["status.active"]


async def test_a_service_with_a_port_as_a_string_is_refused(api):
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": NAMESPACE},
               "spec": {"ports": [{"port": "8000"}]}}
    code, body = await _send(api, "POST", resource_path("services", NAMESPACE), service)
    assert code == 422 and _fields(body) == ["spec.ports[0].port"]


async def test_what_an_update_leaves_as_it_was_is_let_through(api):
    """Ratcheting: an object that became invalid by other means (here, stored before the rule) can still have
    its status written; the write is judged on what it changes."""
    doc = _deployment()
    api.emulator.schemas, schemas = None, api.emulator.schemas
    doc["spec"]["serving"] = {"minReplicas": "two"}
    await api.create(doc)
    api.emulator.schemas = schemas
    name = doc["metadata"]["name"]
    status_path = resource_path("speculativedeployments", NAMESPACE, name, "status")
    code, _ = await _send(api, "PATCH", status_path, {"status": {"phase": "Pending"}})
    assert code == 200
    code, body = await _send(api, "PATCH", status_path, {"status": {"observedGeneration": "1"}})
    assert code == 422 and _fields(body) == ["status.observedGeneration"]


async def test_kinds_without_a_schema_here_are_stored(api):
    monitor = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor",
               "metadata": {"name": "m", "namespace": NAMESPACE}, "spec": {"anything": 1}}
    code, _ = await _send(api, "POST", resource_path("podmonitors", NAMESPACE), monitor)
    assert code in (200, 201)
