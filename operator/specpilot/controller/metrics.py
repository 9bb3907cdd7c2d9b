"""The operator's own Prometheus metrics, served on --metrics-port at /metrics."""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import generate_latest
from prometheus_client.utils import floatToGoString

from specpilot.api.deployment_spec import Strategy
from specpilot.api.deployment_status import PoolStatus, SloAttainment

POOL_LABELS = ["namespace", "deployment", "pool"]
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""Prometheus's text format, the one `exposition()` writes (every Prometheus and agent reads it)."""


class Gauge:
    """A labelled gauge whose series are one dict, label values -> value, exposed by a collector at scrape time.

    prometheus_client's Gauge keeps a child object per series with its own value object and lock (about 1.2 KB
    a series); the operator keeps about 14 series per deployment, so at 1,000 deployments that alone was about
    17 MiB. Here a series is a dict entry (about 0.2 KB). The same calls: `labels(*values).set(v)`,
    `remove(*values)` (KeyError when absent), `collect()`, `clear()`."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str],
                 registry: CollectorRegistry | None = None) -> None:
        self._name, self._documentation, self._labelnames = name, documentation, tuple(labelnames)
        self._values: dict[tuple[str, ...], float] = {}
        if registry is not None:
            registry.register(self)

    def labels(self, *values: str) -> _Series:
        if len(values) != len(self._labelnames):
            raise ValueError(f"{self._name} takes labels {self._labelnames}, got {values}")
        return _Series(self._values, tuple(str(v) for v in values))

    def remove(self, *values: str) -> None:
        del self._values[tuple(str(v) for v in values)]

    def clear(self) -> None:
        self._values.clear()

    def describe(self) -> list[GaugeMetricFamily]:
        return [GaugeMetricFamily(self._name, self._documentation, labels=self._labelnames)]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(self._name, self._documentation, labels=self._labelnames)
        for values, value in list(self._values.items()):  # a snapshot: the scrape runs in its own thread
            family.add_metric(values, value)
        yield family

    def exposition(self) -> str:
        """The family in Prometheus's text format (0.0.4), as prometheus_client's `generate_latest` writes it
        (labels sorted by name, values as Go formats floats), without its per-sample machinery: at 1,000
        deployments the operator has about 14,000 series and `generate_latest` took about 200 ms of the GIL
        per scrape, stalling the event loop's reconciliations while it ran."""
        help_text = self._documentation.replace("\\", r"\\").replace("\n", r"\n")
        lines = [f"# HELP {self._name} {help_text}\n# TYPE {self._name} gauge\n"]
        order = sorted(range(len(self._labelnames)), key=lambda i: self._labelnames[i])
        names = [self._labelnames[i] for i in order]
        for values, value in list(self._values.items()):  # a snapshot: the scrape runs in its own thread
            if names:
                labels = ",".join(f'{name}="{_escape(values[i])}"' for name, i in zip(names, order, strict=True))
                lines.append(f"{self._name}{{{labels}}} {floatToGoString(value)}\n")
            else:
                lines.append(f"{self._name} {floatToGoString(value)}\n")
        return "".join(lines)


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r'\"')
    return value


class _Series:
    __slots__ = ("_values", "_key")

    def __init__(self, values: dict[tuple[str, ...], float], key: tuple[str, ...]) -> None:
        self._values, self._key = values, key

    def set(self, value: float) -> None:
        self._values[self._key] = float(value)


class OperatorMetrics:
    """Counters and gauges a platform team alerts on."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        """Every metric, for `collect()` and `generate_latest`; /metrics is `exposition()`."""
        self._client = CollectorRegistry()
        """prometheus_client's own metrics (counters, histograms: a series per namespace or per decision)."""
        self.registry.register(self._client)
        r, g = self._client, self.registry
        self.reconcile_seconds = Histogram(
            "specpilot_reconcile_duration_seconds", "Time to reconcile one SpeculativeDeployment.",
            ["namespace"], registry=r, buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30))
        self.reconcile_errors = Counter(
            "specpilot_reconcile_errors_total", "Reconciliations that raised, by error type.",
            ["namespace", "error"], registry=r)
        self.decisions = Counter(
            "specpilot_decisions_total", "Decision changes, by pool and chosen method (none = no SD).",
            ["namespace", "deployment", "pool", "method"], registry=r)
        self.toggles = Counter(
            "specpilot_speculation_toggles_total", "Restart-strategy toggles of speculation, by new state.",
            ["namespace", "deployment", "pool", "state"], registry=r)
        self.profiling_jobs = Counter(
            "specpilot_profiling_jobs_total", "Benchmark Jobs by outcome (created, succeeded, failed).",
            ["namespace", "outcome"], registry=r)
        self._declare_pool_gauges(r, g)
        self._declare_dashboard_gauges(g)
        self._declare_fleet_gauges(g)
        self._decision_labels: dict[tuple[str, str, str], tuple[str, str, str]] = {}

    def _declare_pool_gauges(self, r: CollectorRegistry, g: CollectorRegistry) -> None:
        """The planner's outputs per pool and the operator's own request counts."""
        self.desired_replicas = Gauge(
            "specpilot_desired_replicas", "Replicas the SD-aware planner wants per pool (for HPA/KEDA).",
            ["namespace", "deployment", "pool"], registry=g)
        self.speculation_enabled = Gauge(
            "specpilot_speculation_enabled", "1 when the pool serves with speculation.",
            ["namespace", "deployment", "pool"], registry=g)
        self.observed_concurrency = Gauge(
            "specpilot_observed_concurrency", "Observed running requests per replica.",
            ["namespace", "deployment", "pool"], registry=g)
        self.cost_per_mtok = Gauge(
            "specpilot_cost_per_million_tokens_dollars", "Predicted $/Mtok under the current decision.",
            ["namespace", "deployment", "pool"], registry=g)
        self.api_requests = Counter(
            "specpilot_api_requests_total", "Requests the operator sent to the Kubernetes API server, by verb "
            "(get, list, create, patch, apply, delete) and resource (watches are kopf's and not counted).",
            ["verb", "resource"], registry=r)
        self.metrics_available = Gauge(
            "specpilot_metrics_available", "1 when the load metrics for a deployment are fresh.",
            ["namespace", "deployment"], registry=g)

    def _declare_fleet_gauges(self, g: CollectorRegistry) -> None:
        self.fleet_demand = Gauge(
            "specpilot_fleet_demand_tokens_per_second", "The deployment's observed demand in output tokens per "
            "second, served plus backlog (two or more pools).", ["namespace", "deployment"], registry=g)
        self.fleet_forecast = Gauge(
            "specpilot_fleet_forecast_tokens_per_second", "The demand the fleet's replicas are sized for: the "
            "highest expected within the scale-up lead time at policy.sloAttainmentPercent (two or more pools).",
            ["namespace", "deployment"], registry=g)

    def _declare_dashboard_gauges(self, g: CollectorRegistry) -> None:
        """What the dashboard and the alert rules read beside the planner's outputs (charts/specpilot/dashboards,
        rules), and the operator's saturation."""
        self.decision_info = Gauge(
            "specpilot_decision_info", "1 for the pool's current decision: method (none = no SD), strategy "
            "and schedule (short form, empty for none or the restart strategy).",
            [*POOL_LABELS, "method", "strategy", "schedule"], registry=g)
        self.num_speculative_tokens = Gauge(
            "specpilot_num_speculative_tokens", "K the pool's engine starts with (the schedule's maximum; 0: no SD).",
            POOL_LABELS, registry=g)
        self.crossover_concurrency = Gauge(
            "specpilot_crossover_concurrency", "Per-replica concurrency above which speculation stops paying.",
            POOL_LABELS, registry=g)
        self.cost_per_mtok_without_sd = Gauge(
            "specpilot_cost_per_million_tokens_without_sd_dollars",
            "Predicted $/Mtok without speculation at the same load.", POOL_LABELS, registry=g)
        self.replicas = Gauge(
            "specpilot_replicas", "Replicas of the pool's Deployment.", POOL_LABELS, registry=g)
        self.live_acceptance = Gauge(
            "specpilot_live_acceptance_rate", "Live acceptance at the first draft position (accepted / drafts).",
            POOL_LABELS, registry=g)
        self.profiled_acceptance = Gauge(
            "specpilot_profiled_acceptance_rate",
            "The served method's profiled acceptance at the first draft position.", POOL_LABELS, registry=g)
        self.profiles_failed = Gauge(
            "specpilot_profiles_failed", "The pool's profiles that failed for good (after the Job's retries).",
            POOL_LABELS, registry=g)
        self.observed_tokens_per_second = Gauge(
            "specpilot_observed_generation_tokens_per_second",
            "Output tokens per second of the pool's replicas, as the operator last read them.", POOL_LABELS, registry=g)
        self.observed_tpot_p95_seconds = Gauge(
            "specpilot_observed_tpot_p95_seconds", "p95 time per output token of the pool, as the operator last "
            "read it.", POOL_LABELS, registry=g)
        self.tpot_slo_seconds = Gauge(
            "specpilot_tpot_slo_seconds", "The deployment's TPOT SLO (spec.policy.tpotSloMs).",
            ["namespace", "deployment"], registry=g)
        self.traffic_share = Gauge(
            "specpilot_traffic_share", "Fraction of the deployment's traffic the fleet placement plans for the pool "
            "(two or more pools).", POOL_LABELS, registry=g)
        self.fleet_cost_per_mtok = Gauge(
            "specpilot_fleet_cost_per_million_tokens_dollars", "The fleet's $/Mtok under its placement at the "
            "observed demand (two or more pools).", ["namespace", "deployment"], registry=g)
        self.slo_attainment = Gauge(
            "specpilot_slo_attainment_ratio", "Share of the deployment's requests within its SLOs over the metrics "
            "window, from vLLM's histograms: slo=tpot, ttft, both_at_least, both_at_most (the share within both is "
            "known only within those bounds).", ["namespace", "deployment", "slo"], registry=g)
        self.slo_attainment_target = Gauge(
            "specpilot_slo_attainment_target_ratio", "policy.sloAttainmentPercent / 100.",
            ["namespace", "deployment"], registry=g)
        self.reconciles_waiting = Gauge(
            "specpilot_reconciles_waiting", "Reconciliations due that wait for one of the operator's reconciliation "
            "slots: above zero for minutes, the operator cannot keep up with its deployments at this "
            "reconcileIntervalSeconds (give it more CPU, or a longer interval).", [], registry=g)
        self.reconciles_running = Gauge(
            "specpilot_reconciles_running", "Reconciliations running now (at most the operator's slots, 16).",
            [], registry=g)
        self.reconciles_waiting.labels().set(0)
        self.reconciles_running.labels().set(0)

    def record_slo(self, namespace: str, deployment: str, attainment: SloAttainment | None,
                   target_percent: float) -> None:
        """The deployment's SLO attainment gauges (a figure not measured removes its series: a gap, not a stale
        value) and its target."""
        self.slo_attainment_target.labels(namespace, deployment).set(target_percent / 100)
        figures = {"tpot": "tpot_percent", "ttft": "ttft_percent", "both_at_least": "both_at_least_percent",
                   "both_at_most": "both_at_most_percent"}
        for slo, field in figures.items():
            value = getattr(attainment, field) if attainment is not None else None
            if value is not None:
                self.slo_attainment.labels(namespace, deployment, slo).set(value / 100)
            else:
                _discard(self.slo_attainment, (namespace, deployment, slo))

    def record_fleet(self, namespace: str, deployment: str, pools: list[PoolStatus],
                     cost_per_mtok: float | None, demand_tokens_per_second: float | None = None,
                     forecast_tokens_per_second: float | None = None) -> None:
        """The fleet placement's gauges: each pool's planned share, the fleet's $/Mtok, the observed demand and the
        forecast the replicas are sized for (each absent when unknown)."""
        for gauge, value in ((self.fleet_demand, demand_tokens_per_second),
                             (self.fleet_forecast, forecast_tokens_per_second)):
            if value is not None:
                gauge.labels(namespace, deployment).set(value)
            else:
                _discard(gauge, (namespace, deployment))
        for pool in pools:
            labels = (namespace, deployment, pool.name)
            if pool.traffic_share is not None:
                self.traffic_share.labels(*labels).set(pool.traffic_share)
            else:
                _discard(self.traffic_share, labels)
        if cost_per_mtok is not None:
            self.fleet_cost_per_mtok.labels(namespace, deployment).set(cost_per_mtok)
        else:
            _discard(self.fleet_cost_per_mtok, (namespace, deployment))

    def record_pool(self, namespace: str, deployment: str, pool: PoolStatus, profiled_acceptance: float | None,
                    tpot_slo_ms: float | None) -> None:
        """The per-pool gauges from the pool's status after a reconciliation. A value the status no longer
        has (no crossover, no live acceptance) removes its series, so a panel shows a gap, not a stale value."""
        labels = (namespace, deployment, pool.name)
        decision = pool.decision
        if tpot_slo_ms is not None:
            self.tpot_slo_seconds.labels(namespace, deployment).set(tpot_slo_ms / 1000)
        else:
            _discard(self.tpot_slo_seconds, (namespace, deployment))
        self.speculation_enabled.labels(*labels).set(1 if pool.speculation_enabled else 0)
        self.replicas.labels(*labels).set(pool.replicas)
        self.profiles_failed.labels(*labels).set(pool.profiles.failed)
        if pool.desired_replicas is not None:
            self.desired_replicas.labels(*labels).set(pool.desired_replicas)
        if pool.observed and pool.observed.concurrency is not None:
            self.observed_concurrency.labels(*labels).set(pool.observed.concurrency)
        info = None
        if decision is not None:
            info = (decision.method or "none", Strategy(decision.strategy).value, decision.schedule_summary)
            self.num_speculative_tokens.labels(*labels).set(decision.num_speculative_tokens if decision.method else 0)
        previous = self._decision_labels.get(labels)
        if previous is not None and previous != info:
            self.decision_info.remove(*labels, *previous)
        if info is not None:
            self.decision_info.labels(*labels, *info).set(1)
            self._decision_labels[labels] = info
        else:
            self._decision_labels.pop(labels, None)
        live = pool.observed.acceptance_per_position[0] if pool.observed and pool.observed.acceptance_per_position \
            and pool.speculation_enabled else None
        for gauge, value in (
                (self.cost_per_mtok, decision.cost_per_mtok_with_sd if decision else None),
                (self.cost_per_mtok_without_sd, decision.cost_per_mtok_without_sd if decision else None),
                (self.crossover_concurrency, decision.crossover_concurrency if decision else None),
                (self.live_acceptance, live),
                (self.observed_tokens_per_second,
                 pool.observed.generation_tokens_per_second if pool.observed else None),
                (self.observed_tpot_p95_seconds, pool.observed.tpot_p95_ms / 1000
                 if pool.observed and pool.observed.tpot_p95_ms is not None else None),
                (self.profiled_acceptance, profiled_acceptance if decision and decision.method else None)):
            if value is not None:
                gauge.labels(*labels).set(value)
            else:
                _discard(gauge, labels)

    def forget_deployment(self, namespace: str, deployment: str) -> None:
        """Drops every series of a deleted SpeculativeDeployment, so no panel shows it and no alert (profiles
        failed, metrics unavailable) keeps firing for it."""
        labelled = [(self.decision_info, [*POOL_LABELS, "method", "strategy", "schedule"]),
                    (self.decisions, [*POOL_LABELS, "method"]), (self.toggles, [*POOL_LABELS, "state"]),
                    (self.metrics_available, ["namespace", "deployment"]),
                    (self.tpot_slo_seconds, ["namespace", "deployment"]),
                    (self.fleet_cost_per_mtok, ["namespace", "deployment"]),
                    (self.fleet_demand, ["namespace", "deployment"]),
                    (self.fleet_forecast, ["namespace", "deployment"]),
                    (self.slo_attainment, ["namespace", "deployment", "slo"]),
                    (self.slo_attainment_target, ["namespace", "deployment"])]
        labelled += [(gauge, POOL_LABELS) for gauge in (
            self.desired_replicas, self.speculation_enabled, self.observed_concurrency, self.cost_per_mtok,
            self.cost_per_mtok_without_sd, self.num_speculative_tokens, self.crossover_concurrency, self.replicas,
            self.live_acceptance, self.profiled_acceptance, self.profiles_failed, self.observed_tokens_per_second,
            self.observed_tpot_p95_seconds, self.traffic_share)]
        for metric, names in labelled:
            for family in metric.collect():
                for sample in family.samples:
                    if sample.labels.get("namespace") == namespace and sample.labels.get("deployment") == deployment:
                        _discard(metric, tuple(sample.labels[name] for name in names))
        for key in [k for k in self._decision_labels if k[:2] == (namespace, deployment)]:
            del self._decision_labels[key]

    def gauges(self) -> list[Gauge]:
        return [value for value in vars(self).values() if isinstance(value, Gauge)]

    def exposition(self) -> bytes:
        """What /metrics serves: prometheus_client's metrics as it writes them, then the gauges (`Gauge.exposition`),
        the same text `generate_latest(self.registry)` gives, in a few milliseconds at 14,000 series."""
        return generate_latest(self._client) + "".join(g.exposition() for g in self.gauges()).encode()

    def serve(self, port: int, addr: str = "0.0.0.0") -> ThreadingHTTPServer:
        """/metrics (gzip when asked) on a daemon thread, as prometheus_client's `start_http_server` serves it."""
        metrics = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics is served")
                    return
                body = metrics.exposition()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                if "gzip" in self.headers.get("Accept-Encoding", ""):
                    body = gzip.compress(body, compresslevel=1)
                    self.send_header("Content-Encoding", "gzip")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:  # a scrape every few seconds is not news
                pass

        server = ThreadingHTTPServer((addr, port), Handler)
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
        return server


def _discard(gauge: Gauge, labels: tuple[str, ...]) -> None:
    """Removes a labelled series if it exists (prometheus_client raises KeyError otherwise)."""
    try:
        gauge.remove(*labels)
    except KeyError:
        pass
