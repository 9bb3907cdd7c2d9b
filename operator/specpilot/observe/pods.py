"""Observed load and live acceptance for clusters without Prometheus: scrape the serving pods' /metrics.

`PodScrapeSource` lives as long as the operator. Each `observe` call scrapes the pool's pods at once and
appends one sample per pod to that pod's ring buffer; the observation is computed from the samples inside
the window, the way the Prometheus source's queries compute it from Prometheus' own samples:
- gauges are time-averaged over the calls ("rounds") in the window, each round weighted equally, of the
  mean (per replica) or sum (pool total) across the pods that answered in that round;
- counters grow from each pod's oldest to its newest sample in the window (a drop is a pod restart);
  rates divide by that pod's span, then add up over pods;
- the TPOT p95 interpolates the summed bucket increases like Prometheus' histogram_quantile.
So the resolution is the observe interval: rates need two calls inside the window.

Every read is bounded (`specpilot.observe.bounded`): a page over the size limit or slower than the time
limit counts as a failed scrape, draft positions beyond the served method's K are ignored, and what was
left out is reported in `PoolObservation.cut` (or `MetricsUnavailable.cut`). Failure messages never quote
a pod's answer.

A pod that is no longer among the targets (scaled down, replaced) stops counting at once; its buffer is
dropped when its newest sample leaves the window. One instance may serve several pools: only the samples
of the targets passed in are read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

import aiohttp

from specpilot import vllm_page
from specpilot.observe import vllm_metrics as vm
from specpilot.observe.bounded import ReadLimits, ReadRefused, bounded_get, new_session
from specpilot.observe.model import MetricsUnavailable, PoolObservation

# Bounds a pod's buffer when observe is called far more often than the window needs.
MAX_SAMPLES_PER_POD = 1024
MAX_CONCURRENT_SCRAPES = 16
"""Pods scraped at once: bounds the memory of one round to this many pages at the size limit."""

PodKey = tuple[str, str]
"""(pod name, base URL): the IP makes a pod unique across namespaces."""


@dataclasses.dataclass(frozen=True)
class PodSample:
    at_s: float
    """Clock reading (seconds) of the round that took this sample."""
    snapshot: vm.VllmSnapshot


class PodScrapeSource:
    """Scrapes vLLM pods directly and keeps their recent samples between calls."""

    def __init__(
        self,
        *,
        window_s: float,
        stale_after_s: float,
        timeout_s: float = 5,
        limits: ReadLimits | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        if window_s <= 0 or stale_after_s <= 0 or timeout_s <= 0:
            raise ValueError(f"window_s, stale_after_s and timeout_s must be > 0 "
                             f"(got {window_s}, {stale_after_s}, {timeout_s})")
        self.window_s = window_s
        self.stale_after_s = stale_after_s
        self.limits = limits or ReadLimits(timeout_s=timeout_s)
        self.timeout_s = self.limits.timeout_s
        self._clock = clock
        self._wall_clock = wall_clock
        self._history: dict[PodKey, deque[PodSample]] = {}

    async def observe(self, targets: Sequence[tuple[str, str]],
                      max_positions: int = vm.MAX_POSITIONS) -> PoolObservation:
        """Scrapes `targets` ((pod name, base URL such as http://10.0.0.7:8000)) and reports the pool.

        `max_positions` is the served method's K: per-position acceptance beyond it is ignored.
        Raises MetricsUnavailable when no target has ever answered inside the window, or when the newest
        sample is older than stale_after_s.
        """
        if not targets:
            raise MetricsUnavailable("no pods to scrape: the pool has no running pods with an IP")
        now_s = self._clock()
        observed_at = self._wall_clock()
        keys = list(dict.fromkeys((name, url.rstrip("/")) for name, url in targets))
        gate = asyncio.Semaphore(MAX_CONCURRENT_SCRAPES)

        async def scrape(url: str) -> tuple[vm.VllmSnapshot | str, tuple[str, ...]]:
            async with gate:
                return await _scrape(session, url, self.limits, max_positions)

        async with new_session(self.limits) as session:
            results = await asyncio.gather(*(scrape(url) for _, url in keys))
        failures, cut = [], []
        for key, (result, pod_cut) in zip(keys, results):
            cut += [f"pod {key[0]}: {what}" for what in pod_cut]
            if isinstance(result, vm.VllmSnapshot):
                self._history.setdefault(key, deque(maxlen=MAX_SAMPLES_PER_POD)).append(PodSample(now_s, result))
            else:
                failures.append(f"{key[0]} at {key[1]}: {result}")
        self._forget_before(now_s - self.window_s)

        history = {key[0]: list(self._history[key]) for key in keys if key in self._history}
        if not history:
            raise MetricsUnavailable(f"could not scrape any of the {len(keys)} pods: {'; '.join(failures)}",
                                     cut=tuple(cut))
        newest_age_s = now_s - max(samples[-1].at_s for samples in history.values())
        if newest_age_s > self.stale_after_s:
            raise MetricsUnavailable(f"stale: newest sample {newest_age_s:.0f} s old (stale after "
                                     f"{self.stale_after_s:g} s); {'; '.join(failures)}", cut=tuple(cut))
        observation = observation_from_samples(history, now_s=now_s, window_s=self.window_s,
                                               stale_after_s=self.stale_after_s, observed_at=observed_at)
        return dataclasses.replace(observation, cut=tuple(cut))

    def _forget_before(self, oldest_s: float) -> None:
        for key in list(self._history):
            samples = self._history[key]
            while samples and samples[0].at_s < oldest_s:
                samples.popleft()
            if not samples:
                del self._history[key]


def observation_from_samples(
    history: Mapping[str, Sequence[PodSample]],
    *,
    now_s: float,
    window_s: float,
    stale_after_s: float,
    observed_at: datetime,
) -> PoolObservation:
    """The pool's observation from its pods' samples (oldest first, all inside the window). Pure."""
    rounds: dict[float, list[vm.VllmSnapshot]] = {}
    for samples in history.values():
        for sample in samples:
            rounds.setdefault(sample.at_s, []).append(sample.snapshot)
    per_round = list(rounds.values())

    def time_average(value: Callable[[list[vm.VllmSnapshot]], float | None]) -> float | None:
        values = [v for v in map(value, per_round) if v is not None]
        return sum(values) / len(values) if values else None

    def mean(values: Sequence[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return sum(present) / len(present) if present else None

    increase: vm.CounterIncrease | None = None
    generation_tokens_per_second: float | None = None
    for samples in history.values():
        if len(samples) < 2:
            continue
        pod_increase = vm.window_increase([s.snapshot for s in samples])
        increase = pod_increase if increase is None else increase + pod_increase
        rate = pod_increase.generation_tokens / (samples[-1].at_s - samples[0].at_s)
        generation_tokens_per_second = rate + (generation_tokens_per_second or 0.0)

    if increase is None:
        summary = vm.SpecDecodeSummary([], None, None)
        tpot_p95_s = None
    else:
        summary = vm.spec_decode_summary(increase.spec_decode, increase.generation_tokens)
        tpot_p95_s = vm.histogram_quantile(vm.TPOT_QUANTILE, increase.tpot_buckets)

    return PoolObservation(
        replicas_reporting=sum(1 for samples in history.values() if now_s - samples[-1].at_s <= stale_after_s),
        running_per_replica=time_average(lambda r: mean([s.running for s in r])) or 0.0,
        waiting_per_replica=time_average(lambda r: mean([s.waiting for s in r])) or 0.0,
        total_running=time_average(lambda r: sum(s.running for s in r)) or 0.0,
        total_waiting=time_average(lambda r: sum(s.waiting for s in r)) or 0.0,
        generation_tokens_per_second=generation_tokens_per_second,
        tpot_p95_ms=None if tpot_p95_s is None else tpot_p95_s * 1000.0,
        acceptance_per_position=summary.acceptance_per_position,
        drafts_per_step=summary.drafts_per_step,
        mean_acceptance_length=summary.mean_acceptance_length,
        kv_cache_usage=time_average(lambda r: mean([s.kv_cache_usage for s in r])),
        observed_at=observed_at,
        window_s=window_s,
        concurrency_histogram=vm.concurrency_histogram(
            sample.snapshot.running for samples in history.values() for sample in samples),
        tpot_buckets=increase.tpot_buckets if increase is not None else (),
        ttft_buckets=increase.ttft_buckets if increase is not None else (),
    )


async def _scrape(session: aiohttp.ClientSession, base_url: str, limits: ReadLimits,
                  max_positions: int) -> tuple[vm.VllmSnapshot | str, tuple[str, ...]]:
    """One pod's snapshot, or why there is none (words of our own, never the pod's answer), and what the
    bounds left out."""
    try:
        body = await bounded_get(session, f"{base_url}/metrics", limits)
    except ReadRefused as refused:
        return f"/metrics: {refused.why}", ((f"/metrics {refused.why}",) if refused.cut else ())
    try:
        return vm.parse_page(body.decode("utf-8", errors="replace"), max_positions=max_positions,
                             max_samples=limits.max_series)
    except vllm_page.TooManySamples as error:
        return f"/metrics: {error}", (f"/metrics {error}",)
    except ValueError as error:
        return f"/metrics: {error}", ()
