"""The sandbox's kubelet and workload controllers: run what the operator creates as local processes.

For every benchmark Job it runs the pod's two containers as two processes, each with its own environment
as the containers have: the `engine` container's supervisor (its own arguments, with the simulated engine
`specpilot_sandbox.engine` of the GPU type the Job's node selector lands on in place of vLLM's server) and
the `bench` container's `specpilot-bench` command line, which alone gets the result token. Both listen and
connect on the Job's own loopback address (its "pod IP"), so Jobs never collide on the pod's fixed ports. The
engine runs on a virtual clock the bench's load generator reads too (`sandbox.clock`), so a profile holds
the twin's figures however slow or busy the host is. It reports each Job's outcome in its status with the Job controller's
retry-and-give-up behaviour. For every serving Deployment it runs one simulated engine per replica with the
pod's own engine arguments, each on its own loopback address (its "pod IP") and its own virtual clock
(`clock_file`: the demo's clients time their requests with the clock of the replica they went to, so what
they measure is the simulated GPU's time, as the profiles are), publishes Pod objects (Ready once the
engine answers, with the engine container's ports) that the operator scrapes and Services and InferencePools
select, rolls pods on a template change by the Deployment's maxSurge and maxUnavailable (by default a new pod
ready before an old one stops), and keeps the Deployment's status as the Deployment controller would.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import random
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from specpilot.api import seal
from specpilot.manifests.names import ANNOTATION_ENGINE_CONFIG as ENGINE_CONFIG_ANNOTATION
from specpilot.manifests.names import BENCH_CONTAINER, ENGINE_CONTAINER
from specpilot.perf.catalog import DEFAULT_CATALOG, UnknownGpuError

from .apiserver import SandboxApiServer
from .clock import CLOCK_FILE_ENV

log = logging.getLogger("specpilot_sandbox.kubelet")

ENGINE_MODULE = "specpilot_sandbox.engine"


@dataclass
class SimSettings:
    """How the simulated GPUs behave."""

    time_scale: float = 2.0
    """Simulated seconds per wall second. Keep the scaled step time well above the engine's own Python work
    per step (~1 ms at 128 requests on a shared core), or the engines measure the CPU, not the twin."""
    startup_delay_s: float = 4.0
    """Simulated model-load time of an engine."""
    workload: str = "sharegpt"
    """Acceptance priors of the simulated engines."""


@dataclass
class PodProcess:
    name: str
    ip: str
    port: int
    template: str
    process: subprocess.Popen
    clock: Path | None = None
    """The file the pod's engine publishes its virtual clock in."""
    ready: bool = False
    stopping: bool = False


UNPULLABLE_REGISTRY_SUFFIX = ".invalid"
"""An image whose registry host ends so (RFC 2606's reserved top-level domain, e.g. `registry.invalid/vllm:1`)
cannot be pulled here: its container waits in ErrImagePull, then ImagePullBackOff, and nothing runs, until the
Job's activeDeadlineSeconds, as in a cluster whose registry refuses it."""
ENGINE_MEMORY_BYTES = 1 << 30
"""What the simulated engine takes once it loads its model: an engine container with a lower memory limit is
OOMKilled (exit 137) as it does, as the kernel's OOM killer would kill a real one."""
FALLBACK_LOG_LINES, FALLBACK_LOG_BYTES = 80, 2048
"""What the kubelet keeps of a failed container's log as its message (terminationMessagePolicy
FallbackToLogsOnError) when it wrote no termination message."""


@dataclass
class JobRun:
    name: str
    process: subprocess.Popen | None
    failures: int = 0
    retry_at: float = 0.0
    done: bool = False
    started_at: float = 0.0
    """When the Job started (loop time): its activeDeadlineSeconds counts from here, across retries."""
    pod: str | None = None
    """The name of its current (or last) pod's Pod object."""
    log_offsets: dict[str, int] = field(default_factory=dict)
    """Container -> where its log file stood when the current pod started (its log is what follows)."""
    unpullable: str | None = None
    """The image of its pod that cannot be pulled: nothing runs."""
    pull_checks: int = 0
    oom_killed: bool = False
    """The engine container was OOMKilled in the current pod."""
    engine_memory: int | None = None
    """The engine container's memory limit in bytes (None: none)."""
    engine_starts: int = 0
    """Engine logs its supervisor had written when the current pod started (a new one: an engine starts)."""


@dataclass
class Kubelet:
    api: SandboxApiServer
    kubeconfig: Path
    workdir: Path
    sim: SimSettings = field(default_factory=SimSettings)
    pods: dict[str, list[PodProcess]] = field(default_factory=dict)
    jobs: dict[str, JobRun] = field(default_factory=dict)
    job_engines: dict[str, subprocess.Popen] = field(default_factory=dict)
    """Job name -> its engine container's process (the supervisor, and the engine it starts)."""
    # Pod IPs are loopback addresses; start each kubelet at a random one so two sandboxes never collide.
    _ips: itertools.count = field(default_factory=lambda: itertools.count(random.randrange(1_000_000)))

    def _next_ip(self) -> str:
        n = next(self._ips)
        return f"127.{20 + n // 62_500 % 200}.{n // 250 % 250}.{n % 250 + 2}"

    def _sku_for(self, node_selector: dict[str, str]) -> str:
        for node in self.api.objects("nodes"):
            labels = node["metadata"].get("labels") or {}
            if all(labels.get(k) == v for k, v in node_selector.items()):
                product = labels.get("nvidia.com/gpu.product") or labels.get("amd.com/gpu.product-name") or ""
                try:
                    return DEFAULT_CATALOG.resolve(product).sku
                except UnknownGpuError:
                    return product
        return "H100-SXM"

    def _sim_args(self, sku: str) -> list[str]:
        return [f"--sku={sku}", f"--time-scale={self.sim.time_scale:g}",
                f"--startup-delay-s={self.sim.startup_delay_s:g}", f"--workload={self.sim.workload}"]

    def _spawn(self, command: list[str], log_name: str, **extra_env: str) -> subprocess.Popen:
        log_file = (self.workdir / log_name).open("ab")
        # The bench's own load generator: importing vLLM's costs seconds and a GiB per Job, for nothing here.
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SPECPILOT_BENCH_DISABLE_VLLM": "1", **extra_env}
        env.pop("KUBERNETES_SERVICE_HOST", None)
        return subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                                cwd=self.workdir, start_new_session=True)

    async def run(self, stop: asyncio.Event, interval_s: float = 0.3) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
            while not stop.is_set():
                await self._sync_jobs()
                await self._sync_deployments(session)
                await asyncio.sleep(interval_s)

    # ----- Jobs -----

    def _job_containers(self, job: dict, ip: str) -> tuple[list[str], list[str]]:
        """The command lines of a benchmark pod's bench and engine containers as local processes on `ip`."""
        pod = job["spec"]["template"]["spec"]
        containers = {c.get("name"): c for c in pod.get("containers") or []}
        bench = containers[BENCH_CONTAINER]
        bench_args = list(bench.get("args", []))
        supervisor_url = _flag(bench_args, "--supervisor-url")
        if supervisor_url is not None:
            bench_args = _with_flag(bench_args, "--supervisor-url", _on_host(supervisor_url, ip))
        name = job["metadata"]["name"]
        bench_command = [sys.executable, "-m", "specpilot_bench", *bench_args,
                         "--kubeconfig", str(self.kubeconfig), "--no-calibration",
                         "--log-dir", str(self.workdir / "bench-logs"),
                         "--termination-log", str(self._termination_path(name, BENCH_CONTAINER))]
        engine = containers.get(ENGINE_CONTAINER)
        if engine is None:
            return bench_command, []
        args = list(engine.get("args", []))
        split = args.index("--")
        supervisor, command = args[:split], args[split + 1:]
        listen = _flag(supervisor, "--listen") or "127.0.0.1:8090"
        supervisor = _with_flag(_with_flag(supervisor, "--listen", f"{ip}:{listen.rpartition(':')[2]}"),
                                "--log-dir", str(self.workdir / "engine-logs" / name))
        supervisor = _with_flag(supervisor, "--termination-log", str(self._termination_path(name, ENGINE_CONTAINER)))
        # vLLM's server (`python3 -m vllm.entrypoints.openai.api_server`) becomes the simulated GPU
        module_at = command.index("-m") + 2 if "-m" in command else 1
        engine_args = _with_flag(command[module_at:], "--host", ip)
        sku = self._sku_for(pod.get("nodeSelector") or {})
        engine_command = [sys.executable, "-m", "specpilot_bench", "engine-supervisor", *supervisor, "--",
                          sys.executable, "-m", ENGINE_MODULE, *engine_args, *self._sim_args(sku)]
        return bench_command, engine_command

    def _termination_path(self, job_name: str, container: str, fresh: bool = True) -> Path:
        """The container's termination message file (its /dev/termination-log); `fresh`: created empty, as the
        kubelet creates it before the container starts."""
        folder = self.workdir / "termination"
        folder.mkdir(exist_ok=True)
        path = folder / f"{job_name}-{container}"
        if fresh:
            path.write_bytes(b"")
        return path

    def _clock_path(self, name: str) -> Path:
        clocks = self.workdir / "clocks"
        clocks.mkdir(exist_ok=True)
        return clocks / name

    def _spawn_job(self, job: dict) -> subprocess.Popen:
        """Start the Job's pod: the engine container's process, then the bench's; returns the bench's."""
        name = job["metadata"]["name"]
        clock = {CLOCK_FILE_ENV: str(self._clock_path(f"{name}.clock"))}
        bench_command, engine_command = self._job_containers(job, self._next_ip())
        if engine_command:
            _stop(self.job_engines.pop(name, None))
            self.job_engines[name] = self._spawn(engine_command, f"job-{name}-engine.log", **clock)
        # Of the bench container's environment only the result token is passed on (the rest points at
        # cluster paths); with it the bench seals its results as in a cluster. The engine never gets it.
        token = seal.token_of(job)
        return self._spawn(bench_command, f"job-{name}.log", **clock, **({seal.TOKEN_ENV: token} if token else {}))

    def _stop_job(self, name: str, run: JobRun) -> None:
        _stop(run.process)
        _stop(self.job_engines.get(name))

    async def _sync_jobs(self) -> None:
        loop = asyncio.get_running_loop()
        live = {j["metadata"]["name"]: j for j in self.api.objects("jobs")}
        for name, run in list(self.jobs.items()):
            if name not in live:
                self._stop_job(name, run)
                del self.jobs[name]
        for name, job in live.items():
            run = self.jobs.get(name)
            if run is None and not (job.get("status") or {}).get("conditions"):
                run = self.jobs[name] = JobRun(name, None, started_at=loop.time())
                await self._start_pod(job, run)
                await self._patch_job(job, {"active": 1, "ready": 0 if run.process is None else 1,
                                            "startTime": _now()})
                continue
            if run is None or run.done:
                continue
            deadline = job["spec"].get("activeDeadlineSeconds")
            if deadline is not None and loop.time() - run.started_at > float(deadline) / self.sim.time_scale:
                # As the Job controller: past activeDeadlineSeconds (simulated time) the running pod is
                # terminated and deleted, and the Job fails for good, whatever retries it had left.
                self._stop_job(name, run)  # kept in the run: shutdown() waits for it to exit
                run.done = True
                if run.process is not None or run.unpullable:
                    await self._delete_job_pod(job, run)
                await self._patch_job(job, {"active": 0, "ready": 0, "failed": run.failures + 1, "conditions": [
                    {"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                     "message": "Job was active longer than specified deadline"}]})
                continue
            if run.unpullable:
                await self._pull_back_off(job, run)
                continue
            if run.process is None:
                if loop.time() >= run.retry_at:
                    await self._start_pod(job, run)
                    await self._patch_job(job, {"active": 1, "ready": 0 if run.process is None else 1})
                continue
            self._kill_if_out_of_memory(name, run)
            code = run.process.poll()
            if code is None:
                continue
            run.process = None
            # The bench told the supervisor it is done; a supervisor left behind goes with the pod.
            engine = self.job_engines.pop(name, None)
            _wait(engine, timeout_s=5)
            await self._finish_pod(job, run, code, None if engine is None else engine.returncode)
            if code == 0:
                run.done = True
                await self._patch_job(job, {"active": 0, "ready": 0, "succeeded": 1, "completionTime": _now(),
                                            "conditions": [{"type": "Complete", "status": "True",
                                                            "reason": "Completed"}]})
                continue
            run.failures += 1
            limit = int(job["spec"].get("backoffLimit", 6))
            if run.failures > limit:
                run.done = True
                await self._patch_job(job, {"active": 0, "ready": 0, "failed": run.failures, "conditions": [
                    {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
                     "message": "Job has reached the specified backoff limit"}]})
            else:
                # The Job controller's back-off (10 s, doubling), in simulated time.
                run.retry_at = loop.time() + 10 * 2 ** (run.failures - 1) / self.sim.time_scale
                await self._patch_job(job, {"active": 0, "ready": 0, "failed": run.failures})

    # ----- a Job's pod, as the kubelet reports it -----

    async def _start_pod(self, job: dict, run: JobRun) -> None:
        """One attempt: a Pod object for it (labelled and owned as the Job controller does), and its containers'
        processes, unless an image cannot be pulled."""
        name = job["metadata"]["name"]
        pod_spec = job["spec"]["template"]["spec"]
        containers = [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]
        run.unpullable = next((c.get("image") for c in containers if _unpullable(c.get("image"))), None)
        run.oom_killed, run.pull_checks = False, 0
        engine = next((c for c in pod_spec.get("containers") or [] if c.get("name") == ENGINE_CONTAINER), {})
        run.engine_memory = _quantity(((engine.get("resources") or {}).get("limits") or {}).get("memory"))
        run.engine_starts = _files(self.workdir / "engine-logs" / name)
        run.pod = f"{name}-{uuid.uuid4().hex[:5]}"
        run.log_offsets = {container: _size(self.workdir / log) for container, log in
                           ((BENCH_CONTAINER, f"job-{name}.log"), (ENGINE_CONTAINER, f"job-{name}-engine.log"))}
        if run.unpullable is None:
            run.process = self._spawn_job(job)
        meta = job["metadata"]
        uid = meta.get("uid", "")
        labels = {**((job["spec"]["template"].get("metadata") or {}).get("labels") or {}), "job-name": name,
                  "batch.kubernetes.io/job-name": name, "controller-uid": uid,
                  "batch.kubernetes.io/controller-uid": uid}
        statuses = [_container_status(c, {"running": {"startedAt": _now()}} if run.process is not None
                                      else {"waiting": {"reason": "ContainerCreating"}})
                    for c in pod_spec.get("containers") or []]
        with contextlib.suppress(RuntimeError):
            await self.api.create({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": run.pod, "namespace": meta.get("namespace"), "labels": labels,
                             "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name, "uid": uid,
                                                  "controller": True, "blockOwnerDeletion": True}]},
                "spec": {"restartPolicy": "Never",
                         "containers": [{"name": c.get("name"), "image": c.get("image", "")}
                                        for c in pod_spec.get("containers") or []]},
                "status": {"phase": "Running" if run.process is not None else "Pending",
                           "containerStatuses": statuses}})

    async def _pull_back_off(self, job: dict, run: JobRun) -> None:
        """The pod whose image cannot be pulled: ErrImagePull on the first try, ImagePullBackOff after."""
        run.pull_checks += 1
        if run.pull_checks > 2:
            return
        reason = "ErrImagePull" if run.pull_checks == 1 else "ImagePullBackOff"
        host = str(run.unpullable).split("/", 1)[0]
        message = (f'rpc error: code = Unknown desc = failed to pull and unpack image "{run.unpullable}": dial tcp: '
                   f"lookup {host}: no such host" if reason == "ErrImagePull"
                   else f'Back-off pulling image "{run.unpullable}"')
        containers = job["spec"]["template"]["spec"].get("containers") or []
        statuses = [_container_status(c, {"waiting": {"reason": reason, "message": message}
                                          if c.get("image") == run.unpullable else {"reason": "ContainerCreating"}})
                    for c in containers]
        await self._patch_pod(job, run, {"phase": "Pending", "containerStatuses": statuses})

    def _kill_if_out_of_memory(self, name: str, run: JobRun) -> None:
        """An engine container whose memory limit is below what the simulated engine takes is killed as the
        kernel would kill it, once its supervisor starts the engine (loads the model)."""
        engine = self.job_engines.get(name)
        if run.oom_killed or engine is None or engine.poll() is not None:
            return
        limit = run.engine_memory
        if limit is None or limit >= ENGINE_MEMORY_BYTES or _files(self.workdir / "engine-logs" / name) <= \
                run.engine_starts:
            return
        run.oom_killed = True
        # The whole container: the supervisor's process group and the engine's, which it starts in its own.
        _kill_groups([*_descendants(engine.pid), engine.pid])
        print(f"[sandbox kubelet] engine container of {name}: OOMKilled (limit {limit} bytes, the simulated "
              f"engine takes {ENGINE_MEMORY_BYTES})", file=sys.stderr, flush=True)

    async def _finish_pod(self, job: dict, run: JobRun, bench_code: int, engine_code: int | None) -> None:
        """The pod's containers terminated: each one's exit code, reason and termination message (the file it
        wrote, or with FallbackToLogsOnError the end of its log when it failed without writing one)."""
        name = job["metadata"]["name"]
        containers = job["spec"]["template"]["spec"].get("containers") or []
        codes = {BENCH_CONTAINER: bench_code, ENGINE_CONTAINER: 137 if run.oom_killed else engine_code}
        logs = {BENCH_CONTAINER: f"job-{name}.log", ENGINE_CONTAINER: f"job-{name}-engine.log"}
        statuses = []
        for container in containers:
            cname = container.get("name")
            code = codes.get(cname)
            if code is None:
                continue
            code = 128 - code if code < 0 else code  # killed by a signal: 128 + its number, as the runtime says
            reason = "OOMKilled" if cname == ENGINE_CONTAINER and run.oom_killed else (
                "Completed" if code == 0 else "Error")
            message = _read_text(self._termination_path(name, cname, fresh=False))
            if not message and code != 0 and container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
                message = _log_tail(self.workdir / logs[cname], run.log_offsets.get(cname, 0))
            terminated = {"exitCode": code, "reason": reason, "finishedAt": _now()}
            if message:
                terminated["message"] = message
            statuses.append(_container_status(container, {"terminated": terminated}))
        failed = any(s["state"]["terminated"]["exitCode"] for s in statuses)
        await self._patch_pod(job, run, {"phase": "Failed" if failed else "Succeeded", "containerStatuses": statuses})

    async def _patch_pod(self, job: dict, run: JobRun, status: dict) -> None:
        if run.pod is None:
            return
        with contextlib.suppress(RuntimeError):
            await self.api.patch("pods", job["metadata"].get("namespace"), run.pod, {"status": status},
                                 subresource="status")

    async def _delete_job_pod(self, job: dict, run: JobRun) -> None:
        if run.pod is not None:
            with contextlib.suppress(RuntimeError):
                await self.api.delete("pods", job["metadata"].get("namespace"), run.pod)

    async def _patch_job(self, job: dict, status: dict) -> None:
        with contextlib.suppress(RuntimeError):
            await self.api.patch("jobs", job["metadata"].get("namespace"), job["metadata"]["name"],
                                 {"status": status}, subresource="status")

    # ----- Deployments -----

    def _engine_command(self, deployment: dict, ip: str) -> tuple[list[str], int]:
        pod = deployment["spec"]["template"]["spec"]
        engine = pod["containers"][0]
        args = list(engine.get("args", []))
        port = int(_flag(args, "--port") or 8000)
        sku = self._sku_for(pod.get("nodeSelector") or {})
        return [sys.executable, "-m", ENGINE_MODULE, *args, "--host", ip, *self._sim_args(sku)], port

    async def _sync_deployments(self, session: aiohttp.ClientSession) -> None:
        live = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in self.api.objects("deployments")}
        for key in list(self.pods):
            if key not in live:
                for pod in self.pods.pop(key):
                    await self._delete_pod(key[0], pod)
        for key, deployment in live.items():
            await self._sync_deployment(session, key, deployment)

    async def _sync_deployment(self, session: aiohttp.ClientSession, key: tuple[str, str], deployment: dict) -> None:
        namespace, name = key
        pods = self.pods.setdefault(key, [])
        template = deployment["spec"]["template"]
        revision = (template["metadata"].get("annotations") or {}).get(ENGINE_CONFIG_ANNOTATION) or \
            str(hash(str(template)))
        replicas = int(deployment["spec"].get("replicas", 1) or 0)

        for pod in pods:
            if not pod.ready and pod.process.poll() is None:
                pod.ready = await _healthy(session, f"http://{pod.ip}:{pod.port}/health")
                if pod.ready:
                    await self._publish_pod(namespace, deployment, pod)
        for pod in [p for p in pods if p.process.poll() is not None and not p.stopping]:
            log.warning("pod %s exited with %s; restarting it", pod.name, pod.process.returncode)
            pods.remove(pod)
            await self._delete_pod(namespace, pod)

        current = [p for p in pods if p.template == revision]
        old = [p for p in pods if p.template != revision]
        rolling = ((deployment["spec"].get("strategy") or {}).get("rollingUpdate")) or {}
        to_start, doomed = rollout_step(replicas, int(rolling.get("maxSurge", 1)),
                                        int(rolling.get("maxUnavailable", 0)), old, current)
        for _ in range(to_start):
            ip = self._next_ip()
            command, port = self._engine_command(deployment, ip)
            pod_name = f"{name}-{revision[:6]}-" + "-".join(ip.split(".")[1:])
            clock = self._clock_path(f"pod-{pod_name}.clock")
            pods.append(PodProcess(pod_name, ip, port, revision,
                                   self._spawn(command, f"pod-{pod_name}.log", **{CLOCK_FILE_ENV: str(clock)}),
                                   clock=clock))
        for pod in doomed:
            pods.remove(pod)
            await self._delete_pod(namespace, pod)

        ready = sum(1 for p in pods if p.ready)
        updated = sum(1 for p in pods if p.template == revision)
        status = {"observedGeneration": deployment["metadata"].get("generation", 1), "replicas": len(pods),
                  "updatedReplicas": updated, "readyReplicas": ready, "availableReplicas": ready,
                  "unavailableReplicas": max(0, replicas - ready)}
        if {k: (deployment.get("status") or {}).get(k) for k in status} != status:
            with contextlib.suppress(RuntimeError):
                await self.api.patch("deployments", namespace, name, {"status": status}, subresource="status")

    async def _publish_pod(self, namespace: str, deployment: dict, pod: PodProcess) -> None:
        # As the Deployment controller does: the pod belongs to its template's ReplicaSet, which the Deployment
        # controls (the operator scrapes only pods it can trace to its own Deployment, not any pod with its labels).
        labels = {**(deployment["spec"]["template"]["metadata"].get("labels") or {}), "pod-template-hash": pod.template[:6]}
        replicaset_name = f"{deployment['metadata']['name']}-{pod.template[:6]}"
        replicaset = self.api.get("replicasets", namespace, replicaset_name)
        with contextlib.suppress(RuntimeError):
            replicaset = replicaset or await self.api.create({
                "apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": {"name": replicaset_name, "namespace": namespace, "labels": labels,
                             "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "controller": True,
                                                  "name": deployment["metadata"]["name"],
                                                  "uid": deployment["metadata"]["uid"]}]},
                "spec": {"selector": deployment["spec"]["selector"], "template": deployment["spec"]["template"]}})
        if replicaset is None:
            return
        owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "controller": True, "name": replicaset_name,
                 "uid": replicaset["metadata"]["uid"]}
        # The engine container's ports, as the template names them (a Service's named targetPort resolves
        # there), and the Ready condition: the pod is published once its engine answers /health, and Services
        # and InferencePools route only to ready pods.
        engine = next((c for c in deployment["spec"]["template"]["spec"].get("containers") or []
                       if c.get("name") == ENGINE_CONTAINER), {})
        container = {"name": ENGINE_CONTAINER, "image": "simulated"}
        if engine.get("ports"):
            container["ports"] = engine["ports"]
        with contextlib.suppress(RuntimeError):
            await self.api.create({"apiVersion": "v1", "kind": "Pod",
                                   "metadata": {"name": pod.name, "namespace": namespace, "labels": labels,
                                                "ownerReferences": [owner]},
                                   "spec": {"containers": [container]},
                                   "status": {"phase": "Running", "podIP": pod.ip,
                                              "conditions": [{"type": "Ready", "status": "True"}]}})

    async def _delete_pod(self, namespace: str, pod: PodProcess) -> None:
        pod.stopping = True
        _stop(pod.process)
        with contextlib.suppress(RuntimeError):
            await self.api.delete("pods", namespace, pod.name)

    def pod_revisions(self, namespace: str, deployment: str) -> dict[str, str]:
        """Base URL -> engine-config revision of each ready pod of a Deployment."""
        return {f"http://{p.ip}:{p.port}": p.template for p in self.pods.get((namespace, deployment), []) if p.ready}

    def clock_file(self, url: str) -> Path | None:
        """The virtual clock of the serving pod at base URL `url` (None: no such pod)."""
        for pods in self.pods.values():
            for pod in pods:
                if f"http://{pod.ip}:{pod.port}" == url:
                    return pod.clock
        return None

    def serving_endpoints(self, namespace: str, deployment: str) -> list[str]:
        """Base URLs of the ready pods of a Deployment (what its Service would route to)."""
        return [f"http://{p.ip}:{p.port}" for p in self.pods.get((namespace, deployment), []) if p.ready]

    async def shutdown(self) -> None:
        for name, run in self.jobs.items():
            self._stop_job(name, run)
        for pods in self.pods.values():
            for pod in pods:
                _stop(pod.process)
        for run in self.jobs.values():
            _wait(run.process)
        for process in self.job_engines.values():
            _wait(process)
        for pods in self.pods.values():
            for pod in pods:
                _wait(pod.process)

    def running_processes(self) -> int:
        alive = [r.process for r in self.jobs.values() if r.process is not None and r.process.poll() is None]
        alive += [p for p in self.job_engines.values() if p.poll() is None]
        alive += [p.process for ps in self.pods.values() for p in ps if p.process.poll() is None]
        return len(alive)


def rollout_step(replicas: int, max_surge: int, max_unavailable: int, old: list, current: list) -> tuple[int, list]:
    """One pass of the Deployment controller's rolling update over pods with a `.ready` flag: how many pods
    of the new template to start, and which pods to stop.

    maxSurge: new pods up to the replica count, that many beyond it while old pods remain. maxUnavailable:
    a ready old pod stops only while the ready pods left still cover replicas - maxUnavailable. Old pods that
    are not ready, and new ones beyond the replica count (the least ready first), stop at once.
    """
    to_start = max(0, min(replicas - len(current), replicas + (max_surge if old else 0) - len(old) - len(current)))
    ready_old = [p for p in old if p.ready]
    doomed = [p for p in old if not p.ready]
    doomed += ready_old[:max(0, len(ready_old) + sum(p.ready for p in current) - (replicas - max_unavailable))]
    doomed += sorted(current, key=lambda p: p.ready)[:max(0, len(current) - replicas)]
    return to_start, doomed


def _flag(args: list[str], flag: str) -> str | None:
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def _with_flag(args: list[str], flag: str, value: str) -> list[str]:
    """`args` with `flag`'s value (`--flag v` or `--flag=v`) replaced by `value`, or the flag appended."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg == flag and i + 1 < len(out):
            out[i + 1] = value
            return out
        if arg.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return out
    return [*out, flag, value]


def _on_host(url: str, host: str) -> str:
    """`url` with its host replaced by `host` (the Job's pod IP in place of the pod's loopback)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{host}:{parts.port}" if parts.port else host))


def _container_status(container: dict, state: dict) -> dict:
    """A containerStatuses entry as the kubelet writes one."""
    image = container.get("image", "")
    return {"name": container.get("name"), "image": image, "imageID": f"sandbox://{image}" if "running" in state
            or "terminated" in state else "", "ready": "running" in state, "restartCount": 0, "started":
            "running" in state, "state": state}


def _unpullable(image: str | None) -> bool:
    """An image the sandbox cannot pull: its registry host ends in UNPULLABLE_REGISTRY_SUFFIX."""
    host = str(image or "").split("/", 1)[0] if "/" in str(image or "") else ""
    return host.split(":", 1)[0].endswith(UNPULLABLE_REGISTRY_SUFFIX)


def _quantity(value: object) -> int | None:
    """A Kubernetes memory quantity ("512Mi", "2G", "1e9", 1024) in bytes; None when absent or unreadable."""
    text = str(value).strip() if value is not None else ""
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "K": 10**3, "M": 10**6,
             "G": 10**9, "T": 10**12, "m": 1e-3}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            try:
                return int(float(text[:-len(suffix)]) * units[suffix])
            except ValueError:
                return None
    try:
        return int(float(text)) if text else None
    except ValueError:
        return None


def _descendants(pid: int) -> list[int]:
    """A process's children, recursively (Linux's /proc; none found elsewhere)."""
    try:
        children = [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (OSError, ValueError):
        return []
    return [p for child in children for p in (child, *_descendants(child))]


def _files(folder: Path) -> int:
    return sum(1 for _ in folder.iterdir()) if folder.is_dir() else 0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_text(path: Path, limit: int = 4096) -> str:
    """A termination message file's text (the kubelet keeps its first 4096 bytes)."""
    try:
        with path.open("rb") as f:
            return f.read(limit).decode(errors="replace")
    except OSError:
        return ""


def _log_tail(path: Path, offset: int) -> str:
    """The end of a container's log since `offset` (its pod's start), as FallbackToLogsOnError keeps it: the
    last 80 lines, at most 2048 bytes."""
    try:
        with path.open("rb") as f:
            f.seek(max(offset, _size(path) - FALLBACK_LOG_BYTES))
            text = f.read(FALLBACK_LOG_BYTES).decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-FALLBACK_LOG_LINES:])


def _now() -> str:
    from datetime import UTC, datetime

    return datetime.now(tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


async def _healthy(session: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with session.get(url) as response:
            return response.status == 200
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return False


def _stop(process: subprocess.Popen | None) -> None:
    if process is not None and process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)


def _wait(process: subprocess.Popen | None, timeout_s: float = 10, term_grace_s: float = 15) -> None:
    """Wait for `process` to exit; past `timeout_s` end it as a container runtime ends a container: SIGTERM to its
    process group (an engine supervisor stops the engine it started), then, past `term_grace_s`, SIGKILL to every
    process group of its tree, taken before the signal (the engine runs in a session of its own, and once its
    parent is gone nothing finds it)."""
    if process is None:
        return
    try:
        process.wait(timeout=timeout_s)
        return
    except subprocess.TimeoutExpired:
        pass
    tree = _descendants(process.pid)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=term_grace_s)
    except subprocess.TimeoutExpired:
        pass
    _kill_groups([*tree, process.pid])
    process.wait()


def _kill_groups(pids: list[int]) -> None:
    """SIGKILL the process group of each of `pids` that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(os.getpgid(pid), signal.SIGKILL)
