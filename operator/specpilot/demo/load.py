"""The demo's clients: keep N requests in flight against the Service (every ready serving pod of every
pool, least outstanding first), and record what each request saw.

They send the workload the deployment was profiled with (ShareGPT's first turns, other prompts than the
profiles' own): a crossover measured on long prompts sits at a higher concurrency than one on short prompts
(more context to read per step keeps the step memory-bound longer), so serving another workload than the
profiled one would be a different experiment."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp

PROMPT_SEED = 1
"""Seed of the clients' ShareGPT sample (the profiles' is the workload's own, 0)."""
PROMPT_COUNT = 512


def demo_prompts() -> tuple[str, ...]:
    """The prompts the clients send, in turn (ShareGPT first turns, as the deployment's profiling workload)."""
    from specpilot_bench.workloads import load_prompts

    return tuple(p.text for p in load_prompts("sharegpt", PROMPT_COUNT, output_len=1, seed=PROMPT_SEED))


@dataclass(frozen=True)
class Sample:
    finished_at: float
    pool: str
    latency_s: float
    tokens: int

    @property
    def ms_per_token(self) -> float:
        return 1000 * self.latency_s / max(1, self.tokens)


@dataclass
class LoadDriver:
    """Closed-loop load: `concurrency` workers, each sending one request after another."""

    endpoints: Callable[[], list[tuple[str, str]]]
    """Current (pool, base URL) of the ready pods behind the Service."""
    model: str
    max_tokens: int
    samples: list[Sample] = field(default_factory=list)
    errors: int = 0
    prompts: tuple[str, ...] = field(default_factory=demo_prompts)
    _outstanding: dict[str, int] = field(default_factory=dict)
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

    async def set_concurrency(self, concurrency: int) -> None:
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

    def _pick(self) -> tuple[str, str] | None:
        endpoints = self.endpoints()
        if not endpoints:
            return None
        random.shuffle(endpoints)
        return min(endpoints, key=lambda e: self._outstanding.get(e[1], 0))

    async def _worker(self) -> None:
        assert self._session is not None
        turn = random.randrange(len(self.prompts))
        while True:
            turn += 1
            target = self._pick()
            if target is None:
                await asyncio.sleep(0.2)
                continue
            pool, url = target
            self._outstanding[url] = self._outstanding.get(url, 0) + 1
            started = time.monotonic()
            try:
                async with self._session.post(f"{url}/v1/completions", json={
                        "model": self.model, "prompt": self.prompts[turn % len(self.prompts)], "max_tokens": self.max_tokens,
                        "ignore_eos": True, "temperature": 0}) as response:
                    body = await response.json()
                    tokens = int(body["usage"]["completion_tokens"]) if response.status == 200 else 0
                if tokens:
                    self.samples.append(Sample(time.monotonic(), pool, time.monotonic() - started, tokens))
                else:
                    self.errors += 1
            except (aiohttp.ClientError, asyncio.TimeoutError, KeyError, ValueError):
                self.errors += 1
                await asyncio.sleep(0.2)
            finally:
                self._outstanding[url] -= 1

    def in_flight(self, url: str) -> int:
        """Requests this driver has in flight at one pod."""
        return self._outstanding.get(url, 0)

    def recent(self, window_s: float, pool: str | None = None) -> list[Sample]:
        since = time.monotonic() - window_s
        return [s for s in self.samples if s.finished_at >= since and (pool is None or s.pool == pool)]
