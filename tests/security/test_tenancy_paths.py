"""The paths a hostile tenant took past the tenancy check (issue 25), each refused now with a message naming the
field and the fix, and never reaching a pod: mount paths judged as the kubelet will read them, specpilot's
container and volume names, the ServiceAccount token volume outside the bench, uids and gids as the API server
types them, variables and engine flags that load code, and volumes mounted over the Python installation."""

from __future__ import annotations

import pytest

from specpilot.api.args import code_loading_problems, extra_args_problems
from specpilot.api.tenancy import (
    BENCHMARK_POD_CONTAINERS,
    RESERVED_CONTAINER_NAMES,
    RESERVED_VOLUME_NAMES,
    SERVING_POD_CONTAINERS,
    TOKEN_VOLUME_PREFIX,
    TenancyPolicy,
)
from tests.security.test_spec_hostile_inputs import _at, _doc, judge

TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def _engine_override(pod: str, **fields) -> dict:
    """A podOverrides object that overrides the engine container of the serving or the benchmark pod."""
    return {"containers": [{"name": "engine", **fields}]}


def _refused(doc: dict, expected: str, policy: TenancyPolicy | None = None) -> str:
    verdict = judge(doc, policy)
    assert verdict.model is not None and expected in verdict.model, verdict.model
    assert not verdict.reached_pod
    return verdict.model


def _accepted(doc: dict, policy: TenancyPolicy | None = None) -> None:
    verdict = judge(doc, policy)
    assert verdict.model is None and verdict.reached_pod, verdict.model


# ----- mount paths, as the kubelet will read them -----

@pytest.mark.parametrize("path", [
    "//var/run/secrets/kubernetes.io/serviceaccount", "/var/run//secrets/kubernetes.io/serviceaccount",
    "/var/run/./secrets/kubernetes.io/serviceaccount/", "/run/secrets/kubernetes.io/serviceaccount",
    f"{TOKEN_PATH}/token", "//dev/shm", "/workload/", "//home/specpilot",
])
@pytest.mark.parametrize("pod", ["serving", "profiling"])
def test_a_mount_over_specpilots_paths_is_refused_however_the_path_is_spelled(pod, path):
    doc = _at(_doc(), f"spec.{pod}.podOverrides", {
        "volumes": [{"name": "e", "emptyDir": {}}],
        **_engine_override(pod, volumeMounts=[{"name": "e", "mountPath": path}])})
    _refused(doc, f"spec.{pod}.podOverrides.containers[0].volumeMounts[0].mountPath {path!r}")


def test_a_path_with_dot_dot_is_refused():
    doc = _at(_doc(), "spec.serving.podOverrides", {
        "volumes": [{"name": "e", "emptyDir": {}}],
        **_engine_override("serving", volumeMounts=[{"name": "e", "mountPath": "/models/../var/run/secrets"}])})
    _refused(doc, "spec.serving.podOverrides.containers[0].volumeMounts[0].mountPath '/models/../var/run/secrets' "
                  "contains '..'")


@pytest.mark.parametrize("path", [
    "/usr/lib/python3.12/site-packages", "/usr/local/lib/python3.12/dist-packages/vllm",
    "/opt/venv/lib/python3.12/site-packages/sitecustomize.py", "/models/site-packages", "/models/sitecustomize.py",
    "/models/usercustomize.py", "/data/evil.pth", "/etc/ld.so.preload", "/etc/ssl/openssl.cnf", "/usr/bin",
    "/home/specpilot/.local/lib/python3.12/site-packages", "/home/specpilot/.local", "/home/specpilot/.cache/vllm",
    "/home/specpilot/.triton/cache", "/", "/lib64", "/proc/self",
])
@pytest.mark.parametrize("pod", ["serving", "profiling"])
def test_a_config_map_over_python_or_the_system_is_refused(pod, path):
    doc = _at(_doc(), f"spec.{pod}.podOverrides", {
        "volumes": [{"name": "code", "configMap": {"name": "innocent"}}],
        **_engine_override(pod, volumeMounts=[{"name": "code", "mountPath": path}])})
    message = _refused(doc, f"spec.{pod}.podOverrides.containers[0].volumeMounts[0].mountPath {path!r}")
    assert "mount your volume elsewhere" in message


@pytest.mark.parametrize("path", ["/models", "/data/weights", "/home/specpilot/.cache/huggingface", "/mnt/cache",
                                  "/var/cache/models", "/models/llama/config.json"])
def test_ordinary_mounts_pass(path):
    doc = _at(_doc(), "spec.profiling.podOverrides", {
        "volumes": [{"name": "weights", "persistentVolumeClaim": {"claimName": "w"}}],
        **_engine_override("profiling", volumeMounts=[{"name": "weights", "mountPath": path}])})
    _accepted(doc)


# ----- specpilot's container and volume names, and the token volume -----

@pytest.mark.parametrize("name", sorted(RESERVED_CONTAINER_NAMES))
@pytest.mark.parametrize("pod", ["serving", "profiling"])
def test_an_init_container_may_not_take_a_name_specpilot_runs(pod, name):
    doc = _at(_doc(), f"spec.{pod}.podOverrides", {"initContainers": [
        {"name": name, "volumeMounts": [{"name": "kube-api-access", "mountPath": "/t"}]}]})
    policy = TenancyPolicy(allowed_pod_override_fields=["extraContainers"])
    message = _refused(doc, f"spec.{pod}.podOverrides.initContainers[0] (name {name!r}) takes the name of a "
                            f"container specpilot runs", policy)
    assert "initContainers[0].volumeMounts[0].name 'kube-api-access' is the ServiceAccount token volume" in message


def test_the_serving_pod_may_not_gain_a_container_named_bench():
    doc = _at(_doc(), "spec.serving.podOverrides", {"containers": [{"name": "bench", "image": "x"}]})
    _refused(doc, "spec.serving.podOverrides.containers[0] (name 'bench') takes the name of a container specpilot "
                  "runs", TenancyPolicy(allowed_pod_override_fields=["extraContainers"]))


@pytest.mark.parametrize("volume", ["kube-api-access", "kube-api-access-x7k2p"])
@pytest.mark.parametrize("pod", ["serving", "profiling"])
def test_the_token_volume_mounts_nowhere_but_the_bench(pod, volume):
    engine = _at(_doc(), f"spec.{pod}.podOverrides", _engine_override(pod, volumeMounts=[
        {"name": volume, "mountPath": "/models/t"}]))
    _refused(engine, f"spec.{pod}.podOverrides.containers[0].volumeMounts[0].name {volume!r} is the "
                     f"ServiceAccount token volume, which only the bench container mounts")
    # even in an extra container the admin allowed
    extra = _at(_doc(), f"spec.{pod}.podOverrides", {"containers": [
        {"name": "sidecar", "image": "busybox", "volumeMounts": [{"name": volume, "mountPath": "/t"}]}]})
    _refused(extra, "containers[0].volumeMounts[0].name", TenancyPolicy(allowed_pod_override_fields=["extraContainers"]))


@pytest.mark.parametrize("name", sorted(RESERVED_VOLUME_NAMES | {"kube-api-access"}))
def test_a_volume_may_not_take_the_name_of_specpilots(name):
    doc = _at(_doc(), "spec.profiling.podOverrides", {"volumes": [{"name": name, "configMap": {"name": "c"}}]})
    _refused(doc, f"spec.profiling.podOverrides.volumes[0].name {name!r} is the name of one of specpilot's volumes")


@pytest.mark.parametrize("name", sorted(RESERVED_VOLUME_NAMES))
def test_a_tenant_container_may_not_mount_specpilots_volumes(name):
    doc = _at(_doc(), "spec.profiling.podOverrides", _engine_override("profiling", volumeMounts=[
        {"name": name, "mountPath": "/models/x"}]))
    _refused(doc, f"spec.profiling.podOverrides.containers[0].volumeMounts[0].name {name!r} is one of specpilot's "
                  f"volumes")


def test_a_projected_service_account_token_is_refused_even_where_projected_volumes_are_allowed():
    doc = _at(_doc(), "spec.profiling.podOverrides", {"volumes": [{"name": "t", "projected": {"sources": [
        {"configMap": {"name": "c"}}, {"serviceAccountToken": {"path": "token", "audience": "vault"}}]}}]})
    _refused(doc, "spec.profiling.podOverrides.volumes[0].projected.sources[1].serviceAccountToken is not allowed")


@pytest.mark.parametrize("field,value", [("env", [{"name": "EXTRA", "value": "1"}]),
                                         ("volumeMounts", [{"name": "w", "mountPath": "/models"}]),
                                         ("securityContext", {"runAsUser": 5}), ("imagePullPolicy", "Always")])
def test_the_bench_takes_nothing_of_the_tenants_but_resources(field, value):
    doc = _at(_doc(), "spec.profiling.podOverrides", {"volumes": [{"name": "w", "emptyDir": {}}], "containers": [
        {"name": "bench", field: value}]})
    policy = TenancyPolicy(allowed_pod_override_fields=[f"containers.{field}"])  # not even when the admin allows it
    _refused(doc, f"spec.profiling.podOverrides.containers[0].{field} is not allowed: the bench container holds the "
                  f"result token", policy)
    _accepted(_at(_doc(), "spec.profiling.podOverrides", {"containers": [
        {"name": "bench", "resources": {"limits": {"memory": "8Gi"}}}]}))


# ----- uids and gids as the API server types them -----

@pytest.mark.parametrize("field,value,expected", [
    ("runAsUser", "0", "securityContext.runAsUser must be a uid written as an integer (got '0')"),
    ("runAsUser", "1000", "securityContext.runAsUser must be a uid written as an integer (got '1000')"),
    ("runAsUser", True, "securityContext.runAsUser must be a uid written as an integer (got True)"),
    ("runAsUser", 1000.0, "securityContext.runAsUser must be a uid written as an integer (got 1000.0)"),
    ("runAsUser", -1, "securityContext.runAsUser must be a uid from 1 to 2147483647 (got -1)"),
    ("runAsGroup", 0, "securityContext.runAsGroup is 0 (root)"),
    ("runAsGroup", "0", "securityContext.runAsGroup must be a gid written as an integer"),
    ("fsGroup", 0, "securityContext.fsGroup is 0 (root)"),
    ("fsGroup", "0", "securityContext.fsGroup must be a gid written as an integer"),
    ("supplementalGroups", [0], "securityContext.supplementalGroups[0] is 0 (root)"),
    ("supplementalGroups", [3000, "0"], "securityContext.supplementalGroups[1] must be a gid written as an integer"),
    ("supplementalGroups", 0, "securityContext.supplementalGroups must be a list of gids"),
    ("fsGroupChangePolicy", "Never", "securityContext.fsGroupChangePolicy must be OnRootMismatch or Always"),
])
@pytest.mark.parametrize("pod", ["serving", "profiling"])
def test_ids_are_checked_as_the_api_server_types_them(pod, field, value, expected):
    doc = _at(_doc(), f"spec.{pod}.podOverrides", {"securityContext": {field: value}})
    _refused(doc, f"spec.{pod}.podOverrides.{expected}")


def test_non_root_ids_pass():
    _accepted(_at(_doc(), "spec.serving.podOverrides", {"securityContext": {
        "runAsUser": 4242, "runAsGroup": 4242, "fsGroup": 2000, "supplementalGroups": [3000],
        "fsGroupChangePolicy": "Always"}}))


# ----- variables that load code -----

CODE_LOADING_ENV = ["OPENSSL_CONF", "OPENSSL_MODULES", "GCONV_PATH", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT",
                    "LD_DEBUG_OUTPUT", "PYTHONPATH", "PYTHONSTARTUP", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONWARNINGS",
                    "PYTHONBREAKPOINT", "PYTHONPLATLIBDIR", "PYTHONSOMETHINGNEW", "VLLM_ALLOW_RUNTIME_LORA_UPDATING",
                    "VLLM_LOGGING_CONFIG_PATH", "CUDA_INJECTION64_PATH", "NCCL_NET_PLUGIN", "TRITON_CACHE_DIR",
                    "GLIBC_TUNABLES", "BASH_ENV"]


@pytest.mark.parametrize("name", CODE_LOADING_ENV)
def test_a_variable_that_loads_code_is_refused(name):
    doc = _at(_doc(), "spec.model.env", [{"name": name, "value": "/models/x"}])
    _refused(doc, f"spec.model.env[0].name {name!r} is not allowed")
    doc = _at(_doc(), "spec.profiling.podOverrides", _engine_override("profiling", env=[{"name": name, "value": "1"}]))
    _refused(doc, f"spec.profiling.podOverrides.containers[0].env[0].name {name!r} is not allowed")


def test_ordinary_variables_pass():
    _accepted(_at(_doc(), "spec.model.env", [{"name": n, "value": "1"} for n in (
        "PYTHONUNBUFFERED", "PYTHONHASHSEED", "VLLM_LOGGING_LEVEL", "HF_HOME", "NCCL_DEBUG", "OMP_NUM_THREADS")]))


# ----- engine flags that import code -----

CODE_LOADING_SPELLINGS = [
    ["--tool-parser-plugin", "/models/p.py"], ["--tool_parser_plugin=/models/p.py"], ["--tool-parser-p", "/m/p.py"],
    ["--reasoning-parser-plugin=/models/r.py"], ["--middleware", "evil.app"], ["--middleware=evil.app"],
    ["--midd", "evil.app"], ["--worker-extension-cls", "evil.Ext"], ["--worker_extension_cls=evil.Ext"],
    ["--worker-ext", "evil.Ext"], ["--worker-cls=evil.W"], ["--scheduler-cls", "evil.S"],
    ["--logits-processors", "evil.LP"], ["--logits_processors=evil.LP"], ["--logits-p", "evil.LP"],
    ["--model-class-overrides", '{"LlamaForCausalLM": "evil:M"}'], ["--log-config-file=/models/log.json"],
    ["--logging-config.pylogging_config_file=/models/log.json"],
    ["--distributed-executor-backend", "evil.Executor"], ["--distributed_executor_backend=evil.Executor"],
    ["--distributed-exec", "evil.Executor"],
    ["--kv-transfer-config", '{"kv_connector": "Evil", "kv_connector_module_path": "evil"}'],
    ["--kv-transfer-config.kv_connector_module_path=evil"], ["--kv_transfer_config.kv_connector_module_path", "evil"],
    ["--kv-transfer-config=@/models/kv.json"], ["--ec-transfer-config", '{"ec_connector_module_path": "evil"}'],
    ["--compilation-config", '{"backend": "evil.compile"}'], ["-cc", '{"inductor_passes": {"p": "evil.f"}}'],
    ["-cc.backend=evil.compile"], ["--compilation-config.backend", "evil.compile"],
]


@pytest.mark.parametrize("args", CODE_LOADING_SPELLINGS, ids=lambda a: " ".join(a)[:50])
def test_engine_flags_that_import_code_are_refused_in_every_spelling(args):
    doc = _at(_doc(), "spec.model.extraArgs", ["--enable-prefix-caching", *args])
    message = _refused(doc, "spec.model.extraArgs[1]")
    assert "makes the engine import code" in message, message


ORDINARY_ARGS = ["--reasoning-parser", "deepseek_r1", "--tool-call-parser", "hermes", "--enable-auto-tool-choice",
                 "--distributed-executor-backend", "mp", "--kv-transfer-config",
                 '{"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}', "--compilation-config.mode", "3",
                 "-cc", '{"cudagraph_capture_sizes": [1, 2, 4]}']


def test_engine_flags_that_import_nothing_pass():
    assert code_loading_problems(ORDINARY_ARGS) == [] and extra_args_problems(ORDINARY_ARGS) == []
    _accepted(_at(_doc(), "spec.model.extraArgs", ORDINARY_ARGS))


# ----- the names the tenancy check reserves are the ones the builders use -----

def _built_pods() -> list[tuple[str, dict]]:
    from specpilot.config import OperatorConfig
    from specpilot.policy.needs import profile_spec
    from specpilot.manifests.benchmark import benchmark_job
    from specpilot.manifests.serving import serving_deployment
    from specpilot.api import SpeculativeDeploymentSpec
    from tests.security.test_spec_hostile_inputs import BENCH_IMAGE, OWNER

    doc = _doc()
    doc["spec"]["profiling"]["workload"] = {"name": "custom", "file": {"name": "prompts", "key": "p.jsonl"}}
    spec = SpeculativeDeploymentSpec.model_validate(doc["spec"])
    pool = spec.gpu_pools[0]
    serving = serving_deployment(sdep_name="x", namespace="team", uid="u", spec=spec, pool=pool,
                                 method=spec.methods[0], replicas=1)
    profile = profile_spec(spec, "H100-SXM", spec.methods[0], OperatorConfig())
    job = benchmark_job(profile_name=profile.object_name(), namespace="team", profile_spec=profile, spec=spec,
                        pool=pool, bench_image=BENCH_IMAGE, owner=OWNER, result_token="t")
    return [("serving", serving["spec"]["template"]["spec"]), ("profiling", job["spec"]["template"]["spec"])]


def test_the_reserved_names_are_the_builders_names():
    from specpilot.manifests import names

    assert RESERVED_CONTAINER_NAMES == names.OWNED_CONTAINER_NAMES
    for pod, spec in _built_pods():
        layout = SERVING_POD_CONTAINERS if pod == "serving" else BENCHMARK_POD_CONTAINERS
        for field in ("containers", "initContainers"):
            built = {c["name"] for c in spec.get(field) or []}
            assert built <= RESERVED_CONTAINER_NAMES, (pod, field, built)
            # a container a tenant may override is where the builder puts it
            assert set(layout[field]) <= built, (pod, field, built)
        for volume in spec.get("volumes") or []:
            assert volume["name"] in RESERVED_VOLUME_NAMES or volume["name"].startswith(TOKEN_VOLUME_PREFIX), volume


def test_only_the_bench_mounts_the_token_in_a_built_pod():
    for pod, spec in _built_pods():
        holders = [c["name"] for field in ("containers", "initContainers") for c in spec.get(field) or []
                   if any(m["name"].startswith(TOKEN_VOLUME_PREFIX) for m in c.get("volumeMounts") or [])]
        assert holders == ([] if pod == "serving" else ["bench"]), (pod, holders)

