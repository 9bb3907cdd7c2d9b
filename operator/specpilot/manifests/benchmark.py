"""The benchmark Job that measures one SpeculationProfile on one GPU pool.

One pod, two containers, one trust boundary (docs/security.md):
- `engine` runs the profile's engine image with the tenant's environment, mounts and resources, the GPUs, and
  no token of any kind. Its process is the engine supervisor (specpilot_bench/supervisor.py, copied into a
  shared emptyDir by the `supervisor-install` init container from the benchmark image), which starts the
  engine for each run (baseline, or K=1 and the method's K) with the command line and the per-k
  `--speculative-config` the operator wrote into its arguments.
- `bench` runs `specpilot-bench` from the operator's benchmark image. It alone mounts the ServiceAccount
  token (a projected volume; the pod does not automount one) and carries the result token; it takes no
  tenant environment, volumes or mounts, asks the supervisor over loopback for each run's engine, and
  measures the engine over loopback with its own clock. When it is done it tells the supervisor, which stops
  the engine and exits, so the pod completes (a bench that died without saying so stops calling, and the
  supervisor gives up after --idle-exit-s).
No shared process namespace: the engine cannot read the bench's environment or memory. (`specpilot-bench
--engine-url` still measures an engine that is already running, by hand; `--launch` starts it itself.)

`bench_args` is the single list of flags the operator passes to `specpilot-bench`; a unit test parses
every Job's arguments with the bench's own parser, so the two cannot drift apart silently.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from ..api import seal
from ..api.deployment_spec import MAX_CONCURRENCY_LEVEL, GpuPool, ModelSpec, SpeculativeDeploymentSpec, WorkloadName
from ..api.profile import SpeculationProfileSpec
from ..api import tenancy
from ..api.tenancy import TenancyPolicy, profiling_problems, refuse, serving_problems
from . import names
from .engine import (
    ENGINE_COMMAND,
    MODEL_FLAG,
    SPECULATIVE_CONFIG_FLAG,
    engine_env,
    model_engine_args,
    speculative_config_json,
)
from .merge import deep_merge
from .pod import (
    STARTUP_BUDGET_SECONDS,
    TOKEN_VOLUME,
    dshm_mount,
    dshm_volume,
    gpu_resources,
    harden,
    home_mount,
    home_volume,
    identity_env,
    owner_reference,
    pool_placement,
    restore_container,
    restore_placement,
    token_mount,
    token_volume,
    with_identity_env,
)

BENCH_COMMAND = ["specpilot-bench"]
BENCH_CONTAINER = names.BENCH_CONTAINER
ENGINE_CONTAINER = names.ENGINE_CONTAINER
SUPERVISOR_INSTALL_CONTAINER = names.SUPERVISOR_INSTALL_CONTAINER
SUPERVISOR_VOLUME = "engine-supervisor"
SUPERVISOR_DIR = tenancy.SUPERVISOR_DIR
SUPERVISOR_SCRIPT = f"{SUPERVISOR_DIR}/supervisor.py"
SUPERVISOR_PORT = 8090
"""Loopback port of the engine supervisor's control endpoint (the bench's --supervisor-url)."""
ENGINE_HOST = "127.0.0.1"
"""The benchmark engine and its supervisor listen on the pod's loopback only: the bench is their one client."""
BENCH_HOME_VOLUME = "bench-home"
WORKLOAD_VOLUME = "workload"
WORKLOAD_DIR = "/workload"
WORKLOAD_FILE_NAME = "prompts.jsonl"
WORKLOAD_FILE = f"{WORKLOAD_DIR}/{WORKLOAD_FILE_NAME}"
TTL_SECONDS_AFTER_FINISHED = 86400
"""Finished Jobs stay a day for `kubectl logs`; the results are in the profile's status."""
TERMINATION_MESSAGE = {"terminationMessagePath": "/dev/termination-log",
                       "terminationMessagePolicy": "FallbackToLogsOnError"}
"""On every container of the pod: the kubelet records in the pod's status what the container wrote to
/dev/termination-log (the bench its error line, the supervisor the engine's last log lines), or the end of
its log when it failed without writing one, so the operator can say why a Job failed without reading logs
(`policy.job_failure`)."""
def bench_engine_model(spec: SpeculativeDeploymentSpec, profile_spec: SpeculationProfileSpec) -> ModelSpec:
    """The engine a profile measures: the profile's identity (model, revision, TP, context, image) with the
    deployment's other settings (served name, token). Extra args, env, resources and memory share come from
    the profile when it records them (they are part of its identity), else from the deployment. One
    data-parallel rank: a profile measures one engine."""
    update: dict = {
        "id": profile_spec.model.id,
        "revision": profile_spec.model.revision,
        "tensor_parallel_size": profile_spec.model.tensor_parallel_size,
        "max_model_len": profile_spec.model.max_model_len,
        "data_parallel_size": 1,
        "image": profile_spec.engine_image,
    }
    engine = profile_spec.engine
    if engine is not None:
        update.update(extra_args=list(engine.extra_args), env=list(engine.env), resources=engine.resources)
        if engine.gpu_memory_utilization is not None:
            update["gpu_memory_utilization"] = engine.gpu_memory_utilization
    return spec.model.model_copy(update=update)


def bench_args(*, profile_name: str, namespace: str, profile_spec: SpeculationProfileSpec, port: int) -> list[str]:
    """Arguments of `specpilot-bench` for one Job (its parser: `specpilot_bench.cli.build_parser`).

    With --profile-name the bench reads what to measure from the profile itself; the flags that
    describe the measurement are passed too, so a Job's command line says what it measures. The engine is
    the engine container's (--supervisor-url on the pod's loopback, serving at --engine-port `port`); the
    bench has no GPU, so it calibrates nothing (--no-calibration). Options with a None value are left out.
    """
    workload = profile_spec.workload
    method_config = speculative_config_json(profile_spec.method)
    target = profile_spec.model
    options: list[tuple[str, str | bool | None]] = [
        ("--profile-name", profile_name),
        ("--namespace", namespace),
        ("--job-name", names.bench_job_name(profile_name)),
        ("--supervisor-url", f"http://{ENGINE_HOST}:{SUPERVISOR_PORT}"),
        ("--engine-port", str(port)),
        ("--no-calibration", True),
        (MODEL_FLAG, target.id),
        (SPECULATIVE_CONFIG_FLAG, method_config),
        ("--tensor-parallel-size", str(target.tensor_parallel_size)),
        ("--max-model-len", None if target.max_model_len is None else str(target.max_model_len)),
        ("--levels", ",".join(str(c) for c in profile_spec.concurrency_levels)),
        ("--requests-per-level", str(profile_spec.requests_per_level)),
        ("--workload", WorkloadName(workload.name).value),
        ("--workload-file", WORKLOAD_FILE if workload.file else None),
        ("--input-len", None if workload.input_len is None else str(workload.input_len)),
        ("--output-len", str(workload.output_len)),
        ("--temperature", str(workload.temperature)),
        ("--seed", str(workload.seed)),
        ("--sku", profile_spec.sku),
        ("--engine-image", profile_spec.engine_image),
        ("--engine-start-timeout", str(STARTUP_BUDGET_SECONDS)),
    ]
    args: list[str] = []
    for flag, value in options:
        if value is True:
            args.append(flag)
        elif value is not None:
            args += [flag, value]
    return args


def supervisor_args(profile_spec: SpeculationProfileSpec, engine_model: ModelSpec, port: int,
                    home_dir: str) -> list[str]:
    """Arguments of the engine supervisor (specpilot_bench/supervisor.py): its loopback control address, the
    `--speculative-config` of every k a run of this profile may ask for (1..K: a refinement round may measure
    any of them), and after `--` the engine's command line, which is the profile's engine on the pod's
    loopback without speculation (the supervisor adds the run's config)."""
    args = ["--listen", f"{ENGINE_HOST}:{SUPERVISOR_PORT}", "--log-dir", f"{home_dir}/engine-logs"]
    method = profile_spec.method
    for k in range(1, (method.num_speculative_tokens if method else 0) + 1):
        args += ["--config-for-k", f"{k}={speculative_config_json(method, k)}"]
    engine = model_engine_args(engine_model, method=None, port=port)
    return [*args, "--", *ENGINE_COMMAND, *engine, "--host", ENGINE_HOST]


@dataclasses.dataclass(frozen=True)
class RefineRun:
    """One Job of a refinement round (`policy.refine.RefineJob.run`): it re-measures some levels of a profile
    that is already measured, `levels` (default: the profile's), only at `ks` (default: every run the profile
    has), `repeat` times each, and with `append` adds the points to the profile's stored runs (`specpilot-bench
    --levels --ks --repeat --append`). `part` tells apart the Jobs of one profile in one round (runs asking for
    different levels or repeats)."""

    round: int
    """The round, from 1."""
    levels: Sequence[int] | None = None
    ks: Sequence[int] | None = None
    repeat: int = 1
    append: bool = True
    part: int | None = None


def benchmark_job(*, profile_name: str, namespace: str, profile_spec: SpeculationProfileSpec,
                  spec: SpeculativeDeploymentSpec, pool: GpuPool, bench_image: str, owner: dict[str, str],
                  sdep_name: str | None = None, tenancy: TenancyPolicy | None = None, refine: RefineRun | None = None,
                  result_token: str | None = None) -> dict[str, Any]:
    """batch/v1 Job measuring `profile_spec` on `pool`, owned by the SpeculationProfile `owner`
    (apiVersion, kind, name, uid) so it is collected with it. `sdep_name`, when given, labels the Job with
    the SpeculativeDeployment that asked for it. `bench_image` is the operator's benchmark image;
    spec.profiling.image replaces it when the policy allows that image. The pod runs as `tenancy` (the operator
    config's policy; its defaults when None) allows, with the ServiceAccount token mounted into the bench
    container only; a spec it refuses raises TenancyViolation.

    A refinement round's Job (`refine`, see `RefineRun`) is named `names.refine_job_name(profile_name, round,
    part)` and labelled with the round, so it never collides with the profile's benchmark Job or an earlier
    round.

    `result_token` (api.seal.job_token) goes into the bench container's environment only: the benchmark
    seals its results with it, and the operator uses no result without a matching seal."""
    if refine is not None:
        _check_refinement(profile_spec, refine)
    policy = tenancy or TenancyPolicy()
    refuse(serving_problems(spec, policy) + profiling_problems(spec, policy, benchmark_image=bench_image))
    bench_image = spec.profiling.image or bench_image
    security = policy.pod_security
    model = bench_engine_model(spec, profile_spec)
    port = spec.serving.port
    gpu_count = model.tensor_parallel_size
    args = bench_args(profile_name=profile_name, namespace=namespace, profile_spec=profile_spec, port=port)
    job_name = names.bench_job_name(profile_name)
    if refine is not None:
        job_name = names.refine_job_name(profile_name, refine.round, refine.part)
        args = _refinement_args(args, job_name, refine)

    # The bench: the operator's image, the tokens, nothing of the tenant's.
    bench_env = [*identity_env(security), {"name": "POD_NAMESPACE", "value": namespace}]
    if result_token:
        bench_env.append({"name": seal.TOKEN_ENV, "value": result_token})
    bench_mounts = [{"name": BENCH_HOME_VOLUME, "mountPath": security.home_dir}, token_mount()]
    volumes = [dshm_volume(), home_volume(), {"name": BENCH_HOME_VOLUME, "emptyDir": {}}, token_volume(),
               {"name": SUPERVISOR_VOLUME, "emptyDir": {}}]
    workload_file = profile_spec.workload.file
    if workload_file is not None:
        volumes.append({"name": WORKLOAD_VOLUME, "configMap": {
            "name": workload_file.name, "items": [{"key": workload_file.key, "path": WORKLOAD_FILE_NAME}]}})
        bench_mounts.append({"name": WORKLOAD_VOLUME, "mountPath": WORKLOAD_DIR, "readOnly": True})
    owned_bench = {"name": BENCH_CONTAINER, "image": bench_image, "command": list(BENCH_COMMAND), "args": args,
                   "env": bench_env, "volumeMounts": bench_mounts, **TERMINATION_MESSAGE}

    # The engine: the profile's engine image under the supervisor, the tenant's env and mounts, the GPUs, no token.
    owned_engine = {"name": ENGINE_CONTAINER, "image": model.image,
                    "command": ["python3", SUPERVISOR_SCRIPT],
                    "args": supervisor_args(profile_spec, model, port, security.home_dir), **TERMINATION_MESSAGE}
    engine: dict[str, Any] = {**owned_engine, "env": with_identity_env(engine_env(model), security),
                              "volumeMounts": [dshm_mount(), home_mount(security),
                                               {"name": SUPERVISOR_VOLUME, "mountPath": SUPERVISOR_DIR,
                                                "readOnly": True}],
                              "resources": gpu_resources(model.resources, pool.gpu_resource_name, gpu_count)}
    install = {"name": SUPERVISOR_INSTALL_CONTAINER, "image": bench_image, "command": ["python3", "-c", (
        "import shutil, specpilot_bench.supervisor as s; shutil.copyfile(s.__file__, "
        f"{SUPERVISOR_SCRIPT!r})")], "volumeMounts": [{"name": SUPERVISOR_VOLUME, "mountPath": SUPERVISOR_DIR}],
        **TERMINATION_MESSAGE}

    pod_spec: dict[str, Any] = {
        "serviceAccountName": names.BENCH_SERVICE_ACCOUNT,
        # The token is mounted into the bench container only (token_volume).
        "automountServiceAccountToken": False,
        "restartPolicy": "Never",
        "enableServiceLinks": False,
        **pool_placement(pool),
        "volumes": volumes,
        "initContainers": [install],
        "containers": [{**owned_bench, "resources": {}}, engine],
    }

    pod_spec = deep_merge(pod_spec, spec.profiling.pod_overrides)
    pod_spec["serviceAccountName"] = names.BENCH_SERVICE_ACCOUNT
    pod_spec["automountServiceAccountToken"] = False
    pod_spec["enableServiceLinks"] = False
    pod_spec["restartPolicy"] = "Never"
    pod_spec.pop("shareProcessNamespace", None)
    restore_container(pod_spec, owned_bench)
    restore_container(pod_spec, install, field="initContainers")
    restore_container(pod_spec, owned_engine, gpu_resource_name=pool.gpu_resource_name, gpu_count=gpu_count)
    _keep_tokens_in_bench(pod_spec)
    restore_placement(pod_spec, pool)
    harden(pod_spec, policy)

    labels = names.bench_labels(profile_name, pool.name, sdep_name)
    if refine is not None:
        labels[names.LABEL_REFINE_ROUND] = str(refine.round)
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name,
            "namespace": namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(api_version=owner["apiVersion"], kind=owner["kind"],
                                                name=owner["name"], uid=owner["uid"])],
        },
        "spec": {
            "activeDeadlineSeconds": spec.profiling.job_deadline_seconds,
            "backoffLimit": spec.profiling.backoff_limit,
            "ttlSecondsAfterFinished": TTL_SECONDS_AFTER_FINISHED,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }


def _keep_tokens_in_bench(pod_spec: dict[str, Any]) -> None:
    """After the tenant's overrides: the supervisor install runs last among the init containers (after any of
    the tenant's), and no container but the bench mounts the ServiceAccount token volume or carries the result
    token, whatever the overrides said."""
    init = pod_spec.get("initContainers") or []
    pod_spec["initContainers"] = sorted(init, key=lambda c: c.get("name") == SUPERVISOR_INSTALL_CONTAINER)
    for field in ("containers", "initContainers"):
        for container in pod_spec.get(field) or []:
            if container.get("name") == BENCH_CONTAINER and field == "containers":
                continue
            container["volumeMounts"] = [m for m in container.get("volumeMounts") or []
                                         if m.get("name") != TOKEN_VOLUME]
            container["env"] = [e for e in container.get("env") or [] if e.get("name") != seal.TOKEN_ENV]


def _check_refinement(profile_spec: SpeculationProfileSpec, run: RefineRun) -> None:
    if run.round < 1:
        raise ValueError(f"the refinement round counts from 1 (got {run.round})")
    if run.part is not None and run.part < 1:
        raise ValueError(f"the part numbers the Jobs of one refinement round from 1 (got {run.part})")
    levels = run.levels
    if levels is not None and (not levels or not all(isinstance(c, int) and 1 <= c <= MAX_CONCURRENCY_LEVEL
                                                     for c in levels)):
        raise ValueError(f"levels must be concurrencies in 1..{MAX_CONCURRENCY_LEVEL} (got {list(levels)[:32]})")
    if run.repeat < 1:
        raise ValueError(f"repeat must be at least 1 (got {run.repeat})")
    top = profile_spec.method.num_speculative_tokens if profile_spec.method else 0
    if run.ks is not None and (not run.ks or min(run.ks) < 0 or max(run.ks) > top):
        raise ValueError(f"ks must lie in 0..{top} for this profile (got {list(run.ks)})")


def _refinement_args(args: list[str], job_name: str, run: RefineRun) -> list[str]:
    """`args` of the profile's benchmark Job turned into a refinement round's: its own --job-name, the levels
    to measure in place of the profile's, and --ks / --repeat / --append."""
    out = list(args)
    out[out.index("--job-name") + 1] = job_name
    levels, ks, repeat, append = run.levels, run.ks, run.repeat, run.append
    if levels is not None:
        out[out.index("--levels") + 1] = ",".join(str(c) for c in sorted(set(levels)))
    extra: list[str] = []
    if ks is not None:
        extra += ["--ks", ",".join(str(k) for k in sorted(set(ks)))]
    if repeat != 1:
        extra += ["--repeat", str(repeat)]
    if append:
        extra.append("--append")
    return out + extra
