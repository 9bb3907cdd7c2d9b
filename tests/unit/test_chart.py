"""Tests of the Helm chart charts/specpilot: lint, rendering, offline validation, RBAC, values schema, security.

Everything runs offline with the pinned helm from scripts/bootstrap-tools.sh (fetched on first use).
"""

import base64
import hashlib
import json
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml

from helm_tools import CHART_DIR, HelmTools, helm_tools  # noqa: F401  (helm_tools is a fixture)

pytestmark = pytest.mark.helm

NON_DEFAULT_VALUES = CHART_DIR / "ci" / "namespaced-ha-values.yaml"
RELEASE_NAMESPACE = "specpilot-system"
FULLNAME = "sp-specpilot"
# Kinds kubernetes-validate has no schema for; they are checked structurally below instead.
CUSTOM_KINDS = {"ServiceMonitor", "KopfPeering", "ClusterKopfPeering"}
RBAC_KINDS = {"Role", "ClusterRole"}
# Every variant of values the chart must render for: (id, values files, --set assignments).
VARIANTS = [
    pytest.param((), (), id="default"),
    pytest.param((NON_DEFAULT_VALUES,), (), id="namespaced-ha"),
    pytest.param((), ("peering.enabled=true", "replicaCount=3", "serviceMonitor.enabled=true"), id="clusterwide-ha"),
    pytest.param((), ("watchNamespaces={" + RELEASE_NAMESPACE + "}", "rbac.create=true"), id="own-namespace"),
    pytest.param((), ("watchNamespaces={a,b}", "networkPolicy.enabled=true", "networkPolicy.servingPods.enabled=true",
                      "rbac.aggregatedRoles=false"), id="network-policies"),
]
# The specpilot.io resources the operator handles, with the verbs it uses on each (sub)resource (measured:
# tests/security/test_rbac_grants.py records them against the sandbox API server).
SPECPILOT_GRANTS = {
    "speculativedeployments": {"list", "watch", "patch"},
    "speculationprofiles": {"get", "list", "watch", "create", "patch"},
    "speculativedeployments/status": {"patch"},
    "speculationprofiles/status": {"patch"},
    "speculativedeployments/finalizers": {"update"},
    "speculationprofiles/finalizers": {"update"},
}
BENCH_CLUSTER_ROLE = f"{FULLNAME}-bench"


def by_kind(objects: list[dict], kind: str) -> list[dict]:
    return [obj for obj in objects if obj["kind"] == kind]


def only(objects: list[dict], kind: str) -> dict:
    matches = by_kind(objects, kind)
    assert len(matches) == 1, f"expected one {kind}, got {[m['metadata']['name'] for m in matches]}"
    return matches[0]


def operator_cluster_role(objects: list[dict]) -> dict:
    """The operator's own ClusterRole (the chart also ships the benchmark and aggregated ones)."""
    (role,) = [o for o in objects if o["kind"] == "ClusterRole" and o["metadata"]["name"] == FULLNAME]
    return role


def operator_container(objects: list[dict]) -> dict:
    return only(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def granted(rules: list[dict], api_group: str, resource: str) -> set[str]:
    """Verbs the rules grant on one (API group, resource)."""
    verbs: set[str] = set()
    for rule in rules:
        if api_group in rule.get("apiGroups", []) and resource in rule.get("resources", []):
            verbs |= set(rule["verbs"])
    return verbs


def generated_crds() -> list[dict]:
    """The two specpilot.io CRDs: the chart's files when written, else generated from the pydantic models."""
    files = sorted((CHART_DIR / "crds").glob("specpilot.io_*.yaml"))
    if files:
        return [yaml.safe_load(path.read_text()) for path in files]
    try:
        from specpilot.api.crd import all_crds
    except ImportError as error:
        pytest.skip(f"charts/specpilot/crds/specpilot.io_*.yaml not written yet and specpilot.api.crd "
                    f"not importable ({error}); run `specpilot crds` to write them")
    return list(all_crds().values())


@pytest.fixture(scope="module")
def default_objects(helm_tools: HelmTools) -> list[dict]:
    return helm_tools.render(namespace=RELEASE_NAMESPACE)


@pytest.fixture(scope="module")
def non_default_objects(helm_tools: HelmTools) -> list[dict]:
    return helm_tools.render(namespace=RELEASE_NAMESPACE, values_files=[NON_DEFAULT_VALUES])


@pytest.mark.parametrize("values_files", [(), (NON_DEFAULT_VALUES,)], ids=["default", "namespaced-ha"])
def test_helm_lint_strict_passes(helm_tools: HelmTools, values_files: tuple[Path, ...]) -> None:
    args: list[str | Path] = ["lint", "--strict", CHART_DIR]
    for values_file in values_files:
        args += ["--values", values_file]
    result = helm_tools.helm_run(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_default_render_is_one_clusterwide_standalone_operator(default_objects: list[dict]) -> None:
    kinds = sorted(obj["kind"] for obj in default_objects)
    assert kinds == sorted([
        "ServiceAccount", "ConfigMap", "ClusterRole", "ClusterRole", "ClusterRole", "ClusterRole",
        "ClusterRoleBinding", "Service", "Deployment", "Pod", "Secret",
    ])
    assert sorted(o["metadata"]["name"] for o in by_kind(default_objects, "ClusterRole")) == [
        FULLNAME, BENCH_CLUSTER_ROLE, f"{FULLNAME}-edit", f"{FULLNAME}-view"]
    deployment = only(default_objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"]["type"] == "Recreate"
    container = operator_container(default_objects)
    assert container["image"] == "ghcr.io/specpilot/specpilot:0.1.0"
    assert container["command"] == ["specpilot", "run"]
    assert container["args"] == [
        "--config", "/etc/specpilot/config.yaml",
        "--liveness-port", "8080",
        "--liveness-address", "0.0.0.0",
        "--metrics-port", "9090",
        "--metrics-address", "0.0.0.0",
        "--log-format", "plain",
        "--all-namespaces",
        "--standalone",
    ]


def test_non_default_render_watches_listed_namespaces_with_peering(non_default_objects: list[dict]) -> None:
    deployment = only(non_default_objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    container = operator_container(non_default_objects)
    assert container["image"] == "ghcr.io/specpilot/specpilot:0.1.0-rc1"
    args = container["args"]
    assert args[args.index("--log-format") + 1] == "json"
    assert [args[i + 1] for i, arg in enumerate(args) if arg == "--namespace"] == ["a", "b"]
    assert args[args.index("--peering") + 1] == "specpilot-ha"
    assert "--all-namespaces" not in args and "--standalone" not in args

    peerings = by_kind(non_default_objects, "KopfPeering")
    assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in peerings) == [
        ("a", "specpilot-ha"), ("b", "specpilot-ha"),
    ]
    assert not by_kind(non_default_objects, "ClusterKopfPeering")
    service_monitor = only(non_default_objects, "ServiceMonitor")
    assert service_monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert service_monitor["spec"]["endpoints"][0]["interval"] == "15s"


def test_clusterwide_peering_creates_a_cluster_peering_object(helm_tools: HelmTools) -> None:
    objects = helm_tools.render(set_values=["peering.enabled=true", "replicaCount=2"])
    assert [p["metadata"]["name"] for p in by_kind(objects, "ClusterKopfPeering")] == ["specpilot"]
    assert not by_kind(objects, "KopfPeering")
    cluster_rules = operator_cluster_role(objects)["rules"]
    assert granted(cluster_rules, "kopf.dev", "clusterkopfpeerings") == {"list", "watch", "patch"}


@pytest.mark.parametrize(("values_files", "set_values"), VARIANTS)
def test_every_variant_renders_a_config_the_operator_loads(
    helm_tools: HelmTools, values_files: tuple[Path, ...], set_values: tuple[str, ...], tmp_path: Path
) -> None:
    """The operator exits at start on a config it cannot read: every values variant the chart ships or
    documents must render one it loads (the ci/ values' maxAgeHours 0 once made it exit)."""
    from specpilot.config import load_config

    objects = helm_tools.render(values_files=values_files, set_values=set_values)
    path = tmp_path / "config.yaml"
    path.write_text(only(objects, "ConfigMap")["data"]["config.yaml"])
    config = load_config(path)
    assert config.profiling_defaults.concurrency_levels


@pytest.mark.parametrize(("values_files", "set_values"), VARIANTS)
def test_every_rendered_object_validates_offline(
    helm_tools: HelmTools, values_files: tuple[Path, ...], set_values: tuple[str, ...]
) -> None:
    objects = helm_tools.render(values_files=values_files, set_values=set_values, include_crds=True)
    crd_schemas = {
        crd["spec"]["names"]["kind"]: crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for crd in by_kind(objects, "CustomResourceDefinition")
    }
    for obj in objects:
        name = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in CUSTOM_KINDS:
            if obj["kind"] in crd_schemas:
                jsonschema.validate(obj, crd_schemas[obj["kind"]])
            else:
                assert obj["apiVersion"] == "monitoring.coreos.com/v1", name
            continue
        try:
            kubernetes_validate.validate(obj, "1.34", strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{name} is not a valid Kubernetes 1.34 object: {error.message} at {list(error.path)}")


def test_kopf_peering_crds_are_structural_and_match_kopf(helm_tools: HelmTools) -> None:
    crds = yaml.safe_load_all((CHART_DIR / "crds" / "kopf-peering.yaml").read_text())
    by_name = {crd["metadata"]["name"]: crd for crd in crds}
    assert set(by_name) == {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"}
    assert by_name["clusterkopfpeerings.kopf.dev"]["spec"]["scope"] == "Cluster"
    assert by_name["kopfpeerings.kopf.dev"]["spec"]["scope"] == "Namespaced"
    for crd in by_name.values():
        kubernetes_validate.validate(crd, "1.34", strict=True)
        (version,) = crd["spec"]["versions"]
        assert version["name"] == "v1" and version["served"] and version["storage"]
        status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
        # kopf keeps each peer's keep-alive under status.<identity>: unknown fields must survive.
        assert status == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}


def test_generated_crds_cover_every_specpilot_resource_the_rbac_names(default_objects: list[dict]) -> None:
    crds = generated_crds()
    plurals = {crd["spec"]["names"]["plural"] for crd in crds}
    assert plurals == {"speculativedeployments", "speculationprofiles"}
    for crd in crds:
        kubernetes_validate.validate(crd, "1.34", strict=True)
        assert crd["spec"]["group"] == "specpilot.io"
        # The RBAC grants /status separately: without the subresource those grants would be meaningless.
        assert all("status" in v.get("subresources", {}) for v in crd["spec"]["versions"])
    rules = operator_cluster_role(default_objects)["rules"]
    granted_resources = {r for rule in rules if "specpilot.io" in rule["apiGroups"] for r in rule["resources"]}
    assert granted_resources == set(SPECPILOT_GRANTS)
    assert {resource.split("/")[0] for resource in granted_resources} == plurals


@pytest.mark.parametrize(("values_files", "set_values"), VARIANTS)
def test_rbac_has_no_wildcards(
    helm_tools: HelmTools, values_files: tuple[Path, ...], set_values: tuple[str, ...]
) -> None:
    objects = helm_tools.render(values_files=values_files, set_values=set_values, include_crds=True)
    roles = [obj for obj in objects if obj["kind"] in RBAC_KINDS]
    assert roles
    for role in roles:
        for rule in role["rules"]:
            for field in ("verbs", "resources", "apiGroups"):
                assert not any("*" in entry for entry in rule.get(field, [])), (
                    f"{role['kind']}/{role['metadata']['name']} has a wildcard in {field}: {rule}"
                )
            assert "nonResourceURLs" not in rule
            # resourceNames only narrows `bind` to the benchmark ClusterRole.
            if "resourceNames" in rule:
                assert rule == {"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["clusterroles"],
                                "verbs": ["bind"], "resourceNames": [BENCH_CLUSTER_ROLE]}, rule


def test_clusterwide_rbac_grants_what_the_operator_needs(default_objects: list[dict]) -> None:
    rules = operator_cluster_role(default_objects)["rules"]
    for resource, verbs in SPECPILOT_GRANTS.items():
        assert granted(rules, "specpilot.io", resource) == verbs, resource
    assert granted(rules, "batch", "jobs") == {"list", "watch", "create", "delete"}
    assert granted(rules, "", "nodes") == {"list", "watch"}
    assert granted(rules, "", "pods") == {"list"}
    assert not granted(rules, "", "pods/log") and not granted(rules, "", "configmaps")
    assert granted(rules, "", "events") == {"create"} and not granted(rules, "events.k8s.io", "events")
    assert granted(rules, "apiextensions.k8s.io", "customresourcedefinitions") == {"list", "watch"}
    assert not granted(rules, "rbac.authorization.k8s.io", "roles")
    assert granted(rules, "rbac.authorization.k8s.io", "rolebindings") == {"get", "create"}
    assert not granted(rules, "monitoring.coreos.com", "servicemonitors")
    # Standalone operators never touch peering objects.
    assert not granted(rules, "kopf.dev", "clusterkopfpeerings")
    assert not granted(rules, "kopf.dev", "kopfpeerings")
    binding = only(default_objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == FULLNAME
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": FULLNAME, "namespace": RELEASE_NAMESPACE}
    ]


WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}


@pytest.mark.parametrize("values_files", [(), (NON_DEFAULT_VALUES,)], ids=["default", "namespaced-ha"])
def test_only_the_operators_identity_may_write_a_profiles_annotations(
    helm_tools: HelmTools, values_files: tuple[Path, ...]
) -> None:
    """The operator's verdict on a profile is an annotation (metadata, on the main resource): under the chart's
    RBAC only the operator's own roles may write SpeculationProfiles themselves. The benchmark role patches their
    status alone, and the roles aggregated into view/edit/admin only read them."""
    objects = helm_tools.render(namespace=RELEASE_NAMESPACE, values_files=values_files)
    roles = [obj for obj in objects if obj["kind"] in ("Role", "ClusterRole")]
    writers = {(role["kind"], role["metadata"]["name"]) for role in roles
               if granted(role["rules"], "specpilot.io", "speculationprofiles") & WRITE_VERBS}
    assert writers and {name for _, name in writers} == {FULLNAME}, writers
    bound = {(b["roleRef"]["kind"], b["roleRef"]["name"]): b["subjects"]
             for b in objects if b["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    for writer in writers:
        assert bound[writer] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": RELEASE_NAMESPACE}]
    bench = next(role for role in roles if role["metadata"]["name"] == BENCH_CLUSTER_ROLE)
    assert granted(bench["rules"], "specpilot.io", "speculationprofiles") == {"get"}
    assert granted(bench["rules"], "specpilot.io", "speculationprofiles/status") == {"get", "patch"}


def test_namespaced_rbac_is_a_role_per_watched_namespace(non_default_objects: list[dict]) -> None:
    cluster_rules = operator_cluster_role(non_default_objects)["rules"]
    # Cluster scope keeps only what has no namespace: nodes, namespaces, CRDs.
    assert {r for rule in cluster_rules for r in rule["resources"]} == {
        "nodes", "namespaces", "customresourcedefinitions",
    }
    roles = {(r["metadata"]["namespace"], r["metadata"]["name"]): r for r in by_kind(non_default_objects, "Role")}
    assert set(roles) == {("a", FULLNAME), ("b", FULLNAME), (RELEASE_NAMESPACE, f"{FULLNAME}-self")}
    for namespace in ("a", "b"):
        rules = roles[(namespace, FULLNAME)]["rules"]
        for resource, verbs in SPECPILOT_GRANTS.items():
            assert granted(rules, "specpilot.io", resource) == verbs, (namespace, resource)
        assert granted(rules, "rbac.authorization.k8s.io", "rolebindings") == {"get", "create"}
        assert granted(rules, "rbac.authorization.k8s.io", "clusterroles") == {"bind"}
        assert granted(rules, "kopf.dev", "kopfpeerings") == {"list", "watch", "patch"}
    self_rules = roles[(RELEASE_NAMESPACE, f"{FULLNAME}-self")]["rules"]
    assert {r for rule in self_rules for r in rule["resources"]} == {"events"}
    bindings = {(b["metadata"]["namespace"], b["roleRef"]["name"]) for b in by_kind(non_default_objects, "RoleBinding")}
    assert bindings == set(roles)


def test_watching_the_release_namespace_needs_no_extra_self_role(helm_tools: HelmTools) -> None:
    objects = helm_tools.render(namespace=RELEASE_NAMESPACE, set_values=[f"watchNamespaces={{{RELEASE_NAMESPACE}}}"])
    assert [(r["metadata"]["namespace"], r["metadata"]["name"]) for r in by_kind(objects, "Role")] == [
        (RELEASE_NAMESPACE, FULLNAME)
    ]


@pytest.mark.parametrize(
    ("set_values", "expected_in_error"),
    [
        (["replicaCount=-1"], "replicaCount"),
        (["replicaCount=two"], "replicaCount"),
        (["logFormat=xml"], "logFormat"),
        (["image.pullPolicy=Sometimes"], "pullPolicy"),
        (["watchNamespaces={Bad_Namespace}"], "watchNamespaces"),
        (["config.gpuPricesPerHour.H100-SXM=-2"], "gpuPricesPerHour"),
        (["config.profilingDefaults.concurrencyLevels={0,2}"], "concurrencyLevels"),
        (["config.profilingDefaults.concurrencyLevels={1,1000000000}"], "concurrencyLevels"),
        (["config.profilingDefaults.requestsPerLevel=0"], "requestsPerLevel"),
        (["config.prometheusUrl=prometheus:9090"], "prometheusUrl"),
        (["serviceMonitor.interval=soon"], "interval"),
        (["replicaCountt=2"], "replicaCountt"),
        (["config.allowedPrometheusUrls={prometheus:9090}"], "allowedPrometheusUrls"),
        (["config.metricsReadLimits.maxResponseBytes=10"], "maxResponseBytes"),
        (["metricsBindAddress=everywhere"], "metricsBindAddress"),
        (["networkPolicy.enabled=maybe"], "enabled"),
        (["config.tenancy=open"], "tenancy"),
        (["config.unknownKnob=1"], "unknownKnob"),
    ],
)
def test_values_schema_rejects_bad_values(
    helm_tools: HelmTools, set_values: list[str], expected_in_error: str
) -> None:
    result = helm_tools.template(set_values=set_values)
    assert result.returncode != 0, f"helm template accepted {set_values}"
    assert "values don't meet the specifications of the schema" in result.stderr
    assert expected_in_error in result.stderr


def test_replicas_without_peering_are_refused_with_the_fix(helm_tools: HelmTools) -> None:
    result = helm_tools.template(set_values=["replicaCount=2"])
    assert result.returncode != 0
    assert "set peering.enabled=true" in result.stderr


def test_config_map_holds_the_operator_config(default_objects: list[dict], non_default_objects: list[dict]) -> None:
    config_map = only(default_objects, "ConfigMap")
    assert config_map["metadata"]["name"] == f"{FULLNAME}-config"
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    assert set(config) == {"prometheusUrl", "benchmarkImage", "defaultEngineImage", "gpuPricesPerHour", "profilingDefaults",
                           "reconcileIntervalSeconds", "profileWatchSeconds", "allowedPrometheusUrls",
                           "allowedGatewayParents", "defaultGatewayParentRefs", "metricsReadLimits",
                           "benchClusterRole", "tenancy"}
    assert config["allowedPrometheusUrls"] == [] and config["benchClusterRole"] == BENCH_CLUSTER_ROLE
    assert config["allowedGatewayParents"] == [] and config["defaultGatewayParentRefs"] == []
    # No default endpoint picker: routing: auto uses InferencePools only where a spec names a picker.
    assert "defaultEndpointPickerRef" not in config
    assert config["prometheusUrl"] == "http://prometheus-operated.monitoring.svc:9090"
    assert config["benchmarkImage"] == "ghcr.io/specpilot/specpilot-bench:0.1.0"
    assert config["defaultEngineImage"] == "vllm/vllm-openai:v0.32.0"
    assert config["gpuPricesPerHour"]["H100-SXM"] == 2.50
    assert config["gpuPricesPerHour"]["H200"] == 3.50
    assert all(price > 0 for price in config["gpuPricesPerHour"].values())
    # The operator reads this file, and every priced SKU is one the GPU catalog knows.
    from specpilot.config import OperatorConfig
    from specpilot.perf.catalog import DEFAULT_CATALOG

    parsed = OperatorConfig.model_validate(config)
    assert parsed.gpu_prices_per_hour == config["gpuPricesPerHour"]
    # the chart's defaults are the operator's own
    assert (parsed.reconcile_interval_seconds, parsed.profile_watch_seconds) == (
        OperatorConfig().reconcile_interval_seconds, OperatorConfig().profile_watch_seconds)
    assert all(DEFAULT_CATALOG.resolve(sku).sku == sku for sku in config["gpuPricesPerHour"])
    assert config["profilingDefaults"] == {
        "concurrencyLevels": [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256],
        "requestsPerLevel": 64,
        "maxParallelJobsPerPool": 1,
        "maxAgeHours": 168,
    }
    overridden = yaml.safe_load(only(non_default_objects, "ConfigMap")["data"]["config.yaml"])
    assert overridden["prometheusUrl"] == ""
    assert overridden["gpuPricesPerHour"]["H100-SXM"] == 2.10
    assert overridden["gpuPricesPerHour"]["H200"] == 3.50  # untouched SKUs keep their default price
    assert overridden["profilingDefaults"]["concurrencyLevels"] == [1, 4, 16, 64]

    pod_spec = only(default_objects, "Deployment")["spec"]["template"]["spec"]
    mounted = {v["name"]: v for v in pod_spec["volumes"]}
    assert mounted["config"]["configMap"]["name"] == config_map["metadata"]["name"]
    mounts = {m["mountPath"]: m for m in pod_spec["containers"][0]["volumeMounts"]}
    assert mounts["/etc/specpilot"]["name"] == "config"


def test_config_checksum_rolls_the_operator_on_config_change(helm_tools: HelmTools, default_objects: list[dict]) -> None:
    def checksum(objects: list[dict]) -> str:
        return only(objects, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/config"]

    config_map = only(default_objects, "ConfigMap")
    changed = helm_tools.render(namespace=RELEASE_NAMESPACE, set_values=["config.profilingDefaults.requestsPerLevel=65"])
    assert len(checksum(default_objects)) == len(hashlib.sha256().hexdigest())
    assert checksum(changed) != checksum(default_objects)
    assert only(changed, "ConfigMap")["data"] != config_map["data"]


@pytest.mark.parametrize("objects_fixture", ["default_objects", "non_default_objects"])
def test_pods_run_restricted(request: pytest.FixtureRequest, objects_fixture: str) -> None:
    objects = request.getfixturevalue(objects_fixture)
    operator_pod = only(objects, "Deployment")["spec"]["template"]["spec"]
    test_pod = only(objects, "Pod")["spec"]
    for pod in (operator_pod, test_pod):
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 65532
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["runAsNonRoot"] is True
            assert context["readOnlyRootFilesystem"] is True
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context["seccompProfile"] == {"type": "RuntimeDefault"}
            assert container["resources"]["requests"] and container["resources"]["limits"]
    volumes = {v["name"]: v for v in operator_pod["volumes"]}
    assert volumes["tmp"] == {"name": "tmp", "emptyDir": {}}
    assert {"name": "tmp", "mountPath": "/tmp"} in operator_pod["containers"][0]["volumeMounts"]


def test_operator_probes_and_env(default_objects: list[dict]) -> None:
    container = operator_container(default_objects)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"health": 8080, "metrics": 9090}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert {"name": "SPECPILOT_OPERATOR_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}} in container["env"]
    assert container["resources"] == {
        "requests": {"cpu": "100m", "memory": "256Mi"},
        "limits": {"cpu": "1", "memory": "512Mi"},
    }


def test_service_and_helm_test_reach_the_operator(default_objects: list[dict]) -> None:
    service = only(default_objects, "Service")
    deployment = only(default_objects, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        "metrics": (9090, "metrics"), "health": (8080, "health"),
    }
    test_pod = only(default_objects, "Pod")
    assert test_pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    # The Service must not select its own test Pod.
    assert not service["spec"]["selector"].items() <= test_pod["metadata"]["labels"].items()
    (container,) = test_pod["spec"]["containers"]
    assert container["image"] == "busybox:1.37"
    script = container["command"][-1]
    assert f"http://{service['metadata']['name']}:8080/healthz" in script
    assert f"http://{service['metadata']['name']}:9090/metrics" in script


def test_service_monitor_scrapes_the_metrics_port(non_default_objects: list[dict]) -> None:
    service = only(non_default_objects, "Service")
    service_monitor = only(non_default_objects, "ServiceMonitor")
    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert service_monitor["spec"]["namespaceSelector"] == {"matchNames": [RELEASE_NAMESPACE]}
    (endpoint,) = service_monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


def test_notes_say_what_to_do_next(helm_tools: HelmTools) -> None:
    result = helm_tools.helm_run(
        "install", "sp", CHART_DIR, "--namespace", RELEASE_NAMESPACE, "--dry-run=client",
        "--values", NON_DEFAULT_VALUES,
    )
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "kubectl get sdep" in notes
    assert f"helm test sp -n {RELEASE_NAMESPACE}" in notes
    assert "namespaces: a, b" in notes
    assert ".status.pools[*].decision" in notes


def test_values_schema_is_valid_draft7_and_documents_every_value() -> None:
    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    assert schema["additionalProperties"] is False
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    jsonschema.Draft7Validator(schema).validate(values)
    assert set(values) == set(schema["properties"])
    # Every top-level key carries a comment, or else each of its direct children does.
    lines = (CHART_DIR / "values.yaml").read_text().splitlines()

    def commented(index: int) -> bool:
        return index > 0 and lines[index - 1].strip().startswith("#")

    top_level = [i for i, line in enumerate(lines) if line and not line.startswith(("#", " ", "-"))]
    for position, index in enumerate(top_level):
        if commented(index):
            continue
        end = top_level[position + 1] if position + 1 < len(top_level) else len(lines)
        children = [i for i in range(index + 1, end) if lines[i].startswith("  ") and lines[i][2] not in " #-"]
        assert children, f"values.yaml: top-level key '{lines[index]}' has no comment"
        for child in children:
            assert commented(child), f"values.yaml line {child + 1} ('{lines[child].strip()}') has no comment"


def test_docs_values_table_lists_every_value() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    # Free-form maps are documented as a whole, not key by key.
    documented_whole = {"resources", "config.gpuPricesPerHour", "networkPolicy.prometheus.namespaceSelector",
                        "config.tenancy", "grafanaDashboard.labels", "prometheusRule.alerts"}

    def keys(node: dict, prefix: str = "") -> list[str]:
        out = []
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and value and path not in documented_whole:
                out += keys(value, f"{path}.")
            else:
                out.append(path)
        return out

    docs = (CHART_DIR.parents[1] / "docs" / "helm.md").read_text()
    values_section = docs.split("\n## Values\n", 1)[1].split("\n## ", 1)[0]
    table_keys = {line.split("`")[1] for line in values_section.splitlines() if line.startswith("| `")}
    assert set(keys(values)) == table_keys


def test_aggregated_roles_fold_sdep_rights_into_view_and_edit(default_objects: list[dict]) -> None:
    roles = {o["metadata"]["name"]: o for o in by_kind(default_objects, "ClusterRole")}
    view, edit = roles[f"{FULLNAME}-view"], roles[f"{FULLNAME}-edit"]
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-view" not in edit["metadata"]["labels"]
    assert granted(view["rules"], "specpilot.io", "speculationprofiles") == {"get", "list", "watch"}
    assert granted(edit["rules"], "specpilot.io", "speculativedeployments") == {
        "create", "update", "patch", "delete", "deletecollection"}
    # Profiles (and every status) are written by the operator and its benchmark Jobs only.
    assert not granted(edit["rules"], "specpilot.io", "speculationprofiles")
    assert not any(r.endswith("/status") for rule in edit["rules"] for r in rule["resources"])


def test_network_policies_admit_only_prometheus_and_the_operator(helm_tools: HelmTools) -> None:
    assert not by_kind(helm_tools.render(namespace=RELEASE_NAMESPACE), "NetworkPolicy")  # off by default
    objects = helm_tools.render(namespace=RELEASE_NAMESPACE, set_values=[
        "watchNamespaces={a,b}", "networkPolicy.enabled=true", "networkPolicy.servingPods.enabled=true"])
    policies = {(p["metadata"].get("namespace"), p["metadata"]["name"]): p for p in by_kind(objects, "NetworkPolicy")}
    assert set(policies) == {(None, FULLNAME), ("a", f"{FULLNAME}-serving"), ("b", f"{FULLNAME}-serving")}
    operator_pod = only(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    own = policies[(None, FULLNAME)]["spec"]
    assert own["podSelector"]["matchLabels"].items() <= operator_pod.items()
    assert own["policyTypes"] == ["Ingress"]
    prometheus, helm_test = own["ingress"]
    assert prometheus["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert prometheus["from"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    assert helm_test["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "helm-test"
    serving = policies[("a", f"{FULLNAME}-serving")]["spec"]
    assert serving["podSelector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "specpilot",
                                                     "app.kubernetes.io/component": "serving"}
    (rule,) = serving["ingress"]
    assert rule["from"][0]["namespaceSelector"]["matchLabels"] == {"kubernetes.io/metadata.name": RELEASE_NAMESPACE}
    assert rule["from"][0]["podSelector"]["matchLabels"].items() <= operator_pod.items()


def test_bind_addresses_reach_the_operator(helm_tools: HelmTools) -> None:
    objects = helm_tools.render(namespace=RELEASE_NAMESPACE, set_values=["metricsBindAddress=127.0.0.1"])
    args = operator_container(objects)["args"]
    assert args[args.index("--metrics-address") + 1] == "127.0.0.1"
    assert args[args.index("--liveness-address") + 1] == "0.0.0.0"


def test_the_result_key_reaches_the_operator_only_and_is_kept(default_objects: list[dict]) -> None:
    secret = by_kind(default_objects, "Secret")[0]
    assert secret["metadata"]["name"] == f"{FULLNAME}-result-key"
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(base64.b64decode(secret["data"]["key"])) >= 32
    container = by_kind(default_objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    key_env = next(e for e in container["env"] if e["name"] == "SPECPILOT_RESULT_KEY")
    assert key_env["valueFrom"]["secretKeyRef"] == {"name": f"{FULLNAME}-result-key", "key": "key"}
    # The operator reads no Secret through the API: the kubelet hands it the key.
    rules = [r for role in by_kind(default_objects, "ClusterRole") for r in role["rules"]]
    assert not any("secrets" in r.get("resources", []) for r in rules)


def test_an_existing_result_key_secret_is_used_instead(helm_tools: HelmTools) -> None:
    objects = helm_tools.render(namespace=RELEASE_NAMESPACE, set_values=["resultKey.existingSecret=my-key"])
    assert not by_kind(objects, "Secret")
    container = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    key_env = next(e for e in container["env"] if e["name"] == "SPECPILOT_RESULT_KEY")
    assert key_env["valueFrom"]["secretKeyRef"]["name"] == "my-key"
