"""Observed load and live speculative-decoding acceptance of the serving pools.

Two sources produce the same `PoolObservation` (or raise `MetricsUnavailable`): `PrometheusSource`
(metrics.source: prometheus) and `PodScrapeSource` (metrics.source: pods, for clusters without
Prometheus). Their test double, vLLM-named metrics served from a driven state, is the sandbox package's
(`specpilot_sandbox.exporter`).
"""

from specpilot.observe.model import MetricsUnavailable, PoolObservation
from specpilot.observe.pods import PodScrapeSource
from specpilot.observe.prometheus import PrometheusSource, pool_pod_regex

__all__ = ["MetricsUnavailable", "PodScrapeSource", "PoolObservation", "PrometheusSource", "pool_pod_regex"]
