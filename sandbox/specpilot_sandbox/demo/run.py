"""Play the demo: sandbox cluster + kubelet + the real operator + load, then summarise.

Everything the operator touches is real except the Kubernetes API (kmock's emulator) and the GPUs
(simulated engines that take their timing and acceptance from the twin): the operator runs as its own
process exactly as in a cluster, the benchmark Jobs run `specpilot-bench`, the serving pods' metrics are
scraped by the operator's pod source.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from specpilot.api import seal
from specpilot.api.schedule import ScheduleRange, k_at
from specpilot.controller.profiles import RETRY_HINT, job_state
from specpilot.manifests.names import bench_job_name
from specpilot.specdec import drafts_per_request_step
from specpilot.vllm_page import (
    GENERATION_TOKENS_TOTAL,
    REQUEST_SUCCESS_TOTAL,
    SPEC_DECODE_ACCEPTED_TOKENS_TOTAL,
    SPEC_DECODE_DRAFTS_TOTAL,
    parse_samples,
)

from ..apiserver import SandboxApiServer
from ..fidelity import FIDELITY_BOUND_PERCENT, profile_fidelity
from ..kubelet import ENGINE_CONFIG_ANNOTATION, Kubelet
from .load import LoadDriver
from .scenario import NAME, NAMESPACE, DemoScenario, Phase


@dataclass
class PoolPhase:
    """What one pool did during one phase of the load trace. Times are the simulated GPUs' (each request timed
    by the virtual clock of the replica it went to, `demo.load`)."""

    pool: str
    requests: int = 0
    """Requests measured: sent in the phase after each replica's first burst (the phase's clients arriving
    together, as the replays' first `concurrency` requests, which they leave out too), finished before it ended."""
    requests_per_replica: int = 0
    """Measured requests per replica that served some: how many the replays measure."""
    ms_per_token: float | None = None
    """Mean over those requests of end-to-end latency per output token (simulated ms, time to first token
    included), as the replays compute it (`engine_core.closed_loop_ms_per_token`)."""
    tokens_per_second: float = 0.0
    """Output tokens per simulated second, summed over the pool's replicas."""
    concurrency_per_replica: float = 0.0
    """Requests in flight per replica, time-averaged over each replica's simulated time (Little's law's L: what
    the engine's batch held), averaged over the replicas that served."""
    replicas: int = 0
    drafts_per_request_step: float | None = None
    """Drafts per request-step over the phase, from the engines' counters (`specdec.drafts_per_request_step`):
    0 = SD was off, f (1 for a model drafter) = on at every step."""
    settled: bool = True
    """The same pods served the whole phase, all started from the Deployment's current engine config (no
    rollout during the phase, none pending): the engines ran the decision in force."""
    service_changed: bool = False
    """The Service's ready pods (every pool's) changed during the phase: the load per replica moved (a pool
    joined, or another pool rolled)."""


@dataclass
class PhaseResult:
    phase: Phase
    started_at: float
    ended_at: float
    pools: dict[str, PoolPhase] = field(default_factory=dict)
    decisions: dict[str, dict] = field(default_factory=dict)
    """Pool -> the decision in force at the end of the phase (status.pools[].decision)."""
    placement: dict[str, dict] = field(default_factory=dict)
    """Pool -> the fleet placement at the end of the phase: planned traffic share, replicas the fleet wants,
    the pool's $/Mtok at the load it gets, whether its GPUs are all taken (`placement_of`)."""
    fleet: dict = field(default_factory=dict)
    """status.fleet at the end of the phase: the fleet's $/Mtok, demand and the placement in words."""


@dataclass(frozen=True)
class TimelineSample:
    at_s: float
    """Seconds since the load trace began."""
    in_flight: int
    """Requests the clients held in flight over the whole Service."""
    ms_per_token: dict[str, float]
    """Pool -> median ms per output token of the requests that finished in the last 5 s."""
    k: dict[str, int]
    """Pool -> K its engines run at their current batch (the decided schedule at the requests in flight per
    ready pod; 0 = speculation off)."""
    share: dict[str, float] = field(default_factory=dict)
    """Pool -> the traffic share the fleet placement plans for it (status.pools[].trafficShare)."""
    fleet_cost: float | None = None
    """The fleet's planned $/Mtok (status.fleet.costPerMtok)."""


def placement_of(status: dict) -> dict[str, dict]:
    """Pool -> its part of the fleet placement in a deployment's status (pools the placement has not reached
    yet are left out)."""
    placed = {}
    for pool in status.get("pools") or []:
        if pool.get("trafficShare") is None:
            continue
        placed[pool["name"]] = {"share": pool["trafficShare"], "replicas": pool.get("fleetTargetReplicas"),
                                "cost_per_mtok": pool.get("costPerMtok"), "full": bool(pool.get("full")),
                                "sku": pool.get("sku")}
    return placed


@dataclass
class DemoResult:
    profiles: list[dict] = field(default_factory=list)
    phases: list[PhaseResult] = field(default_factory=list)
    status: dict = field(default_factory=dict)
    events: list[dict] = field(default_factory=list)
    joined_pool: str = ""
    joined_at_s: float | None = None
    """When the new GPU type's node joined, in seconds since the trace began."""
    trace_started_s: float | None = None
    """When the load trace began, in seconds since the demo started: the origin of the timeline's and the join's
    times (the phases' are since the demo started)."""
    joined_pool_profiled: bool = False
    processes_left: int = 0
    errors: int = 0
    wall_s: float = 0.0
    timeline: list[TimelineSample] = field(default_factory=list)
    """One sample a second while the load runs."""
    stages: list[tuple[str, float]] = field(default_factory=list)
    """(stage, wall seconds since the demo started) when each stage began: where the wall time went."""
    fidelity: dict[str, PoolFidelity] = field(default_factory=dict)
    """Pool -> how far its measured profiles sit from the twin (`sandbox.fidelity`)."""

    @property
    def faithful(self) -> bool:
        """Every pool's profiles hold the twin's figures within FIDELITY_BOUND_PERCENT."""
        return all(f.worst_percent <= FIDELITY_BOUND_PERCENT for f in self.fidelity.values())


@dataclass(frozen=True)
class PoolFidelity:
    """The worst level over a pool's measured profiles: measured output throughput vs the twin's."""

    pool: str
    sku: str
    worst_percent: float
    """|measured / twin - 1| at the worst level, in percent."""
    where: str
    """Which profile, K and concurrency that was (e.g. "eagle3 K=4 at concurrency 128")."""
    levels: int
    """Levels compared over the pool's profiles."""


def pool_fidelity(profiles: list[dict], pools: list[dict]) -> dict[str, PoolFidelity]:
    """Each pool's fidelity from its SKU's Succeeded profiles (`sandbox.fidelity.profile_fidelity`)."""
    by_sku: dict[str, list] = {}
    for profile in profiles:
        if (profile.get("status") or {}).get("phase") == "Succeeded":
            by_sku.setdefault(profile["spec"]["sku"], []).append(profile_fidelity(profile))
    out = {}
    for pool in pools:
        checked = by_sku.get(pool.get("sku") or "")
        if not checked:
            continue
        worst = max(((f, f.worst) for f in checked if f.worst is not None),
                    key=lambda fw: abs(fw[1].error_percent), default=None)
        if worst is None:
            continue
        profile, level = worst
        out[pool["name"]] = PoolFidelity(
            pool=pool["name"], sku=pool["sku"], worst_percent=round(abs(level.error_percent), 2),
            where=f"{profile.method} K={level.num_speculative_tokens} at concurrency {level.concurrency} "
                  f"({level.measured_tokens_per_s:.0f} vs {level.twin_tokens_per_s:.0f} tok/s)",
            levels=sum(len(f.levels) for f in checked))
    return out


class DemoError(RuntimeError):
    """The demo could not reach a step; the message says which and where the logs are."""


def _pool_of(deployment_name: str) -> str:
    return deployment_name.removeprefix(f"{NAME}-")


class Demo:
    def __init__(self, scenario: DemoScenario, workdir: Path,
                 on_tick: Callable[[Demo], None] | None = None) -> None:
        self.scenario = scenario
        self.workdir = workdir
        self.on_tick = on_tick
        self.api: SandboxApiServer | None = None
        self.kubelet: Kubelet | None = None
        self.driver: LoadDriver | None = None
        self.phase: Phase | None = None
        self.started = time.monotonic()
        self.stages: list[tuple[str, float]] = []
        self.stage = "starting"
        self.operator: subprocess.Popen | None = None
        self.joined_at = 0.0
        self.kept_logs: Path | None = None
        """Where the logs are copied once everything has stopped, when the run stops on a failed profile (the
        command line removes `workdir`)."""

    @property
    def stage(self) -> str:
        return self.stages[-1][0]

    @stage.setter
    def stage(self, stage: str) -> None:
        self.stages.append((stage, round(time.monotonic() - self.started, 2)))

    # ----- what the view reads -----

    def status(self) -> dict:
        obj = self.api.get("speculativedeployments", NAMESPACE, NAME) if self.api else None
        return (obj or {}).get("status") or {}

    def profiles(self) -> list[dict]:
        return self.api.objects("speculationprofiles", NAMESPACE) if self.api else []

    def events(self) -> list[dict]:
        return self.api.objects("events", NAMESPACE) if self.api else []

    def endpoints(self) -> list[tuple[str, str]]:
        if self.kubelet is None:
            return []
        out = []
        for (namespace, name), _ in list(self.kubelet.pods.items()):
            if namespace == NAMESPACE:
                out += [(_pool_of(name), url) for url in self.kubelet.serving_endpoints(namespace, name)]
        return out

    # ----- the run -----

    async def run(self) -> DemoResult:
        result = DemoResult()
        self.workdir.mkdir(parents=True, exist_ok=True)
        stop = asyncio.Event()
        async with SandboxApiServer() as api:
            self.api = api
            kubeconfig = api.write_kubeconfig(self.workdir / "kubeconfig", NAMESPACE)
            await api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
            for node in self.scenario.nodes:
                await api.create(_node(*node))
            self.kubelet = Kubelet(api, kubeconfig, self.workdir, self.scenario.sim)
            kubelet_task = asyncio.create_task(self.kubelet.run(stop))
            ticker = asyncio.create_task(self._tick(stop))
            try:
                self.operator = self._start_operator(kubeconfig)
                await api.create(self.scenario.deployment())
                await self._run_scenario(result)
            finally:
                stop.set()
                self.stage = "cleaning up"
                await self._stop_operator()
                await kubelet_task
                await self.kubelet.shutdown()
                ticker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await ticker
                result.processes_left = self.kubelet.running_processes() + (
                    1 if self.operator and self.operator.poll() is None else 0)
                result.profiles = self.profiles()
                result.status = self.status()
                result.events = self.events()
                result.fidelity = pool_fidelity(result.profiles, result.status.get("pools") or [])
                if self.kept_logs is not None:
                    shutil.copytree(self.workdir, self.kept_logs, dirs_exist_ok=True)
        result.wall_s = time.monotonic() - self.started
        result.stages = list(self.stages)
        return result

    async def _run_scenario(self, result: DemoResult) -> None:
        initial_pools = sorted({pool for _, _, pool in self.scenario.nodes})
        self.stage = "profiling"
        await self._wait(lambda: all(self._decided(p) for p in initial_pools), 600,
                         "every initial pool profiled and decided", fail=self._profiling_failed)
        self.stage = "starting serving pods"
        await self._wait(lambda: self._serving_decided(initial_pools), 300,
                         "a ready serving pod running the decided configuration in every initial pool")
        model = self.scenario.deployment()["spec"]["model"]["servedName"]
        async with LoadDriver(self.endpoints, model, self.scenario.output_len, clock_of=self._clock_of) as driver:
            self.driver = driver
            trace_start = time.monotonic()
            result.trace_started_s = trace_start - self.started
            sampler = asyncio.create_task(self._sample_timeline(result, trace_start))
            try:
                node_name, product, pool = self.scenario.joining_node
                result.joined_pool = pool
                for i, phase in enumerate(self.scenario.phases):
                    self.phase = phase
                    self.stage = f"load: {phase.name}"
                    if i == len(self.scenario.phases) - 1:
                        # After the ramp up and down, a node of a new GPU type joins: the operator profiles it
                        # while the cluster keeps serving the last phase's load.
                        self.joined_at = time.monotonic()
                        result.joined_at_s = self.joined_at - trace_start
                        await self.api.create(_node(node_name, product, pool))
                    # The phase begins as a profiled level does: the previous clients leave, the engines go
                    # idle, the phase's clients arrive together (`LoadDriver.set_concurrency`).
                    await driver.set_concurrency(0, together=True)
                    before, revisions_before = await self._counters(), self._revisions()
                    held_before, started = driver.held(), time.monotonic()
                    await driver.set_concurrency(phase.concurrency)
                    await asyncio.sleep(phase.duration_s)
                    held_after, ended = driver.held(), time.monotonic()
                    after, revisions_after = await self._counters(), self._revisions()
                    result.phases.append(self._phase_result(phase, started, ended, before, after,
                                                            revisions_before, revisions_after,
                                                            held_before, held_after))
                if not self._decided(pool):
                    self.stage = f"profiling the new GPU type {product}"
                    with contextlib.suppress(DemoError):
                        await self._wait(lambda: self._decided(pool),
                                         self.scenario.after_join_timeout_s - (time.monotonic() - self.joined_at),
                                         f"pool {pool} profiled")
                result.joined_pool_profiled = self._decided(pool)
            finally:
                sampler.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sampler
                result.errors = driver.errors
                self.driver = None
                self.phase = None

    def _clock_of(self, url: str):
        """The virtual clock of the serving pod at `url`, as its clients read it (None: no such pod)."""
        from specpilot_bench.clock import read_clock

        path = self.kubelet.clock_file(url) if self.kubelet else None
        return read_clock(path) if path else None

    def _serving_decided(self, pools: list[str]) -> bool:
        """Every pool has a ready pod, and every ready pod runs its Deployment's current engine config (pods
        started before the decision, without speculation, have been rolled away)."""
        revisions = self._revisions()
        ready = {pool for pool, _ in revisions.values()}
        return ready >= set(pools) and all(current for pool, current in revisions.values() if pool in pools)

    def _decided(self, pool: str) -> bool:
        for p in self.status().get("pools") or []:
            if p["name"] == pool:
                decision = p.get("decision") or {}
                return decision.get("source") in ("profile", "live-acceptance") and \
                    p["profiles"]["ready"] + p["profiles"].get("failed", 0) >= p["profiles"]["total"] > 0
        return False

    def _profiling_failed(self) -> str | None:
        """Why profiling failed for good, or None: a profile is Failed and no attempt of its Job is left to
        change that, because the Job is out of retries, or it completed and the operator refused its result
        (unsealed or implausible) or found none, or there is no Job. A profile Failed while its Job still
        runs a retry is not failed for good. The operator retries none of these by itself (the reprofile
        annotation does), so waiting would only run out the demo's time."""
        jobs = {job["metadata"]["name"]: job for job in self.api.objects("jobs", NAMESPACE)}
        for profile in self.profiles():
            status = profile.get("status") or {}
            job = jobs.get(bench_job_name(profile["metadata"]["name"]))
            gave_up = job is None or job_state(job) != "Active"
            if status.get("phase") == "Failed" and gave_up:
                message = (status.get("message") or status.get("reason") or "no message").strip().splitlines()[-1]
                # the demo's run ends here: the reprofile annotation it would take means nothing to its user
                return f"profile {profile['metadata']['name']} failed: {message.replace(f'; {RETRY_HINT}', '')}"
        return None

    async def _wait(self, predicate: Callable[[], bool], timeout_s: float, what: str,
                    fail: Callable[[], str | None] | None = None) -> None:
        """Until `predicate` holds; a DemoError with the diagnosis when `fail` names a problem, the operator
        exits, `timeout_s` passes or the run reaches its bound (`DemoScenario.timeout_s` since it started)."""
        waited_from = time.monotonic()
        run_deadline = self.started + self.scenario.timeout_s
        deadline = min(waited_from + timeout_s, run_deadline)
        while not predicate():
            problem = fail() if fail else None
            if problem:
                self.kept_logs = self.workdir.with_name(f"{self.workdir.name}-failed")
                raise DemoError(f"{problem}; while waiting for {what} (logs kept in {self.kept_logs})\n"
                                f"{self.diagnosis()}")
            if self.operator is not None and self.operator.poll() is not None:
                raise DemoError(f"the operator exited ({self.operator.returncode}) while waiting for {what}; "
                                f"see {self.workdir / 'operator.log'}\n{self.diagnosis()}")
            if time.monotonic() > deadline:
                bound = (f"the demo's bound of {self.scenario.timeout_s:.0f} s" if deadline == run_deadline
                         else f"{timeout_s:.0f} s")
                raise DemoError(f"timed out waiting for {what} ({time.monotonic() - waited_from:.0f} s, "
                                f"{bound}); logs in {self.workdir}\n{self.diagnosis()}")
            await asyncio.sleep(0.25)

    def diagnosis(self, log_lines: int = 15) -> str:
        """What each stage took, and what every profile, its Job, and every pool was doing, with the operator
        log's last lines and those of each Job still running: enough to see where a run stalled without the
        logs (a CI machine's temporary folder is gone when its report is read)."""
        lines = ["where the time went: " + "; ".join(
            f"{stage} from {at:g} s" for stage, at in self.stages) + f"; now {time.monotonic() - self.started:.0f} s"]
        if self.api is None:
            return "\n".join(lines)
        jobs = {job["metadata"]["name"]: job for job in self.api.objects("jobs", NAMESPACE)}
        runs = self.kubelet.jobs if self.kubelet else {}
        for profile in self.profiles():
            status = profile.get("status") or {}
            job_name = bench_job_name(profile["metadata"]["name"])
            job_status = (jobs.get(job_name) or {}).get("status") or {}
            run = runs.get(job_name)
            running = run is not None and run.process is not None and run.process.poll() is None
            job = ("no Job" if job_name not in jobs else
                   f"Job active={job_status.get('active', 0)} succeeded={job_status.get('succeeded', 0)} "
                   f"failed={job_status.get('failed', 0)}" + (" (its process is running)" if running else ""))
            message = (status.get("message") or status.get("reason") or "").strip().splitlines()
            lines.append(f"profile {profile['metadata']['name']}: {status.get('phase') or 'no phase'}; {job}"
                         + (f"; {message[-1][:200]}" if message else ""))
            if running:
                lines += [f"    {line}" for line in _tail(self.workdir / f"job-{job_name}.log", 4)]
        deployment = self.status()
        for pool in deployment.get("pools") or []:
            decision = pool.get("decision") or {}
            profiles = pool.get("profiles") or {}
            lines.append(f"pool {pool['name']} ({pool.get('sku') or 'no GPU type'}): decision "
                         f"{decision.get('source') or 'none'}, profiles ready {profiles.get('ready', 0)} "
                         f"failed {profiles.get('failed', 0)} of {profiles.get('total', 0)}")
        for condition in deployment.get("conditions") or []:
            if condition.get("status") != "True" or condition.get("type") in ("Degraded", "Stalled"):
                lines.append(f"condition {condition.get('type')}={condition.get('status')} "
                             f"{condition.get('reason', '')}: {str(condition.get('message', ''))[:200]}")
        lines.append(f"operator log, last {log_lines} lines:")
        lines += [f"    {line}" for line in _tail(self.workdir / "operator.log", log_lines)]
        return "\n".join(lines)

    async def _tick(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            if self.on_tick:
                self.on_tick(self)
            await asyncio.sleep(0.5)

    async def _sample_timeline(self, result: DemoResult, trace_start: float) -> None:
        while True:
            await asyncio.sleep(1.0)
            if self.driver is None:
                continue
            ms = {}
            for pool in {s.pool for s in self.driver.recent(5)}:
                ms[pool] = statistics.median(s.ms_per_token for s in self.driver.recent(5, pool))
            status = self.status()
            placement = placement_of(status)
            result.timeline.append(TimelineSample(
                time.monotonic() - trace_start, self.driver.concurrency, ms, self._k_in_force(),
                share={pool: p["share"] for pool, p in placement.items() if p.get("share") is not None},
                fleet_cost=(status.get("fleet") or {}).get("costPerMtok")))

    def _k_in_force(self) -> dict[str, int]:
        """Pool -> K at the current batch of its pods, from the decision in force (see TimelineSample.k)."""
        urls: dict[str, list[str]] = {}
        for pool, url in self.endpoints():
            urls.setdefault(pool, []).append(url)
        out = {}
        for pool in self.status().get("pools") or []:
            decision = pool.get("decision") or {}
            mine = urls.get(pool["name"])
            if not mine:
                continue
            if not decision.get("method"):
                # Serving without speculation (not profiled yet, or no method pays): K is 0, not absent.
                out[pool["name"]] = 0
                continue
            batch = max(1, round(sum(self.driver.in_flight(u) for u in mine) / len(mine)))
            schedule = [ScheduleRange.model_validate(r) for r in decision.get("schedule") or []]
            out[pool["name"]] = k_at(schedule, batch) if schedule else int(decision.get("numSpeculativeTokens") or 0)
        return out

    def _revisions(self) -> dict[str, tuple[str, bool]]:
        """URL -> (pool, whether the pod runs its Deployment's current engine config)."""
        out = {}
        for dep in self.api.objects("deployments", NAMESPACE):
            name = dep["metadata"]["name"]
            current = (dep["spec"]["template"]["metadata"].get("annotations") or {}).get(ENGINE_CONFIG_ANNOTATION)
            for url, revision in self.kubelet.pod_revisions(NAMESPACE, name).items():
                out[url] = (_pool_of(name), revision == current)
        return out

    async def _counters(self) -> dict[str, tuple[str, dict[str, float]]]:
        """URL -> (pool, counters: drafts, accepted draft tokens, generated tokens, finished requests) from each
        ready pod's /metrics."""
        out = {}
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as session:
            for pool, url in self.endpoints():
                try:
                    async with session.get(f"{url}/metrics") as response:
                        text = await response.text()
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    continue
                samples = parse_samples(text)
                out[url] = (pool, {key: float(sum(value for _, value in samples.get(name, [])))
                                   for key, name in _COUNTERS.items()})
        return out

    def _phase_result(self, phase: Phase, started: float, ended: float, before: dict, after: dict,
                      revisions_before: dict, revisions_after: dict, held_before: dict | None = None,
                      held_after: dict | None = None) -> PhaseResult:
        """What each pool did over the phase. `held_*` are the driver's in-flight integrals (`LoadDriver.held`)
        at its start and end, each on its replica's simulated clock."""
        status = self.status()
        result = PhaseResult(phase, started - self.started, ended - self.started,
                             decisions={p["name"]: p.get("decision") or {} for p in status.get("pools") or []},
                             placement=placement_of(status), fleet=dict(status.get("fleet") or {}))
        samples = [s for s in self.driver.samples if started <= s.finished_at <= ended]
        pool_of = {url: pool for url, (pool, _) in after.items()} | {s.url: s.pool for s in samples}
        held = _held_between(held_before or {}, held_after or {})
        # A replica's measured requests: sent in the phase, after its burst (the first of its share, as the
        # replays leave their first `concurrency` out).
        share = {url: max(1, round(area / span)) for url, (area, span) in held.items()}
        for pool in sorted(set(pool_of.values())):
            mine = [s for s in samples if s.pool == pool]
            measured = [s for s in mine if s.sent_at >= started and s.turn >= share.get(s.url, 1)]
            urls = [u for u, (p, _) in after.items() if p == pool]
            delta = dict.fromkeys(_COUNTERS, 0.0)
            for url in urls:
                if url in before and after[url][1]["generated"] >= before[url][1]["generated"]:
                    for key in delta:
                        delta[key] += after[url][1][key] - before[url][1][key]
            served = {url: held[url] for url, p in pool_of.items() if p == pool and url in held}
            result.pools[pool] = PoolPhase(
                pool=pool, requests=len(measured),
                requests_per_replica=round(len(measured) / max(1, len({s.url for s in measured}))),
                ms_per_token=statistics.fmean(s.ms_per_token for s in measured) if measured else None,
                tokens_per_second=sum(sum(s.tokens for s in mine if s.url == url) / span
                                      for url, (_, span) in served.items()),
                concurrency_per_replica=(statistics.fmean(area / span for area, span in served.values())
                                         if served else 0.0),
                replicas=len(urls),
                drafts_per_request_step=drafts_per_request_step(delta["drafts"], delta["generated"],
                                                                delta["accepted"], delta["finished"]),
                settled=({u for u, (p, _) in revisions_before.items() if p == pool}
                         == {u for u, (p, _) in revisions_after.items() if p == pool})
                and all(current for p, current in revisions_after.values() if p == pool),
                service_changed=set(revisions_before) != set(revisions_after),
            )
        return result

    # ----- the operator process -----

    def _start_operator(self, kubeconfig: Path) -> subprocess.Popen:
        config = self.workdir / "operator-config.yaml"
        config.write_text(yaml.safe_dump({"reconcileIntervalSeconds": self.scenario.reconcile_interval_s,
                                          "benchmarkImage": "specpilot-bench:sandbox"}))
        log = (self.workdir / "operator.log").open("ab")
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               seal.KEY_ENV: secrets.token_hex(32)}  # as the chart's Secret gives it
        env.pop("KUBERNETES_SERVICE_HOST", None)
        return subprocess.Popen(
            [sys.executable, "-m", "specpilot", "run", "--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE,
             "--standalone", "--liveness-port", "0", "--metrics-port", "0", "--config", str(config)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)

    async def _stop_operator(self) -> None:
        if self.operator is None or self.operator.poll() is not None:
            return
        os.killpg(self.operator.pid, signal.SIGTERM)
        for _ in range(100):
            if self.operator.poll() is not None:
                return
            await asyncio.sleep(0.1)
        # Still running after 10 s: its threads' stacks go to operator.log (what it was stuck on), then kill it.
        os.kill(self.operator.pid, signal.SIGUSR1)
        await asyncio.sleep(0.2)
        os.killpg(self.operator.pid, signal.SIGKILL)
        self.operator.wait()


_COUNTERS = {"drafts": SPEC_DECODE_DRAFTS_TOTAL, "accepted": SPEC_DECODE_ACCEPTED_TOKENS_TOTAL,
             "generated": GENERATION_TOKENS_TOTAL, "finished": REQUEST_SUCCESS_TOTAL}
"""The engines' counters a phase reads (drafts per request-step: `specdec.drafts_per_request_step`)."""


def _held_between(before: dict, after: dict) -> dict[str, tuple[float, float]]:
    """URL -> (request-seconds the driver held at that replica, the replica's simulated seconds) between two
    `LoadDriver.held` readings; a replica first used in between counts from its first request."""
    out = {}
    for url, (area, now, since) in after.items():
        area0, then, _ = before.get(url, (0.0, since, since))
        if then is not None and now - then > 0:
            out[url] = (area - area0, now - then)
    return out


def _tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of a log, each cut at 300 characters ([] when there is none)."""
    try:
        with path.open(errors="replace") as f:
            return [line.rstrip()[:300] for line in collections.deque(f, maxlen=lines)]
    except OSError:
        return []


def _node(name: str, product: str, pool: str) -> dict:
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product, "nvidia.com/gpu.count": "8",
                                                  "specpilot.io/demo-pool": pool}},
            "status": {"capacity": {"nvidia.com/gpu": "8"}, "allocatable": {"nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}
