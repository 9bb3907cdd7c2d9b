"""Operator scale: the real operator reconciling N SpeculativeDeployments on the sandbox API server.

Starts the sandbox API server (kmock's emulator with specpilot's CRDs) in this process, two GPU pools of
nodes (H100 and H200), and `python -m specpilot run` as a subprocess with its metrics port open. Then:

1. creates one SpeculativeDeployment alone (kopf's watches may still be coming up), then N-1 more at
   --create-rate per second, varied: 1-2 pools, 1-3 candidate methods, each with its own model revision
   so no two share a profile (the most objects per deployment);
2. once each has a status.phase, plays the benchmark Jobs as the operator starts them (at most
   maxParallelJobsPerPool at once): writes a synthetic Succeeded result (the twin, noise-free) into each
   Job's profile, until every deployment reaches phase Serving;
3. waits until the backlog those results left has drained (no reconciliation waiting for one of the
   operator's slots, `specpilot_reconciles_waiting`, for a few seconds), so the steady state is not the tail
   of the stage before; then
4. lets the operator's timers reconcile every deployment for --duration seconds (steady state).

Reports, per stage: reconciles and reconcile latency p50/p95/p99 from the operator's own histogram
`specpilot_reconcile_duration_seconds` (bucket deltas, interpolated as PromQL's histogram_quantile
does), the end-to-end latencies measured here (created -> status.phase set; results published ->
Serving), the error counter, the operator's RSS (VmRSS, peak VmHWM) and CPU seconds from /proc, and
the objects it created. Prints a table and writes JSON (default out/operator_scale.json).

The emulator and this load generator share the machine's cores with the operator: their CPU seconds
are reported beside the operator's so the reader can see how much of the machine they took.

Usage (from the repository root): python benchmarks/operator_scale.py [--count 200] [--duration 60]
A series, three runs of each N and a table of how each figure grows (median / worst):
    python benchmarks/operator_scale.py --counts 100,200,500,1000 --runs 3 --duration 60
The table of runs already made: python benchmarks/operator_scale.py --summarize out/operator_scale-n*.json
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import aiohttp
import numpy as np
import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specpilot.api import seal  # noqa: E402
from specpilot_sandbox.apiserver import SandboxApiServer  # noqa: E402
from tests.operator.scenario import H100, H200, measured_status, node  # noqa: E402

NAMESPACE = "scale"
MODEL_ID = "meta-llama/Llama-3.1-8B-Instruct"
POOLS = [{"name": "h100", "nodeSelector": {"pool": "h100"}}, {"name": "h200", "nodeSelector": {"pool": "h200"}}]
METHODS = [
    {"method": "ngram", "numSpeculativeTokens": 4, "promptLookupMax": 4},
    {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "numSpeculativeTokens": 4},
    {"method": "draft_model", "model": "meta-llama/Llama-3.2-1B-Instruct", "numSpeculativeTokens": 3},
]
NODES_PER_POOL = 4
RECONCILE_HISTOGRAM = "specpilot_reconcile_duration_seconds"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PR_SET_PDEATHSIG = 1


def sdep_body(index: int) -> dict:
    """The index-th deployment: pools and methods cycle so the set mixes 1-2 pools and 1-3 methods."""
    pools = [POOLS[index % 2]] if index % 3 else POOLS
    methods = METHODS[: 1 + index % 3]
    return {
        "apiVersion": "specpilot.io/v1alpha1", "kind": "SpeculativeDeployment",
        "metadata": {"name": f"model-{index:04d}", "namespace": NAMESPACE},
        "spec": {
            "model": {"id": MODEL_ID, "revision": f"rev-{index:04d}", "servedName": f"model-{index:04d}"},
            "methods": methods,
            "gpuPools": pools,
            "policy": {"tpotSloMs": 60},
            "serving": {"minReplicas": 1, "maxReplicas": 4},
            "metrics": {"source": "pods"},
        },
    }


@cache
def profile_result(sku: str, method: str | None, max_k: int) -> dict:
    """The status a benchmark Job would publish; identical inputs give identical results, so compute once."""
    return measured_status(sku, method, max_k)


# --- reading the operator: its /metrics and /proc ----------------------------------------------------------


@dataclass(frozen=True)
class MetricsSnapshot:
    """The reconcile histogram (cumulative bucket counts summed over namespaces), the error counter and the
    API requests the operator sent, by verb."""

    buckets: dict[float, float]
    count: float
    sum_s: float
    errors: float
    requests: dict[str, float] = field(default_factory=dict)
    waiting: float = 0.0
    """specpilot_reconciles_waiting at the scrape (a gauge: not subtracted)."""

    def minus(self, earlier: MetricsSnapshot) -> MetricsSnapshot:
        return MetricsSnapshot({le: n - earlier.buckets.get(le, 0.0) for le, n in self.buckets.items()},
                               self.count - earlier.count, self.sum_s - earlier.sum_s, self.errors - earlier.errors,
                               {verb: n - earlier.requests.get(verb, 0.0) for verb, n in self.requests.items()},
                               self.waiting)


def parse_metrics(text: str) -> MetricsSnapshot:
    buckets: dict[float, float] = {}
    count = sum_s = errors = waiting = 0.0
    requests: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == f"{RECONCILE_HISTOGRAM}_bucket":
                le = float(sample.labels["le"])
                buckets[le] = buckets.get(le, 0.0) + sample.value
            elif sample.name == f"{RECONCILE_HISTOGRAM}_count":
                count += sample.value
            elif sample.name == f"{RECONCILE_HISTOGRAM}_sum":
                sum_s += sample.value
            elif sample.name == "specpilot_reconcile_errors_total":
                errors += sample.value
            elif sample.name == "specpilot_api_requests_total":
                key = f"{sample.labels['verb']} {sample.labels['resource']}"
                requests[key] = requests.get(key, 0.0) + sample.value
            elif sample.name == "specpilot_reconciles_waiting":
                waiting += sample.value
    return MetricsSnapshot(buckets, count, sum_s, errors, requests, waiting)


def histogram_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """PromQL's histogram_quantile over cumulative buckets: linear within the bucket holding rank q*total.

    A rank in the +Inf bucket answers the highest finite bound (as PromQL does); no observations: None.
    """
    bounds = sorted(buckets)
    total = buckets.get(float("inf"), 0.0)
    if total <= 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0.0
    for le in bounds:
        count = buckets[le]
        if count >= rank:
            if le == float("inf"):
                return lower_bound
            if count == lower_count:
                return le
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = le, count
    return lower_bound


@dataclass(frozen=True)
class ProcessUsage:
    rss_bytes: int
    peak_rss_bytes: int
    cpu_s: float


def process_usage(pid: int | str) -> ProcessUsage:
    """VmRSS and VmHWM from /proc/PID/status; user + system CPU seconds from /proc/PID/stat."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    stat = Path(f"/proc/{pid}/stat").read_text()
    # Fields after the parenthesised command name; utime and stime are the 14th and 15th of the line.
    after_name = stat.rsplit(")", 1)[1].split()
    utime, stime = int(after_name[11]), int(after_name[12])
    kib = lambda key: int(fields[key].split()[0]) * 1024  # noqa: E731
    return ProcessUsage(kib("VmRSS"), kib("VmHWM"), (utime + stime) / CLOCK_TICKS)


# --- the run -------------------------------------------------------------------------------------------------


@dataclass
class Stage:
    """What one stage of the run cost the operator."""

    name: str
    wall_s: float
    metrics: MetricsSnapshot
    operator_cpu_s: float
    sandbox_cpu_s: float

    def row(self) -> dict:
        m = self.metrics
        q = {f"p{int(p * 100)}_s": histogram_quantile(p, m.buckets) for p in (0.5, 0.95, 0.99)}
        return {"stage": self.name, "wall_s": round(self.wall_s, 2), "reconciles": int(m.count),
                "reconciles_per_s": round(m.count / self.wall_s, 2) if self.wall_s else None,
                "reconcile_mean_s": round(m.sum_s / m.count, 4) if m.count else None,
                **{k: None if v is None else round(v, 4) for k, v in q.items()},
                "errors": int(m.errors), "operator_cpu_s": round(self.operator_cpu_s, 2),
                "operator_cpu_share": round(self.operator_cpu_s / self.wall_s, 3) if self.wall_s else None,
                "sandbox_and_load_cpu_s": round(self.sandbox_cpu_s, 2),
                "operator_cpu_ms_per_reconcile": round(1000 * self.operator_cpu_s / m.count, 1) if m.count else None,
                "api_requests_per_reconcile": _per_verb(m.requests, m.count),
                "api_requests_per_reconcile_by_resource": {key: round(n / m.count, 3) for key, n
                                                           in sorted(m.requests.items()) if n} if m.count else {}}


def _per_verb(requests: dict[str, float], reconciles: float) -> dict[str, float]:
    """Requests per reconcile by verb, from counts keyed "verb resource"."""
    if not reconciles:
        return {}
    verbs: dict[str, float] = {}
    for key, n in requests.items():
        verb = key.split(" ", 1)[0]
        verbs[verb] = verbs.get(verb, 0.0) + n
    return {verb: round(n / reconciles, 2) for verb, n in sorted(verbs.items()) if n}


@dataclass
class Tracker:
    """Times, seen from the load generator, at which each deployment was created and reached a phase."""

    created_at: dict[str, float] = field(default_factory=dict)
    phase_at: dict[str, float] = field(default_factory=dict)
    published_at: dict[str, float] = field(default_factory=dict)
    """When the last of a deployment's profiles got its result (profiles are shared between deployments)."""
    serving_at: dict[str, float] = field(default_factory=dict)
    publishing: bool = False

    def observe(self, obj: dict) -> None:
        now = time.monotonic()
        name = obj["metadata"]["name"]
        phase = (obj.get("status") or {}).get("phase")
        if phase and name not in self.phase_at and name in self.created_at:
            self.phase_at[name] = now
        if phase == "Serving" and name not in self.serving_at and self.publishing:
            self.serving_at[name] = now


async def watch_deployments(url: str, tracker: Tracker, watching: asyncio.Event) -> None:
    """`kubectl get sdep -w`: feed every change of a SpeculativeDeployment to the tracker as it happens."""
    path = f"{url}/apis/specpilot.io/v1alpha1/namespaces/{NAMESPACE}/speculativedeployments"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None)) as session:
        async with session.get(path, params={"watch": "true"}) as response:
            response.raise_for_status()
            watching.set()
            while line := await response.content.readline():
                event = json.loads(line)
                if isinstance(event.get("object"), dict) and event["object"].get("kind") != "Status":
                    tracker.observe(event["object"])


def _phase_words(api: SandboxApiServer, name: str) -> str:
    status = (api.get("speculativedeployments", NAMESPACE, name) or {}).get("status") or {}
    pools = "; ".join(f"{p.get('name')}: profiles {(p.get('profiles') or {}).get('ready')}/"
                      f"{(p.get('profiles') or {}).get('total')}" for p in status.get("pools") or [])
    return f"{status.get('phase')}, {pools}"


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    arr = np.array(values)
    return {"n": len(values), "p50_s": round(float(np.percentile(arr, 50)), 3),
            "p95_s": round(float(np.percentile(arr, 95)), 3), "max_s": round(float(arr.max()), 3)}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> MetricsSnapshot:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return parse_metrics(response.read().decode())


async def wait_until(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.1)
    return False


DRAINED_S = 3.0
"""How long specpilot_reconciles_waiting must stay at zero for the backlog to count as drained."""


async def wait_drained(port: int, timeout_s: float) -> bool:
    """Wait until the operator has had no reconciliation waiting for a slot for DRAINED_S (scraped every
    0.25 s); False after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    quiet_since: float | None = None
    while time.monotonic() < deadline:
        now = time.monotonic()
        if scrape(port).waiting > 0:
            quiet_since = None
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= DRAINED_S:
            return True
        await asyncio.sleep(0.25)
    return False


async def play_jobs(api: SandboxApiServer, tracker: Tracker, count: int, timeout_s: float) -> tuple[int, bool]:
    """Play the benchmark Jobs as the operator starts them: each Job's profile gets a Succeeded result
    (as the Job writes it) until every deployment serves or `timeout_s` passes. A deployment's
    published_at is when the last of its profiles got its result. Returns (profiles published, all serving)."""
    published: dict[str, float] = {}
    tracker.publishing = True
    start = time.monotonic()
    while len(tracker.serving_at) < count and time.monotonic() - start < timeout_s:
        for profile in api.objects("speculationprofiles", NAMESPACE):
            name, status = profile["metadata"]["name"], profile.get("status") or {}
            # a Job writes its result after the operator has recorded the Job in the profile's status
            if name in published or not status.get("jobName") or status.get("phase") == "Succeeded":
                continue
            method = profile["spec"].get("method") or {}
            result = profile_result(profile["spec"]["sku"], method.get("method"), method.get("numSpeculativeTokens", 4))
            job = api.get("jobs", NAMESPACE, status["jobName"]) or {}
            await api.patch("speculationprofiles", NAMESPACE, name, {"status": seal.sealed(result, job)},
                            subresource="status")
            published[name] = time.monotonic()
        await asyncio.sleep(0.2)
    for name in tracker.created_at:
        status = (api.get("speculativedeployments", NAMESPACE, name) or {}).get("status") or {}
        times = [published[p] for pool in status.get("pools") or []
                 for p in (pool.get("profiles") or {}).get("names") or [] if p in published]
        tracker.published_at[name] = max(times, default=start)
    return len(published), len(tracker.serving_at) >= count


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when this benchmark dies, so no operator outlives it (Linux)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


async def stop(operator: subprocess.Popen, grace_s: float = 30.0) -> float | None:
    """SIGTERM, as Kubernetes stops a pod; seconds until it exited, or None if it had to be killed.

    Waits without blocking the event loop: the emulator in this process must keep answering the
    operator's last requests while it shuts down.
    """
    if operator.poll() is not None:
        return 0.0
    began = time.monotonic()
    operator.send_signal(signal.SIGTERM)
    while operator.poll() is None:
        if time.monotonic() - began > grace_s:
            operator.kill()
            operator.wait()
            return None
        await asyncio.sleep(0.05)
    return time.monotonic() - began


async def sample_load(samples: list[float], every_s: float = 5.0) -> None:
    """The host's 1-minute load average every `every_s` seconds: how much else wanted the cores during a run."""
    while True:
        samples.append(os.getloadavg()[0])
        await asyncio.sleep(every_s)


async def run(args: argparse.Namespace, workdir: Path) -> dict:
    load: list[float] = []
    sampler = asyncio.create_task(sample_load(load))
    try:
        return await _run(args, workdir, load)
    finally:
        sampler.cancel()


async def _run(args: argparse.Namespace, workdir: Path, load: list[float]) -> dict:
    stages: list[Stage] = []
    tracker = Tracker()
    async with SandboxApiServer() as api:
        await api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for i in range(NODES_PER_POOL):
            await api.create(node(f"h100-{i}", H100, "h100"))
            await api.create(node(f"h200-{i}", H200, "h200"))
        kubeconfig = api.write_kubeconfig(workdir / "kubeconfig", NAMESPACE)
        config = workdir / "config.yaml"
        config.write_text(yaml.safe_dump({"benchmarkImage": "ghcr.io/specpilot/specpilot-bench:scale",
                                          "reconcileIntervalSeconds": args.interval}))
        port = free_port()
        log_path = args.out.with_suffix(".log")
        env = {**os.environ, "PYTHONUNBUFFERED": "1",
               seal.KEY_ENV: secrets.token_hex(32)}  # as the chart's Secret gives it
        env.pop("KUBERNETES_SERVICE_HOST", None)
        with log_path.open("wb") as log:
            operator = subprocess.Popen(
                [sys.executable, "-m", "specpilot", "run", "--kubeconfig", str(kubeconfig), "--namespace", NAMESPACE,
                 "--standalone", "--liveness-port", "0", "--metrics-port", str(port), "--config", str(config)],
                stdout=log, stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent)
        try:
            for _ in range(300):
                try:
                    scrape(port)
                    break
                except OSError:
                    await asyncio.sleep(0.1)
            else:
                raise SystemExit(f"the operator never served /metrics on port {port}; see {log_path}")
            peak_rss = 0

            def mark(name: str, since: float, before: tuple[MetricsSnapshot, float, float]) -> tuple:
                nonlocal peak_rss
                now_metrics, op, me = scrape(port), process_usage(operator.pid), process_usage("self")
                peak_rss = max(peak_rss, op.peak_rss_bytes)
                stages.append(Stage(name, time.monotonic() - since, now_metrics.minus(before[0]),
                                    op.cpu_s - before[1], me.cpu_s - before[2]))
                return now_metrics, op.cpu_s, me.cpu_s

            watching = asyncio.Event()
            watcher = asyncio.create_task(watch_deployments(api.url, tracker, watching))
            await asyncio.wait_for(watching.wait(), 30)
            start = time.monotonic()
            baseline = (scrape(port), process_usage(operator.pid).cpu_s, process_usage("self").cpu_s)

            # 1. The first deployment alone: kopf's watches may still be coming up.
            first = sdep_body(0)
            tracker.created_at[first["metadata"]["name"]] = time.monotonic()
            await api.create(first)
            if not await wait_until(lambda: tracker.phase_at, args.timeout):
                raise SystemExit(f"the first SpeculativeDeployment got no phase in {args.timeout:.0f} s; see {log_path}")
            first_phase_s = tracker.phase_at[first["metadata"]["name"]] - tracker.created_at[first["metadata"]["name"]]
            snapshot = mark("first deployment", start, baseline)

            # 2. The other N-1 at the create rate; then wait for every phase.
            t0 = time.monotonic()
            gap_s = 1.0 / args.create_rate if args.create_rate > 0 else 0.0
            for i in range(1, args.count):
                body = sdep_body(i)
                tracker.created_at[body["metadata"]["name"]] = time.monotonic()
                await api.create(body)
                await asyncio.sleep(max(0.0, t0 + i * gap_s - time.monotonic()))
            created_s = time.monotonic() - t0
            all_phased = await wait_until(lambda: len(tracker.phase_at) == args.count, args.timeout)
            snapshot = mark(f"create {args.count - 1} ({args.create_rate:g}/s)", t0, snapshot)

            # 3. The benchmark Jobs' results arrive; every deployment decides (its profile watch sees them).
            t0 = time.monotonic()
            profiles_published, all_serving = await play_jobs(api, tracker, args.count, args.timeout)
            snapshot = mark("results published -> Serving", t0, snapshot)

            # 4. The backlog the results left drains: until no reconciliation has waited for a slot for
            # DRAINED_S (the operator's specpilot_reconciles_waiting), so the steady state measures the timers
            # alone and not the tail of the stage before.
            t0 = time.monotonic()
            drained = await wait_drained(port, args.timeout)
            snapshot = mark("backlog drained", t0, snapshot)

            # 5. Steady state: timers only.
            t0 = time.monotonic()
            waiting_max = 0.0
            spy = steady_profiler(args, operator.pid)
            while time.monotonic() - t0 < args.duration:
                peak_rss = max(peak_rss, process_usage(operator.pid).peak_rss_bytes)
                waiting_max = max(waiting_max, scrape(port).waiting)
                await asyncio.sleep(1.0)
            mark(f"steady state ({args.duration:g} s)", t0, snapshot)
            if spy is not None:
                spy.wait(timeout=60)

            usage = process_usage(operator.pid)
            total = Stage("total", time.monotonic() - start, scrape(port).minus(baseline[0]),
                          usage.cpu_s - baseline[1], process_usage("self").cpu_s - baseline[2])
            objects = {plural: len(api.objects(plural, NAMESPACE)) for plural in
                       ("speculativedeployments", "speculationprofiles", "jobs", "deployments", "services",
                        "events", "serviceaccounts", "roles", "rolebindings")}
            not_serving = {name: _phase_words(api, name)
                           for name in sorted(set(tracker.created_at) - set(tracker.serving_at))}
            alive = operator.poll() is None
            watcher.cancel()
        finally:
            stop_s = await stop(operator)

    running_log, _, shutdown_log = log_path.read_text(errors="replace").partition("Signal SIGTERM is received")
    phase_latency = [tracker.phase_at[n] - tracker.created_at[n] for n in tracker.phase_at if n != "model-0000"]
    serving_latency = [tracker.serving_at[n] - tracker.published_at[n] for n in tracker.serving_at
                       if n in tracker.published_at]
    return {
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                    "load_average_1m": {"min": round(min(load, default=0.0), 2), "max": round(max(load, default=0.0), 2)}},
        "settings": {"count": args.count, "duration_s": args.duration, "reconcile_interval_s": args.interval,
                     "create_rate_per_s": args.create_rate, "nodes_per_pool": NODES_PER_POOL},
        "stages": [s.row() for s in stages],
        "total": total.row(),
        "latency_seen_by_client": {
            "first_deployment_to_phase_s": round(first_phase_s, 3),
            "created_to_phase": percentiles(phase_latency),
            "create_seconds": round(created_s, 2),
            "all_got_a_phase": all_phased,
            "published_to_serving": percentiles(serving_latency),
            "not_serving": not_serving,
            "all_serving": all_serving,
        },
        "operator": {"rss_mib": round(usage.rss_bytes / 2**20, 1),
                     "peak_rss_mib": round(max(peak_rss, usage.peak_rss_bytes) / 2**20, 1),
                     "cpu_s": round(usage.cpu_s, 2), "alive_at_end": alive,
                     "stop_after_sigterm_s": None if stop_s is None else round(stop_s, 2),
                     "log_errors": sum(1 for line in running_log.splitlines() if " ERROR " in line),
                     "log_tracebacks": running_log.count("Traceback (most recent call last)"),
                     "log_errors_at_shutdown": sum(1 for line in shutdown_log.splitlines() if " ERROR " in line)},
        "objects": objects,
        "profiles_published": profiles_published,
        "backlog": {"drained": drained, "steady_waiting_max": waiting_max},
    }


def fmt(value, unit: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value * 1000:.0f} ms" if unit == "ms" else f"{value:g}"
    return str(value)


def print_report(result: dict) -> None:
    settings, client, op = result["settings"], result["latency_seen_by_client"], result["operator"]
    print(f"\nspecpilot operator, {settings['count']} SpeculativeDeployments on the sandbox API server "
          f"(reconcile interval {settings['reconcile_interval_s']:g} s)")
    header = ["stage", "wall s", "reconciles", "/s", "p50", "p95", "p99", "mean", "errors", "operator CPU s",
              "sandbox+load CPU s"]
    rows = [[r["stage"], fmt(r["wall_s"]), fmt(r["reconciles"]), fmt(r["reconciles_per_s"]),
             fmt(r["p50_s"], "ms"), fmt(r["p95_s"], "ms"), fmt(r["p99_s"], "ms"), fmt(r["reconcile_mean_s"], "ms"),
             fmt(r["errors"]), fmt(r["operator_cpu_s"]), fmt(r["sandbox_and_load_cpu_s"])]
            for r in [*result["stages"], result["total"]]]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    for row in [header, *rows]:
        print("  ".join(str(x).ljust(w) if i == 0 else str(x).rjust(w) for i, (x, w) in enumerate(zip(row, widths))))
    for r in [*result["stages"], result["total"]]:
        per = r.get("api_requests_per_reconcile") or {}
        writes = sum(n for verb, n in per.items() if verb not in ("get", "list"))
        print(f"  {r['stage']}: API requests per reconcile "
              f"{', '.join(f'{verb} {n:g}' for verb, n in per.items()) or 'none'} (writes {writes:.2f}); "
              f"operator CPU {r.get('operator_cpu_ms_per_reconcile')} ms per reconcile")
        written = {key: n for key, n in (r.get("api_requests_per_reconcile_by_resource") or {}).items()
                   if not key.startswith(("get ", "list "))}
        if written and r["stage"].startswith("steady"):
            print(f"    writes by resource: {', '.join(f'{key} {n:g}' for key, n in written.items())}")
    print("reconcile quantiles come from the operator's histogram buckets "
          "(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30 s), interpolated within a bucket")
    c2p, p2s = client["created_to_phase"], client["published_to_serving"]
    print(f"client side: first deployment got a phase {client['first_deployment_to_phase_s']} s after creation "
          f"(kopf's start-up may be included); the other {c2p['n']}: created -> status.phase p50 {c2p.get('p50_s')} s, "
          f"p95 {c2p.get('p95_s')} s, max {c2p.get('max_s')} s (created in {client['create_seconds']} s)")
    print(f"             results published -> Serving p50 {p2s.get('p50_s')} s, p95 {p2s.get('p95_s')} s "
          f"(a finished profile is acted on within profileWatchSeconds, 2 s)"
          + (f"; never Serving: {', '.join(f'{n} ({w})' for n, w in client['not_serving'].items())}"
             if client["not_serving"] else ""))
    print(f"operator: RSS {op['rss_mib']} MiB at the end, peak {op['peak_rss_mib']} MiB; {op['cpu_s']} CPU s in all; "
          f"log ERROR lines {op['log_errors']} (and {op['log_errors_at_shutdown']} while stopping), "
          f"tracebacks {op['log_tracebacks']}; alive: {op['alive_at_end']}; "
          f"stopped {op['stop_after_sigterm_s']} s after SIGTERM (None: killed after 30 s)")
    backlog = result.get("backlog") or {}
    if backlog:
        print(f"backlog: {'drained' if backlog['drained'] else 'NOT drained'} before the steady state (no reconciliation "
              f"waiting for a slot for {DRAINED_S:g} s); during it at most {backlog['steady_waiting_max']:g} waited "
              f"(specpilot_reconciles_waiting, scraped every second)")
    print("objects in the namespace: " + ", ".join(f"{k} {v}" for k, v in result["objects"].items()))
    print(f"note: {result['machine']['cpus']} CPU(s); the emulator and this load generator run in one process "
          f"beside the operator and share the cores (their CPU seconds are the last column).")


def _steady(result: dict) -> dict:
    return next(r for r in result["stages"] if r["stage"].startswith("steady"))


def _stage(result: dict, name: str) -> dict:
    """One stage's row ({} in a report from before the stage existed)."""
    return next((r for r in result["stages"] if r["stage"] == name), {})


GROWTH_COLUMNS = [
    # (column, unit, value from one run's JSON); the worst run is the highest, but for the WORST_IS_LOWEST ones
    ("created -> phase p95", "s", lambda r: r["latency_seen_by_client"]["created_to_phase"].get("p95_s")),
    ("results -> Serving p95", "s", lambda r: r["latency_seen_by_client"]["published_to_serving"].get("p95_s")),
    ("not Serving", "", lambda r: len(r["latency_seen_by_client"]["not_serving"])),
    ("steady reconcile p50", "ms", lambda r: _steady(r)["p50_s"]),
    ("steady reconcile p95", "ms", lambda r: _steady(r)["p95_s"]),
    ("steady reconcile p99", "ms", lambda r: _steady(r)["p99_s"]),
    ("steady reconciles/s", "", lambda r: _steady(r)["reconciles_per_s"]),
    ("backlog drain s", "", lambda r: _stage(r, "backlog drained").get("wall_s")),
    ("steady waiting max", "", lambda r: (r.get("backlog") or {}).get("steady_waiting_max")),
    ("steady writes per reconcile", "", lambda r: round(sum(
        n for verb, n in (_steady(r)["api_requests_per_reconcile"] or {}).items() if verb not in ("get", "list")), 2)),
    ("steady gets per reconcile", "", lambda r: (_steady(r)["api_requests_per_reconcile"] or {}).get("get", 0.0)),
    ("CPU ms per reconcile, steady", "", lambda r: _steady(r)["operator_cpu_ms_per_reconcile"]),
    ("CPU ms per reconcile, all", "", lambda r: r["total"]["operator_cpu_ms_per_reconcile"]),
    ("RSS end MiB", "", lambda r: r["operator"]["rss_mib"]),
    ("RSS peak MiB", "", lambda r: r["operator"]["peak_rss_mib"]),
    ("load average (max)", "", lambda r: (r["machine"].get("load_average_1m") or {}).get("max")),
]
WORST_IS_LOWEST = {"steady reconciles/s"}
"""Columns where fewer is worse (the timers' rate not kept up with)."""


def growth_table(results: list[dict]) -> str:
    """One markdown row per N: each figure's median over the runs and, after a slash, the worst (the highest;
    for WORST_IS_LOWEST the lowest), so a bimodal figure shows."""
    by_count: dict[int, list[dict]] = {}
    for r in results:
        by_count.setdefault(r["settings"]["count"], []).append(r)
    header = ["N", "runs", *[name + (f" ({unit})" if unit else "") for name, unit, _ in GROWTH_COLUMNS]]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for count in sorted(by_count):
        cells = [f"{count:,}", str(len(by_count[count]))]
        for name, unit, value in GROWTH_COLUMNS:
            values = [value(r) for r in by_count[count]]
            known = [v for v in values if v is not None]
            if not known:
                cells.append("-")
                continue
            scale = 1000 if unit == "ms" else 1
            median = float(np.median(known)) * scale
            worst = (min(known) if name in WORST_IS_LOWEST else max(known)) * scale
            text = f"{median:,.0f}" if unit == "ms" else f"{median:,.3g}" if median < 100 else f"{median:,.0f}"
            if len(known) > 1:
                text += " / " + (f"{worst:,.0f}" if unit == "ms" or worst >= 100 else f"{worst:,.3g}")
            cells.append(text + ("" if len(known) == len(values) else f" ({len(values) - len(known)} none)"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def steady_profiler(args: argparse.Namespace, pid: int) -> subprocess.Popen | None:
    """py-spy on the operator for the steady window (--py-spy): where a steady reconciliation's time goes.
    Raw folded stacks (one line per stack and its sample count) beside --out."""
    if not args.py_spy:
        return None
    out = args.out.with_suffix(".steady.pyspy.txt")
    print(f"py-spy: sampling the operator (pid {pid}) for the steady window into {out}", flush=True)
    return subprocess.Popen([args.py_spy, "record", "--nonblocking", "-r", "100", "-f", "raw", "-d",
                             str(int(args.duration)), "-p", str(pid), "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=200, help="SpeculativeDeployments to create (default 200)")
    p.add_argument("--duration", type=float, default=60, help="seconds of steady state to measure (default 60)")
    p.add_argument("--interval", type=float, default=15, help="the operator's reconcileIntervalSeconds (default 15)")
    p.add_argument("--create-rate", type=float, default=20,
                   help="SpeculativeDeployments created per second after the first (0: as fast as possible)")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for each stage before giving up")
    p.add_argument("--out", type=Path, default=ROOT / "out" / "operator_scale.json", help="JSON report path")
    p.add_argument("--counts", type=lambda v: [int(n) for n in v.split(",")],
                   help="a series: run each of these N (comma-separated, e.g. 100,200,500,1000) --runs times and "
                        "print how each figure grows (median / worst per N); JSON per run beside --out")
    p.add_argument("--runs", type=int, default=1, help="runs per N (default 1; the growth table wants 3)")
    p.add_argument("--py-spy", metavar="PATH",
                   help="a py-spy binary: sample the operator during the steady window (folded stacks beside --out)")
    p.add_argument("--summarize", type=Path, nargs="+", metavar="JSON",
                   help="print the growth table of runs already made (their JSON reports) and exit")
    args = p.parse_args()
    if args.summarize:
        print(growth_table([json.loads(path.read_text()) for path in args.summarize]))
        return 0
    if args.count < 1 or args.runs < 1 or any(n < 1 for n in args.counts or []):
        p.error("--count, --counts and --runs must be >= 1")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    # A SIGTERM to the benchmark unwinds through asyncio.run, whose cleanup stops the operator.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    series = [(n, i) for n in args.counts for i in range(1, args.runs + 1)] if args.counts else \
        [(args.count, i) for i in range(1, args.runs + 1)]
    results, ok = [], True
    for count, index in series:
        one = argparse.Namespace(**{**vars(args), "count": count})
        if len(series) > 1:
            one.out = args.out.with_name(f"{args.out.stem}-n{count}-run{index}.json")
        with tempfile.TemporaryDirectory(prefix="specpilot-scale-") as tmp:
            result = asyncio.run(run(one, Path(tmp)))
        one.out.write_text(json.dumps(result, indent=2) + "\n")
        print_report(result)
        print(f"JSON: {one.out}; operator log: {one.out.with_suffix('.log')}", flush=True)
        complete = result["latency_seen_by_client"]["all_got_a_phase"] and result["latency_seen_by_client"]["all_serving"]
        ok = ok and complete and result["operator"]["alive_at_end"]
        results.append(result)
    if len(series) > 1:
        print("\nHow the figures grow with N (median / worst over the runs):")
        print(growth_table(results))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
