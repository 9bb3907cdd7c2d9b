"""Every pod template the operator and the chart produce passes the `restricted` Pod Security Standard, checked
offline (tests/security/pss_restricted.py), and the operator's pods run without a token they do not need."""

from __future__ import annotations

import copy

import pytest

from specpilot.api import SpeculativeDeploymentSpec
from specpilot.api.tenancy import TenancyPolicy
from specpilot.config import OperatorConfig
from specpilot.policy.needs import profile_spec
from specpilot.manifests.benchmark import benchmark_job
from specpilot.manifests.pod import TOKEN_PATH, TOKEN_VOLUME
from specpilot.manifests.serving import SERVING_SERVICE_ACCOUNT, serving_deployment, serving_service_account
from tests.conftest import load_example
from tests.security.pss_restricted import pod_templates, violations

EXAMPLES = ["llama-70b-h100-h200.yaml", "minimal.yaml"]
OWNER = {"apiVersion": "specpilot.io/v1alpha1", "kind": "SpeculationProfile", "name": "p", "uid": "u-1"}
BENCH_IMAGE = "ghcr.io/specpilot/specpilot-bench:0.1.0"

SAFE_OVERRIDES = {
    "priorityClassName": "llm",
    "securityContext": {"fsGroup": 2000, "runAsUser": 4242, "supplementalGroups": [3000]},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
    "volumes": [{"name": "weights", "persistentVolumeClaim": {"claimName": "weights"}},
                {"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}},
                {"name": "prompts", "configMap": {"name": "prompts"}}],
}
"""Overrides a tenant may set: the pods must still pass."""


def _spec(example: str, overrides: dict | None = None) -> SpeculativeDeploymentSpec:
    doc = copy.deepcopy(load_example(example)["spec"])
    if overrides is not None:
        engine = {"name": "engine", "volumeMounts": [{"name": "weights", "mountPath": "/models"}],
                  "env": [{"name": "HF_HOME", "value": "/models/hf"}]}
        doc.setdefault("serving", {})["podOverrides"] = {**copy.deepcopy(overrides), "containers": [engine]}
        doc.setdefault("profiling", {})["podOverrides"] = {
            **copy.deepcopy(overrides), "containers": [{"name": "bench", "resources": {"limits": {"memory": "8Gi"}}},
                                                       engine]}
    return SpeculativeDeploymentSpec.model_validate(doc)


def _serving_pods(spec: SpeculativeDeploymentSpec, policy: TenancyPolicy | None = None):
    for pool in spec.gpu_pools:
        for method in [None, *spec.methods]:
            deployment = serving_deployment(sdep_name="llama", namespace="team", uid="u-0", spec=spec, pool=pool,
                                            method=method, replicas=1, tenancy=policy)
            yield f"{pool.name}/{method.key if method else 'off'}", deployment


def _bench_jobs(spec: SpeculativeDeploymentSpec, policy: TenancyPolicy | None = None):
    config = OperatorConfig()
    for pool in spec.gpu_pools:
        for method in [None, *spec.methods]:
            profile = profile_spec(spec, pool.sku or "H100-SXM", method, config)
            job = benchmark_job(profile_name=profile.object_name(), namespace="team", profile_spec=profile,
                                spec=spec, pool=pool, bench_image=BENCH_IMAGE, owner=OWNER, tenancy=policy)
            yield f"{pool.name}/{method.key if method else 'baseline'}", job


@pytest.mark.parametrize("overrides", [None, SAFE_OVERRIDES], ids=["plain", "tenant-overrides"])
@pytest.mark.parametrize("example", EXAMPLES)
def test_every_operator_pod_passes_restricted(example, overrides):
    spec = _spec(example, overrides)
    checked = 0
    for where, obj in [*_serving_pods(spec), *_bench_jobs(spec)]:
        for _, pod_spec in pod_templates(obj):
            assert violations(pod_spec) == [], where
            checked += 1
    assert checked >= 4  # the minimal example: serving with and without its method, and two benchmark Jobs


def test_serving_pods_run_as_their_own_account_without_a_token():
    spec = _spec("llama-70b-h100-h200.yaml", SAFE_OVERRIDES)
    for _, deployment in _serving_pods(spec):
        pod = deployment["spec"]["template"]["spec"]
        assert pod["serviceAccountName"] == SERVING_SERVICE_ACCOUNT
        assert pod["automountServiceAccountToken"] is False
        assert not any("projected" in v and TOKEN_VOLUME == v["name"] for v in pod["volumes"])
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 4242  # the tenant's non-zero uid is kept
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        engine = pod["containers"][0]
        assert {"name": "HOME", "value": "/home/specpilot"} in engine["env"]
        assert {"name": "HF_HOME", "value": "/models/hf"} in engine["env"]
    account = serving_service_account("team")
    assert account["automountServiceAccountToken"] is False
    assert account["metadata"]["name"] == SERVING_SERVICE_ACCOUNT


def test_the_bench_token_is_mounted_into_the_bench_container_only():
    spec = _spec("llama-70b-h100-h200.yaml")
    for where, job in _bench_jobs(spec):
        pod = job["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False, where
        assert pod["serviceAccountName"] == "specpilot-bench"
        token = next(v for v in pod["volumes"] if v["name"] == TOKEN_VOLUME)
        assert [s for s in token["projected"]["sources"] if "serviceAccountToken" in s]
        bench = next(c for c in pod["containers"] if c["name"] == "bench")
        assert {"name": TOKEN_VOLUME, "mountPath": TOKEN_PATH, "readOnly": True} in bench["volumeMounts"]
        for engine in pod.get("initContainers") or []:
            assert all(m["name"] != TOKEN_VOLUME for m in engine.get("volumeMounts") or []), where


def test_admin_allowed_fields_reach_the_pod_and_only_then():
    """What the cluster admin allows (e.g. hostNetwork, a container securityContext) is the admin's decision:
    the pod then carries it (and may leave the restricted standard); without the allowance it is refused."""
    doc = copy.deepcopy(load_example("minimal.yaml")["spec"])
    doc["serving"] = {"podOverrides": {"hostNetwork": True, "runtimeClassName": "nvidia",
                                       "containers": [{"name": "engine",
                                                       "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]}}
    spec = SpeculativeDeploymentSpec.model_validate(doc)
    policy = TenancyPolicy(allowed_pod_override_fields=["hostNetwork", "runtimeClassName",
                                                        "containers.securityContext"])
    (_, deployment), *_ = _serving_pods(spec, policy)
    pod = deployment["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["runtimeClassName"] == "nvidia"
    engine = pod["containers"][0]["securityContext"]
    assert engine["capabilities"] == {"add": ["SYS_ADMIN"]}
    assert engine["allowPrivilegeEscalation"] is False  # what the tenant did not set stays hardened
    assert "hostNetwork is true" in violations(pod)


@pytest.mark.parametrize("bad,expected", [
    ({"hostNetwork": True}, "hostNetwork is true"),
    ({"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}, "is a hostPath volume"),
    ({"containers": [{"name": "x", "securityContext": {"privileged": True, "allowPrivilegeEscalation": False,
                                                       "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True}}]},
     "privileged is true"),
    ({"containers": [{"name": "x"}]}, "allowPrivilegeEscalation is not false"),
    ({"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "Unconfined"}},
      "containers": [{"name": "x", "securityContext": {"allowPrivilegeEscalation": False,
                                                       "capabilities": {"drop": ["ALL"], "add": ["SYS_ADMIN"]}}}]},
     "capabilities.add has ['SYS_ADMIN']"),
    ({"containers": [{"name": "x", "ports": [{"containerPort": 80, "hostPort": 80}]}]}, "hostPort 80"),
])
def test_the_checker_catches_what_restricted_forbids(bad, expected):
    assert any(expected in v for v in violations(bad)), violations(bad)


@pytest.mark.helm
@pytest.mark.parametrize("set_values", [(), ("peering.enabled=true", "replicaCount=2")], ids=["default", "ha"])
def test_every_chart_pod_passes_restricted(set_values):
    from tests.helm_tools import ensure_tools

    objects = ensure_tools().render(namespace="specpilot-system", set_values=list(set_values))
    templates = [t for obj in objects for t in pod_templates(obj)]
    assert templates, "the chart renders no pod"
    for where, pod_spec in templates:
        assert violations(pod_spec) == [], where
