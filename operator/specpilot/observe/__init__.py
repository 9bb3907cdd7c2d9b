"""Observed load and live speculative-decoding acceptance of the serving pools.

Two sources produce the same `PoolObservation` (or raise `MetricsUnavailable`): `PrometheusSource`
(metrics.source: prometheus) and `PodScrapeSource` (metrics.source: pods, for clusters without
Prometheus). `exporter` serves vLLM-named metrics from a driven state, for tests and the simulated engine.
"""

from specpilot.observe.model import MetricsUnavailable, PoolObservation
from specpilot.observe.pods import PodScrapeSource
from specpilot.observe.prometheus import PrometheusSource, pool_pod_regex

__all__ = ["MetricsUnavailable", "PodScrapeSource", "PoolObservation", "PrometheusSource", "pool_pod_regex"]
