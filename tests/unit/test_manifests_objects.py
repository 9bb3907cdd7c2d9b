"""Every object the operator creates, built from the examples, validates offline (kubernetes-validate for
built-in kinds, a structural schema for the PodMonitor) and carries the behaviour the operator relies on:
rolling updates that never drop capacity, GPU counts, owner references, placement, pod-override rules,
benchmark Job shapes and the bench's least-privilege Role."""

from __future__ import annotations

import copy
import json

import jsonschema
import kubernetes_validate
import pytest

from specpilot.api import ScheduleRange, SpeculationProfileSpec, SpeculativeDeploymentSpec
from specpilot.api.deployment_spec import DEFAULT_CONCURRENCY_LEVELS
from specpilot.api.profile import ProfileTarget
from specpilot.manifests import names
from specpilot.api import seal
from specpilot.manifests.benchmark import WORKLOAD_FILE, bench_args, bench_engine_model, benchmark_job
from specpilot.manifests.engine import engine_args, engine_config_hash
from specpilot.manifests.rbac import bench_rbac
from specpilot_bench.cli import build_parser as build_bench_parser
from specpilot.manifests.serving import pod_monitor, service, serving_deployment
from tests.conftest import load_example

K8S_VERSION = "1.34"
NAMESPACE = "llm"
SDEP_UID = "0b0e5f3e-6c1a-4d55-9d43-2f7d3c1e9a01"
PROFILE_UID = "7d1f2a3b-0000-4c5d-8e9f-0a1b2c3d4e5f"
BENCH_IMAGE = "ghcr.io/specpilot/specpilot-bench:0.1.0"
SCHEDULE = [
    ScheduleRange(from_batch_size=1, to_batch_size=16, num_speculative_tokens=4),
    ScheduleRange(from_batch_size=17, to_batch_size=512, num_speculative_tokens=0),
]


def _custom_workload_doc() -> dict:
    doc = load_example("minimal.yaml")
    doc["spec"]["profiling"] = {"workload": {"name": "custom", "file": {"name": "prompts", "key": "support.jsonl"},
                                             "outputLen": 128}}
    return doc


EXAMPLES = {
    "realistic": load_example("llama-70b-h100-h200.yaml"),
    "minimal": load_example("minimal.yaml"),
    "custom-workload": _custom_workload_doc(),
}


def spec_of(example: str) -> SpeculativeDeploymentSpec:
    return SpeculativeDeploymentSpec.model_validate(EXAMPLES[example]["spec"])


def sdep_name_of(example: str) -> str:
    return EXAMPLES[example]["metadata"]["name"]


def validate(obj: dict) -> None:
    """Offline API-server-like validation; a failure names the object and the first problem only."""
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{obj['kind']} {obj['metadata']['name']}: {exc.message} at {list(exc.absolute_path)}")
    assert len(obj["metadata"]["name"]) <= 63


def profile_spec_for(spec: SpeculativeDeploymentSpec, method, sku: str = "H100-SXM") -> SpeculationProfileSpec:
    """The profile the operator asks for: the deployment's model identity on one SKU."""
    return SpeculationProfileSpec(
        model=ProfileTarget(id=spec.model.id, revision=spec.model.revision,
                            tensor_parallel_size=spec.model.tensor_parallel_size,
                            max_model_len=spec.model.max_model_len),
        method=method, sku=sku, engine_image=spec.model.image, workload=spec.profiling.workload,
        concurrency_levels=spec.profiling.concurrency_levels, requests_per_level=spec.profiling.requests_per_level)


def profile_owner(name: str) -> dict[str, str]:
    return {"apiVersion": "specpilot.io/v1alpha1", "kind": "SpeculationProfile", "name": name, "uid": PROFILE_UID}


def engine_of(pod_spec: dict, field: str = "containers") -> dict:
    return next(c for c in pod_spec[field] if c["name"] == "engine")


def bench_of(pod_spec: dict) -> dict:
    return next(c for c in pod_spec["containers"] if c["name"] == "bench")


def bench_engine_of(pod_spec: dict) -> dict:
    return next(c for c in pod_spec["containers"] if c["name"] == "engine")


def flag_value(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def deployment_for(example: str, pool_index: int = 0, method_index: int | None = 0, **kwargs) -> dict:
    spec = kwargs.pop("spec", None) or spec_of(example)
    method = None if method_index is None else spec.methods[method_index]
    arguments = {"num_speculative_tokens": None, "schedule": None, "replicas": 2, **kwargs}
    return serving_deployment(sdep_name=sdep_name_of(example), namespace=NAMESPACE, uid=SDEP_UID, spec=spec,
                              pool=spec.gpu_pools[pool_index], method=method, **arguments)


# ----- serving Deployment -----

SERVING_CASES = [
    (example, pool_index, method_index)
    for example in EXAMPLES
    for pool_index in range(len(spec_of(example).gpu_pools))
    for method_index in [None, *range(len(spec_of(example).methods))]
]


@pytest.mark.parametrize(("example", "pool_index", "method_index"), SERVING_CASES)
def test_serving_deployment_validates_and_never_drops_capacity(example, pool_index, method_index):
    spec = spec_of(example)
    pool = spec.gpu_pools[pool_index]
    deployment = deployment_for(example, pool_index, method_index)
    validate(deployment)

    assert deployment["metadata"]["name"] == f"{sdep_name_of(example)}-{pool.name}"
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    assert deployment["spec"]["progressDeadlineSeconds"] == 5400
    template = deployment["spec"]["template"]
    assert deployment["spec"]["selector"]["matchLabels"].items() <= template["metadata"]["labels"].items()
    assert template["metadata"]["labels"]["specpilot.io/pool"] == pool.name
    pod_spec = template["spec"]
    engine = engine_of(pod_spec)
    gpus = str(spec.model.tensor_parallel_size * spec.model.data_parallel_size)
    assert engine["resources"]["requests"][pool.gpu_resource_name] == gpus
    assert engine["resources"]["limits"][pool.gpu_resource_name] == gpus
    assert pod_spec.get("nodeSelector", {}) == pool.node_selector
    assert pod_spec.get("tolerations", []) == [t.dump() for t in pool.tolerations]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory"}} in pod_spec["volumes"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in engine["volumeMounts"]
    assert engine["ports"] == [{"name": "http", "containerPort": spec.serving.port, "protocol": "TCP"}]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert engine[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert engine["startupProbe"]["periodSeconds"] * engine["startupProbe"]["failureThreshold"] >= 1800
    assert pod_spec["enableServiceLinks"] is False
    assert template["metadata"]["annotations"]["specpilot.io/engine-config"] == engine_config_hash(engine["args"])
    assert template["metadata"]["annotations"]["prometheus.io/port"] == str(spec.serving.port)
    speculating = method_index is not None
    assert template["metadata"]["labels"]["specpilot.io/speculation"] == ("on" if speculating else "off")
    assert ("--speculative-config" in engine["args"]) == speculating


def test_owner_reference_points_at_the_speculative_deployment():
    deployment = deployment_for("realistic")
    assert deployment["metadata"]["ownerReferences"] == [{
        "apiVersion": "specpilot.io/v1alpha1", "kind": "SpeculativeDeployment", "name": "llama-70b",
        "uid": SDEP_UID, "controller": True, "blockOwnerDeletion": True}]
    assert deployment["metadata"]["namespace"] == NAMESPACE


def test_engine_runs_the_exact_schedule():
    spec = spec_of("realistic")
    deployment = deployment_for("realistic", method_index=1, num_speculative_tokens=4, schedule=SCHEDULE)
    engine = engine_of(deployment["spec"]["template"]["spec"])
    assert engine["command"] == ["python3", "-m", "vllm.entrypoints.openai.api_server"]
    assert engine["image"] == spec.model.image
    assert engine["args"] == engine_args(spec, method=spec.methods[1], num_speculative_tokens=4,
                                         schedule=SCHEDULE, port=8000)
    config = json.loads(flag_value(engine["args"], "--speculative-config"))
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 16, 4], [17, 512, 0]]
    assert deployment["spec"]["template"]["metadata"]["labels"]["specpilot.io/method"] == "eagle3"


def test_a_new_decision_changes_the_pod_template_and_the_same_one_does_not():
    same_a = deployment_for("realistic", method_index=1, num_speculative_tokens=4, schedule=SCHEDULE)
    same_b = deployment_for("realistic", method_index=1, num_speculative_tokens=4, schedule=SCHEDULE)
    off = deployment_for("realistic", method_index=None)
    assert same_a == same_b
    annotation = "specpilot.io/engine-config"
    assert (same_a["spec"]["template"]["metadata"]["annotations"][annotation]
            != off["spec"]["template"]["metadata"]["annotations"][annotation])
    assert same_a["spec"]["selector"] == off["spec"]["selector"]


def test_k_zero_serves_without_speculation():
    deployment = deployment_for("realistic", method_index=1, num_speculative_tokens=0)
    template = deployment["spec"]["template"]
    assert "--speculative-config" not in engine_of(template["spec"])["args"]
    assert template["metadata"]["labels"]["specpilot.io/speculation"] == "off"


def test_external_autoscaling_leaves_replicas_out():
    doc = copy.deepcopy(EXAMPLES["realistic"]["spec"])
    doc["serving"]["autoscaling"] = "external"
    spec = SpeculativeDeploymentSpec.model_validate(doc)
    deployment = deployment_for("realistic", spec=spec, replicas=None)
    validate(deployment)
    assert "replicas" not in deployment["spec"]
    assert deployment_for("realistic", replicas=3)["spec"]["replicas"] == 3


def test_a_pool_without_a_spare_gpu_rolls_one_pod_down_before_the_next_comes_up():
    doc = copy.deepcopy(EXAMPLES["realistic"]["spec"])
    doc["serving"]["rollout"] = {"maxSurge": 0, "maxUnavailable": 1, "progressDeadlineSeconds": 7200}
    deployment = deployment_for("realistic", spec=SpeculativeDeploymentSpec.model_validate(doc), replicas=3)
    validate(deployment)
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}
    assert deployment["spec"]["progressDeadlineSeconds"] == 7200


def test_a_pools_own_rollout_overrides_the_deployments():
    doc = copy.deepcopy(EXAMPLES["realistic"]["spec"])
    doc["gpuPools"][1]["rollout"] = {"maxSurge": 0, "maxUnavailable": 1}
    spec = SpeculativeDeploymentSpec.model_validate(doc)
    full = deployment_for("realistic", pool_index=1, spec=spec, replicas=2)
    spare = deployment_for("realistic", pool_index=0, spec=spec, replicas=2)
    assert full["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 1, "maxSurge": 0}
    assert spare["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}


def test_gpu_count_is_tensor_times_data_parallel_and_merges_user_resources():
    doc = copy.deepcopy(EXAMPLES["realistic"]["spec"])
    doc["model"]["tensorParallelSize"] = 2
    doc["model"]["dataParallelSize"] = 2
    doc["gpuPools"][1]["gpuResourceName"] = "amd.com/gpu"
    spec = SpeculativeDeploymentSpec.model_validate(doc)
    deployment = deployment_for("realistic", pool_index=1, spec=spec)
    validate(deployment)
    resources = engine_of(deployment["spec"]["template"]["spec"])["resources"]
    assert resources == {"requests": {"cpu": "16", "memory": "200Gi", "amd.com/gpu": "4"},
                         "limits": {"memory": "320Gi", "amd.com/gpu": "4"}}


def test_pod_overrides_win_except_for_what_specpilot_owns():
    doc = copy.deepcopy(EXAMPLES["realistic"]["spec"])
    doc["serving"]["podOverrides"] = {
        "priorityClassName": "llm-serving",
        "nodeSelector": {"topology.kubernetes.io/zone": "us-east-1a",
                         "nvidia.com/gpu.product": "NVIDIA-A10G"},
        "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}],
        "volumes": [{"name": "weights", "persistentVolumeClaim": {"claimName": "llama-70b-weights"}}],
        "containers": [{
            "name": "engine",
            "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"},
                    {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "t"}}}],
            "volumeMounts": [{"name": "weights", "mountPath": "/models", "readOnly": True}],
            "resources": {"limits": {"nvidia.com/gpu": "1", "memory": "400Gi"}},
        }],
    }
    spec = SpeculativeDeploymentSpec.model_validate(doc)
    deployment = deployment_for("realistic", method_index=1, spec=spec)
    validate(deployment)
    pod_spec = deployment["spec"]["template"]["spec"]
    engine = engine_of(pod_spec)
    # the user's additions and values win
    assert pod_spec["priorityClassName"] == "llm-serving"
    assert pod_spec["nodeSelector"]["topology.kubernetes.io/zone"] == "us-east-1a"
    assert {"name": "weights", "persistentVolumeClaim": {"claimName": "llama-70b-weights"}} in pod_spec["volumes"]
    assert [m["mountPath"] for m in engine["volumeMounts"]] == ["/dev/shm", "/home/specpilot", "/models"]
    assert engine["env"][2:] == [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "t"}}},
                                 {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]
    assert engine["resources"]["limits"]["memory"] == "400Gi"
    # ...except what specpilot owns: the engine's image and command line, the GPU count, the pool's placement
    assert engine["image"] == spec.model.image
    assert engine["args"][:2] == ["--model", "meta-llama/Llama-3.3-70B-Instruct"]
    assert "--speculative-config" in engine["args"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert engine["resources"]["requests"]["nvidia.com/gpu"] == "4"
    assert pod_spec["nodeSelector"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert pod_spec["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "dedicated", "operator": "Equal", "value": "llm", "effect": "NoSchedule"}]


# ----- Service and PodMonitor -----

@pytest.mark.parametrize("example", list(EXAMPLES))
def test_service_spans_every_pool(example):
    spec = spec_of(example)
    svc = service(sdep_name=sdep_name_of(example), namespace=NAMESPACE, uid=SDEP_UID, spec=spec)
    validate(svc)
    assert svc["spec"]["type"] == "ClusterIP"
    assert svc["spec"]["ports"] == [{"name": "http", "port": spec.serving.port, "targetPort": "http",
                                     "protocol": "TCP"}]
    assert svc["metadata"]["ownerReferences"][0]["uid"] == SDEP_UID
    selector = svc["spec"]["selector"].items()
    for pool_index in range(len(spec.gpu_pools)):
        labels = deployment_for(example, pool_index)["spec"]["template"]["metadata"]["labels"]
        assert selector <= labels.items()
    method = spec.methods[0]
    profile = profile_spec_for(spec, method)
    job = benchmark_job(profile_name=profile.object_name(), namespace=NAMESPACE, profile_spec=profile, spec=spec,
                        pool=spec.gpu_pools[0], bench_image=BENCH_IMAGE, owner=profile_owner(profile.object_name()),
                        sdep_name=sdep_name_of(example))
    assert not selector <= job["spec"]["template"]["metadata"]["labels"].items()


POD_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PodMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "required": ["selector", "podMetricsEndpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {"type": "object", "additionalProperties": False, "properties": {
                    "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}},
                "namespaceSelector": {"type": "object", "additionalProperties": False, "properties": {
                    "any": {"type": "boolean"}, "matchNames": {"type": "array", "items": {"type": "string"}}}},
                "podTargetLabels": {"type": "array", "items": {"type": "string"}},
                "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": {
                    "type": "object", "additionalProperties": False, "properties": {
                        "port": {"type": "string"}, "path": {"type": "string"}, "interval": {"type": "string"},
                        "scheme": {"enum": ["http", "https"]}}}},
            },
        },
    },
}
"""The fields of prometheus-operator's PodMonitor (monitoring.coreos.com/v1) that specpilot writes."""


def test_pod_monitor_scrapes_the_serving_pods_by_pool():
    monitor = pod_monitor(sdep_name="llama-70b", namespace=NAMESPACE, uid=SDEP_UID)
    jsonschema.validate(monitor, POD_MONITOR_SCHEMA)
    assert monitor["spec"]["podMetricsEndpoints"] == [{"port": "http", "path": "/metrics"}]
    assert set(monitor["spec"]["podTargetLabels"]) == {"specpilot.io/pool", "specpilot.io/deployment"}
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}
    assert monitor["metadata"]["ownerReferences"][0]["kind"] == "SpeculativeDeployment"
    labels = deployment_for("realistic", 1)["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert all(label in labels for label in monitor["spec"]["podTargetLabels"])


# ----- benchmark Jobs -----

def _job_cases():
    for example in EXAMPLES:
        spec = spec_of(example)
        for pool_index in range(len(spec.gpu_pools)):
            for method in [None, *spec.methods]:
                yield example, pool_index, method


JOB_CASES = [pytest.param(*case, id=f"{case[0]}-{case[1]}-{case[2].key if case[2] else 'baseline'}")
             for case in _job_cases()]


def job_for(example: str, pool_index: int, method, spec=None) -> tuple[dict, dict]:
    spec = spec or spec_of(example)
    profile = profile_spec_for(spec, method)
    name = profile.object_name()
    job = benchmark_job(profile_name=name, namespace=NAMESPACE, profile_spec=profile, spec=spec,
                        pool=spec.gpu_pools[pool_index], bench_image=BENCH_IMAGE, owner=profile_owner(name),
                        sdep_name=sdep_name_of(example))
    return job, {"profile": profile, "name": name, "spec": spec, "pool": spec.gpu_pools[pool_index]}


@pytest.mark.parametrize(("example", "pool_index", "method"), JOB_CASES)
def test_benchmark_job_validates_with_the_pools_placement(example, pool_index, method):
    job, ctx = job_for(example, pool_index, method)
    validate(job)
    spec, pool, name = ctx["spec"], ctx["pool"], ctx["name"]
    assert job["metadata"]["name"] == names.bench_job_name(name)
    assert job["metadata"]["ownerReferences"] == [{
        "apiVersion": "specpilot.io/v1alpha1", "kind": "SpeculationProfile", "name": name, "uid": PROFILE_UID,
        "controller": True, "blockOwnerDeletion": True}]
    assert job["spec"]["activeDeadlineSeconds"] == spec.profiling.job_deadline_seconds
    assert job["spec"]["backoffLimit"] == spec.profiling.backoff_limit
    assert job["spec"]["ttlSecondsAfterFinished"] == 86400
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["specpilot.io/profile"] == name and labels["specpilot.io/pool"] == pool.name
    assert labels == job["metadata"]["labels"] and labels is not job["metadata"]["labels"]
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == "specpilot-bench"
    assert pod_spec["restartPolicy"] == "Never"
    assert pod_spec.get("nodeSelector", {}) == pool.node_selector
    assert pod_spec.get("tolerations", []) == [t.dump() for t in pool.tolerations]
    gpu_holder = bench_engine_of(pod_spec)  # the engine container holds the GPUs; the bench measures it over loopback
    assert gpu_holder["resources"]["limits"][pool.gpu_resource_name] == str(spec.model.tensor_parallel_size)
    assert {"name": "dshm", "mountPath": "/dev/shm"} in gpu_holder["volumeMounts"]
    bench = bench_of(pod_spec)
    assert pool.gpu_resource_name not in (bench.get("resources") or {}).get("limits", {})
    assert bench["image"] == BENCH_IMAGE and bench["command"] == ["specpilot-bench"]
    args = bench["args"]
    assert flag_value(args, "--profile-name") == name
    assert flag_value(args, "--namespace") == NAMESPACE
    assert flag_value(args, "--levels") == ",".join(str(c) for c in spec.profiling.concurrency_levels)
    assert flag_value(args, "--sku") == "H100-SXM"


def test_the_engine_container_runs_the_supervisor_with_the_engine_command_line():
    spec = spec_of("realistic")
    job, ctx = job_for("realistic", 0, spec.methods[0])
    pod_spec = job["spec"]["template"]["spec"]
    assert [c["name"] for c in pod_spec["initContainers"]] == ["supervisor-install"]
    assert [c["name"] for c in pod_spec["containers"]] == ["bench", "engine"]
    engine = bench_engine_of(pod_spec)
    assert engine["image"] == "vllm/vllm-openai:v0.32.0"
    assert engine["command"] == ["python3", "/specpilot-supervisor/supervisor.py"]
    args = engine["args"]
    configs = [args[i + 1] for i, a in enumerate(args) if a == "--config-for-k"]
    assert [c.split("=", 1)[0] for c in configs] == ["1", "2", "3", "4"]
    assert json.loads(configs[-1].split("=", 1)[1]) == {"method": "ngram", "num_speculative_tokens": 4,
                                                       "prompt_lookup_max": 5, "prompt_lookup_min": 2}
    command = args[args.index("--") + 1:]
    assert command == ["python3", "-m", "vllm.entrypoints.openai.api_server",
                       "--model", "meta-llama/Llama-3.3-70B-Instruct", "--served-model-name", "llama-3.3-70b",
                       "--tensor-parallel-size", "4", "--max-model-len", "16384", "--gpu-memory-utilization", "0.9",
                       "--port", "8000", "--enable-prefix-caching", "--max-num-seqs=256", "--host", "127.0.0.1"]
    bench_args_ = bench_of(pod_spec)["args"]
    assert flag_value(bench_args_, "--supervisor-url") == "http://127.0.0.1:8090"
    assert flag_value(bench_args_, "--engine-port") == "8000"
    assert "--launch" not in bench_args_ and not any(a.startswith("--engine-arg") for a in bench_args_)


def test_baseline_engine_container_runs_only_k0():
    job, _ = job_for("minimal", 0, None)
    pod_spec = job["spec"]["template"]["spec"]
    assert "--speculative-config" not in bench_of(pod_spec)["args"]
    assert "--config-for-k" not in bench_engine_of(pod_spec)["args"]


def test_only_the_bench_holds_a_token_and_it_takes_nothing_of_the_tenants():
    doc = copy.deepcopy(EXAMPLES["realistic"]["spec"])
    doc["model"]["env"] = [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}]
    doc["profiling"]["podOverrides"] = {
        "volumes": [{"name": "weights", "persistentVolumeClaim": {"claimName": "w"}}],
        "containers": [{"name": "engine", "env": [{"name": "EXTRA", "value": "1"}],
                            "volumeMounts": [{"name": "weights", "mountPath": "/models"}]}],
    }
    spec = SpeculativeDeploymentSpec.model_validate(doc)
    profile = profile_spec_for(spec, spec.methods[0])
    job = benchmark_job(profile_name="p", namespace=NAMESPACE, profile_spec=profile, spec=spec,
                        pool=spec.gpu_pools[0], bench_image=BENCH_IMAGE, owner=profile_owner("p"),
                        result_token="t0k3n")
    validate(job)
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["automountServiceAccountToken"] is False
    assert "shareProcessNamespace" not in pod_spec
    bench, engine = bench_of(pod_spec), bench_engine_of(pod_spec)
    everyone = pod_spec["containers"] + pod_spec["initContainers"]
    holders = [c["name"] for c in everyone if any(m["name"] == "kube-api-access" for m in c.get("volumeMounts", []))]
    assert holders == ["bench"]
    token_env = [c["name"] for c in everyone if any(e["name"] == seal.TOKEN_ENV for e in c.get("env", []))]
    assert token_env == ["bench"]
    # the tenant's env and mounts reach the engine, never the bench
    assert {"name": "EXTRA", "value": "1"} in engine["env"]
    assert {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"} in engine["env"]
    assert "/models" in [m["mountPath"] for m in engine["volumeMounts"]]
    assert {e["name"] for e in bench["env"]} == {"HOME", "USER", "POD_NAMESPACE", seal.TOKEN_ENV}
    assert {m["name"] for m in bench["volumeMounts"]} == {"bench-home", "kube-api-access"}
    assert bench["image"] == BENCH_IMAGE


def test_overrides_cannot_put_the_token_beside_the_engine(monkeypatch):
    """Whatever the overrides say (even past a tenancy check that let them through), the token volume and the
    result token stay in the bench container, and the tenant's env and mounts stay out of it."""
    from specpilot.api.tenancy import TenancyPolicy
    from specpilot.manifests import benchmark

    monkeypatch.setattr(benchmark, "refuse", lambda problems: None)

    doc = copy.deepcopy(EXAMPLES["realistic"]["spec"])
    doc["profiling"]["podOverrides"] = {
        "shareProcessNamespace": True,
        "containers": [{"name": "engine", "volumeMounts": [
            {"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
            "env": [{"name": seal.TOKEN_ENV, "value": "x"}]},
                       {"name": "bench", "env": [{"name": "OPENSSL_CONF", "value": "/x"}],
                        "volumeMounts": [{"name": "home", "mountPath": "/usr/lib/python3/sitecustomize.py"}]}],
    }
    spec = SpeculativeDeploymentSpec.model_validate(doc)
    profile = profile_spec_for(spec, spec.methods[0])
    policy = TenancyPolicy(allowed_pod_override_fields=["*"])
    job = benchmark_job(profile_name="p", namespace=NAMESPACE, profile_spec=profile, spec=spec,
                        pool=spec.gpu_pools[0], bench_image=BENCH_IMAGE, owner=profile_owner("p"),
                        result_token="t0k3n", tenancy=policy)
    pod_spec = job["spec"]["template"]["spec"]
    engine, bench = bench_engine_of(pod_spec), bench_of(pod_spec)
    assert "kube-api-access" not in [m["name"] for m in engine["volumeMounts"]]
    assert seal.TOKEN_ENV not in [e["name"] for e in engine["env"]]
    assert "OPENSSL_CONF" not in [e["name"] for e in bench["env"]]
    assert "/usr/lib/python3/sitecustomize.py" not in [m["mountPath"] for m in bench["volumeMounts"]]
    assert "shareProcessNamespace" not in pod_spec


def test_profile_engine_is_one_data_parallel_rank_of_the_profiled_identity():
    doc = copy.deepcopy(EXAMPLES["realistic"]["spec"])
    doc["model"]["dataParallelSize"] = 2
    spec = SpeculativeDeploymentSpec.model_validate(doc)
    job, ctx = job_for("realistic", 0, spec.methods[0], spec=spec)
    engine = bench_engine_of(job["spec"]["template"]["spec"])
    assert "--data-parallel-size" not in engine["args"]
    assert engine["resources"]["limits"]["nvidia.com/gpu"] == "4"
    model = bench_engine_model(spec, ctx["profile"])
    assert (model.id, model.tensor_parallel_size, model.image) == (
        ctx["profile"].model.id, ctx["profile"].model.tensor_parallel_size, ctx["profile"].engine_image)


def test_custom_workload_mounts_the_configmap_key():
    job, _ = job_for("custom-workload", 0, spec_of("custom-workload").methods[0])
    validate(job)
    pod_spec = job["spec"]["template"]["spec"]
    assert {"name": "workload", "configMap": {"name": "prompts", "items": [
        {"key": "support.jsonl", "path": "prompts.jsonl"}]}} in pod_spec["volumes"]
    bench = bench_of(pod_spec)
    assert {"name": "workload", "mountPath": "/workload", "readOnly": True} in bench["volumeMounts"]
    assert WORKLOAD_FILE == "/workload/prompts.jsonl"
    assert flag_value(bench["args"], "--workload-file") == WORKLOAD_FILE
    assert flag_value(bench["args"], "--workload") == "custom"
    assert flag_value(bench["args"], "--output-len") == "128"


def test_profiling_pod_overrides_merge_into_the_engine_and_keep_the_bench_identity():
    doc = copy.deepcopy(EXAMPLES["realistic"]["spec"])
    doc["profiling"]["podOverrides"] = {
        "priorityClassName": "batch-low",
        "volumes": [{"name": "weights", "persistentVolumeClaim": {"claimName": "llama-70b-weights"}}],
        "containers": [{"name": "engine", "env": [{"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"}],
                            "volumeMounts": [{"name": "weights", "mountPath": "/models"}]}],
    }
    spec = SpeculativeDeploymentSpec.model_validate(doc)
    job, _ = job_for("realistic", 0, spec.methods[1], spec=spec)
    validate(job)
    pod_spec = job["spec"]["template"]["spec"]
    assert pod_spec["priorityClassName"] == "batch-low"
    assert pod_spec["serviceAccountName"] == "specpilot-bench"
    assert pod_spec["restartPolicy"] == "Never"
    engine = bench_engine_of(pod_spec)
    assert "/models" in [m["mountPath"] for m in engine["volumeMounts"]]
    assert {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"} in engine["env"]
    assert engine["command"] == ["python3", "/specpilot-supervisor/supervisor.py"]
    assert bench_of(pod_spec)["image"] == BENCH_IMAGE


def test_bench_args_are_the_jobs_arguments():
    spec = spec_of("minimal")
    profile = profile_spec_for(spec, spec.methods[0])
    args = bench_args(profile_name="p", namespace="ns", profile_spec=profile, port=8000)
    assert flag_value(args, "--supervisor-url") and flag_value(args, "--job-name") == names.bench_job_name("p")
    assert json.loads(flag_value(args, "--speculative-config"))["num_speculative_tokens"] == 4


@pytest.mark.parametrize(("example", "pool_index", "method"), JOB_CASES)
def test_the_bench_parses_what_the_job_passes(example, pool_index, method):
    job, ctx = job_for(example, pool_index, method)
    profile = ctx["profile"]
    parsed = build_bench_parser().parse_args(bench_of(job["spec"]["template"]["spec"])["args"])
    assert (parsed.profile_name, parsed.namespace, parsed.job_name) == (ctx["name"], NAMESPACE,
                                                                        job["metadata"]["name"])
    assert parsed.supervisor_url and not parsed.launch and parsed.engine_url is None
    assert parsed.num_speculative_tokens is None and parsed.no_calibration
    assert (parsed.model, parsed.tensor_parallel_size, parsed.max_model_len) == (
        profile.model.id, profile.model.tensor_parallel_size, profile.model.max_model_len)
    assert parsed.levels == profile.concurrency_levels
    assert parsed.requests_per_level == profile.requests_per_level
    assert (parsed.workload, parsed.output_len, parsed.temperature, parsed.seed) == (
        profile.workload.name, profile.workload.output_len, profile.workload.temperature, profile.workload.seed)
    assert (parsed.sku, parsed.engine_image) == (profile.sku, profile.engine_image)
    assert (parsed.workload_file is not None) == (profile.workload.file is not None)
    if method is not None:
        assert json.loads(parsed.speculative_config) == method.speculative_config(None)
    else:
        assert parsed.speculative_config is None
    assert not parsed.engine_arg  # the engine's command line is the engine container's, not the bench's


# ----- RBAC -----

@pytest.mark.parametrize("owner", [None, {"apiVersion": "specpilot.io/v1alpha1", "kind": "SpeculativeDeployment",
                                          "name": "llama-70b", "uid": SDEP_UID}])
def test_bench_role_grants_only_reading_the_profile_and_patching_its_status(owner):
    objects = bench_rbac(NAMESPACE, owner)
    for obj in objects:
        validate(obj)
        assert obj["metadata"]["name"] == "specpilot-bench"
        assert obj["metadata"]["namespace"] == NAMESPACE
        if owner is None:
            assert "ownerReferences" not in obj["metadata"]
        else:
            assert obj["metadata"]["ownerReferences"][0]["uid"] == SDEP_UID
            assert obj["metadata"]["ownerReferences"][0]["controller"] is False
    account, role, binding = objects
    assert [account["kind"], role["kind"], binding["kind"]] == ["ServiceAccount", "Role", "RoleBinding"]
    grants = {(group, resource, verb)
              for rule in role["rules"]
              for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]}
    assert grants == {("specpilot.io", "speculationprofiles", "get"),
                      ("specpilot.io", "speculationprofiles/status", "get"),
                      ("specpilot.io", "speculationprofiles/status", "patch")}
    assert all(set(rule) == {"apiGroups", "resources", "verbs"} for rule in role["rules"])
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "specpilot-bench"}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "specpilot-bench", "namespace": NAMESPACE}]
    account["metadata"]["labels"]["x"] = "y"
    assert "x" not in role["metadata"]["labels"]
