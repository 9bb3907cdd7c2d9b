"""The pod-scrape source against vLLM-named exporters over real HTTP, on a shared fake clock.

The exporters' counters and the source's ring buffers read the same fake clock, so every rate and ratio
is exact and no test sleeps.
"""

from __future__ import annotations

import socket
from datetime import UTC, datetime

import pytest
from aiohttp import web

from specpilot.observe import vllm_metrics as vm
from specpilot.observe.model import MetricsUnavailable
from specpilot.observe.pods import PodScrapeSource
from specpilot_sandbox.exporter import VllmMetricsState, start_exporter

ACCEPTANCE = [0.8, 0.5]
OBSERVED_AT = datetime(2026, 1, 1, tzinfo=UTC)


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


class Pods:
    """Exporters standing in for vLLM pods, on the shared fake clock."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.states: list[VllmMetricsState] = []
        self.targets: list[tuple[str, str]] = []
        self.runners: list[web.AppRunner] = []

    async def start(self, names: list[str]) -> tuple[list[VllmMetricsState], list[tuple[str, str]]]:
        for name in names:
            state = VllmMetricsState(clock=self.clock)
            runner, url = await start_exporter(state)
            self.runners.append(runner)
            self.states.append(state)
            self.targets.append((name, url))
        return self.states, self.targets

    async def stop(self, index: int) -> None:
        """The pod stops answering at its address (crashed, or its node went away)."""
        await self.runners[index].cleanup()


@pytest.fixture
async def pods(clock):
    """Factory: await pods(names) -> (states, targets) of running exporters; stopped after the test."""
    started = Pods(clock)
    yield started.start
    for runner in started.runners:
        await runner.cleanup()


def source(clock: FakeClock, *, window_s: float = 60, stale_after_s: float = 30) -> PodScrapeSource:
    return PodScrapeSource(window_s=window_s, stale_after_s=stale_after_s, timeout_s=2, clock=clock,
                           wall_clock=lambda: OBSERVED_AT)


async def test_rates_acceptance_and_tpot_from_two_scrapes(clock, pods):
    states, targets = await pods(["chat-l4-a-1", "chat-l4-a-2"])
    for state, running in zip(states, (2, 6)):
        state.set_load(running=running, waiting=1, kv_cache_usage=0.25)
        state.set_rates(request_steps_per_second=100, drafts_per_step=0.5, acceptance_per_position=ACCEPTANCE,
                        finished_requests_per_second=1, tpot_s=0.03)
    observer = source(clock)

    first = await observer.observe(targets)
    assert first.replicas_reporting == 2
    assert first.running_per_replica == 4 and first.total_running == 8
    assert first.waiting_per_replica == 1 and first.total_waiting == 2
    assert first.kv_cache_usage == pytest.approx(0.25)
    # One sample per pod: nothing to take a rate of yet.
    assert first.generation_tokens_per_second is None and first.tpot_p95_ms is None
    assert first.acceptance_per_position == []
    assert first.observed_at == OBSERVED_AT and first.window_s == 60

    clock.now_s += 10
    second = await observer.observe(targets)
    tokens_per_step = 1 + 0.5 * sum(ACCEPTANCE)
    assert second.generation_tokens_per_second == pytest.approx(2 * 100 * tokens_per_step)
    assert second.acceptance_per_position == pytest.approx(ACCEPTANCE)
    assert second.drafts_per_step == pytest.approx(0.5)
    assert second.mean_acceptance_length == pytest.approx(1 + sum(ACCEPTANCE))
    # Every TPOT is 30 ms, in vLLM's (25, 50] ms bucket: rank 95% interpolates to 48.75 ms.
    assert second.tpot_p95_ms == pytest.approx(48.75)
    assert second.concurrency_histogram == [(2.0, 0.5), (6.0, 0.5)]
    # The window's histograms, for the SLO attainment: 20 requests finished (2 pods x 1/s x 10 s), each with a
    # TPOT of 30 ms and the exporter's TTFT of 100 ms.
    tpot_50ms, tpot_25ms = vm.fraction_within(0.05, second.tpot_buckets), vm.fraction_within(0.025, second.tpot_buckets)
    assert tpot_50ms.count == pytest.approx(20) and tpot_50ms.fraction == 1.0 and tpot_25ms.fraction == 0.0
    assert vm.fraction_within(0.1, second.ttft_buckets).fraction == 1.0
    assert vm.fraction_within(0.08, second.ttft_buckets).fraction == 0.0


async def test_gauges_average_over_the_rounds_in_the_window_and_old_rounds_leave_it(clock, pods):
    states, targets = await pods(["p-a-1"])
    observer = source(clock, window_s=25)
    for running in (2, 4, 9):
        states[0].set_load(running=running)
        observation = await observer.observe(targets)
        clock.now_s += 10
    assert observation.running_per_replica == pytest.approx((2 + 4 + 9) / 3)
    assert observation.concurrency_histogram == [(2.0, 1 / 3), (4.0, 1 / 3), (9.0, 1 / 3)]

    states[0].set_load(running=9)
    later = await observer.observe(targets)  # now 30 s after the first round, which left the window
    assert later.running_per_replica == pytest.approx((4 + 9 + 9) / 3)


async def test_a_pod_restart_resets_its_counters_without_negative_increases(clock, pods):
    states, targets = await pods(["p-a-1"])
    state = states[0]
    state.set_rates(request_steps_per_second=10, drafts_per_step=1, acceptance_per_position=[0.5])
    observer = source(clock)
    await observer.observe(targets)
    clock.now_s += 10
    await observer.observe(targets)
    clock.now_s += 5
    state.restart()
    clock.now_s += 5
    observation = await observer.observe(targets)
    # 10 s counted before the restart, 5 s after it; the 5 s before the restart were lost with the pod.
    assert observation.generation_tokens_per_second == pytest.approx((10 + 5) * 10 * 1.5 / 20)
    assert observation.acceptance_per_position == pytest.approx([0.5])


async def test_a_vanished_pod_stops_counting(clock, pods):
    states, targets = await pods(["p-a-1", "p-a-2"])
    states[0].set_load(running=1)
    states[1].set_load(running=7)
    observer = source(clock)
    await observer.observe(targets)
    clock.now_s += 10
    observation = await observer.observe(targets[:1])  # p-a-2 was scaled down
    assert observation.replicas_reporting == 1
    assert observation.running_per_replica == 1
    assert observation.concurrency_histogram == [(1.0, 1.0)]


async def test_a_rescheduled_pod_with_nothing_scraped_yet(clock, pods):
    states, targets = await pods(["p-a-1"])
    observer = source(clock)
    await observer.observe(targets)
    # The same pod name at another address is another pod (rescheduled, new IP): nothing known of it.
    with pytest.raises(MetricsUnavailable, match=r"^could not scrape any of the 1 pods: p-a-1 at http://127"):
        await observer.observe([("p-a-1", f"http://127.0.0.1:{_closed_port()}")])


async def test_a_failed_scrape_keeps_recent_samples_then_goes_stale(clock):
    started = Pods(clock)
    states, targets = await started.start(["p-a-1"])
    states[0].set_load(running=3)
    observer = source(clock, stale_after_s=15)
    await observer.observe(targets)
    await started.stop(0)

    clock.now_s += 10
    recent = await observer.observe(targets)  # the last sample is 10 s old, stale after 15 s
    assert recent.replicas_reporting == 1
    assert recent.running_per_replica == 3
    clock.now_s += 10
    with pytest.raises(MetricsUnavailable, match=r"^stale: newest sample 20 s old \(stale after 15 s\); p-a-1 at"):
        await observer.observe(targets)


async def test_nothing_to_scrape_or_not_vllm(clock):
    observer = source(clock)
    with pytest.raises(MetricsUnavailable, match="no pods to scrape"):
        await observer.observe([])

    async def not_vllm(_: web.Request) -> web.Response:
        return web.Response(text="process_cpu_seconds_total 1.0\n")

    app = web.Application()
    app.router.add_get("/metrics", not_vllm)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        with pytest.raises(MetricsUnavailable, match=r"p-a-1 at http://.*: no vllm:num_requests_running"):
            await observer.observe([("p-a-1", f"http://{host}:{port}")])
    finally:
        await runner.cleanup()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
