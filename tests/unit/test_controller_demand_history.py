"""A fleet whose status keeps no demand history yet reads the one its Prometheus holds, once per metrics interval;
without Prometheus, or with one that cannot answer, the forecast starts cold and nothing fails."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

from specpilot.api.deployment_spec import SpeculativeDeploymentSpec
from specpilot.api.deployment_status import DemandSample, FleetStatus, SpeculativeDeploymentStatus
from specpilot.config import OperatorConfig
from specpilot.controller import reconcile
from specpilot.controller.context import Context
from specpilot.controller.metrics import OperatorMetrics
from specpilot.controller.observation import demand_history

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def spec(source: str = "prometheus", autoscaling: str = "internal", url: str | None = None):
    metrics = {"source": source, **({"prometheusUrl": url} if url else {})}
    return SpeculativeDeploymentSpec.model_validate({
        "model": {"id": "meta-llama/Llama-3.1-8B-Instruct"},
        "methods": [{"method": "ngram", "numSpeculativeTokens": 4}],
        "gpuPools": [{"name": "a100", "nodeSelector": {"pool": "a100"}},
                     {"name": "h100", "nodeSelector": {"pool": "h100"}}],
        "metrics": metrics, "serving": {"autoscaling": autoscaling}})


def pools(skus=("A100", "H100"), observed=(True, False)):
    return [SimpleNamespace(view=SimpleNamespace(primary_sku=sku, pool=SimpleNamespace(name=f"p{i}")),
                            observation=object() if seen else None)
            for i, (sku, seen) in enumerate(zip(skus, observed, strict=True))]


def test_only_a_placed_fleet_without_a_history_and_with_a_fresh_observation_reads_one():
    empty = SpeculativeDeploymentStatus()
    kept = SpeculativeDeploymentStatus(fleet=FleetStatus(demand_history=[DemandSample(time=T0, tokens_per_second=1.0)]))
    assert reconcile._starts_cold(spec(), empty, pools())
    assert not reconcile._starts_cold(spec(), kept, pools())  # its own history
    assert not reconcile._starts_cold(spec(), empty, pools(observed=(False, False)))  # not at a metrics interval
    assert not reconcile._starts_cold(spec(), empty, pools(skus=("A100", None)))  # one pool: no fleet placement
    assert not reconcile._starts_cold(spec(autoscaling="none"), empty, pools())  # replicas fixed: nothing placed


async def test_without_a_readable_prometheus_the_forecast_starts_cold():
    def ctx(url: str = ""):
        return Context(kube=SimpleNamespace(), config=OperatorConfig(prometheus_url=url), metrics=OperatorMetrics(),
                       connection=SimpleNamespace())

    assert await demand_history(ctx(), spec(source="pods"), "llm", "chat", ["a100", "h100"]) == ()
    assert await demand_history(ctx(), spec(), "llm", "chat", ["a100", "h100"]) == ()  # no URL
    # a URL the operator may not use (neither its own nor allowed), and one where nothing answers
    assert await demand_history(ctx(), spec(url="http://10.0.0.1:9090"), "llm", "chat", ["a100"]) == ()
    closed = ctx("http://127.0.0.1:9")
    try:
        assert await demand_history(closed, spec(), "llm", "chat", ["a100", "h100"]) == ()
    finally:
        for source in closed.prometheus_sources.values():
            await source.close()
