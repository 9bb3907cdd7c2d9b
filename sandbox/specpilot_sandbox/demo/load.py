"""The demo's clients: keep N requests in flight against the Service (every ready serving pod of every
pool, least outstanding first), and record what each request saw.

They send the workload the deployment was profiled with (ShareGPT's first turns, other prompts than the
profiles' own): a crossover measured on long prompts sits at a higher concurrency than one on short prompts
(more context to read per step keeps the step memory-bound longer), so serving another workload than the
profiled one would be a different experiment.

A phase of the trace begins as a profiled level does (`set_concurrency(..., together=True)`): the previous
phase's clients leave (their requests are cancelled), the driver waits until every replica is idle, and the
phase's clients arrive together, so each engine starts the phase with one burst of its share. Each replica
then takes the prompts in turn from the first. Its requests are then the ones a host-free replay of the same
engine at the same load submits (`engine_core.closed_loop_ms_per_token`: a burst, then the prompts in turn),
and the two compare request for request. Both matter: a few long prompts stall a whole batch while they
prefill, so two samples of the same workload differ by several percent per token over a phase of a few
seconds; and without speculation a burst's requests stay in step (one token each per step, all prefilling
together), while requests that arrived one by one stay staggered, each step carrying some prefill, which the
simulated engine charges as more time per token (about a fifth more at 30 requests on an A100).

Each request is timed with the clock of the replica it went to: the serving engines run on virtual clocks
(`sandbox.clock`, as the benchmark Jobs' engines do), so a latency is simulated seconds of that replica's GPU,
whatever the host's speed, and compares like for like with the host-free replays of the same engine
(`engine_core.closed_loop_ms_per_token`). The driver is closed loop and sticky: a worker whose request
finished sends its next one to the same replica while that replica is among the least loaded, so the
engine's arrival window (the clock stands still until as many requests have come in as finished) sees the
replacement, and the batch a replica steps with is the number of requests the driver holds there. It also
keeps, per replica, the time-average of the requests it holds there in that replica's simulated time
(`InFlight`): the concurrency the engine served, which is Little's law's L (throughput x latency).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

from specpilot.vllm_page import NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, parse_samples

PROMPT_SEED = 1
"""Seed of the clients' ShareGPT sample (the profiles' is the workload's own, 0)."""
PROMPT_COUNT = 512

Clock = Callable[[], float]
"""Seconds on a replica's clock (`specpilot_bench.clock.read_clock`), or the host's (`time.monotonic`)."""


def demo_prompts() -> tuple[str, ...]:
    """The prompts the clients send, in turn (ShareGPT first turns, as the deployment's profiling workload)."""
    from specpilot_bench.workloads import load_prompts

    return tuple(p.text for p in load_prompts("sharegpt", PROMPT_COUNT, output_len=1, seed=PROMPT_SEED))


@dataclass(frozen=True)
class Sample:
    finished_at: float
    """Host time (time.monotonic) the response came in: which phase the request belongs to."""
    pool: str
    latency_s: float
    """End-to-end latency on the replica's clock (simulated seconds on a virtual clock), time to first token
    included."""
    tokens: int
    url: str = ""
    sent_at: float = 0.0
    """Host time the request was sent."""
    turn: int = 0
    """Which of the replica's requests since `restart_prompts` it was (its prompt is the turn-th)."""

    @property
    def ms_per_token(self) -> float:
        return 1000 * self.latency_s / max(1, self.tokens)


@dataclass
class InFlight:
    """Requests the driver holds at one replica, integrated over that replica's clock."""

    count: int = 0
    area: float = 0.0
    """Integral of `count` over the replica's time (request-seconds)."""
    since: float | None = None
    """The replica's time of the first event (None: none yet)."""
    last: float = 0.0

    def advance(self, now: float) -> None:
        if self.since is None:
            self.since = self.last = now
        self.area += self.count * max(0.0, now - self.last)
        self.last = max(self.last, now)


@dataclass
class LoadDriver:
    """Closed-loop load: `concurrency` workers, each sending one request after another."""

    endpoints: Callable[[], list[tuple[str, str]]]
    """Current (pool, base URL) of the ready pods behind the Service."""
    model: str
    max_tokens: int
    clock_of: Callable[[str], Clock | None] = lambda url: None
    """A replica's clock by its base URL (None: the host's, time.monotonic)."""
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0
    prompts: tuple[str, ...] = field(default_factory=demo_prompts)
    _outstanding: dict[str, int] = field(default_factory=dict)
    _in_flight: dict[str, InFlight] = field(default_factory=dict)
    _turns: dict[str, int] = field(default_factory=dict)
    _clocks: dict[str, Clock] = field(default_factory=dict)
    _workers: list[asyncio.Task] = field(default_factory=list)
    _session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> LoadDriver:
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=120), connector=aiohttp.TCPConnector(limit=0))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.set_concurrency(0)
        if self._session is not None:
            await self._session.close()

    async def set_concurrency(self, concurrency: int, *, together: bool = False) -> None:
        """Hold `concurrency` requests in flight. `together`: the current clients leave first (their requests
        cancelled), and once every replica is idle the new ones arrive together, each replica's prompts from
        the first again (see the module docstring)."""
        if together:
            await self.set_concurrency(0)
            await self.wait_idle()
            self.restart_prompts()
        while len(self._workers) < concurrency:
            self._workers.append(asyncio.create_task(self._worker()))
        while len(self._workers) > concurrency:
            task = self._workers.pop()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    @property
    def concurrency(self) -> int:
        return len(self._workers)

    def restart_prompts(self) -> None:
        """Every replica's next request takes the first prompt again (a phase begins)."""
        self._turns.clear()

    async def wait_idle(self, timeout_s: float = 10.0) -> bool:
        """Until no ready replica runs or queues a request (their /metrics), at most `timeout_s`: a cancelled
        request leaves its engine at the step's end. Whether they all went idle."""
        assert self._session is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            busy = False
            for _, url in self.endpoints():
                try:
                    async with self._session.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=2)) as r:
                        samples = parse_samples(await r.text())
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    continue  # gone (rolled away): nothing of this driver's runs there
                if any(value for name in (NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING)
                       for _, value in samples.get(name, [])):
                    busy = True
                    break
            if not busy:
                return True
            await asyncio.sleep(0.05)
        return False

    def clock(self, url: str) -> Clock:
        """The clock requests to `url` are timed with (cached: a reader maps the replica's clock file once)."""
        clock = self._clocks.get(url)
        if clock is None:
            clock = self._clocks[url] = self.clock_of(url) or time.monotonic
        return clock

    def _pick(self, previous: str | None) -> tuple[str, str] | None:
        """Least outstanding first; a worker stays on its replica while that one is among the least loaded
        (so the replacement of a finished request joins the batch it left)."""
        endpoints = self.endpoints()
        if not endpoints:
            return None
        least = min(self._outstanding.get(url, 0) for _, url in endpoints)
        for pool, url in endpoints:
            if url == previous and self._outstanding.get(url, 0) <= least:
                return pool, url
        random.shuffle(endpoints)
        return min(endpoints, key=lambda e: self._outstanding.get(e[1], 0))

    def _count(self, url: str, change: int, now: float) -> None:
        held = self._in_flight.setdefault(url, InFlight())
        held.advance(now)
        held.count += change
        self._outstanding[url] = self._outstanding.get(url, 0) + change

    async def _worker(self) -> None:
        assert self._session is not None
        previous: str | None = None
        while True:
            target = self._pick(previous)
            if target is None:
                await asyncio.sleep(0.2)
                continue
            pool, url = target
            previous = url
            turn = self._turns.get(url, 0)
            self._turns[url] = turn + 1
            clock = self.clock(url)
            sent_at = time.monotonic()
            started = clock()
            self._count(url, +1, started)
            try:
                async with self._session.post(f"{url}/v1/completions", json={
                        "model": self.model, "prompt": self.prompts[turn % len(self.prompts)],
                        "max_tokens": self.max_tokens, "ignore_eos": True, "temperature": 0}) as response:
                    body = await response.json()
                    # The replica's clock stands at the step that finished the request until its replacement
                    # arrives: read it before anything else.
                    ended = clock()
                    tokens = int(body["usage"]["completion_tokens"]) if response.status == 200 else 0
                if tokens:
                    self.samples.append(Sample(time.monotonic(), pool, ended - started, tokens, url=url,
                                               sent_at=sent_at, turn=turn))
                else:
                    self.errors += 1
            except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError):
                self.errors += 1
                await asyncio.sleep(0.2)
            finally:
                self._count(url, -1, clock())

    def in_flight(self, url: str) -> int:
        """Requests this driver has in flight at one pod."""
        return self._outstanding.get(url, 0)

    def held(self) -> dict[str, tuple[float, float, float | None]]:
        """URL -> (request-seconds held there, the replica's time now, its time of the first request) on each
        replica's clock: the difference of two readings over the difference of their times is the time-average
        of the requests held there in between."""
        out = {}
        for url, held in self._in_flight.items():
            held.advance(self.clock(url)())
            out[url] = (held.area, held.last, held.since)
        return out

    def recent(self, window_s: float, pool: str | None = None) -> list[Sample]:
        since = time.monotonic() - window_s
        return [s for s in self.samples if s.finished_at >= since and (pool is None or s.pool == pool)]
