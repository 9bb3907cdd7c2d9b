"""A stand-in for a vLLM server's /metrics: vLLM-named metrics driven by a mutable state object.

Tests (and the simulated engine of the demo) set the load (running / waiting requests, KV cache usage)
and the rates at which the engine would work (request-steps per second, drafts per step, per-position
acceptance, finished requests and their TPOT / TTFT); the counters and histograms advance by integrating
those rates over time, so a scraper sees exactly what a steady vLLM engine would show. Names and labels
(`engine`, `model_name`) are vLLM's; the spec-decode counters appear only while speculation is on, as in
vLLM. Counter values are fractional because they integrate rates; Prometheus does not mind.
"""

from __future__ import annotations

import bisect
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry
from prometheus_client.utils import floatToGoString

from specpilot import vllm_page
from specpilot.observe import vllm_metrics as vm

# The text format generate_latest writes; Prometheus 2.x knows it by this version.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclasses.dataclass
class PromHistogram:
    """A Prometheus histogram of seconds with fixed bucket bounds (the +Inf bucket last), fed by events."""

    bounds_s: tuple[float, ...]
    counts: list[float] = dataclasses.field(init=False)
    sum_s: float = 0.0

    def __post_init__(self) -> None:
        self.counts = [0.0] * (len(self.bounds_s) + 1)

    def observe(self, value_s: float, n: float) -> None:
        self.counts[bisect.bisect_left(self.bounds_s, value_s)] += n
        self.sum_s += value_s * n

    def cumulative(self) -> list[tuple[str, float]]:
        out, running = [], 0.0
        for bound, count in zip((*self.bounds_s, float("inf")), self.counts):
            running += count
            out.append((floatToGoString(bound), running))
        return out


class VllmMetricsState:
    """The engine whose metrics the exporter serves. Mutate it through the methods; counters integrate."""

    def __init__(
        self,
        *,
        model_name: str = "specpilot-sim",
        engine: str = "0",
        block_size: int = 16,
        num_gpu_blocks: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.model_name = model_name
        self.engine = engine
        self.block_size = block_size
        self.num_gpu_blocks = num_gpu_blocks
        self._clock = clock
        self.running = 0.0
        self.waiting = 0.0
        self.kv_cache_usage = 0.0
        self.request_steps_per_second = 0.0
        self.drafts_per_step = 0.0
        self.acceptance_per_position: tuple[float, ...] = ()
        self.finished_requests_per_second = 0.0
        self.tpot_s = 0.02
        self.ttft_s = 0.1
        self._reset_counters()
        self._advanced_at = clock()

    def set_load(
        self, *, running: float | None = None, waiting: float | None = None, kv_cache_usage: float | None = None
    ) -> None:
        """Sets the gauges; None leaves a gauge as it is."""
        if running is not None:
            self.running = running
        if waiting is not None:
            self.waiting = waiting
        if kv_cache_usage is not None:
            self.kv_cache_usage = kv_cache_usage

    def set_rates(
        self,
        *,
        request_steps_per_second: float | None = None,
        drafts_per_step: float | None = None,
        acceptance_per_position: Sequence[float] | None = None,
        finished_requests_per_second: float | None = None,
        tpot_s: float | None = None,
        ttft_s: float | None = None,
    ) -> None:
        """Changes how fast the counters grow from now on (what happened so far is kept).

        Each request-step emits one token plus the accepted drafts; a step drafts with probability
        `drafts_per_step`, and a draft's token at position j is accepted with probability
        acceptance_per_position[j]. An empty acceptance_per_position means speculation is off.
        """
        self.advance()
        if request_steps_per_second is not None:
            self.request_steps_per_second = request_steps_per_second
        if drafts_per_step is not None:
            self.drafts_per_step = drafts_per_step
        if acceptance_per_position is not None:
            self.acceptance_per_position = tuple(acceptance_per_position)
            self._accepted_per_position += [0.0] * (len(self.acceptance_per_position)
                                                    - len(self._accepted_per_position))
        if finished_requests_per_second is not None:
            self.finished_requests_per_second = finished_requests_per_second
        if tpot_s is not None:
            self.tpot_s = tpot_s
        if ttft_s is not None:
            self.ttft_s = ttft_s

    def restart(self) -> None:
        """Zeroes every counter and histogram, as a restarted vLLM pod would."""
        self._reset_counters()
        self._advanced_at = self._clock()

    def advance(self) -> None:
        """Integrates the rates up to now."""
        now = self._clock()
        dt = max(0.0, now - self._advanced_at)
        self._advanced_at = now
        steps = self.request_steps_per_second * dt
        speculating = bool(self.acceptance_per_position)
        drafts = steps * self.drafts_per_step if speculating else 0.0
        accepted_per_position = [drafts * p for p in self.acceptance_per_position]
        accepted = sum(accepted_per_position)
        self._generation_tokens += steps + accepted
        if speculating:
            self._drafts += drafts
            self._draft_tokens += drafts * len(self.acceptance_per_position)
            self._accepted_tokens += accepted
            for j, value in enumerate(accepted_per_position):
                self._accepted_per_position[j] += value
        finished = self.finished_requests_per_second * dt
        if finished > 0:
            self._tpot.observe(self.tpot_s, finished)
            self._ttft.observe(self.ttft_s, finished)
            self._request_success += finished

    def metric_families(self) -> Iterator[Metric]:
        """The families as vLLM names them, advanced to now."""
        self.advance()
        labels = [vllm_page.ENGINE_LABEL, vllm_page.MODEL_NAME_LABEL]
        values = [self.engine, self.model_name]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=labels)
            family.add_metric(values, value)
            return family

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(values, value)
            return family

        def histogram(name: str, doc: str, hist: PromHistogram) -> HistogramMetricFamily:
            family = HistogramMetricFamily(name, doc, labels=labels)
            family.add_metric(values, hist.cumulative(), sum_value=hist.sum_s)
            return family

        yield gauge(vllm_page.NUM_REQUESTS_RUNNING, "Number of requests in model execution batches.", self.running)
        yield gauge(vllm_page.NUM_REQUESTS_WAITING, "Number of requests waiting to be processed.", self.waiting)
        yield gauge(vllm_page.KV_CACHE_USAGE_PERC, "KV-cache usage. 1 means 100 percent usage.", self.kv_cache_usage)
        yield counter(vllm_page.GENERATION_TOKENS_TOTAL, "Number of generation tokens processed.",
                      self._generation_tokens)
        yield counter(vllm_page.REQUEST_SUCCESS_TOTAL, "Count of successfully processed requests.",
                      self._request_success)
        if self.acceptance_per_position:
            yield counter(vllm_page.SPEC_DECODE_DRAFTS_TOTAL, "Number of spec decoding drafts.", self._drafts)
            yield counter(vllm_page.SPEC_DECODE_DRAFT_TOKENS_TOTAL, "Number of draft tokens.", self._draft_tokens)
            yield counter(vllm_page.SPEC_DECODE_ACCEPTED_TOKENS_TOTAL, "Number of accepted tokens.",
                          self._accepted_tokens)
            per_position = CounterMetricFamily(vllm_page.SPEC_DECODE_ACCEPTED_PER_POS_TOTAL,
                                               "Accepted tokens per draft position.",
                                               labels=[*labels, vllm_page.POSITION_LABEL])
            for j in range(len(self.acceptance_per_position)):
                per_position.add_metric([*values, str(j)], self._accepted_per_position[j])
            yield per_position
        yield histogram(vllm_page.TPOT_SECONDS, "Histogram of time per output token in seconds.", self._tpot)
        yield histogram(vllm_page.TTFT_SECONDS, "Histogram of time to first token in seconds.", self._ttft)
        info = GaugeMetricFamily(vllm_page.CACHE_CONFIG_INFO, "Information of the LLMEngine CacheConfig",
                                 labels=[vllm_page.ENGINE_LABEL, "block_size", "num_gpu_blocks",
                                         "kv_cache_size_tokens"])
        info.add_metric([self.engine, str(self.block_size), str(self.num_gpu_blocks),
                         str(self.block_size * self.num_gpu_blocks)], 1.0)
        yield info

    def _reset_counters(self) -> None:
        self._generation_tokens = 0.0
        self._request_success = 0.0
        self._drafts = 0.0
        self._draft_tokens = 0.0
        self._accepted_tokens = 0.0
        self._accepted_per_position = [0.0] * len(self.acceptance_per_position)
        self._tpot = PromHistogram(vm.TPOT_BUCKETS_S)
        self._ttft = PromHistogram(vm.TTFT_BUCKETS_S)


class _StateCollector(Collector):
    def __init__(self, state: VllmMetricsState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        return self._state.metric_families()


def render_metrics(state: VllmMetricsState) -> bytes:
    """The /metrics page of `state`, in Prometheus' text format."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_StateCollector(state))
    return generate_latest(registry)


def exporter_app(state: VllmMetricsState) -> web.Application:
    """An aiohttp app serving `state` at /metrics."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=render_metrics(state), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    return app


async def start_exporter(
    state: VllmMetricsState, host: str = "127.0.0.1", port: int = 0
) -> tuple[web.AppRunner, str]:
    """Serves `state` on host:port (0: a free port); returns the runner (await runner.cleanup() to stop)
    and the base URL, e.g. http://127.0.0.1:40123."""
    runner = web.AppRunner(exporter_app(state), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound_host, bound_port = runner.addresses[0][:2]
    return runner, f"http://{bound_host}:{bound_port}"
