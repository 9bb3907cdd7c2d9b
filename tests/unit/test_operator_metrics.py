"""The operator's per-pool gauges (controller.metrics.OperatorMetrics.record_pool): what the dashboard and the
alert rules read, set from a pool's status, and removed when the status no longer has the value."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.exposition import generate_latest

from specpilot.api.deployment_spec import Strategy
from specpilot.api.deployment_status import Decision, ObservedLoad, PoolStatus, ProfileProgress
from specpilot.controller.metrics import OperatorMetrics

LABELS = {"namespace": "llm", "deployment": "chat", "pool": "h100"}


def samples(metrics: OperatorMetrics) -> dict[str, list[tuple[dict, float]]]:
    """What /metrics serves (`exposition()`), parsed."""
    out: dict[str, list[tuple[dict, float]]] = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
    return out


def value(metrics: OperatorMetrics, name: str, **labels: str) -> float | None:
    wanted = {**LABELS, **labels}
    found = [v for l, v in samples(metrics).get(name, []) if l == wanted]
    assert len(found) <= 1
    return found[0] if found else None


def serving_pool(**overrides) -> PoolStatus:
    decision = Decision(method="eagle3", num_speculative_tokens=5, schedule_summary="1-16:5,17-64:3,65+:0",
                        strategy=Strategy.DYNAMIC, crossover_concurrency=48.0, cost_per_mtok_with_sd=0.21,
                        cost_per_mtok_without_sd=0.33)
    fields = dict(name="h100", decision=decision, speculation_enabled=True, replicas=3, desired_replicas=4,
                  profiles=ProfileProgress(ready=2, total=3, failed=1),
                  observed=ObservedLoad(concurrency=12.5, acceptance_per_position=[0.71, 0.5],
                                        generation_tokens_per_second=950.0, tpot_p95_ms=31.0))
    return PoolStatus(**{**fields, **overrides})


def test_record_pool_exports_what_the_dashboard_reads() -> None:
    metrics = OperatorMetrics()
    metrics.record_pool("llm", "chat", serving_pool(), profiled_acceptance=0.8, tpot_slo_ms=40)
    assert value(metrics, "specpilot_decision_info", method="eagle3", strategy="dynamic",
                 schedule="1-16:5,17-64:3,65+:0") == 1
    assert value(metrics, "specpilot_num_speculative_tokens") == 5
    assert value(metrics, "specpilot_crossover_concurrency") == 48
    assert value(metrics, "specpilot_cost_per_million_tokens_dollars") == 0.21
    assert value(metrics, "specpilot_cost_per_million_tokens_without_sd_dollars") == 0.33
    assert value(metrics, "specpilot_replicas") == 3
    assert value(metrics, "specpilot_desired_replicas") == 4
    assert value(metrics, "specpilot_observed_concurrency") == 12.5
    assert value(metrics, "specpilot_speculation_enabled") == 1
    assert value(metrics, "specpilot_live_acceptance_rate") == 0.71
    assert value(metrics, "specpilot_profiled_acceptance_rate") == 0.8
    assert value(metrics, "specpilot_profiles_failed") == 1
    assert value(metrics, "specpilot_observed_generation_tokens_per_second") == 950
    assert value(metrics, "specpilot_observed_tpot_p95_seconds") == 0.031
    tpot_slo = [v for l, v in samples(metrics)["specpilot_tpot_slo_seconds"]
                if l == {"namespace": "llm", "deployment": "chat"}]
    assert tpot_slo == [0.04]


def test_a_new_decision_replaces_the_info_series_and_absent_values_remove_theirs() -> None:
    metrics = OperatorMetrics()
    metrics.record_pool("llm", "chat", serving_pool(), profiled_acceptance=0.8, tpot_slo_ms=40)
    off = Decision(method=None, strategy=Strategy.RESTART, cost_per_mtok_with_sd=0.3, cost_per_mtok_without_sd=0.3)
    metrics.record_pool("llm", "chat", serving_pool(decision=off, speculation_enabled=False,
                                                   observed=ObservedLoad(concurrency=80)),
                        profiled_acceptance=0.8, tpot_slo_ms=None)
    info = [(l, v) for l, v in samples(metrics)["specpilot_decision_info"] if l["pool"] == "h100"]
    assert info == [({**LABELS, "method": "none", "strategy": "restart", "schedule": ""}, 1.0)]
    assert value(metrics, "specpilot_num_speculative_tokens") == 0
    assert value(metrics, "specpilot_speculation_enabled") == 0
    # No crossover, no live acceptance (speculation off) and no served method's profile: the series go away.
    for gone in ("specpilot_crossover_concurrency", "specpilot_live_acceptance_rate",
                 "specpilot_profiled_acceptance_rate", "specpilot_observed_generation_tokens_per_second",
                 "specpilot_observed_tpot_p95_seconds"):
        assert value(metrics, gone) is None, gone
    assert "specpilot_tpot_slo_seconds" not in samples(metrics)


def test_pools_keep_their_own_series() -> None:
    metrics = OperatorMetrics()
    metrics.record_pool("llm", "chat", serving_pool(), profiled_acceptance=0.8, tpot_slo_ms=None)
    metrics.record_pool("llm", "chat", serving_pool(name="l4", decision=None, speculation_enabled=False,
                                                   observed=None, replicas=0, desired_replicas=None),
                        profiled_acceptance=None, tpot_slo_ms=None)
    assert value(metrics, "specpilot_decision_info", method="eagle3", strategy="dynamic",
                 schedule="1-16:5,17-64:3,65+:0") == 1
    assert value(metrics, "specpilot_replicas", pool="l4") == 0
    assert value(metrics, "specpilot_num_speculative_tokens", pool="l4") is None
    assert not [l for l, _ in samples(metrics)["specpilot_decision_info"] if l["pool"] == "l4"]


def test_a_deleted_deployment_leaves_no_series() -> None:
    metrics = OperatorMetrics()
    for deployment in ("chat", "batch"):
        metrics.record_pool("llm", deployment, serving_pool(), profiled_acceptance=0.8, tpot_slo_ms=40)
        metrics.metrics_available.labels("llm", deployment).set(0)
        metrics.decisions.labels("llm", deployment, "h100", "eagle3").inc()
        metrics.toggles.labels("llm", deployment, "h100", "off").inc()
    metrics.profiling_jobs.labels("llm", "created").inc()
    metrics.forget_deployment("llm", "chat")
    left = {(name, labels.get("deployment")) for name, found in samples(metrics).items() for labels, _ in found
            if labels.get("namespace") == "llm"}
    assert not [name for name, deployment in left if deployment == "chat"]
    assert ("specpilot_decision_info", "batch") in left and ("specpilot_decisions_total", "batch") in left
    assert ("specpilot_profiling_jobs_total", None) in left  # per namespace, not per deployment
    # Recreated under the same name, it starts afresh.
    metrics.record_pool("llm", "chat", serving_pool(), profiled_acceptance=0.8, tpot_slo_ms=40)
    assert value(metrics, "specpilot_decision_info", method="eagle3", strategy="dynamic",
                 schedule="1-16:5,17-64:3,65+:0") == 1


def test_a_gauge_series_is_a_dict_entry_that_scrapes_and_removes_as_prometheus_clients_does(monkeypatch) -> None:
    """controller.metrics.Gauge keeps a series as one dict entry (the operator holds ~14 per deployment): it
    scrapes as prometheus_client's Gauge would (HELP, TYPE, one sample per series), `remove` of an absent
    series raises KeyError as prometheus_client's does, a wrong label count is refused, and a scrape taken
    while a reconciliation adds a series reads a snapshot (the HTTP server scrapes in its own thread)."""
    import pytest
    from prometheus_client.core import GaugeMetricFamily

    metrics = OperatorMetrics()
    gauge = metrics.replicas
    gauge.labels("llm", "chat", "h100").set(3)
    gauge.labels("llm", "chat", "h100").set(4)  # the same series: replaced
    text = generate_latest(metrics.registry).decode()
    assert "# TYPE specpilot_replicas gauge" in text
    assert 'specpilot_replicas{deployment="chat",namespace="llm",pool="h100"} 4.0' in text
    gauge.remove("llm", "chat", "h100")
    assert value(metrics, "specpilot_replicas") is None
    with pytest.raises(KeyError):
        gauge.remove("llm", "chat", "h100")
    with pytest.raises(ValueError):
        gauge.labels("llm", "chat")

    # A reconciliation adds a series while a scrape is between two samples: the scrape reads a snapshot.
    for i in range(3):
        gauge.labels("llm", f"d{i}", "h100").set(i)
    real = GaugeMetricFamily.add_metric

    def add_metric_while_a_series_is_added(self, labels, value, *args, **kwargs):
        gauge.labels("llm", f"new-{value}", "h100").set(value)
        return real(self, labels, value, *args, **kwargs)

    monkeypatch.setattr(GaugeMetricFamily, "add_metric", add_metric_while_a_series_is_added)
    assert len(list(gauge.collect())[0].samples) == 3
    monkeypatch.setattr(GaugeMetricFamily, "add_metric", real)
    assert len(list(gauge.collect())[0].samples) == 6


def test_the_saturation_gauges_count_reconciliations_waiting_and_running():
    # specpilot_reconciles_waiting above zero is the operator falling behind its timers (issue 27): counted
    # while a reconciliation waits for its object's lock or a slot, released when it runs, ends or is cancelled
    import asyncio

    from specpilot.controller.handlers import Slots, _counted

    metrics = OperatorMetrics()

    def gauges() -> tuple[float, float]:
        found = samples(metrics)
        return found["specpilot_reconciles_waiting"][0][1], found["specpilot_reconciles_running"][0][1]

    async def scenario() -> None:
        assert gauges() == (0, 0)  # exported from the start: an alert's query finds the series
        queue, slots = {"waiting": 0, "running": 0}, Slots(1)
        release = asyncio.Event()

        async def reconcile(lock: asyncio.Lock) -> None:
            async with _counted(metrics, queue, lock, slots, urgent=False):
                await release.wait()

        first = asyncio.create_task(reconcile(asyncio.Lock()))
        second = asyncio.create_task(reconcile(asyncio.Lock()))  # another object: waits for the one slot
        third = asyncio.create_task(reconcile(asyncio.Lock()))
        await asyncio.sleep(0.01)
        assert gauges() == (2, 1)
        third.cancel()  # e.g. the operator stopping: no longer waiting
        await asyncio.sleep(0.01)
        assert gauges() == (1, 1)
        release.set()
        await asyncio.gather(first, second)
        assert gauges() == (0, 0) and queue == {"waiting": 0, "running": 0}

    asyncio.run(scenario())


def parsed(text: str) -> dict[str, tuple[str, str, list]]:
    return {f.name: (f.type, f.documentation, sorted((s.name, sorted(s.labels.items()), s.value) for s in f.samples))
            for f in text_string_to_metric_families(text)}


def test_the_served_text_is_what_prometheus_client_writes_for_the_same_metrics():
    # /metrics renders the gauges itself (issue 27: generate_latest took ~200 ms of the GIL at 14,000 series);
    # the text must parse to the same families, help, samples and values, hostile label values escaped
    metrics = OperatorMetrics()
    metrics.record_pool("llm", "chat", serving_pool(), profiled_acceptance=0.7, tpot_slo_ms=50)
    metrics.record_pool("llm", "chat", serving_pool(name='a"b\\c\nd'), profiled_acceptance=None, tpot_slo_ms=None)
    metrics.decisions.labels("llm", "chat", "h100", "eagle3").inc()
    metrics.reconcile_seconds.labels("llm").observe(0.02)
    metrics.replicas.labels("llm", "chat", "nan").set(float("nan"))
    metrics.replicas.labels("llm", "chat", "inf").set(float("inf"))
    served = metrics.exposition().decode()
    reference = generate_latest(metrics.registry).decode()
    assert set(served.splitlines()) == set(reference.splitlines())
    assert parsed(served).keys() == parsed(reference).keys()
    assert 'pool="a\\"b\\\\c\\nd"' in served
    for name, (kind, documentation, found) in parsed(reference).items():
        got = parsed(served)[name]
        assert (got[0], got[1]) == (kind, documentation), name
        assert repr(got[2]) == repr(found), name  # repr: NaN equals NaN


def test_metrics_endpoint_serves_the_exposition_plain_and_gzipped():
    import gzip
    import urllib.request

    metrics = OperatorMetrics()
    metrics.replicas.labels("llm", "chat", "h100").set(3)
    server = metrics.serve(0, "127.0.0.1")
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        with urllib.request.urlopen(url) as answer:
            assert answer.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            plain = answer.read()
        request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(request) as answer:
            assert answer.headers["Content-Encoding"] == "gzip"
            assert gzip.decompress(answer.read()) == plain
        assert b'specpilot_replicas{deployment="chat",namespace="llm",pool="h100"} 3.0' in plain
        with __import__("pytest").raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url.replace("/metrics", "/other"))
        assert refused.value.code == 404
    finally:
        server.shutdown()
        server.server_close()


def test_slo_attainment_gauges_carry_only_a_judged_window():
    """Below MIN_REQUESTS finished requests the condition does not judge, and the gauges (which the alert reads)
    carry no figure: a few slow requests on a quiet deployment fire nothing. From MIN_REQUESTS on they do."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from specpilot.api.deployment_spec import SpeculativeDeploymentSpec
    from specpilot.api.deployment_status import ObservedLoad, PoolStatus, SloAttainment, SpeculativeDeploymentStatus
    from specpilot.controller.reconcile import _record
    from specpilot.policy.plan import DeploymentPlan, DeploymentSnapshot, _slo_attained
    from specpilot.policy.profiling import all_accepted
    from specpilot.policy.slo import MIN_REQUESTS

    metrics = OperatorMetrics()
    ctx = SimpleNamespace(metrics=metrics)
    spec = SpeculativeDeploymentSpec.model_validate({
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "gpuPools": [{"name": "h100", "nodeSelector": {"a": "b"}}],
        "methods": [{"method": "ngram"}], "policy": {"tpotSloMs": 25}})

    def attained(requests: float) -> tuple[SpeculativeDeploymentStatus, list]:
        slo = SloAttainment(requests=requests, tpot_percent=50.0, tpot_bucket="0.01-0.025 s",
                            both_at_least_percent=50.0, both_at_most_percent=50.0)
        status = SpeculativeDeploymentStatus(pools=[PoolStatus(name="h100", observed=ObservedLoad(slo=slo))])
        events: list = []
        now = datetime.now(UTC)
        snapshot = DeploymentSnapshot(spec=spec, name="chat", uid="u1", generation=1, old=SpeculativeDeploymentStatus(),
                                      now=now, pools=[], profiling=all_accepted([], now), profiles={})
        _slo_attained(snapshot, status, events)
        _record(ctx, spec, snapshot, DeploymentPlan(status, [], events, {}, set()), "llm", "chat")
        return status, events

    def sample(slo: str) -> float | None:
        return metrics.registry.get_sample_value("specpilot_slo_attainment_ratio",
                                                 {"namespace": "llm", "deployment": "chat", "slo": slo})

    status, events = attained(MIN_REQUESTS - 1)
    assert [c.reason for c in status.conditions if c.type == "SloAttained"] == ["TooFewRequests"]
    assert sample("both_at_most") is None and events == []
    status, events = attained(100)
    assert [c.reason for c in status.conditions if c.type == "SloAttained"] == ["Missed"]
    assert sample("both_at_most") == 0.5 and [e.reason for e in events] == ["SloAttainmentLow"]
    assert metrics.registry.get_sample_value("specpilot_slo_attainment_target_ratio",
                                             {"namespace": "llm", "deployment": "chat"}) == 0.99
