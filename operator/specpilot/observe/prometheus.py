"""Observed load and live acceptance of a pool, queried from Prometheus.

The queries are in `specpilot.observe.promql`; the arithmetic that turns counter increases into acceptance
is shared with the pod-scrape source (`specpilot.observe.vllm_metrics`). prometheus-api-client is
synchronous, so each observation runs its queries in one worker thread, all evaluated at the same instant.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from specpilot.observe import promql
from specpilot.observe import vllm_metrics as vm
from specpilot.observe.model import MetricsUnavailable, PoolObservation
from specpilot.observe.promql import pool_pod_regex

__all__ = ["PrometheusSource", "pool_pod_regex"]

# Samples per window for subqueries and the concurrency range query.
STEPS_PER_WINDOW = 30


class PrometheusSource:
    """Reads a pool's vLLM metrics from the Prometheus server at `url`."""

    def __init__(
        self,
        url: str,
        *,
        window_s: float,
        stale_after_s: float,
        namespace_label: str = "namespace",
        pod_label: str = "pod",
        timeout_s: float = 10,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if window_s <= 0 or stale_after_s <= 0:
            raise ValueError(f"window_s and stale_after_s must be > 0 (got {window_s}, {stale_after_s})")
        self.url = url.rstrip("/")
        self.window_s = window_s
        self.stale_after_s = stale_after_s
        self.namespace_label = namespace_label
        self.pod_label = pod_label
        self.step_s = window_s / STEPS_PER_WINDOW
        self._client = PrometheusConnect(
            url=self.url,
            headers=dict(headers) if headers else None,
            timeout=timeout_s,
            # The client's default retries a refused connection for seconds; the next observation retries.
            retry=Retry(total=1, backoff_factor=0.1, status_forcelist=[502, 503, 504]),
        )
        # requests.Session is not documented as thread-safe; observations of several pools take turns.
        self._session_lock = threading.Lock()

    async def observe(self, namespace: str, pod_name_regex: str) -> PoolObservation:
        """The pool whose pods in `namespace` match `pod_name_regex` (see `pool_pod_regex`).

        Raises MetricsUnavailable when Prometheus cannot be reached or rejects a query, when no series
        match, or when the newest sample is older than stale_after_s.
        """
        return await asyncio.to_thread(self._observe, namespace, pod_name_regex)

    def _observe(self, namespace: str, pod_name_regex: str) -> PoolObservation:
        with self._session_lock:
            return self._observe_at(time.time(), namespace, pod_name_regex)

    def _observe_at(self, now: float, namespace: str, pod_name_regex: str) -> PoolObservation:
        selector = promql.pod_selector(namespace, pod_name_regex, namespace_label=self.namespace_label,
                                       pod_label=self.pod_label)
        window_s, step_s = self.window_s, self.step_s

        def scalar(query: str) -> float | None:
            return _value(self._instant(query, now))

        newest = scalar(promql.newest_sample_time(selector, window_s, step_s))
        if newest is None:
            raise MetricsUnavailable(f"no series for pods matching {pod_name_regex} in namespace {namespace} "
                                     f"in the last {window_s:g} s at {self.url}")
        age_s = now - newest
        if age_s > self.stale_after_s:
            raise MetricsUnavailable(f"stale: newest sample {age_s:.0f} s old (stale after "
                                     f"{self.stale_after_s:g} s) for pods matching {pod_name_regex} "
                                     f"in namespace {namespace}")

        generation_tokens = scalar(promql.pool_increase(vm.GENERATION_TOKENS_TOTAL, selector, window_s))
        summary = vm.spec_decode_summary(self._spec_decode_increase(selector, now), generation_tokens or 0.0)
        tpot_p95_s = scalar(promql.pool_quantile(vm.TPOT_QUANTILE, vm.TPOT_SECONDS, selector, window_s))
        return PoolObservation(
            replicas_reporting=int(scalar(promql.replicas_reporting(selector, self.stale_after_s)) or 0),
            running_per_replica=scalar(promql.mean_per_replica(
                vm.NUM_REQUESTS_RUNNING, selector, window_s, step_s, self.pod_label)) or 0.0,
            waiting_per_replica=scalar(promql.mean_per_replica(
                vm.NUM_REQUESTS_WAITING, selector, window_s, step_s, self.pod_label)) or 0.0,
            total_running=scalar(promql.pool_total(vm.NUM_REQUESTS_RUNNING, selector, window_s, step_s)) or 0.0,
            total_waiting=scalar(promql.pool_total(vm.NUM_REQUESTS_WAITING, selector, window_s, step_s)) or 0.0,
            generation_tokens_per_second=scalar(promql.pool_rate(vm.GENERATION_TOKENS_TOTAL, selector, window_s)),
            tpot_p95_ms=None if tpot_p95_s is None else tpot_p95_s * 1000.0,
            acceptance_per_position=summary.acceptance_per_position,
            drafts_per_step=summary.drafts_per_step,
            mean_acceptance_length=summary.mean_acceptance_length,
            kv_cache_usage=scalar(promql.mean_gauge(vm.KV_CACHE_USAGE_PERC, selector, window_s, step_s)),
            observed_at=datetime.fromtimestamp(now, UTC),
            window_s=window_s,
            concurrency_histogram=vm.concurrency_histogram(self._running_samples(selector, now)),
        )

    def _instant(self, query: str, now: float) -> list[dict]:
        return self._ask(query, lambda: self._client.custom_query(query, params={"time": f"{now:.3f}"}))

    def _ask(self, query: str, call: Callable[[], list[dict]]) -> list[dict]:
        try:
            return call()
        except requests.exceptions.RequestException as error:
            raise MetricsUnavailable(f"no Prometheus at {self.url}: {error}") from error
        except PrometheusApiClientException as error:
            raise MetricsUnavailable(f"Prometheus at {self.url} failed the query {query}: {error}") from error

    def _spec_decode_increase(self, selector: str, now: float) -> vm.SpecDecodeCounts | None:
        def instant(query: str) -> list[dict]:
            return self._instant(query, now)

        drafts = _value(instant(promql.pool_increase(vm.SPEC_DECODE_DRAFTS_TOTAL, selector, self.window_s)))
        if drafts is None:
            return None
        per_position = {
            int(series["metric"][vm.POSITION_LABEL]): _value([series]) or 0.0
            for series in instant(promql.pool_increase_by(
                vm.SPEC_DECODE_ACCEPTED_PER_POS_TOTAL, vm.POSITION_LABEL, selector, self.window_s))
            if vm.POSITION_LABEL in series["metric"]
        }
        width = max(per_position, default=-1) + 1
        return vm.SpecDecodeCounts(
            drafts=drafts,
            draft_tokens=_value(instant(promql.pool_increase(
                vm.SPEC_DECODE_DRAFT_TOKENS_TOTAL, selector, self.window_s))) or 0.0,
            accepted_tokens=_value(instant(promql.pool_increase(
                vm.SPEC_DECODE_ACCEPTED_TOKENS_TOTAL, selector, self.window_s))) or 0.0,
            accepted_per_position=tuple(per_position.get(j, 0.0) for j in range(width)),
        )

    def _running_samples(self, selector: str, now: float) -> list[float]:
        query = promql.running_per_pod(selector, self.pod_label)
        end = datetime.fromtimestamp(now, UTC)
        result = self._ask(query, lambda: self._client.custom_query_range(
            query, start_time=end - timedelta(seconds=self.window_s), end_time=end, step=f"{self.step_s:.3f}"))
        return [float(value) for series in result for _, value in series["values"]]


def _value(result: list[dict]) -> float | None:
    """The value of a one-series instant result; None when empty or NaN (e.g. a quantile of nothing)."""
    if not result:
        return None
    value = float(result[0]["value"][1])
    return None if math.isnan(value) else value
