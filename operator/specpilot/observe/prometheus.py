"""Observed load and live acceptance of a pool, queried from Prometheus.

The queries are in `specpilot.observe.promql`; the arithmetic that turns counter increases into acceptance
is shared with the pod-scrape source (`specpilot.observe.vllm_metrics`). Each observation runs its queries
one after another over one aiohttp session, all evaluated at the same instant.

Prometheus' HTTP API is read with the same bounds as a pod's /metrics (`specpilot.observe.bounded`): each
answer is size- and time-limited, redirects are not followed, an answer with more series than allowed is
refused, draft positions beyond the served method's K are ignored, and a failure is reported with the
status code and size only: the answer of whatever the URL points at is never passed on.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import aiohttp

from specpilot.observe import promql
from specpilot import vllm_page
from specpilot.observe import vllm_metrics as vm
from specpilot.observe.bounded import ReadLimits, ReadRefused, bounded_get, new_session
from specpilot.observe.model import MetricsUnavailable, PoolObservation
from specpilot.observe.promql import pool_pod_regex

__all__ = ["PrometheusSource", "pool_pod_regex"]

# Samples per window for subqueries and the concurrency range query.
STEPS_PER_WINDOW = 30
MAX_HISTORY_SAMPLES = 1024
"""Samples of a demand history read (the planner keeps 64; more is a step too fine for the span asked for)."""
_ERROR_TYPE = re.compile(r"^[A-Za-z_]{1,40}$")


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
        limits: ReadLimits | None = None,
    ) -> None:
        if window_s <= 0 or stale_after_s <= 0:
            raise ValueError(f"window_s and stale_after_s must be > 0 (got {window_s}, {stale_after_s})")
        self.url = url.rstrip("/")
        self.window_s = window_s
        self.stale_after_s = stale_after_s
        self.namespace_label = namespace_label
        self.pod_label = pod_label
        self.step_s = window_s / STEPS_PER_WINDOW
        self.limits = limits or ReadLimits(timeout_s=timeout_s,
                                           timeout_setting="metricsReadLimits.prometheusTimeoutSeconds")
        self._headers = dict(headers) if headers else None
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        """Closes the HTTP session (the operator does so on shutdown)."""
        if self._session is not None and not self._session.closed:
            await self._session.close()
        self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = new_session(self.limits, self._headers)
        return self._session

    async def observe(self, namespace: str, pod_name_regex: str,
                      max_positions: int = vm.MAX_POSITIONS) -> PoolObservation:
        """The pool whose pods in `namespace` match `pod_name_regex` (see `pool_pod_regex`).

        `max_positions` is the served method's K: per-position acceptance beyond it is ignored.
        Raises MetricsUnavailable when Prometheus cannot be reached or rejects a query, when an answer breaks
        a bound, when no series match, or when the newest sample is older than stale_after_s.
        """
        return await self._observe_at(time.time(), namespace, pod_name_regex, max_positions)

    async def _observe_at(self, now: float, namespace: str, pod_name_regex: str,
                          max_positions: int) -> PoolObservation:
        selector = promql.pod_selector(namespace, pod_name_regex, namespace_label=self.namespace_label,
                                       pod_label=self.pod_label)
        window_s, step_s = self.window_s, self.step_s
        cut: list[str] = []

        async def scalar(query: str) -> float | None:
            return _value(await self._instant(query, now))

        newest = await scalar(promql.newest_sample_time(selector, window_s, step_s))
        if newest is None:
            raise MetricsUnavailable(f"no series for pods matching {pod_name_regex} in namespace {namespace} "
                                     f"in the last {window_s:g} s at {self.url}")
        age_s = now - newest
        if age_s > self.stale_after_s:
            raise MetricsUnavailable(f"stale: newest sample {age_s:.0f} s old (stale after "
                                     f"{self.stale_after_s:g} s) for pods matching {pod_name_regex} "
                                     f"in namespace {namespace}")

        generation_tokens = await scalar(promql.pool_increase(vllm_page.GENERATION_TOKENS_TOTAL, selector, window_s))
        spec_decode = await self._spec_decode_increase(selector, now, max_positions, cut)
        summary = vm.spec_decode_summary(spec_decode, generation_tokens or 0.0)
        tpot_p95_s = await scalar(promql.pool_quantile(vm.TPOT_QUANTILE, vllm_page.TPOT_SECONDS, selector, window_s))
        return PoolObservation(
            replicas_reporting=int(await scalar(promql.replicas_reporting(selector, self.stale_after_s)) or 0),
            running_per_replica=await scalar(promql.mean_per_replica(
                vllm_page.NUM_REQUESTS_RUNNING, selector, window_s, step_s, self.pod_label)) or 0.0,
            waiting_per_replica=await scalar(promql.mean_per_replica(
                vllm_page.NUM_REQUESTS_WAITING, selector, window_s, step_s, self.pod_label)) or 0.0,
            total_running=await scalar(promql.pool_total(
                vllm_page.NUM_REQUESTS_RUNNING, selector, window_s, step_s)) or 0.0,
            total_waiting=await scalar(promql.pool_total(
                vllm_page.NUM_REQUESTS_WAITING, selector, window_s, step_s)) or 0.0,
            generation_tokens_per_second=await scalar(promql.pool_rate(vllm_page.GENERATION_TOKENS_TOTAL, selector,
                                                                       window_s)),
            tpot_p95_ms=None if tpot_p95_s is None else tpot_p95_s * 1000.0,
            acceptance_per_position=summary.acceptance_per_position,
            drafts_per_step=summary.drafts_per_step,
            mean_acceptance_length=summary.mean_acceptance_length,
            kv_cache_usage=await scalar(promql.mean_gauge(vllm_page.KV_CACHE_USAGE_PERC, selector, window_s, step_s)),
            observed_at=datetime.fromtimestamp(now, UTC),
            window_s=window_s,
            concurrency_histogram=vm.concurrency_histogram(await self._running_samples(selector, now)),
            tpot_buckets=await self._buckets(vllm_page.TPOT_SECONDS, selector, now, cut),
            ttft_buckets=await self._buckets(vllm_page.TTFT_SECONDS, selector, now, cut),
            cut=tuple(cut),
        )

    async def demand_history(self, namespace: str, deployment_names: Sequence[str], span_s: float,
                             step_s: float) -> list[tuple[datetime, float]]:
        """The output tokens/s of the Deployments' pods over the last `span_s` seconds, a sample per `step_s`
        (time, tokens/s), oldest first; empty when Prometheus holds none. Raises MetricsUnavailable as
        `observe` does."""
        return await self._demand_history_at(time.time(), namespace, deployment_names, span_s, step_s)

    async def _demand_history_at(self, now: float, namespace: str, deployment_names: Sequence[str],
                                 span_s: float, step_s: float) -> list[tuple[datetime, float]]:
        selector = promql.pod_selector(namespace, promql.pods_regex(deployment_names),
                                       namespace_label=self.namespace_label, pod_label=self.pod_label)
        query = promql.pool_rate(vllm_page.GENERATION_TOKENS_TOTAL, selector, self.window_s)
        start = now - span_s
        result = await self._ask("query_range", query, {
            "query": query, "start": f"{start:.3f}", "end": f"{now:.3f}", "step": f"{step_s:.3f}"})
        values = result[0].get("values") if len(result) == 1 else None
        samples: list[tuple[datetime, float]] = []
        for pair in values[:MAX_HISTORY_SAMPLES] if isinstance(values, list) else []:
            if not (isinstance(pair, list) and len(pair) == 2):
                continue
            at, value = _number(pair[0]), _number(pair[1])
            # a sample outside the range asked for, or beyond any engine's rate, is no reading of this deployment
            if at is not None and value is not None and start <= at <= now and value <= vm.MAX_GAUGE:
                samples.append((datetime.fromtimestamp(at, UTC), value))
        return sorted(samples)

    async def _instant(self, query: str, now: float) -> list[dict]:
        return await self._ask("query", query, {"query": query, "time": f"{now:.3f}"})

    async def _ask(self, endpoint: str, query: str, params: dict[str, str]) -> list[dict]:
        """The `result` list of one query of the HTTP API, bounded; MetricsUnavailable when there is none."""
        try:
            body = await bounded_get(self._http(), f"{self.url}/api/v1/{endpoint}", self.limits, params)
        except ReadRefused as refused:
            cut = (f"Prometheus at {self.url}: {refused.why}",) if refused.cut else ()
            if refused.why == "cannot connect":
                raise MetricsUnavailable(f"no Prometheus at {self.url}: cannot connect", cut=cut) from refused
            raise MetricsUnavailable(f"Prometheus at {self.url} failed the query {query}: {refused.why}",
                                     cut=cut) from refused
        try:
            answer = json.loads(body)
        except ValueError as error:
            raise MetricsUnavailable(f"Prometheus at {self.url} answered the query {query} with something "
                                     f"that is not JSON ({len(body)} bytes, not shown)") from error
        if not isinstance(answer, dict) or answer.get("status") != "success":
            error_type = answer.get("errorType") if isinstance(answer, dict) else None
            kind = error_type if isinstance(error_type, str) and _ERROR_TYPE.match(error_type) else "unknown"
            raise MetricsUnavailable(f"Prometheus at {self.url} failed the query {query}: error type {kind}")
        result = (answer.get("data") or {}).get("result") if isinstance(answer.get("data"), dict) else None
        if not isinstance(result, list):
            raise MetricsUnavailable(f"Prometheus at {self.url} answered the query {query} without a result list")
        if len(result) > self.limits.max_series:
            what = (f"Prometheus at {self.url}: an answer of {len(result)} series, over the "
                    f"{self.limits.max_series} limit (metricsReadLimits.maxSeries): refused")
            raise MetricsUnavailable(what, cut=(what,))
        return [series for series in result if isinstance(series, dict) and isinstance(series.get("metric"), dict)]

    async def _spec_decode_increase(self, selector: str, now: float, max_positions: int,
                                    cut: list[str]) -> vm.SpecDecodeCounts | None:
        async def instant(query: str) -> list[dict]:
            return await self._instant(query, now)

        drafts = _value(await instant(promql.pool_increase(vllm_page.SPEC_DECODE_DRAFTS_TOTAL, selector,
                                                           self.window_s)))
        if drafts is None:
            return None
        per_position: dict[int, float] = {}
        ignored = 0
        for series in await instant(promql.pool_increase_by(
                vllm_page.SPEC_DECODE_ACCEPTED_PER_POS_TOTAL, vllm_page.POSITION_LABEL, selector, self.window_s)):
            if vllm_page.POSITION_LABEL not in series["metric"]:
                continue
            position = vm.position_index(series["metric"][vllm_page.POSITION_LABEL], max_positions)
            if position is None:
                ignored += 1
            else:
                per_position[position] = _value([series]) or 0.0
        if ignored:
            cut.append(f"Prometheus at {self.url}: {ignored} {vllm_page.POSITION_LABEL} label(s) outside "
                       f"0..{min(max_positions, vm.MAX_POSITIONS) - 1} (the method's K) ignored")
        width = max(per_position, default=-1) + 1
        return vm.SpecDecodeCounts(
            drafts=drafts,
            draft_tokens=_value(await instant(promql.pool_increase(
                vllm_page.SPEC_DECODE_DRAFT_TOKENS_TOTAL, selector, self.window_s))) or 0.0,
            accepted_tokens=_value(await instant(promql.pool_increase(
                vllm_page.SPEC_DECODE_ACCEPTED_TOKENS_TOTAL, selector, self.window_s))) or 0.0,
            accepted_per_position=tuple(per_position.get(j, 0.0) for j in range(width)),
        )

    async def _buckets(self, histogram: str, selector: str, now: float, cut: list[str]) -> vm.Buckets:
        """The window's increase of a latency histogram over the pool, as cumulative buckets (bounded like a
        pod's page: at most vm.MAX_BUCKETS, finite non-negative counts)."""
        buckets: dict[float, float] = {}
        for series in await self._instant(promql.pool_increase_by(f"{histogram}_bucket", "le", selector,
                                                                                self.window_s), now):
            try:
                le = float(series["metric"]["le"])
            except (KeyError, TypeError, ValueError):
                continue
            value = _value([series])
            if value is not None:
                buckets[le] = value
        if len(buckets) > vm.MAX_BUCKETS:
            cut.append(f"a {histogram} histogram of {len(buckets)} buckets (over {vm.MAX_BUCKETS}) ignored")
            return ()
        return tuple(sorted(buckets.items()))

    async def _running_samples(self, selector: str, now: float) -> list[float]:
        query = promql.running_per_pod(selector, self.pod_label)
        result = await self._ask("query_range", query, {
            "query": query, "start": f"{now - self.window_s:.3f}", "end": f"{now:.3f}", "step": f"{self.step_s:.3f}"})
        samples: list[float] = []
        for series in result:
            values = series.get("values")
            for pair in values if isinstance(values, list) else []:
                value = _number(pair[1] if isinstance(pair, list) and len(pair) == 2 else None)
                if value is not None and value <= vm.MAX_GAUGE:
                    samples.append(value)
                if len(samples) > self.limits.max_series * STEPS_PER_WINDOW:
                    return samples
        return samples


def _number(raw: object) -> float | None:
    """A sample value as Prometheus writes it ("1.5", "NaN"); None when not a finite, non-negative number."""
    try:
        value = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _value(result: list[dict]) -> float | None:
    """The value of a one-series instant result; None when empty, NaN (e.g. a quantile of nothing), or not a
    finite non-negative number."""
    if not result:
        return None
    pair = result[0].get("value")
    return _number(pair[1] if isinstance(pair, list) and len(pair) == 2 else None)
