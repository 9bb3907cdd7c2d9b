"""The Prometheus observer against a real Prometheus server scraping vLLM-named exporters as pods.

Each exporter stands in for one vLLM pod; Prometheus (Debian's binary, on loopback) scrapes them every
second with the `namespace` and `pod` labels Kubernetes discovery would give. Assertions wait for the
data with bounded poll loops, never on timing.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

import pytest
from prometheus_server import ScrapeTarget, prometheus_server  # noqa: F401  (prometheus_server is a fixture)

from specpilot.observe import vllm_metrics as vm
from specpilot.observe.model import MetricsUnavailable, PoolObservation
from specpilot.observe.prometheus import PrometheusSource, pool_pod_regex
from specpilot_sandbox.exporter import VllmMetricsState, start_exporter

pytestmark = pytest.mark.prometheus

WINDOW_S = 6.0
POLL_DEADLINE_S = 25.0
ACCEPTANCE = [0.8, 0.6, 0.3]
DRAFTS_PER_STEP = 0.75
POOL_PODS = ["chat-l4-7d9f8b6c5-abcde", "chat-l4-7d9f8b6c5-fghij", "chat-l4-7d9f8b6c5-klmno"]
# Neither may be counted in pool chat-l4 of namespace llm: another Deployment whose name starts the same,
# and a pod of the same name in another namespace.
OTHER_PODS = [("llm", "chat-l4-big-5f6d7c8b9-pqrst"), ("staging", "chat-l4-7d9f8b6c5-zzzzz")]


class Exporters:
    """Exporters on the test's event loop, one per pod."""

    def __init__(self) -> None:
        self.states: dict[str, VllmMetricsState] = {}
        self.runners = {}
        self.targets: list[ScrapeTarget] = []

    async def add(self, namespace: str, pod: str, state: VllmMetricsState) -> None:
        runner, url = await start_exporter(state)
        self.states[pod] = state
        self.runners[pod] = runner
        self.targets.append(ScrapeTarget(url.removeprefix("http://"), namespace, pod))

    async def stop(self, pod: str) -> None:
        await self.runners.pop(pod).cleanup()

    async def close(self) -> None:
        for pod in list(self.runners):
            await self.stop(pod)


@pytest.fixture
async def exporters():
    started = Exporters()
    yield started
    await started.close()


async def poll(observe: Callable, settled: Callable[[PoolObservation], bool]) -> PoolObservation:
    """Observes until `settled` holds; fails with the last observation after POLL_DEADLINE_S."""
    last: PoolObservation | MetricsUnavailable | None = None
    loop = asyncio.get_running_loop()
    deadline = loop.time() + POLL_DEADLINE_S
    while loop.time() < deadline:
        try:
            last = await observe()
        except MetricsUnavailable as error:
            last = error
        else:
            if settled(last):
                return last
        await asyncio.sleep(0.5)
    pytest.fail(f"the observation did not settle within {POLL_DEADLINE_S:g} s; last: {last!r}")


def close_to(actual: float | None, expected: float, tolerance: float) -> bool:
    return actual is not None and math.isclose(actual, expected, abs_tol=tolerance)


async def test_load_up_then_down_and_live_acceptance(exporters, prometheus_server):  # noqa: F811
    for pod in POOL_PODS:
        state = VllmMetricsState()
        state.set_load(running=8, waiting=2, kv_cache_usage=0.5)
        state.set_rates(request_steps_per_second=40, drafts_per_step=DRAFTS_PER_STEP,
                        acceptance_per_position=ACCEPTANCE, finished_requests_per_second=2, tpot_s=0.03)
        await exporters.add("llm", pod, state)
    for namespace, pod in OTHER_PODS:
        state = VllmMetricsState()
        state.set_load(running=50, waiting=20, kv_cache_usage=0.9)
        state.set_rates(request_steps_per_second=400, drafts_per_step=1.0, acceptance_per_position=[0.1],
                        finished_requests_per_second=5, tpot_s=0.5)
        await exporters.add(namespace, pod, state)
    server = await asyncio.to_thread(prometheus_server, exporters.targets)
    source = PrometheusSource(server.url, window_s=WINDOW_S, stale_after_s=5)
    regex = pool_pod_regex("chat-l4")

    tokens_per_step = 1 + DRAFTS_PER_STEP * sum(ACCEPTANCE)
    # Settled: the whole window holds the new load. rate() extrapolates to the window edges, so the token
    # rate converges to within a few percent rather than exactly.
    high = await poll(lambda: source.observe("llm", regex),
                      lambda o: o.replicas_reporting == 3 and close_to(o.total_running, 24, 1e-6)
                      and o.concurrency_histogram == [(8.0, 1.0)]
                      and close_to(o.generation_tokens_per_second, 3 * 40 * tokens_per_step, 0.05 * 3 * 40))
    assert high.running_per_replica == pytest.approx(8)
    assert high.waiting_per_replica == pytest.approx(2)
    assert high.total_waiting == pytest.approx(6)
    assert high.kv_cache_usage == pytest.approx(0.5)
    assert high.acceptance_per_position == pytest.approx(ACCEPTANCE, abs=0.01)
    assert high.drafts_per_step == pytest.approx(DRAFTS_PER_STEP, abs=0.01)
    assert high.mean_acceptance_length == pytest.approx(1 + sum(ACCEPTANCE), abs=0.02)
    assert 25 < high.tpot_p95_ms <= 50  # every request's TPOT is 30 ms: vLLM's (25 ms, 50 ms] bucket
    # The histograms the SLO attainment is read from, over the pool's pods only: every TPOT within 50 ms and none
    # within 25 ms; every TTFT (the exporter's 100 ms) within a 100 ms SLO, none within 80 ms.
    assert vm.fraction_within(0.05, high.tpot_buckets).fraction == pytest.approx(1.0)
    assert vm.fraction_within(0.025, high.tpot_buckets).fraction == pytest.approx(0.0)
    assert vm.fraction_within(0.1, high.ttft_buckets).fraction == pytest.approx(1.0)
    assert vm.fraction_within(0.08, high.ttft_buckets).fraction == pytest.approx(0.0)

    for pod in POOL_PODS:
        exporters.states[pod].set_load(running=1, waiting=0)
        exporters.states[pod].set_rates(request_steps_per_second=10, tpot_s=0.012)
    low = await poll(lambda: source.observe("llm", regex),
                     lambda o: close_to(o.total_running, 3, 1e-6) and o.concurrency_histogram == [(1.0, 1.0)]
                     and o.tpot_p95_ms is not None and o.tpot_p95_ms <= 25
                     and close_to(o.generation_tokens_per_second, 3 * 10 * tokens_per_step, 0.05 * 3 * 10))
    assert low.running_per_replica == pytest.approx(1)
    assert low.waiting_per_replica == pytest.approx(0)
    assert low.acceptance_per_position == pytest.approx(ACCEPTANCE, abs=0.01)
    assert 10 < low.tpot_p95_ms <= 25

    with pytest.raises(MetricsUnavailable, match="no series for pods matching"):
        await source.observe("llm", pool_pod_regex("chat-a100"))
    with pytest.raises(MetricsUnavailable, match="failed the query"):
        await source.observe("llm", "(unclosed")


async def test_pods_that_stop_drop_out_then_the_pool_goes_stale(exporters, prometheus_server):  # noqa: F811
    pods = ["solo-h100-6b7c8d9f5-aaaaa", "solo-h100-6b7c8d9f5-bbbbb"]
    for pod in pods:
        state = VllmMetricsState()
        state.set_load(running=4)
        state.set_rates(request_steps_per_second=20)
        await exporters.add("llm", pod, state)
    server = await asyncio.to_thread(prometheus_server, exporters.targets)
    source = PrometheusSource(server.url, window_s=30, stale_after_s=2)
    regex = pool_pod_regex("solo-h100")

    both = await poll(lambda: source.observe("llm", regex), lambda o: o.replicas_reporting == 2)
    assert both.acceptance_per_position == []  # SD off: vLLM exports no spec-decode counters
    assert both.drafts_per_step is None and both.mean_acceptance_length is None

    await exporters.stop(pods[0])
    one = await poll(lambda: source.observe("llm", regex), lambda o: o.replicas_reporting == 1)
    assert one.running_per_replica > 0

    await exporters.stop(pods[1])

    async def stale_reason() -> str | None:
        try:
            await source.observe("llm", regex)
        except MetricsUnavailable as error:
            return error.reason
        return None

    loop = asyncio.get_running_loop()
    deadline = loop.time() + POLL_DEADLINE_S
    reason = await stale_reason()
    while reason is None and loop.time() < deadline:
        await asyncio.sleep(0.5)
        reason = await stale_reason()
    assert reason is not None and reason.startswith("stale: newest sample "), reason


async def test_the_demand_history_of_a_deployments_pools(exporters, prometheus_server):  # noqa: F811
    pods = {"chat-a100-6b7c8d9f5-aaaaa": 20, "chat-h100-7c8d9f5b6-bbbbb": 30, "chat-h100-7c8d9f5b6-ccccc": 30}
    others = {("llm", "chat-a100-big-5f6d7c8b9-ddddd"): 400, ("staging", "chat-h100-7c8d9f5b6-eeeee"): 400}
    for (namespace, pod), steps in [*((("llm", p), s) for p, s in pods.items()), *others.items()]:
        state = VllmMetricsState()
        state.set_load(running=2)
        state.set_rates(request_steps_per_second=steps)  # no speculation: a token per step
        await exporters.add(namespace, pod, state)
    server = await asyncio.to_thread(prometheus_server, exporters.targets)
    source = PrometheusSource(server.url, window_s=4.0, stale_after_s=5)

    async def history():
        samples = await source.demand_history("llm", ["chat-a100", "chat-h100"], span_s=20.0, step_s=1.0)
        return HistoryReading(samples)

    # the three pods of the two pools, not the Deployment whose name starts the same nor the other namespace
    reading = await poll(history, lambda h: len(h.samples) >= 3 and close_to(h.samples[-1][1], 80.0, 4.0))
    times = [t for t, _ in reading.samples]
    assert times == sorted(times) and len(times) <= 21
    assert all(value <= 84.0 for _, value in reading.samples)
    assert await source.demand_history("llm", ["nothing-here"], span_s=20.0, step_s=1.0) == []


class HistoryReading:
    """A demand history with the attributes `poll` reports."""

    def __init__(self, samples) -> None:
        self.samples = samples

    def __repr__(self) -> str:
        return f"HistoryReading({self.samples[-3:]!r})"


async def test_no_prometheus_at_the_url():
    source = PrometheusSource("http://127.0.0.1:9", window_s=60, stale_after_s=30, timeout_s=2)
    with pytest.raises(MetricsUnavailable, match=r"^no Prometheus at http://127\.0\.0\.1:9"):
        await source.observe("llm", pool_pod_regex("chat-l4"))
