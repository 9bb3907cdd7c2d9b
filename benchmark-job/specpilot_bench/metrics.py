"""The engine's Prometheus /metrics: parse a scrape, take deltas between two, sample load during a level.

Names and the bounded page parser are `specpilot.vllm_page`'s (vLLM 0.32's names). Samples are summed over
engines (labels `engine`, `model_name`) because a profile measures the whole server. Spec-decode counters exist
only when speculation is on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from dataclasses import dataclass, field

import aiohttp

from specpilot.vllm_page import (
    CACHE_CONFIG_INFO,
    GENERATION_TOKENS_TOTAL,
    KV_CACHE_USAGE_PERC,
    NUM_PREEMPTIONS_TOTAL,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    POSITION_LABEL,
    SPEC_DECODE_ACCEPTED_PER_POS_TOTAL,
    SPEC_DECODE_ACCEPTED_TOKENS_TOTAL,
    SPEC_DECODE_DRAFT_TOKENS_TOTAL,
    SPEC_DECODE_DRAFTS_TOTAL,
    parse_samples,
)


@dataclass(frozen=True)
class MetricsSnapshot:
    """One scrape: sample name -> list of (labels, value)."""

    samples: dict[str, list[tuple[dict[str, str], float]]]

    def total(self, name: str) -> float | None:
        """Sum of a sample over all label sets; None when the engine does not export it."""
        found = self.samples.get(name)
        return None if found is None else sum(value for _, value in found)

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """Sum of a sample per value of one label (e.g. accepted tokens per `position`)."""
        out: dict[str, float] = defaultdict(float)
        for labels, value in self.samples.get(name, []):
            if label in labels:
                out[labels[label]] += value
        return dict(out)

    def speculative_positions(self) -> int:
        """How many draft positions the engine exports: its num_speculative_tokens (0 without speculation).

        vLLM creates the per-position counter for every position 0..K-1 at start-up, so this reads K
        from an engine we did not start (the sidecar) before any request.
        """
        return len(self.by_label(SPEC_DECODE_ACCEPTED_PER_POS_TOTAL, POSITION_LABEL))

    def kv_capacity_tokens(self) -> int | None:
        """KV cache capacity in tokens, from the labels of vllm:cache_config_info."""
        for labels, _ in self.samples.get(CACHE_CONFIG_INFO, []):
            if labels.get("kv_cache_size_tokens", "None") not in ("None", ""):
                return int(float(labels["kv_cache_size_tokens"]))
            blocks, block_size = labels.get("num_gpu_blocks"), labels.get("block_size")
            if blocks not in (None, "None") and block_size not in (None, "None"):
                return int(blocks) * int(block_size)
        return None


def parse_metrics(text: str) -> MetricsSnapshot:
    """Parse Prometheus text exposition into a snapshot (bounded: `specpilot.vllm_page.parse_samples`)."""
    return MetricsSnapshot(parse_samples(text))


@dataclass(frozen=True)
class ServerDeltas:
    """What the server counted between two scrapes (None: the counter is not exported)."""

    generation_tokens: int | None
    num_drafts: int | None
    num_draft_tokens: int | None
    num_accepted_tokens: int | None
    accepted_per_position: list[int]
    preemptions: int | None


def _delta(before: MetricsSnapshot, after: MetricsSnapshot, name: str) -> int | None:
    end = after.total(name)
    if end is None:
        return None
    return max(0, round(end - (before.total(name) or 0.0)))


def server_deltas(before: MetricsSnapshot, after: MetricsSnapshot) -> ServerDeltas:
    """Counter deltas between two scrapes; per-position counts are ordered by position."""
    start = before.by_label(SPEC_DECODE_ACCEPTED_PER_POS_TOTAL, POSITION_LABEL)
    end = after.by_label(SPEC_DECODE_ACCEPTED_PER_POS_TOTAL, POSITION_LABEL)
    per_position = [max(0, round(end[p] - start.get(p, 0.0))) for p in sorted(end, key=int)]
    return ServerDeltas(
        generation_tokens=_delta(before, after, GENERATION_TOKENS_TOTAL),
        num_drafts=_delta(before, after, SPEC_DECODE_DRAFTS_TOTAL),
        num_draft_tokens=_delta(before, after, SPEC_DECODE_DRAFT_TOKENS_TOTAL),
        num_accepted_tokens=_delta(before, after, SPEC_DECODE_ACCEPTED_TOKENS_TOTAL),
        accepted_per_position=per_position,
        preemptions=_delta(before, after, NUM_PREEMPTIONS_TOTAL),
    )


MAX_METRICS_BYTES = 16 * 2**20
"""Largest /metrics body read (decompressed): vLLM's is tens of KiB. The engine runs code the tenant chose,
so an endless or inflating body is cut here and refused."""


async def scrape(session: aiohttp.ClientSession, base_url: str) -> MetricsSnapshot:
    """GET {base_url}/metrics and parse it (at most MAX_METRICS_BYTES, within 30 s)."""
    async with session.get(f"{base_url}/metrics", timeout=aiohttp.ClientTimeout(total=30)) as resp:
        resp.raise_for_status()
        from .engine import read_bounded

        body = await read_bounded(resp, MAX_METRICS_BYTES)
        if len(body) > MAX_METRICS_BYTES:
            raise ValueError(f"{base_url}/metrics is longer than {MAX_METRICS_BYTES} bytes: not a vLLM engine's")
        return parse_metrics(body.decode("utf-8", errors="replace"))


@dataclass
class LoadSamples:
    """Gauges sampled while a level runs."""

    running: list[float] = field(default_factory=list)
    waiting: list[float] = field(default_factory=list)
    kv_cache_usage: list[float] = field(default_factory=list)

    def add(self, snapshot: MetricsSnapshot) -> None:
        for name, into in ((NUM_REQUESTS_RUNNING, self.running), (NUM_REQUESTS_WAITING, self.waiting),
                           (KV_CACHE_USAGE_PERC, self.kv_cache_usage)):
            value = snapshot.total(name)
            if value is not None:
                into.append(value)

    @property
    def mean_running(self) -> float | None:
        return sum(self.running) / len(self.running) if self.running else None

    @property
    def mean_waiting(self) -> float | None:
        return sum(self.waiting) / len(self.waiting) if self.waiting else None

    @property
    def peak_kv_cache_usage(self) -> float | None:
        return min(1.0, max(self.kv_cache_usage)) if self.kv_cache_usage else None


@contextlib.asynccontextmanager
async def sampling_load(session: aiohttp.ClientSession, base_url: str, interval_s: float = 0.5):
    """Sample running/waiting requests and KV usage every `interval_s` while the block runs."""
    samples = LoadSamples()

    async def loop() -> None:
        while True:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                samples.add(await scrape(session, base_url))
            await asyncio.sleep(interval_s)

    task = asyncio.create_task(loop())
    try:
        yield samples
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
