"""The operator's own Prometheus metrics, served on --metrics-port at /metrics."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class OperatorMetrics:
    """Counters and gauges a platform team alerts on."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
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
        self.desired_replicas = Gauge(
            "specpilot_desired_replicas", "Replicas the SD-aware planner wants per pool (for HPA/KEDA).",
            ["namespace", "deployment", "pool"], registry=r)
        self.speculation_enabled = Gauge(
            "specpilot_speculation_enabled", "1 when the pool serves with speculation.",
            ["namespace", "deployment", "pool"], registry=r)
        self.observed_concurrency = Gauge(
            "specpilot_observed_concurrency", "Observed running requests per replica.",
            ["namespace", "deployment", "pool"], registry=r)
        self.cost_per_mtok = Gauge(
            "specpilot_cost_per_million_tokens_dollars", "Predicted $/Mtok under the current decision.",
            ["namespace", "deployment", "pool"], registry=r)
        self.metrics_available = Gauge(
            "specpilot_metrics_available", "1 when the load metrics for a deployment are fresh.",
            ["namespace", "deployment"], registry=r)

    def serve(self, port: int, addr: str = "0.0.0.0") -> None:
        start_http_server(port, addr=addr, registry=self.registry)
