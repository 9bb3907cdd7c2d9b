"""The sandbox API server refuses what a real one's validation code refuses beyond the schemas (names, containers,
volumes, mounts, a body nested too deeply), with a 422 (or 400) Status naming the field in the API server's words,
and it ignores what a real one ignores: the status sent to a custom resource with a status subresource, and the
rest of the object sent to its /status."""

from __future__ import annotations

import copy
import json

import aiohttp
import pytest

from specpilot.controller.kube import resource_path
from specpilot_sandbox import objectrules
from specpilot_sandbox.apiserver import SandboxApiServer
from test_sandbox_schema import NAMESPACE, api  # noqa: F401  (api is a fixture: the sandbox with the namespace)
from tests.conftest import load_example


async def _send(api: SandboxApiServer, method: str, path: str, body, raw: bytes | None = None):
    headers = {"Content-Type": "application/merge-patch+json" if method == "PATCH" else "application/json"}
    data = raw if raw is not None else json.dumps(body).encode()
    async with aiohttp.ClientSession() as session, session.request(method, api.url + path, data=data,
                                                                   headers=headers) as response:
        return response.status, await response.json(content_type=None)


def _causes(body: dict) -> dict[str, str]:
    assert body["kind"] == "Status" and body["reason"] == "Invalid" and body["code"] == 422, body
    return {c["field"]: c["message"] for c in body["details"]["causes"]}


def _pod(**container) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": NAMESPACE},
            "spec": {"containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.32.0", **container}],
                     "volumes": [{"name": "models", "emptyDir": {}}]}}


def _profile(name: str = "h100-sxm-baseline-1a2b3c4d5e") -> dict:
    doc = copy.deepcopy(load_example("speculationprofile-h100-baseline.yaml"))
    doc["metadata"] = {"name": name, "namespace": NAMESPACE}
    return doc


# ----- names -----

@pytest.mark.parametrize("name,detail", [
    ("Upper", objectrules.SUBDOMAIN_MESSAGE),
    ("profil\u00e9", objectrules.SUBDOMAIN_MESSAGE),
    ("a" * 254, "must be no more than 253 characters"),
])
async def test_an_object_name_that_is_not_a_dns_subdomain_is_refused(api, name, detail):
    code, body = await _send(api, "POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps",
                             {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}})
    assert code == 422
    assert detail in _causes(body)["metadata.name"]
    assert f"metadata.name: Invalid value: {json.dumps(name, ensure_ascii=False)}: " in body["message"]


async def test_a_custom_resource_name_is_a_dns_subdomain_too(api):
    code, body = await _send(api, "POST", resource_path("speculationprofiles", NAMESPACE), _profile("Bad_Name"))
    assert code == 422 and objectrules.SUBDOMAIN_MESSAGE in _causes(body)["metadata.name"]


@pytest.mark.parametrize("plural,kind,name,detail", [
    ("services", "Service", "1abc", objectrules.DNS1035_MESSAGE),
    ("services", "Service", "a" * 64, "must be no more than 63 characters"),
    ("namespaces", "Namespace", "a.b", objectrules.LABEL_MESSAGE),
])
async def test_services_and_namespaces_take_a_label(api, plural, kind, name, detail):
    obj = {"apiVersion": "v1", "kind": kind, "metadata": {"name": name}}
    if kind == "Service":
        obj["spec"] = {"ports": [{"port": 80}]}
    code, body = await _send(api, "POST", resource_path(plural, NAMESPACE if kind == "Service" else None), obj)
    assert code == 422 and detail in _causes(body)["metadata.name"]


async def test_a_dotted_name_is_a_valid_subdomain_and_rbac_names_are_path_segments(api):
    assert (await _send(api, "POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps",
                        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a.b-c"}}))[0] in (200, 201)
    assert objectrules.name_problems("roles", {"name": "system:controller:x"}) == []
    assert objectrules.name_problems("roles", {"name": "a/b"})[0][2].endswith("may not contain '/'")


async def test_a_generate_name_may_end_in_a_dash(api):
    assert objectrules.name_problems("events", {"generateName": "kopf-event-"}) == []
    assert objectrules.name_problems("events", {"generateName": "Kopf-"})[0][0] == "metadata.generateName"


# ----- containers, volumes, mounts -----

@pytest.mark.parametrize("obj,field,text", [
    (_pod(name="Bad_Name"), "spec.containers[0].name", objectrules.LABEL_MESSAGE),
    ({**_pod(), "spec": {**_pod()["spec"], "volumes": [{"name": "Models", "emptyDir": {}}]}},
     "spec.volumes[0].name", objectrules.LABEL_MESSAGE),
    (_pod(volumeMounts=[{"name": "models", "mountPath": "/models", "subPath": "../etc"}]),
     "spec.containers[0].volumeMounts[0].subPath", "Invalid value: \"../etc\": must not contain '..'"),
    (_pod(volumeMounts=[{"name": "models", "mountPath": "/models", "subPath": "/etc"}]),
     "spec.containers[0].volumeMounts[0].subPath", 'Invalid value: "/etc": must be a relative path'),
    (_pod(volumeMounts=[{"name": "models", "mountPath": "/models", "mountPropagation": "Bidirectional"}]),
     "spec.containers[0].volumeMounts[0].mountPropagation",
     "Forbidden: Bidirectional mount propagation is available only to privileged containers"),
    (_pod(volumeMounts=[{"name": "cache", "mountPath": "/cache"}]),
     "spec.containers[0].volumeMounts[0].name", 'Not found: "cache"'),
    (_pod(image=""), "spec.containers[0].image", "Required value"),
])
async def test_a_pod_the_api_server_refuses_is_refused_naming_the_field(api, obj, field, text):
    code, body = await _send(api, "POST", resource_path("pods", NAMESPACE), obj)
    causes = _causes(body)
    assert code == 422 and text in causes[field], causes
    assert f"{field}: " in body["message"] and text in body["message"]


async def test_bidirectional_propagation_is_allowed_to_a_privileged_container(api):
    pod = _pod(volumeMounts=[{"name": "models", "mountPath": "/models", "mountPropagation": "Bidirectional"}],
               securityContext={"privileged": True})
    assert (await _send(api, "POST", resource_path("pods", NAMESPACE), pod))[0] in (200, 201)


@pytest.mark.parametrize("plural,kind,api_version,path", [
    ("jobs", "Job", "batch/v1", ("spec", "template", "spec")),
    ("deployments", "Deployment", "apps/v1", ("spec", "template", "spec")),
])
async def test_a_pod_template_without_an_image_is_refused(api, plural, kind, api_version, path):
    template = {"metadata": {"labels": {"app": "x"}},
                "spec": {"restartPolicy": "Never", "containers": [{"name": "bench"}]}}
    spec = {"template": template} if kind == "Job" else {"selector": {"matchLabels": {"app": "x"}},
                                                          "template": template}
    code, body = await _send(api, "POST", resource_path(plural, NAMESPACE),
                             {"apiVersion": api_version, "kind": kind, "metadata": {"name": "x"}, "spec": spec})
    assert code == 422 and _causes(body)[".".join(path) + ".containers[0].image"] == "Required value"


# ----- nesting -----

async def test_a_body_nested_900_deep_is_a_bad_request_not_a_crash(api):
    profile = _profile()
    nested = "{}"
    for _ in range(900):
        nested = '{"a":' + nested + "}"
    raw = json.dumps(profile)[:-1].encode() + b', "extra": ' + nested.encode() + b"}"
    code, body = await _send(api, "POST", resource_path("speculationprofiles", NAMESPACE), None, raw=raw)
    assert code == 400 and body["reason"] == "BadRequest" and "exceeded max depth of 100" in body["message"]
    assert objectrules.nesting_depth(b'{"a": "[[[[{{{", "b": [[1]]}') == 3


# ----- the status subresource -----

async def test_a_status_sent_to_the_object_itself_is_ignored(api):
    profile = _profile()
    profile["status"] = {"phase": "Succeeded"}
    code, created = await _send(api, "POST", resource_path("speculationprofiles", NAMESPACE), profile)
    assert code in (200, 201) and "status" not in created
    name = profile["metadata"]["name"]
    await api.patch("speculationprofiles", NAMESPACE, name, {"status": {"phase": "Pending"}}, subresource="status")
    code, patched = await _send(api, "PATCH", resource_path("speculationprofiles", NAMESPACE, name),
                                {"metadata": {"labels": {"a": "b"}}, "status": {"phase": "Succeeded"}})
    assert code == 200 and patched["status"]["phase"] == "Pending" and patched["metadata"]["labels"] == {"a": "b"}
    ops = [{"op": "replace", "path": "/status/phase", "value": "Succeeded"},
           {"op": "add", "path": "/metadata/labels/c", "value": "d"}]
    async with aiohttp.ClientSession() as session, session.patch(
            api.url + resource_path("speculationprofiles", NAMESPACE, name), data=json.dumps(ops),
            headers={"Content-Type": "application/json-patch+json"}) as response:
        assert response.status == 200
    stored = api.get("speculationprofiles", NAMESPACE, name)
    assert stored["status"]["phase"] == "Pending" and stored["metadata"]["labels"] == {"a": "b", "c": "d"}


async def test_the_spec_sent_to_status_is_ignored(api):
    profile = _profile()
    await api.create(profile)
    name = profile["metadata"]["name"]
    code, patched = await _send(api, "PATCH", resource_path("speculationprofiles", NAMESPACE, name, "status"),
                                {"spec": {"sku": "B200"}, "metadata": {"labels": {"a": "b"}},
                                 "status": {"phase": "Running"}})
    assert code == 200
    stored = api.get("speculationprofiles", NAMESPACE, name)
    assert stored["spec"]["sku"] == "H100-SXM" and stored["status"]["phase"] == "Running"
    assert "a" not in (stored["metadata"].get("labels") or {})
