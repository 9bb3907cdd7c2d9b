"""Hostile SpeculativeDeployment specs: each is refused with a message naming the field and the fix, by the
CRD schema (what the API server checks), by the typed models and the operator's tenancy policy (what the
operator checks), and never reaches a pod (the builders refuse it too). Messages never echo a huge value."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import pytest
from pydantic import ValidationError

from specpilot.api import SpeculativeDeploymentSpec
from specpilot.api.base import format_validation_error
from specpilot.api.tenancy import TenancyPolicy, TenancyViolation, spec_problems
from specpilot.api.validate import validate_custom_resource
from specpilot.config import OperatorConfig
from specpilot.policy.needs import profile_spec
from specpilot.manifests.benchmark import benchmark_job
from specpilot.manifests.serving import serving_deployment
from tests.conftest import load_example

BENCH_IMAGE = OperatorConfig().benchmark_image
OWNER = {"apiVersion": "specpilot.io/v1alpha1", "kind": "SpeculationProfile", "name": "p", "uid": "u-1"}


def _doc() -> dict:
    return copy.deepcopy(load_example("llama-70b-h100-h200.yaml"))


@dataclass
class Verdict:
    model: str | None
    """The operator's message (typed models, then the tenancy policy); None when it accepts the spec."""
    crd: list[str]
    """What the API server would report (schema and CEL)."""
    reached_pod: bool
    """Whether any builder produced a pod from it."""


def judge(doc: dict, policy: TenancyPolicy | None = None, crds: dict | None = None) -> Verdict:
    policy = policy or TenancyPolicy()
    crd = validate_custom_resource(crds["SpeculativeDeployment"], doc) if crds else []
    try:
        spec = SpeculativeDeploymentSpec.model_validate(doc["spec"])
    except ValidationError as exc:
        return Verdict(format_validation_error(exc), crd, False)
    problems = spec_problems(spec, policy, benchmark_image=BENCH_IMAGE)
    reached = False
    try:
        pool = spec.gpu_pools[0]
        serving_deployment(sdep_name="x", namespace="team", uid="u", spec=spec, pool=pool, method=spec.methods[0],
                           replicas=1, tenancy=policy)
        profile = profile_spec(spec, "H100-SXM", spec.methods[0], OperatorConfig(tenancy=policy))
        benchmark_job(profile_name=profile.object_name(), namespace="team", profile_spec=profile, spec=spec,
                      pool=pool, bench_image=BENCH_IMAGE, owner=OWNER, tenancy=policy)
        reached = True
    except TenancyViolation:
        pass
    return Verdict("; ".join(problems) or None, crd, reached)


def _at(doc: dict, path: str, value) -> dict:
    node = doc
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
    node[keys[-1]] = value
    return doc


ATTACKER_IMAGE = "evil.example.com/miner:latest"

# (id, path in the realistic example, hostile value, text the operator's message must contain)
HOSTILE = [
    ("model-id-flag", "spec.model.id", "--trust-remote-code", "spec.model.id: String should match pattern"),
    ("model-id-newline", "spec.model.id", "meta-llama/Llama-3.1-8B\n--port=1", "spec.model.id: String should match"),
    ("model-id-space", "spec.model.id", "meta llama", "spec.model.id: String should match"),
    ("served-name-flag", "spec.model.servedName", "-x", "spec.model.servedName: String should match"),
    ("revision-control", "spec.model.revision", "main\x00", "spec.model.revision: String should match"),
    ("drafter-flag", "spec.methods.1.model", "--speculative-config", "spec.methods[1].model: String should match"),
    ("engine-image-space", "spec.model.image", "vllm/vllm-openai:v0.32.0 --privileged",
     "spec.model.image: String should match"),
    ("huge-extra-args", "spec.model.extraArgs", ["--enable-prefix-caching"] * 1000,
     "spec.model.extraArgs: List should have at most 64 items"),
    ("huge-levels", "spec.profiling.concurrencyLevels", list(range(1, 1001)),
     "spec.profiling.concurrencyLevels: List should have at most 32 items"),
    ("huge-level", "spec.profiling.concurrencyLevels", [1, 2, 10**9],
     "spec.profiling.concurrencyLevels[2]: Input should be less than or equal to 4096"),
    ("level-flag", "spec.profiling.concurrencyLevels", ["--rm"],
     "spec.profiling.concurrencyLevels[0]: Input should be a valid integer"),
    ("level-newline", "spec.profiling.concurrencyLevels", ["1\n--port=80"],
     "spec.profiling.concurrencyLevels[0]: Input should be a valid integer"),
    ("refine-budget-flag", "spec.profiling.refineBudgetPercent", "--privileged",
     "spec.profiling.refineBudgetPercent: Input should be a valid integer"),
    ("huge-refine-budget", "spec.profiling.refineBudgetPercent", 10**12,
     "spec.profiling.refineBudgetPercent: Input should be less than or equal to 400"),
    ("huge-string", "spec.model.extraArgs", ["--chat-template=" + "x" * 100_000],
     "spec.model.extraArgs[0]: String should have at most 4096 characters"),
    ("privileged", "spec.serving.podOverrides",
     {"containers": [{"name": "engine", "securityContext": {"privileged": True}}]},
     "spec.serving.podOverrides.containers[0].securityContext is not allowed"),
    ("run-as-root", "spec.serving.podOverrides", {"securityContext": {"runAsUser": 0}},
     "spec.serving.podOverrides.securityContext.runAsUser is 0 (root)"),
    ("seccomp-unconfined", "spec.serving.podOverrides",
     {"securityContext": {"seccompProfile": {"type": "Unconfined"}}},
     "spec.serving.podOverrides.securityContext.seccompProfile is not allowed"),
    ("delete-security-context", "spec.serving.podOverrides", {"securityContext": None},
     "spec.serving.podOverrides.securityContext must be an object"),
    ("host-path-root", "spec.serving.podOverrides", {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]},
     "spec.serving.podOverrides.volumes[0].hostPath is not allowed"),
    ("host-network", "spec.serving.podOverrides", {"hostNetwork": True},
     "spec.serving.podOverrides.hostNetwork is not allowed (the pod would share the node's network)"),
    ("host-pid", "spec.profiling.podOverrides", {"hostPID": True}, "spec.profiling.podOverrides.hostPID is not allowed"),
    ("host-ipc", "spec.serving.podOverrides", {"hostIPC": True}, "spec.serving.podOverrides.hostIPC is not allowed"),
    ("node-name", "spec.serving.podOverrides", {"nodeName": "control-plane-1"},
     "spec.serving.podOverrides.nodeName is not allowed"),
    ("tolerate-all", "spec.serving.podOverrides", {"tolerations": [{"operator": "Exists"}]},
     "spec.serving.podOverrides.tolerations[0] has no key, so it tolerates every taint"),
    ("pool-tolerate-all", "spec.gpuPools.0.tolerations", [{"operator": "Exists"}],
     "spec.gpuPools[0].tolerations[0] has no key"),
    ("service-account", "spec.serving.podOverrides", {"serviceAccountName": "cluster-admin"},
     "spec.serving.podOverrides.serviceAccountName is not allowed (the pod would run with another identity's rights)"),
    ("bench-service-account", "spec.profiling.podOverrides", {"serviceAccountName": "default"},
     "spec.profiling.podOverrides.serviceAccountName is not allowed"),
    ("automount-token", "spec.serving.podOverrides", {"automountServiceAccountToken": True},
     "spec.serving.podOverrides.automountServiceAccountToken is not allowed"),
    ("extra-container", "spec.serving.podOverrides", {"containers": [{"name": "miner", "image": ATTACKER_IMAGE}]},
     "spec.serving.podOverrides.containers[0] (name 'miner') is not one of specpilot's containers"),
    ("bench-extra-init", "spec.profiling.podOverrides", {"initContainers": [{"name": "steal", "image": ATTACKER_IMAGE}]},
     "spec.profiling.podOverrides.initContainers[0] (name 'steal') is not one of specpilot's containers"),
    ("engine-image-override", "spec.serving.podOverrides", {"containers": [{"name": "engine", "image": ATTACKER_IMAGE}]},
     "spec.serving.podOverrides.containers[0].image is not allowed"),
    ("engine-command-override", "spec.serving.podOverrides", {"containers": [{"name": "engine", "command": ["sh"]}]},
     "spec.serving.podOverrides.containers[0].command is not allowed"),
    ("host-port", "spec.serving.podOverrides",
     {"containers": [{"name": "engine", "ports": [{"containerPort": 8000, "hostPort": 80}]}]},
     "spec.serving.podOverrides.containers[0].ports is not allowed"),
    ("ephemeral-containers", "spec.serving.podOverrides", {"ephemeralContainers": [{"name": "x"}]},
     "spec.serving.podOverrides.ephemeralContainers is not allowed"),
    ("sa-token-volume", "spec.serving.podOverrides",
     {"volumes": [{"name": "t", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}}]},
     "spec.serving.podOverrides.volumes[0].projected.sources[0].serviceAccountToken is not allowed"),
    ("csi-volume", "spec.serving.podOverrides", {"volumes": [{"name": "s", "csi": {"driver": "secrets-store"}}]},
     "spec.serving.podOverrides.volumes[0].csi is not allowed"),
    ("secret-volume", "spec.serving.podOverrides", {"volumes": [{"name": "s", "secret": {"secretName": "db-root"}}]},
     "spec.serving.podOverrides.volumes[0].secret.secretName references Secret 'db-root'"),
    ("mount-over-token", "spec.profiling.podOverrides",
     {"volumes": [{"name": "e", "emptyDir": {}}], "containers": [{"name": "engine", "volumeMounts": [
         {"name": "e", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}]}]},
     "spec.profiling.podOverrides.containers[0].volumeMounts[0].mountPath "
     "'/var/run/secrets/kubernetes.io/serviceaccount' is specpilot's own mount"),
    ("env-other-secret", "spec.model.env", [{"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db-root",
                                                                                          "key": "password"}}}],
     "spec.model.env[0].valueFrom.secretKeyRef references Secret 'db-root', which the operator's config does not "
     "allow (tenancy.allowedSecretNames: hf-token)"),
    ("override-env-other-secret", "spec.profiling.podOverrides", {"containers": [{"name": "engine", "env": [
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "payments", "key": "k"}}}]}]},
     "spec.profiling.podOverrides.containers[0].env[0].valueFrom.secretKeyRef references Secret 'payments'"),
    ("env-from-secret", "spec.serving.podOverrides", {"containers": [{"name": "engine",
                                                                     "envFrom": [{"secretRef": {"name": "db"}}]}]},
     "spec.serving.podOverrides.containers[0].envFrom is not allowed"),
    ("hf-token-other-secret", "spec.model.hfTokenSecretRef", {"name": "cloud-credentials", "key": "token"},
     "spec.model.hfTokenSecretRef.name references Secret 'cloud-credentials'"),
    ("env-redirect-apiserver", "spec.model.env", [{"name": "KUBERNETES_SERVICE_HOST", "value": "evil.example.com"}],
     "spec.model.env[0].name 'KUBERNETES_SERVICE_HOST' is not allowed"),
    ("env-ld-preload", "spec.model.env", [{"name": "LD_PRELOAD", "value": "/models/evil.so"}],
     "spec.model.env[0].name 'LD_PRELOAD' is not allowed"),
    ("env-forge-result-token", "spec.model.env", [{"name": "SPECPILOT_RESULT_TOKEN", "value": "0" * 64}],
     "spec.model.env[0].name 'SPECPILOT_RESULT_TOKEN' is not allowed"),
    ("env-vllm-dev-endpoints", "spec.model.env", [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}],
     "spec.model.env[0].name 'VLLM_SERVER_DEV_MODE' is not allowed"),
    ("huge-job-deadline", "spec.profiling.jobDeadlineSeconds", 10**12,
     "spec.profiling.jobDeadlineSeconds: Input should be less than or equal to 604800"),
    ("attacker-bench-image", "spec.profiling.image", ATTACKER_IMAGE,
     "spec.profiling.image 'evil.example.com/miner:latest' is not a benchmark image the operator's config allows"),
    # Values that defeat a rule the engine container is held to: the supervisor, the image's working directory
    # (first on `python -m`'s path), HOME and the cache and plugin folders code is loaded from.
    ("mount-over-supervisor", "spec.profiling.podOverrides",
     {"volumes": [{"name": "s", "configMap": {"name": "fake"}}], "containers": [{"name": "engine", "volumeMounts": [
         {"name": "s", "mountPath": "/specpilot-supervisor"}]}]},
     "spec.profiling.podOverrides.containers[0].volumeMounts[0].mountPath '/specpilot-supervisor' is specpilot's own "
     "mount"),
    ("mount-over-workdir", "spec.serving.podOverrides",
     {"volumes": [{"name": "w", "configMap": {"name": "vllm"}}], "containers": [{"name": "engine", "volumeMounts": [
         {"name": "w", "mountPath": "/vllm-workspace/vllm"}]}]},
     "spec.serving.podOverrides.containers[0].volumeMounts[0].mountPath '/vllm-workspace/vllm' is in the system's or "
     "Python's own files"),
    ("mount-hf-modules", "spec.serving.podOverrides",
     {"volumes": [{"name": "m", "configMap": {"name": "mods"}}], "containers": [{"name": "engine", "volumeMounts": [
         {"name": "m", "mountPath": "/home/specpilot/.cache/huggingface/modules"}]}]},
     "is the Python user site or a cache of compiled code under HOME"),
    ("env-home", "spec.model.env", [{"name": "HOME", "value": "/models"}], "spec.model.env[0].name 'HOME' is not allowed"),
    *[(f"env-{name.lower().replace('_', '-')}", "spec.model.env", [{"name": name, "value": "/models/x"}],
       f"spec.model.env[0].name {name!r} is not allowed")
      for name in ("TRITON_CACHE_MANAGER", "TRITON_HOME", "NCCL_CONF_FILE", "XDG_CACHE_HOME", "TORCH_EXTENSIONS_DIR",
                   "FLASHINFER_WORKSPACE_BASE")],
    ("compile-backend-non-ascii", "spec.model.extraArgs", ["--compilation-config", '{"backend": "\u00e9vil.fn"}'],
     "sets --compilation-config, which makes the engine import code"),
    ("compile-backend-fullwidth", "spec.model.extraArgs", ["-cc.backend=\uff45vil.fn"],
     "sets --compilation-config, which makes the engine import code"),
    # Other teams' objects and the cluster's own nodes and priorities.
    ("pull-secret-other-team", "spec.serving.podOverrides", {"imagePullSecrets": [{"name": "payments-registry"}]},
     "spec.serving.podOverrides.imagePullSecrets[0].name references Secret 'payments-registry'"),
    ("env-field-ref-annotations", "spec.model.env",
     [{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations"}}}],
     "spec.model.env[0].valueFrom.fieldRef.fieldPath 'metadata.annotations' is not allowed"),
    ("clone-other-namespace", "spec.serving.podOverrides", {"volumes": [{"name": "w", "ephemeral": {
        "volumeClaimTemplate": {"spec": {"accessModes": ["ReadOnlyMany"], "dataSourceRef": {
            "kind": "PersistentVolumeClaim", "name": "weights", "namespace": "team-b"}}}}}]},
     "spec.serving.podOverrides.volumes[0].ephemeral.volumeClaimTemplate.spec.dataSourceRef.namespace 'team-b' clones "
     "a volume of another namespace"),
    ("tolerate-control-plane", "spec.serving.podOverrides",
     {"tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]},
     "spec.serving.podOverrides.tolerations[0].key 'node-role.kubernetes.io/control-plane' tolerates the taint"),
    ("pool-tolerate-cordoned", "spec.gpuPools.0.tolerations",
     [{"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}],
     "spec.gpuPools[0].tolerations[0].key 'node.kubernetes.io/unschedulable' tolerates the taint"),
    ("system-node-critical", "spec.profiling.podOverrides", {"priorityClassName": "system-node-critical"},
     "spec.profiling.podOverrides.priorityClassName 'system-node-critical' is one of Kubernetes' own priority "
     "classes"),
]


@pytest.mark.parametrize("case_id,path,value,expected", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_hostile_input_is_refused_naming_the_field(crds, case_id, path, value, expected):
    verdict = judge(_at(_doc(), path, value), crds=crds)
    assert verdict.model is not None and expected in verdict.model, verdict.model
    assert not verdict.reached_pod
    assert len(verdict.model) < 2500  # a huge value is never echoed whole
    for problem in verdict.crd:
        assert len(problem) < 20_000


SCHEMA_REFUSED = {"model-id-flag", "model-id-newline", "model-id-space", "served-name-flag", "revision-control",
                  "drafter-flag", "engine-image-space", "huge-extra-args", "huge-levels", "huge-string",
                  "huge-job-deadline", "huge-level", "level-flag", "level-newline", "refine-budget-flag",
                  "huge-refine-budget"}
"""The hostile inputs the API server itself refuses (the rest depend on the operator's config)."""


@pytest.mark.parametrize("case", [c for c in HOSTILE if c[0] in SCHEMA_REFUSED], ids=lambda c: c[0])
def test_the_crd_refuses_what_no_config_allows(crds, case):
    case_id, path, value, _ = case
    field = path.split(".")[-1]
    problems = validate_custom_resource(crds["SpeculativeDeployment"], _at(_doc(), path, value))
    assert any(field in p for p in problems), problems


def test_a_huge_list_is_not_echoed_whole():
    doc = _at(_doc(), "spec.profiling.concurrencyLevels", [5] * 1000)
    message = judge(doc).model
    assert "…" in message and "(1000 items)" in message
    assert len(message) < 1000


def test_a_thousand_problems_are_counted_not_listed():
    doc = _at(_doc(), "spec.model.env", [{"name": f"bad name {i}"} for i in range(60)])
    message = judge(doc).model
    assert "more problem(s)" in message
    assert len(message) < 10_000


# ----- owned engine flags, in every spelling vLLM accepts -----

OWNED_SPELLINGS = [
    ["--speculative-config", "{}"], ["--speculative-config={}"], ["--speculative_config={}"],
    ["--speculative_config", "{}"], ["--speculative-config.num_speculative_tokens=16"],
    ["--speculative-config.num_speculative_tokens", "16"], ["--speculative_config.method=ngram"],
    ["--speculative-config.num_speculative_tokens_per_batch_size+", "1,64,8"],
    ["-sc", "{}"], ["-sc={}"], ["-s", "{}"], ["--speculative", "{}"], ["--spec-method=ngram"],
    ["--spec_tokens", "8"], ["--speculative-model", "x/y"], ["--num-speculative-tokens=5"],
    ["--ngram-prompt-lookup-max=4"],
    ["--config", "/models/evil.yaml"], ["--config=/models/evil.yaml"],
    ["--tensor-parallel-size=8"], ["--tensor_parallel_size", "8"], ["-tp", "8"], ["-tp=8"], ["-t", "8"],
    ["--pipeline-parallel-size=2"], ["-pp", "2"],
    ["--data-parallel-size=2"], ["--data_parallel_size_local=2"], ["-dp", "2"], ["-dpl", "2"], ["-dpa", "1.2.3.4"],
    ["--model", "other/model"], ["--model=other/model"], ["--mod", "other/model"],
    ["--served-model-name=gpt-4"], ["--served_model_name", "gpt-4"],
    ["--port", "80"], ["--port=80"], ["--host=0.0.0.0"], ["--uds", "/tmp/s"],
    ["--max-model-len=999999"], ["--max_model_len", "1"], ["--gpu-memory-utilization=0.99"],
    ["--device-memory-utilization=0.99"], ["--revision=evil"], ["--hf-token=hf_xxx"],
    ["--headless"], ["--nnodes=2"], ["-n", "2"], ["--node-rank=1"], ["-r", "1"],
    ["meta-llama/Other-Model"], ["--"], ["--enable-prefix-caching=true", "stray-positional"],
    ["--enforce-eager", "meta-llama/Other-Model"], ["--no-enable-log-requests", "other/model"],
    ["--chat-template=x\n--port=80"],
]


@pytest.mark.parametrize("args", OWNED_SPELLINGS, ids=lambda a: " ".join(a)[:40])
def test_owned_flags_are_refused_in_every_spelling(args):
    doc = _at(_doc(), "spec.model.extraArgs", ["--enable-prefix-caching", *args])
    verdict = judge(doc)
    assert verdict.model is not None and "spec.model.extraArgs" in verdict.model, verdict.model
    assert "[1]" in verdict.model or "[2]" in verdict.model
    assert not verdict.reached_pod


ALLOWED_ARGS = ["--enable-prefix-caching", "--max-num-seqs=256", "--max-num-seqs", "256", "-q", "awq", "-O3",
                "--seed", "-1", "--compilation-config.mode", "3", "--dtype=bfloat16", "--model-impl=vllm",
                "--config-format=hf", "--tokenizer-revision=main", "--code-revision", "main",
                "--enable-chunked-prefill", "--kv-cache-dtype=fp8", "--no-enable-log-requests",
                "--max-num-batched-tokens", "8192", "--hf-overrides", '{"rope_scaling": null}']


def test_ordinary_engine_flags_pass(crds):
    doc = _at(_doc(), "spec.model.extraArgs", ALLOWED_ARGS)
    assert validate_custom_resource(crds["SpeculativeDeployment"], doc) == []
    verdict = judge(doc)
    assert verdict.model is None and verdict.reached_pod


def test_the_crd_refuses_the_plain_spellings(crds):
    for args in (["--speculative_config={}"], ["--tensor-parallel-size=8"], ["-tp", "8"], ["--config", "f"],
                 ["--speculative-config.num_speculative_tokens=16"], ["--port=80"]):
        doc = _at(_doc(), "spec.model.extraArgs", args)
        problems = validate_custom_resource(crds["SpeculativeDeployment"], doc)
        assert any("engine flag specpilot owns" in p for p in problems), (args, problems)


# ----- what the cluster admin allows -----

def test_admin_allow_lists_open_exactly_what_they_name():
    doc = _doc()
    doc["spec"]["model"]["env"] = [{"name": "DB", "valueFrom": {"secretKeyRef": {"name": "weights-s3",
                                                                                 "key": "k"}}}]
    doc["spec"]["profiling"]["image"] = "registry.example.com/specpilot/bench:1.2"
    doc["spec"]["serving"]["podOverrides"] = {"runtimeClassName": "nvidia"}
    refused = judge(copy.deepcopy(doc)).model
    for field in ("spec.model.env[0].valueFrom.secretKeyRef", "spec.profiling.image",
                  "spec.serving.podOverrides.runtimeClassName"):
        assert field in refused
    policy = TenancyPolicy(allowed_secret_names=["hf-token", "weights-*"],
                           allowed_benchmark_images=["registry.example.com/specpilot/*"],
                           allowed_pod_override_fields=["runtimeClassName"])
    assert judge(copy.deepcopy(doc), policy).model is None
    doc["spec"]["profiling"]["image"] = "registry.example.com/specpilot-evil/bench:1"
    assert "spec.profiling.image" in judge(doc, policy).model


def test_what_stays_allowed_in_the_engine_container_passes():
    """The rules refuse what defeats them and nothing a team ordinarily needs: its own pull secret when the admin
    allows it, the pod's name and node by fieldRef, a ConfigMap key of its namespace, a clone of its own PVC, a
    GPU taint, a priority class of the cluster's, weights under HOME's Hugging Face cache, a built-in backend."""
    doc = _doc()
    doc["spec"]["model"]["env"] = [
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "serving-settings", "key": "mode"}}},
        {"name": "HF_HUB_CACHE", "value": "/models/hub"}, {"name": "HF_HOME", "value": "/models/hf"}]
    doc["spec"]["model"]["extraArgs"] = ["--compilation-config", '{"backend": "inductor"}']
    doc["spec"]["gpuPools"][0]["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists",
                                                  "effect": "NoSchedule"}]
    doc["spec"]["serving"]["podOverrides"] = {
        "imagePullSecrets": [{"name": "team-registry"}], "priorityClassName": "inference-high",
        "volumes": [{"name": "w", "ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadOnlyMany"], "dataSourceRef": {"kind": "PersistentVolumeClaim", "name": "weights"}}}}}],
        "containers": [{"name": "engine", "volumeMounts": [
            {"name": "w", "mountPath": "/home/specpilot/.cache/huggingface/hub"}]}]}
    policy = TenancyPolicy(allowed_secret_names=["hf-token", "team-registry"])
    verdict = judge(doc, policy)
    assert verdict.model is None and verdict.reached_pod
    admin = TenancyPolicy(allowed_pod_override_fields=["systemPriorityClasses", "tolerateControlPlaneTaints"])
    doc = _doc()
    doc["spec"]["serving"]["podOverrides"] = {
        "priorityClassName": "system-cluster-critical",
        "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists"}]}
    assert judge(copy.deepcopy(doc)).model and judge(doc, admin).model is None


def test_an_admin_prefix_must_end_at_a_separator():
    with pytest.raises(ValidationError, match="must end in '/\\*'"):
        TenancyPolicy(allowed_benchmark_images=["registry.example.com/specpilot*"])


def test_the_engine_image_allow_list():
    doc = _at(_doc(), "spec.model.image", ATTACKER_IMAGE)
    assert judge(copy.deepcopy(doc)).model is None  # any engine image by default (it runs hardened, no token)
    policy = TenancyPolicy(allowed_engine_images=["vllm/vllm-openai:*"])
    assert "spec.model.image 'evil.example.com/miner:latest' is not an engine image" in judge(doc, policy).model


def test_an_oversized_spec_is_refused():
    doc = _doc()
    doc["spec"]["serving"]["podOverrides"] = {"affinity": {"nodeAffinity": {"x": "y" * 200_000}}}
    assert "bytes as JSON, more than the 131072" in judge(doc).model


def test_the_operator_config_file_carries_the_tenancy_policy(tmp_path):
    from specpilot.config import load_config

    path = tmp_path / "config.yaml"
    path.write_text("tenancy:\n  allowedSecretNames: [hf-token, weights-s3]\n"
                    "  allowedPodOverrideFields: [runtimeClassName]\n  podSecurity: {runAsUser: 2000}\n")
    config = load_config(path)
    assert config.tenancy.allowed_secret_names == ["hf-token", "weights-s3"]
    assert config.tenancy.pod_security.run_as_user == 2000 and config.tenancy.pod_security.fs_group == 1000
    path.write_text("tenancy:\n  allowedBenchmarkImages: ['registry.example.com/team*']\n  podSecurity: {runAsUser: 0}\n")
    with pytest.raises(SystemExit) as exc:
        load_config(path)
    message = str(exc.value)
    assert "config.tenancy.allowedBenchmarkImages" in message and "config.tenancy.podSecurity.runAsUser" in message


# ----- how much of a shared pool's GPUs one deployment's profiling may hold -----

@pytest.mark.parametrize("path,value,expected", [
    ("spec.profiling.maxParallelJobsPerPool", 32,
     "spec.profiling.maxParallelJobsPerPool 32 is more benchmark Jobs at once than the operator's config allows "
     "per pool (4, tenancy.maxParallelJobsPerPool): set it to at most 4"),
    ("spec.profiling.jobDeadlineSeconds", 86400,
     "spec.profiling.jobDeadlineSeconds 86400 is longer than the operator's config lets a benchmark Job hold "
     "its GPUs (21600 s, tenancy.maxJobDeadlineSeconds): set it to at most 21600"),
], ids=["parallel-jobs", "job-deadline"])
def test_profiling_that_would_hold_a_shared_pools_gpus_is_refused(path, value, expected):
    doc = _at(_doc(), path, value)
    assert expected in judge(copy.deepcopy(doc)).model
    spec = SpeculativeDeploymentSpec.model_validate(doc["spec"])
    profile = profile_spec(spec, "H100-SXM", spec.methods[0], OperatorConfig())
    with pytest.raises(TenancyViolation, match=path.split(".")[-1]):
        benchmark_job(profile_name=profile.object_name(), namespace="team", profile_spec=profile, spec=spec,
                      pool=spec.gpu_pools[0], bench_image=BENCH_IMAGE, owner=OWNER, tenancy=TenancyPolicy())
    # the cluster admin can allow more
    policy = TenancyPolicy(max_parallel_jobs_per_pool=32, max_job_deadline_seconds=604800)
    assert judge(doc, policy).model is None
