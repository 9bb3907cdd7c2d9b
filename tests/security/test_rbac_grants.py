"""The chart grants the operator exactly what it asks the API server for: measured, not assumed.

The sandbox API server records every request as the authorizer sees it (verb, API group, resource,
subresource, namespace, name) with the bearer token that made it. One module-scoped run drives the real
operator through the lifecycle the operator suite covers (profiles and Jobs, a Job that fails for good,
re-profiling by annotation, serving and a PodMonitor behind a Gateway API HTTPRoute over an InferencePool (routing:
inferencePool, then gateway, then back to service), scraping its own pod, a restart that finds the benchmark identity in place, deletion, and a peered
replica), then:
- every recorded request is granted by the chart's rules (default install, and the namespaced one with
  peering, scope by scope);
- every rule the chart grants was used, or is one of the documented exceptions below (admission checks that
  are not requests).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable
from pathlib import Path

import pytest
import yaml

from helm_tools import HelmTools, helm_tools  # noqa: F401  (helm_tools is a fixture)
from specpilot_sandbox.apiserver import RecordedRequest, SandboxApiServer
from specpilot_sandbox.exporter import VllmMetricsState, start_exporter
from tests.operator.scenario import (
    H100,
    NAMESPACE,
    condition,
    create_serving_pod,
    deployment,
    fail_job,
    jobs,
    node,
    play_deployment_controller,
    profiles,
    publish_results,
    sdep,
    status,
)
from tests.security.conftest import OPERATOR_TOKEN, Operator

pytestmark = [pytest.mark.operator, pytest.mark.helm]

RELEASE_NAMESPACE = "specpilot-system"
BENCH_CLUSTER_ROLE = "sp-specpilot-bench"

Grant = tuple[str, str, str]
"""(API group, resource[/subresource], verb)."""

EXCEPTIONS: dict[Grant, str] = {
    ("specpilot.io", "speculativedeployments/finalizers", "update"):
        "admission (OwnerReferencesPermissionEnforcement): the serving Deployment, Service and PodMonitor name "
        "their SpeculativeDeployment as owner with blockOwnerDeletion; no request is made",
    ("specpilot.io", "speculationprofiles/finalizers", "update"):
        "admission (OwnerReferencesPermissionEnforcement): benchmark Jobs name their profile as owner with "
        "blockOwnerDeletion; no request is made",
    ("rbac.authorization.k8s.io", "clusterroles", "bind"):
        "admission (RBAC escalation check): the benchmark RoleBinding refers to the chart's bench ClusterRole; "
        "granted on that one resourceName only",
    ("specpilot.io", "speculationprofiles", "get"):
        "a create race: when two deployments that share a profile create it at once, the one that loses reads "
        "the winner's object (Kube.ensure); the scenarios have no such race",
    ("", "services", "get"):
        "the read-back of an unread object every 5 minutes (kube.APPLY_RESYNC_S: applied again only when it "
        "drifted or is gone); the scenarios end sooner. tests/unit/test_controller_kube_apply.py drives it",
    ("monitoring.coreos.com", "podmonitors", "get"): "as the Service's",
    ("kopf.dev", "clusterkopfpeerings", "list"): "kopf's cluster-wide peering (all-namespaces mode); the "
        "namespaced twin kopfpeerings is recorded below",
    ("kopf.dev", "clusterkopfpeerings", "watch"): "as above",
    ("kopf.dev", "clusterkopfpeerings", "patch"): "as above",
}
"""Grants that no request exercises, each with the reason the chart still needs it."""


def record_scenarios(tmp_path: Path) -> list[RecordedRequest]:
    return asyncio.run(_record(tmp_path))


async def _record(tmp_path: Path) -> list[RecordedRequest]:
    async with SandboxApiServer() as api:
        recorded = api.record_requests()
        await api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        state = VllmMetricsState(model_name="llama")
        state.set_load(running=3)
        ip = f"127.0.{random.randint(1, 250)}.{random.randint(2, 250)}"
        runner, url = await start_exporter(state, host=ip, port=0)
        port = int(url.rsplit(":", 1)[1])
        stop = asyncio.Event()
        controller = asyncio.create_task(play_deployment_controller(api, stop))
        op = Operator(api, tmp_path / "standalone", {})
        op.start()
        try:
            await api.create(node("gpu-a", H100, "h100"))
            await api.install_gateway_api()
            await api.install_inference_extension()
            await api.create(sdep(serving={"minReplicas": 1, "maxReplicas": 2, "port": port, "serviceMonitor": True,
                                           "routing": "inferencePool",
                                           "gateway": {"parentRefs": [{"name": "inference"}]}},
                                  metrics={"source": "pods", "intervalSeconds": 5, "windowSeconds": 30}))
            await api.wait_for(lambda: len(jobs(api)) == 2, what="2 Jobs")
            # One Job fails for good; the other profiles are measured.
            failing = jobs(api)[0]
            failing_profile = failing["metadata"]["ownerReferences"][0]["name"]
            await fail_job(api, failing, failed=3, final=True)
            await api.wait_for(lambda: (api.get("speculationprofiles", NAMESPACE, failing_profile) or {})
                               .get("status", {}).get("phase") == "Failed", what="the failed profile")
            others = [p["metadata"]["name"] for p in profiles(api) if p["metadata"]["name"] != failing_profile]
            await publish_results(api, "H100-SXM", others)
            # Measured again by annotation: the failed profile's Job is deleted and made anew.
            await api.patch("speculativedeployments", NAMESPACE, "llama",
                            {"metadata": {"annotations": {"specpilot.io/reprofile": "1"}}})
            await api.wait_for(lambda: all((p["metadata"].get("annotations") or {}).get("specpilot.io/reprofile") == "1"
                                           for p in profiles(api)), timeout_s=30, what="every profile restarted")
            await publish_results(api, "H100-SXM", timeout_s=60)
            await api.wait_for(lambda: status(api).get("phase") == "Serving", timeout_s=60, what="Serving")
            # Its own serving pod is scraped.
            await create_serving_pod(api, deployment(api, "h100"), "llama-h100-7d9f8-a1b2c", ip)
            await api.wait_for(lambda: (condition(api, "MetricsAvailable") or {}).get("status") == "True",
                               timeout_s=60, what="MetricsAvailable=True")
            # A restart finds the benchmark identity in place.
            before = len(recorded)
            await op.stop()
            op.start()
            await api.wait_for(lambda: any(r.identity == OPERATOR_TOKEN and r.verb == "get" and r.resource ==
                                           "rolebindings" for r in recorded[before:]), timeout_s=60,
                               what="the restarted operator reading the benchmark RoleBinding")
            # Its HTTPRoute over an InferencePool, then routing: gateway, which deletes the InferencePool, then back to
            # routing: service, which deletes the route.
            await api.wait_for(lambda: api.get("httproutes", NAMESPACE, "llama")
                               and api.get("inferencepools", NAMESPACE, "llama-h100"), timeout_s=60,
                               what="the HTTPRoute and the InferencePool")
            await api.patch("speculativedeployments", NAMESPACE, "llama", {"spec": {"serving": {"routing": "gateway"}}})
            await api.wait_for(lambda: api.get("inferencepools", NAMESPACE, "llama-h100") is None, timeout_s=60,
                               what="the InferencePool deleted")
            await api.patch("speculativedeployments", NAMESPACE, "llama", {"spec": {"serving": {"routing": "service"}}})
            await api.wait_for(lambda: api.get("httproutes", NAMESPACE, "llama") is None, timeout_s=60,
                               what="the HTTPRoute deleted")
            await api.delete("speculativedeployments", NAMESPACE, "llama")
            await api.wait_for(lambda: api.get("speculativedeployments", NAMESPACE, "llama") is None,
                               timeout_s=30, what="the deployment gone (finalizer released)")
            await op.stop()
            # A peered replica (chart: peering.enabled) keeps its keep-alive in a KopfPeering.
            await api._request("POST", f"/apis/kopf.dev/v1/namespaces/{NAMESPACE}/kopfpeerings",
                               {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering",
                                "metadata": {"name": "specpilot", "namespace": NAMESPACE}})
            peer = Operator(api, tmp_path / "peered", {}, ["--peering", "specpilot"])
            peer.start()
            try:
                await api.wait_for(lambda: any(r.identity == OPERATOR_TOKEN and r.resource == "kopfpeerings"
                                               and r.verb == "patch" for r in recorded), timeout_s=60,
                                   what="the peered operator's keep-alive")
            finally:
                await peer.stop()
        except BaseException:
            print("status at failure:", status(api))
            print("\n".join(line for line in op.log().splitlines() if " DEBUG " not in line)[-8000:])
            raise
        finally:
            await op.stop()
            stop.set()
            await controller
            await runner.cleanup()
        return list(recorded)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> list[RecordedRequest]:
    return [r for r in record_scenarios(tmp_path_factory.mktemp("rbac")) if r.identity == OPERATOR_TOKEN]


def resource_of(r: RecordedRequest) -> str:
    return f"{r.resource}/{r.subresource}" if r.subresource else r.resource


def used(recorded: Iterable[RecordedRequest]) -> set[Grant]:
    return {(r.group, resource_of(r), r.verb) for r in recorded if not r.non_resource}


def grants(rules: Iterable[dict]) -> set[Grant]:
    return {(group, resource, verb) for rule in rules for group in rule.get("apiGroups", [])
            for resource in rule.get("resources", []) for verb in rule.get("verbs", [])}


def allows(rules: Iterable[dict], r: RecordedRequest) -> bool:
    for rule in rules:
        if r.group in rule.get("apiGroups", []) and resource_of(r) in rule.get("resources", []) \
                and r.verb in rule.get("verbs", []):
            if "resourceNames" not in rule or r.name in rule["resourceNames"]:
                return True
    return False


def operator_roles(objects: list[dict]) -> tuple[list[dict], dict[str, list[dict]]]:
    """Rules of the operator's ClusterRole (bound by its ClusterRoleBinding) and of its Roles by namespace."""
    sa = next(o for o in objects if o["kind"] == "ServiceAccount")["metadata"]["name"]
    subject = {"kind": "ServiceAccount", "name": sa, "namespace": RELEASE_NAMESPACE}
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"], b["metadata"].get("namespace"))
             for b in objects if b["kind"] in ("ClusterRoleBinding", "RoleBinding") and subject in b["subjects"]}
    cluster = [rule for o in objects if o["kind"] == "ClusterRole" and ("ClusterRole", o["metadata"]["name"], None)
               in bound for rule in o["rules"]]
    namespaced: dict[str, list[dict]] = {}
    for o in objects:
        if o["kind"] == "Role" and ("Role", o["metadata"]["name"], o["metadata"]["namespace"]) in bound:
            namespaced.setdefault(o["metadata"]["namespace"], []).extend(o["rules"])
    return cluster, namespaced


def test_discovery_is_the_only_request_outside_the_resource_api(recorded):
    outside = {(r.verb, r.resource) for r in recorded if r.non_resource}
    assert outside, "kopf discovers the API first: the recording missed it"
    assert all(verb == "get" and (path in ("/api", "/apis") or path.startswith(("/api/", "/apis/")))
               for verb, path in outside), outside


def test_every_request_of_the_default_install_is_granted(helm_tools: HelmTools, recorded):
    cluster, namespaced = operator_roles(helm_tools.render(namespace=RELEASE_NAMESPACE))
    assert not namespaced
    refused = sorted({(r.group, resource_of(r), r.verb, r.name if r.resource == "clusterroles" else None)
                      for r in recorded if not r.non_resource and not r.resource.startswith("clusterkopf")
                      and r.resource != "kopfpeerings" and not allows(cluster, r)})
    assert refused == [], f"the chart's ClusterRole refuses requests the operator makes: {refused}"


def test_every_request_of_a_namespaced_peered_install_is_granted_in_its_scope(helm_tools: HelmTools, recorded):
    objects = helm_tools.render(namespace=RELEASE_NAMESPACE, set_values=[
        f"watchNamespaces={{{NAMESPACE}}}", "peering.enabled=true", "replicaCount=2"])
    cluster, namespaced = operator_roles(objects)
    refused = []
    for r in recorded:
        if r.non_resource:
            continue
        rules = namespaced.get(r.namespace, []) if r.namespace else cluster
        if not allows(rules, r):
            refused.append((r.namespace, r.group, resource_of(r), r.verb))
    assert sorted(set(refused)) == [], f"requests the namespaced install refuses: {sorted(set(refused))}"


def test_the_chart_grants_nothing_the_operator_does_not_use(helm_tools: HelmTools, recorded):
    seen = used(recorded)
    for set_values in ([], [f"watchNamespaces={{{NAMESPACE}}}", "peering.enabled=true", "replicaCount=2"],
                       ["peering.enabled=true", "replicaCount=2"]):
        cluster, namespaced = operator_roles(helm_tools.render(namespace=RELEASE_NAMESPACE, set_values=set_values))
        granted = grants(cluster) | {g for rules in namespaced.values() for g in grants(rules)}
        unused = sorted(granted - seen - set(EXCEPTIONS))
        assert unused == [], f"{set_values or 'default'}: granted but never used and not a documented exception: {unused}"
    # Each exception is still granted somewhere: stale ones go.
    all_granted = set()
    for set_values in ([], ["peering.enabled=true", "replicaCount=2"]):
        cluster, _ = operator_roles(helm_tools.render(namespace=RELEASE_NAMESPACE, set_values=set_values))
        all_granted |= grants(cluster)
    assert set(EXCEPTIONS) <= all_granted, set(EXCEPTIONS) - all_granted


def test_the_operator_deletes_only_benchmark_jobs_and_its_http_routes_and_never_rbac_objects(recorded):
    deletes = {(r.group, resource_of(r)) for r in recorded if r.verb == "delete"}
    assert deletes == {("batch", "jobs"), ("gateway.networking.k8s.io", "httproutes"),
                       ("inference.networking.k8s.io", "inferencepools")}, deletes
    rbac_writes = {(resource_of(r), r.verb, r.name) for r in recorded if r.group == "rbac.authorization.k8s.io"
                   and r.verb not in ("get", "list", "watch")}
    assert {verb for _, verb, _ in rbac_writes} <= {"create"}
    assert {resource for resource, _, _ in rbac_writes} == {"rolebindings"}


def test_the_benchmark_identity_is_bound_to_the_shipped_cluster_role(helm_tools: HelmTools):
    objects = helm_tools.render(namespace=RELEASE_NAMESPACE)
    bench = next(o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == BENCH_CLUSTER_ROLE)
    assert grants(bench["rules"]) == {("specpilot.io", "speculationprofiles", "get"),
                                      ("specpilot.io", "speculationprofiles/status", "get"),
                                      ("specpilot.io", "speculationprofiles/status", "patch")}
    config = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap")["data"]["config.yaml"])
    assert config["benchClusterRole"] == BENCH_CLUSTER_ROLE
    cluster, _ = operator_roles(objects)
    (bind,) = [rule for rule in cluster if "bind" in rule["verbs"]]
    assert bind == {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"], "verbs": ["bind"],
                    "resourceNames": [BENCH_CLUSTER_ROLE]}
    # The operator holds no rights on Roles at all, and none to delete or patch any RBAC object.
    assert not {g for g in grants(cluster) if g[0] == "rbac.authorization.k8s.io" and g[1] == "roles"}
    assert not {g for g in grants(cluster) if g[0] == "rbac.authorization.k8s.io" and g[2] in ("delete", "patch")}
