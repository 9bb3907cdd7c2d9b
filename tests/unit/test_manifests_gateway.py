"""Weighted routing (serving.routing: gateway, inferencePool): the API fields and their CRD bounds, the admin's
allow-list of Gateways, the pure builders of the per-pool Services, the InferencePools and the HTTPRoute, the
weights the operator gives the route, and what the executor does when the API server refuses the route."""

from __future__ import annotations

import asyncio
import copy
from datetime import UTC, datetime
from types import SimpleNamespace

import kubernetes_validate
import yaml
import pytest
from pydantic import ValidationError

from specpilot.api import SpeculativeDeploymentSpec
from specpilot.api.deployment_spec import EndpointPickerRef, Routing
from specpilot.api.deployment_status import PoolStatus, RoutingStatus, SpeculativeDeploymentStatus
from specpilot.api.gateway import MAX_BACKENDS, gateway_allowed, gateway_problems
from specpilot.api.validate import validate_custom_resource
from specpilot.config import OperatorConfig
from specpilot.controller.kube import Refused
from specpilot.controller.routing import apply_routing, delete_routing
from specpilot.policy.plan import DeploymentPlan
from specpilot.policy.routing import ApplyRouting, DeleteRouting, route_backends
from specpilot.manifests import names
from specpilot.manifests.serving import http_route, inference_pool, pool_service, service
from tests.conftest import load_example

NAMESPACE = "llm"
UID = "0b0e5f3e-6c1a-4d55-9d43-2f7d3c1e9a01"
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def gateway_doc(parent_refs: list[dict] | None = None, routing: str = "gateway") -> dict:
    doc = load_example("llama-70b-h100-h200.yaml")
    doc["spec"].setdefault("serving", {})["routing"] = routing
    if parent_refs is not None:
        doc["spec"]["serving"]["gateway"] = {"parentRefs": parent_refs}
    return doc


def spec_of(doc: dict) -> SpeculativeDeploymentSpec:
    return SpeculativeDeploymentSpec.model_validate(doc["spec"])


def test_routing_defaults_to_auto_and_gateway_takes_parent_refs(crds):
    plain = load_example("llama-70b-h100-h200.yaml")
    plain["spec"].get("serving", {}).pop("routing", None)
    assert spec_of(plain).serving.routing == "auto"
    doc = gateway_doc([{"name": "inference", "namespace": "gateway-system", "sectionName": "https", "port": 443}])
    assert validate_custom_resource(crds["SpeculativeDeployment"], doc) == []
    ref = spec_of(doc).serving.gateway.parent_refs[0]
    assert (ref.name, ref.namespace, ref.section_name, ref.port) == ("inference", "gateway-system", "https", 443)


@pytest.mark.parametrize("refs, field", [
    ([{"name": "Bad_Name"}], "name"),
    ([{"name": "gw", "namespace": "x" * 64}], "namespace"),
    ([{"name": "gw", "sectionName": "no spaces"}], "sectionName"),
    ([{"name": "gw", "port": 0}], "port"),
    ([{"name": "gw"}] * 33, "parentRefs"),
    ([{"namespace": "gw"}], "name"),
])
def test_bad_parent_refs_are_refused_by_the_crd_and_the_models(crds, refs, field):
    doc = gateway_doc(refs)
    problems = validate_custom_resource(crds["SpeculativeDeployment"], doc)
    assert problems and any(field in p for p in problems), problems
    with pytest.raises(ValidationError):
        spec_of(doc)


def test_weighted_routing_without_a_gateway_is_refused_naming_the_fix_unless_the_operator_names_one(crds):
    for routing in ("gateway", "inferencePool"):
        doc = gateway_doc(routing=routing)
        # The schema lets it through (the operator's config may name a default Gateway); the operator refuses it.
        assert validate_custom_resource(crds["SpeculativeDeployment"], doc) == []
        (problem,) = gateway_problems(spec_of(doc), NAMESPACE, [])
        assert problem.startswith(f"spec.serving.routing is {routing} but no Gateway is named")
        assert "spec.serving.gateway.parentRefs" in problem and "defaultGatewayParentRefs" in problem
        assert gateway_problems(spec_of(doc), NAMESPACE, [], default_gateway=True) == []
    assert gateway_problems(spec_of(gateway_doc(routing="auto")), NAMESPACE, []) == []
    assert validate_custom_resource(crds["SpeculativeDeployment"], gateway_doc(routing="service")) == []


def test_the_fields_are_explained_in_the_crd(crds):
    serving = crds["SpeculativeDeployment"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"]["properties"]["serving"]["properties"]
    assert "HTTPRoute" in serving["routing"]["description"]
    ref = serving["gateway"]["properties"]["parentRefs"]["items"]
    assert all(ref["properties"][f].get("description") for f in ("name", "namespace", "sectionName", "port"))
    assert ref["properties"]["name"]["maxLength"] == 253


def test_only_gateways_the_admin_allows_may_be_parents():
    assert gateway_allowed("llm", "gw", "llm", [])  # the deployment's own namespace, always
    assert not gateway_allowed("gateway-system", "public", "llm", [])
    assert gateway_allowed("gateway-system", "public", "llm", ["gateway-system/public"])
    assert gateway_allowed("gateway-system", "public", "llm", ["*/public"])
    assert gateway_allowed("gateway-system", "other", "llm", ["gateway-system/*"])
    assert not gateway_allowed("gateway-system", "other", "llm", ["gateway-system/public", "*/public"])
    spec = spec_of(gateway_doc([{"name": "mine"}, {"name": "public", "namespace": "gateway-system"}]))
    (problem,) = gateway_problems(spec, NAMESPACE, [])
    assert problem.startswith("spec.serving.gateway.parentRefs[1] names Gateway gateway-system/public")
    assert "allowedGatewayParents" in problem and "ask the cluster admin" in problem
    assert gateway_problems(spec, NAMESPACE, ["gateway-system/public"]) == []
    # A parentRef is judged whatever the mode, so switching to gateway never surprises.
    spec = spec_of(gateway_doc([{"name": "public", "namespace": "gateway-system"}], routing="service"))
    assert gateway_problems(spec, NAMESPACE, []) != []


def test_the_allow_list_is_part_of_the_operator_config():
    config = OperatorConfig.model_validate({"allowedGatewayParents": ["gateway-system/public", "*/shared"]})
    assert config.allowed_gateway_parents == ["gateway-system/public", "*/shared"]
    assert OperatorConfig().allowed_gateway_parents == []
    for bad in ("public", "a/b/c", "Gateway-System/x", ""):
        with pytest.raises(ValidationError):
            OperatorConfig.model_validate({"allowedGatewayParents": [bad]})


def test_every_pool_fits_one_route_rule():
    assert SpeculativeDeploymentSpec.model_fields["gpu_pools"].metadata[-1].max_length <= MAX_BACKENDS


def test_pool_services_select_one_pool_and_validate():
    spec = spec_of(gateway_doc([{"name": "gw"}]))
    svc = pool_service(sdep_name="llama-70b", namespace=NAMESPACE, uid=UID, spec=spec, pool_name="h100")
    kubernetes_validate.validate(svc, "1.34", strict=True)
    assert svc["metadata"]["name"] == names.pool_service_name("llama-70b", "h100") == "llama-70b-h100"
    assert svc["spec"]["selector"] == names.serving_selector("llama-70b", "h100")
    assert svc["metadata"]["ownerReferences"][0]["uid"] == UID
    # The deployment's one Service stays: it selects every pool.
    whole = service(sdep_name="llama-70b", namespace=NAMESPACE, uid=UID, spec=spec)
    assert svc["metadata"]["name"] != whole["metadata"]["name"]
    assert set(whole["spec"]["selector"].items()) < set(svc["spec"]["selector"].items())


def test_http_route_weights_its_pool_services_and_attaches_to_the_parent_refs():
    spec = spec_of(gateway_doc([{"name": "gw"}, {"name": "public", "namespace": "gateway-system",
                                                 "sectionName": "https", "port": 443}]))
    route = http_route(sdep_name="llama-70b", namespace=NAMESPACE, uid=UID, spec=spec,
                       weights={"h100": 620, "h200": 380}, parent_refs=spec.serving.gateway.parent_refs)
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1" and route["kind"] == "HTTPRoute"
    assert route["metadata"]["namespace"] == NAMESPACE
    assert route["metadata"]["ownerReferences"][0]["kind"] == "SpeculativeDeployment"
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "gw"},
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "public", "namespace": "gateway-system",
         "sectionName": "https", "port": 443}]
    (rule,) = route["spec"]["rules"]
    assert [(b["name"], b["weight"], b["port"]) for b in rule["backendRefs"]] == [
        ("llama-70b-h100", 620, spec.serving.port), ("llama-70b-h200", 380, spec.serving.port)]
    assert all(b["kind"] == "Service" and b["group"] == "" for b in rule["backendRefs"])
    # Within the Gateway API's bounds: <= 32 parentRefs, <= 16 backendRefs, weights 0..1000000.
    assert len(route["spec"]["parentRefs"]) <= 32 and len(rule["backendRefs"]) <= 16
    with pytest.raises(ValueError):
        http_route(sdep_name="llama-70b", namespace=NAMESPACE, uid=UID, spec=spec, weights={},
                   parent_refs=spec.serving.gateway.parent_refs)
    with pytest.raises(ValueError):
        http_route(sdep_name="llama-70b", namespace=NAMESPACE, uid=UID, spec=spec, weights={"h100": 1000},
                   parent_refs=[])
    again = http_route(sdep_name="llama-70b", namespace=NAMESPACE, uid=UID, spec=copy.deepcopy(spec),
                       weights={"h100": 620, "h200": 380}, parent_refs=spec.serving.gateway.parent_refs)
    assert again == route  # deterministic: a no-op apply is skipped


def pool(name: str, share: float | None, replicas: int | None) -> PoolStatus:
    return PoolStatus(name=name, traffic_share=share, **({} if replicas is None else {"replicas": replicas}))


def test_route_weights_follow_the_planned_shares_else_an_even_split_per_replica():
    served = {"a100", "h100"}  # the pools with a serving Deployment
    pools = [pool("a100", 0.25, 1), pool("h100", 0.75, 1), pool("h200", None, None)]
    assert route_backends(pools, True, served) == {"a100": 250, "h100": 750}
    # Not planned under gateway routing (one pool, no load yet): as the one Service would split, per replica.
    pools = [pool("a100", None, 1), pool("h100", None, 3)]
    assert route_backends(pools, False, served) == {"a100": 250, "h100": 750}
    # No replica anywhere: equal weights, never a route whose weights are all 0.
    assert route_backends([pool("a100", 0.0, 0), pool("h100", 0.0, 0)], True, served) == {"a100": 500, "h100": 500}
    assert route_backends([pool("h200", None, None)], True, served) == {}


def test_specpilot_validate_applies_the_same_gateway_bound(capsys, tmp_path):
    from specpilot.cli import main

    doc = gateway_doc([{"name": "public", "namespace": "gateway-system"}])
    path = tmp_path / "sdep.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", str(path)]) == 1
    out = capsys.readouterr().out
    assert "the operator would refuse it" in out and "parentRefs[0] names Gateway gateway-system/public" in out
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"allowedGatewayParents": ["gateway-system/public"]}))
    assert main(["validate", "--operator-config", str(config), str(path)]) == 0


class RefusingKube:
    """An API server whose HTTPRoutes answer 403 (an operator whose ClusterRole lacks httproutes)."""

    def __init__(self) -> None:
        self.applied: list[str] = []

    async def apply(self, obj, current=None):
        if obj["kind"] == "HTTPRoute":
            raise Refused(403, "PATCH", f"/apis/gateway.networking.k8s.io/v1/namespaces/{NAMESPACE}/httproutes/x",
                          "forbidden")
        self.applied.append(f"{obj['kind']}/{obj['metadata']['name']}")

    async def delete(self, plural, namespace, name):
        raise Refused(403, "DELETE", f"/apis/gateway.networking.k8s.io/v1/namespaces/{namespace}/{plural}/{name}",
                      "forbidden")


BODY = {"metadata": {"namespace": NAMESPACE, "name": "llama", "uid": UID, "generation": 1}}


def run_apply(spec, old: SpeculativeDeploymentStatus):
    kube = RefusingKube()
    status = SpeculativeDeploymentStatus(pools=[pool("a100", 0.25, 1), pool("h100", 0.75, 1)],
                                         routing=RoutingStatus(mode="gateway", http_route="llama"))
    plan = DeploymentPlan(status, [], [], None, {"a100", "h100"})
    action = ApplyRouting(Routing.GATEWAY, route_backends(status.pools, False, {"a100", "h100"}),
                          tuple(spec.serving.gateway.parent_refs))
    asyncio.run(apply_routing(SimpleNamespace(kube=kube, served_resources={}), BODY, spec, action, plan, old, NOW))
    return plan.status, plan.events, kube


def test_a_refused_route_falls_back_to_the_one_service_with_one_event():
    spec = spec_of(gateway_doc([{"name": "gw"}]))
    status, events, kube = run_apply(spec, SpeculativeDeploymentStatus())
    assert kube.applied == ["Service/llama-a100", "Service/llama-h100"]
    assert status.routing.mode == "service" and status.routing.http_route is None
    (cond,) = [c for c in status.conditions if c.type == "RoutingReady"]
    assert (cond.status, cond.reason) == ("False", "HttpRouteRefused") and "forbidden" in cond.message
    assert [e.reason for e in events] == ["HttpRouteRefused"]
    # Already said: no second Event.
    _, again, _ = run_apply(spec, status)
    assert again == []


def test_routing_objects_that_cannot_be_deleted_are_kept_in_status_to_try_again():
    routing = RoutingStatus(mode="service")
    asyncio.run(delete_routing(SimpleNamespace(kube=RefusingKube()), NAMESPACE, "llama",
                               DeleteRouting("llama", (("h100", "llama-h100"),)), routing))
    assert routing.http_route == "llama" and routing.inference_pools == {"h100": "llama-h100"}


def test_inference_pool_selects_one_pools_serving_pods_and_names_its_picker():
    spec = spec_of(gateway_doc([{"name": "gw"}], routing="inferencePool"))
    picker = EndpointPickerRef()
    pool_obj = inference_pool(sdep_name="llama-70b", namespace=NAMESPACE, uid=UID, spec=spec, pool_name="h100",
                              picker=picker)
    assert pool_obj["apiVersion"] == "inference.networking.k8s.io/v1" and pool_obj["kind"] == "InferencePool"
    assert pool_obj["metadata"]["name"] == names.inference_pool_name("llama-70b", "h100") == "llama-70b-h100"
    assert pool_obj["metadata"]["ownerReferences"][0]["uid"] == UID
    # The pool's own selector: this deployment's, this pool's, serving pods only (no benchmark pod, no other pool).
    assert pool_obj["spec"]["selector"] == {"matchLabels": names.serving_selector("llama-70b", "h100")}
    assert pool_obj["spec"]["selector"]["matchLabels"] != names.serving_selector("llama-70b", "h200")
    assert pool_obj["spec"]["targetPorts"] == [{"number": spec.serving.port}]
    assert pool_obj["spec"]["endpointPickerRef"] == {"group": "", "kind": "Service", "name": "llama-70b-h100-epp",
                                                    "port": {"number": 9002}, "failureMode": "FailClose"}
    named = inference_pool(sdep_name="llama-70b", namespace=NAMESPACE, uid=UID, spec=spec, pool_name="h100",
                           picker=EndpointPickerRef(name="llm-d-router", port=9003, failure_mode="FailOpen"))
    assert named["spec"]["endpointPickerRef"]["name"] == "llm-d-router"
    assert named["spec"]["endpointPickerRef"]["port"] == {"number": 9003}
    assert named["spec"]["endpointPickerRef"]["failureMode"] == "FailOpen"


def test_http_route_over_inference_pools_weighs_them_without_a_port():
    spec = spec_of(gateway_doc([{"name": "gw"}], routing="inferencePool"))
    route = http_route(sdep_name="llama-70b", namespace=NAMESPACE, uid=UID, spec=spec,
                       weights={"h100": 700, "h200": 300}, parent_refs=spec.serving.gateway.parent_refs,
                       backends=Routing.INFERENCE_POOL)
    (rule,) = route["spec"]["rules"]
    assert rule["backendRefs"] == [
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "llama-70b-h100", "weight": 700},
        {"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": "llama-70b-h200", "weight": 300}]


def test_specpilot_validate_knows_inference_pool_routing_and_the_admins_defaults(capsys, tmp_path):
    from specpilot.cli import main

    doc = gateway_doc(routing="inferencePool")
    doc["spec"]["serving"]["inferencePool"] = {"endpointPickerRef": {"name": "llama-epp", "port": 9002}}
    path = tmp_path / "sdep.yaml"
    path.write_text(yaml.safe_dump(doc))
    # No Gateway named in the spec, and none in the default config: refused, naming the fix.
    assert main(["validate", str(path)]) == 1
    assert "spec.serving.routing is inferencePool but no Gateway is named" in capsys.readouterr().out
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"defaultGatewayParentRefs": [{"name": "shared", "namespace": "gateway-system"}],
                                      "defaultEndpointPickerRef": {"port": 9002, "failureMode": "FailOpen"}}))
    assert main(["validate", "--operator-config", str(config), str(path)]) == 0
    # A picker in another namespace: InferencePool v1 cannot reference it, and validate says so.
    doc["spec"]["serving"]["inferencePool"]["endpointPickerRef"]["namespace"] = "kube-system"
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", "--operator-config", str(config), str(path)]) == 1
    assert "endpointPickerRef.namespace is kube-system" in capsys.readouterr().out
    # A port out of range never gets past the schema.
    doc["spec"]["serving"]["inferencePool"]["endpointPickerRef"] = {"port": 70000}
    path.write_text(yaml.safe_dump(doc))
    assert main(["validate", "--operator-config", str(config), str(path)]) == 1
    assert "port" in capsys.readouterr().out
