"""The arithmetic that turns vLLM's metrics into load and live acceptance.

One place for both observation sources (Prometheus and direct pod scraping) and for the sandbox's test exporter (the
metric names and the page parser are `specpilot.vllm_page`'s): a /metrics page read into a per-pod snapshot,
counter increases that survive restarts, Prometheus-compatible histogram quantiles, and speculative-decoding
statistics from counter increases. Everything here is pure.

Speculative decoding from counter increases over a window: per-position acceptance, mean acceptance length
and drafts per request-step as `specpilot.specdec` defines them for every reader of vLLM's counters. A window
reads no request counter, so it passes no finished requests: drafts per request-step is then low by about one
step per request (under 1% for outputs of a few hundred tokens).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence

from .. import specdec
from ..vllm_page import (
    GENERATION_TOKENS_TOTAL,
    KV_CACHE_USAGE_PERC,
    MAX_SAMPLES,
    NUM_REQUESTS_RUNNING,
    NUM_REQUESTS_WAITING,
    POSITION_LABEL,
    SPEC_DECODE_ACCEPTED_PER_POS_TOTAL,
    SPEC_DECODE_ACCEPTED_TOKENS_TOTAL,
    SPEC_DECODE_DRAFT_TOKENS_TOTAL,
    SPEC_DECODE_DRAFTS_TOTAL,
    TPOT_SECONDS,
    TTFT_SECONDS,
    TooManySamples,
    parse_samples,
)

TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0)
"""vLLM's bucket upper bounds for TPOT (a +Inf bucket follows)."""
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
"""vLLM's bucket upper bounds for TTFT (a +Inf bucket follows)."""

TPOT_QUANTILE = 0.95

Buckets = tuple[tuple[float, float], ...]
"""Cumulative histogram buckets: (upper bound `le`, count of observations <= le), sorted by le."""


@dataclasses.dataclass(frozen=True)
class SpecDecodeCounts:
    """The speculative-decoding counters (or their increase over a window)."""

    drafts: float
    draft_tokens: float
    accepted_tokens: float
    accepted_per_position: tuple[float, ...]

    def __add__(self, other: SpecDecodeCounts) -> SpecDecodeCounts:
        width = max(len(self.accepted_per_position), len(other.accepted_per_position))
        return SpecDecodeCounts(
            drafts=self.drafts + other.drafts,
            draft_tokens=self.draft_tokens + other.draft_tokens,
            accepted_tokens=self.accepted_tokens + other.accepted_tokens,
            accepted_per_position=tuple(
                _at(self.accepted_per_position, j) + _at(other.accepted_per_position, j) for j in range(width)
            ),
        )


@dataclasses.dataclass(frozen=True)
class VllmSnapshot:
    """One scrape of one pod, summed over its engines (a pod runs one engine per data-parallel rank)."""

    running: float
    waiting: float
    kv_cache_usage: float | None
    """Mean over engines; None when the page has no vllm:kv_cache_usage_perc."""
    generation_tokens: float
    spec_decode: SpecDecodeCounts | None
    """None when the page has no spec-decode counters (SD off)."""
    tpot_buckets: Buckets
    ttft_buckets: Buckets = ()


@dataclasses.dataclass(frozen=True)
class CounterIncrease:
    """How much a pod's (or a pool's) counters grew over a window."""

    generation_tokens: float
    spec_decode: SpecDecodeCounts | None
    tpot_buckets: Buckets
    ttft_buckets: Buckets = ()

    def __add__(self, other: CounterIncrease) -> CounterIncrease:
        if self.spec_decode is None or other.spec_decode is None:
            spec_decode = self.spec_decode or other.spec_decode
        else:
            spec_decode = self.spec_decode + other.spec_decode
        return CounterIncrease(
            generation_tokens=self.generation_tokens + other.generation_tokens,
            spec_decode=spec_decode,
            tpot_buckets=_add_buckets(self.tpot_buckets, other.tpot_buckets),
            ttft_buckets=_add_buckets(self.ttft_buckets, other.ttft_buckets),
        )


@dataclasses.dataclass(frozen=True)
class SpecDecodeSummary:
    acceptance_per_position: list[float]
    drafts_per_step: float | None
    mean_acceptance_length: float | None


MAX_POSITIONS = 64
"""Most draft positions read from any page (the CRD bounds K at 16); callers pass the served method's K."""
MAX_BUCKETS = 64
"""Most buckets kept of a latency histogram (vLLM's TPOT has 20, its TTFT 23); a page with more has that
histogram ignored."""
MAX_GAUGE = 1e6
"""Largest plausible running/waiting requests per engine; larger or non-finite values are ignored."""
def parse_snapshot(text: str, *, max_positions: int = MAX_POSITIONS, max_samples: int = MAX_SAMPLES) -> VllmSnapshot:
    """Reads a vLLM /metrics page (Prometheus text format). Raises ValueError when it is not one."""
    return parse_page(text, max_positions=max_positions, max_samples=max_samples)[0]


def parse_page(text: str, *, max_positions: int = MAX_POSITIONS,
               max_samples: int = MAX_SAMPLES) -> tuple[VllmSnapshot, tuple[str, ...]]:
    """Reads a vLLM /metrics page into a snapshot, and says what was left out of it.

    The page comes from a pod the tenant controls, so every number is bounded before it is kept: draft
    positions outside 0..max_positions-1 (or not integers) are ignored, a TPOT histogram with more than
    MAX_BUCKETS buckets is ignored, non-finite or negative values (and gauges above MAX_GAUGE) are ignored,
    and a page with more than `max_samples` samples is refused (TooManySamples). Error messages never quote
    the page. Raises ValueError when the page is not a vLLM page.
    """
    max_positions = max(0, min(max_positions, MAX_POSITIONS))
    gauges: dict[str, list[float]] = defaultdict(list)
    counters: dict[str, float] = defaultdict(float)
    per_position: dict[int, float] = defaultdict(float)
    histograms: dict[str, dict[float, float]] = {TPOT_SECONDS: defaultdict(float), TTFT_SECONDS: defaultdict(float)}
    ignored_positions = ignored_values = 0
    for name, series in parse_samples(text, max_samples=max_samples).items():
        for labels, value in series:
            if not math.isfinite(value) or value < 0:
                ignored_values += name in _READ
                continue
            if name in (NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, KV_CACHE_USAGE_PERC):
                if value > MAX_GAUGE:
                    ignored_values += 1
                else:
                    gauges[name].append(value)
            elif name == SPEC_DECODE_ACCEPTED_PER_POS_TOTAL:
                position = _position(labels.get(POSITION_LABEL), max_positions)
                if position is None:
                    ignored_positions += 1
                else:
                    per_position[position] += value
            elif name in (GENERATION_TOKENS_TOTAL, SPEC_DECODE_DRAFTS_TOTAL,
                          SPEC_DECODE_DRAFT_TOKENS_TOTAL, SPEC_DECODE_ACCEPTED_TOKENS_TOTAL):
                counters[name] += value
            elif name in _BUCKETS:
                try:
                    le = float(labels.get("le", ""))
                except ValueError:
                    ignored_values += 1
                    continue
                histograms[_BUCKETS[name]][le] += value
    if NUM_REQUESTS_RUNNING not in gauges:
        raise ValueError(f"no {NUM_REQUESTS_RUNNING} on the page: not a vLLM /metrics endpoint, "
                         "or the engine is not up yet")
    cut: list[str] = []
    if ignored_positions:
        cut.append(f"{ignored_positions} {POSITION_LABEL} label(s) outside 0..{max_positions - 1} "
                   "(the method's K) ignored")
    for metric, what in ((TPOT_SECONDS, "TPOT"), (TTFT_SECONDS, "TTFT")):
        if len(histograms[metric]) > MAX_BUCKETS:
            cut.append(f"a {what} histogram of {len(histograms[metric])} buckets (over {MAX_BUCKETS}) ignored")
            histograms[metric].clear()
    if ignored_values:
        cut.append(f"{ignored_values} non-finite, negative or implausible value(s) ignored")
    spec_decode = None
    if SPEC_DECODE_DRAFTS_TOTAL in counters:
        width = max(per_position, default=-1) + 1
        spec_decode = SpecDecodeCounts(
            drafts=counters[SPEC_DECODE_DRAFTS_TOTAL],
            draft_tokens=counters[SPEC_DECODE_DRAFT_TOKENS_TOTAL],
            accepted_tokens=counters[SPEC_DECODE_ACCEPTED_TOKENS_TOTAL],
            accepted_per_position=tuple(per_position[j] for j in range(width)),
        )
    kv = gauges.get(KV_CACHE_USAGE_PERC)
    snapshot = VllmSnapshot(
        running=sum(gauges[NUM_REQUESTS_RUNNING]),
        waiting=sum(gauges.get(NUM_REQUESTS_WAITING, [])),
        kv_cache_usage=sum(kv) / len(kv) if kv else None,
        generation_tokens=counters[GENERATION_TOKENS_TOTAL],
        spec_decode=spec_decode,
        tpot_buckets=tuple(sorted(histograms[TPOT_SECONDS].items())),
        ttft_buckets=tuple(sorted(histograms[TTFT_SECONDS].items())),
    )
    return snapshot, tuple(cut)


_BUCKETS = {TPOT_SECONDS + "_bucket": TPOT_SECONDS, TTFT_SECONDS + "_bucket": TTFT_SECONDS}
"""The latency histograms' bucket samples the snapshot reads, by the histogram they belong to."""
_READ = frozenset({NUM_REQUESTS_RUNNING, NUM_REQUESTS_WAITING, KV_CACHE_USAGE_PERC, SPEC_DECODE_ACCEPTED_PER_POS_TOTAL,
                   GENERATION_TOKENS_TOTAL, SPEC_DECODE_DRAFTS_TOTAL, SPEC_DECODE_DRAFT_TOKENS_TOTAL,
                   SPEC_DECODE_ACCEPTED_TOKENS_TOTAL, *_BUCKETS})
"""The sample names the snapshot reads; bad values of other samples are not worth mentioning."""


def position_index(value: object, max_positions: int = MAX_POSITIONS) -> int | None:
    """A draft position label as an index in 0..max_positions-1, or None (not an integer, or out of range)."""
    return _position(value, max(0, min(max_positions, MAX_POSITIONS)))


def _position(value: object, max_positions: int) -> int | None:
    if not isinstance(value, str) or not value.isdigit() or len(value) > 4:
        return None
    position = int(value)
    return position if position < max_positions else None


def counter_increase(values: Sequence[float]) -> float:
    """Increase of a counter over consecutive samples, counting a drop as a restart from zero.

    Same rule as Prometheus' increase() without its extrapolation to the window edges: a pod restart
    resets vLLM's counters, and the value after the drop is what was counted since.
    """
    total = 0.0
    for previous, current in zip(values, values[1:]):
        total += current - previous if current >= previous else current
    return total


def window_increase(snapshots: Sequence[VllmSnapshot]) -> CounterIncrease:
    """Counter increases of one pod across its snapshots (oldest first); restarts are handled per counter."""
    sd_snapshots = [s.spec_decode for s in snapshots]
    spec_decode = None
    if any(sd is not None for sd in sd_snapshots):
        # A pod restarted with SD switched on or off shows the counters only part of the time: missing
        # counters read as zero, which counter_increase then treats like any restart.
        zero = SpecDecodeCounts(0.0, 0.0, 0.0, ())
        present = [sd or zero for sd in sd_snapshots]
        width = max(len(sd.accepted_per_position) for sd in present)
        spec_decode = SpecDecodeCounts(
            drafts=counter_increase([sd.drafts for sd in present]),
            draft_tokens=counter_increase([sd.draft_tokens for sd in present]),
            accepted_tokens=counter_increase([sd.accepted_tokens for sd in present]),
            accepted_per_position=tuple(
                counter_increase([_at(sd.accepted_per_position, j) for sd in present]) for j in range(width)
            ),
        )
    return CounterIncrease(
        generation_tokens=counter_increase([s.generation_tokens for s in snapshots]),
        spec_decode=spec_decode,
        tpot_buckets=_buckets_increase([s.tpot_buckets for s in snapshots]),
        ttft_buckets=_buckets_increase([s.ttft_buckets for s in snapshots]),
    )


def _buckets_increase(histograms: Sequence[Buckets]) -> Buckets:
    """Each bucket's increase across one pod's snapshots (a restart handled per bucket, as per counter)."""
    bounds = sorted({le for buckets in histograms for le, _ in buckets})
    per_bound = [dict(buckets) for buckets in histograms]
    return tuple((le, counter_increase([b.get(le, 0.0) for b in per_bound])) for le in bounds)


MIN_DRAFTS_FOR_ACCEPTANCE = 100
"""Drafts a window needs before its acceptance counts as measured: from 100 drafts a first-position rate near
0.7 is known to about +-0.09 (95%), tighter than the drift thresholds it is compared with; from a handful
(a schedule that drafts only in the few steps whose batch dips below its crossover) it is noise that would
re-profile a sound profile."""


def spec_decode_summary(spec_decode: SpecDecodeCounts | None, generation_tokens: float,
                        finished_requests: float = 0.0) -> SpecDecodeSummary:
    """Per-position acceptance, drafts per request-step and mean acceptance length from counter increases
    (acceptance and length only from MIN_DRAFTS_FOR_ACCEPTANCE drafts on)."""
    if spec_decode is None:
        return SpecDecodeSummary([], None, None)
    drafts_per_step = specdec.drafts_per_request_step(spec_decode.drafts, generation_tokens,
                                                      spec_decode.accepted_tokens, finished_requests)
    if spec_decode.drafts < MIN_DRAFTS_FOR_ACCEPTANCE:
        return SpecDecodeSummary([], drafts_per_step, None)
    return SpecDecodeSummary(
        acceptance_per_position=specdec.acceptance_per_position(spec_decode.drafts, spec_decode.accepted_per_position),
        drafts_per_step=drafts_per_step,
        mean_acceptance_length=specdec.mean_acceptance_length(spec_decode.drafts, spec_decode.accepted_tokens),
    )


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile of cumulative buckets, as Prometheus' histogram_quantile() computes it.

    Linear interpolation inside the bucket that holds rank q*count, the first bucket starting at 0; a
    quantile in the +Inf bucket is the largest finite bound. None when there are no observations.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile q must be within [0, 1] (got {q})")
    monotonic = _monotonic(buckets)
    if monotonic is None:
        return None
    rank = q * monotonic[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for le, count in monotonic[:-1]:
        if count >= rank:
            if count == lower_count:
                return le
            return lower_bound + (le - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = le, count
    return lower_bound


def _monotonic(buckets: Buckets) -> list[tuple[float, float]] | None:
    """The buckets with counts made non-decreasing, or None without a +Inf bucket or any observation. Counts from
    separately scraped series can be off by one scrape; Prometheus forces them monotonic too."""
    if len(buckets) < 2 or buckets[-1][0] != math.inf:
        return None
    monotonic: list[tuple[float, float]] = []
    for le, count in buckets:
        monotonic.append((le, max(count, monotonic[-1][1]) if monotonic else count))
    return monotonic if monotonic[-1][1] > 0 else None


@dataclasses.dataclass(frozen=True)
class Within:
    """The share of a histogram's observations at or below a bound, and what it rests on."""

    fraction: float
    count: float
    """Observations in the histogram (requests finished in the window)."""
    lower_le: float
    """The bucket bound at or below the bound (0 for the first bucket)."""
    upper_le: float
    """The bucket bound at or above it: the figure is exact when the bound is a bucket bound, and interpolated
    linearly between the two otherwise (as histogram_quantile interpolates a quantile)."""


def fraction_within(bound: float, buckets: Buckets) -> Within | None:
    """The share of observations <= `bound` from cumulative buckets; None without observations. A bound past the
    largest finite bucket counts what that bucket holds (the +Inf bucket's are never known to be within)."""
    monotonic = _monotonic(buckets)
    if monotonic is None or not math.isfinite(bound) or bound < 0:
        return None
    total = monotonic[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in monotonic[:-1]:
        if bound <= le:
            within = lower_count + (count - lower_count) * ((bound - lower_le) / (le - lower_le) if le > lower_le
                                                            else 1.0)
            return Within(min(within / total, 1.0), total, lower_le, le)
        lower_le, lower_count = le, count
    return Within(min(lower_count / total, 1.0), total, lower_le, math.inf)


def concurrency_histogram(running_samples: Iterable[float]) -> list[tuple[float, float]]:
    """(concurrency, weight) from per-replica running-request samples; weights sum to 1.

    Running requests are a count, so samples are rounded to whole requests (Prometheus may hand back
    floats such as 3.0000000001 after arithmetic).
    """
    counts: dict[float, int] = defaultdict(int)
    for value in running_samples:
        if not math.isnan(value):
            counts[float(round(value))] += 1
    total = sum(counts.values())
    return [(concurrency, n / total) for concurrency, n in sorted(counts.items())]


def _at(values: Sequence[float], index: int) -> float:
    return values[index] if index < len(values) else 0.0


def _add_buckets(a: Buckets, b: Buckets) -> Buckets:
    merged: dict[float, float] = defaultdict(float)
    for le, count in (*a, *b):
        merged[le] += count
    return tuple(sorted(merged.items()))
