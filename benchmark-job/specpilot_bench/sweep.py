"""The concurrency sweep of one engine start: per level a warm-up, then N requests, measured both sides.

The engine runs code the tenant chose, so what it reports is checked against what the bench saw: throughput and
latency are the load generator's own timings of the streams; the output tokens a request reports may not exceed
what it asked for; and the engine's accepted-token counter may not claim more than its streams showed (tokens
beyond one per chunk; `counters_problem`). A level that fails either is refused (`EngineDisagrees`).

The client side is a load generator that streams /v1/completions, keeps `concurrency` requests in flight
and returns per-request TTFT, ITL, latency and output tokens: vLLM's own (`vllm.benchmarks.serve.benchmark`,
what `vllm bench serve` runs, called as a library with our prompts) where vLLM is installed, as in the Job's
image, else ours (`loadgen`), with the same result shape. Around it we scrape /metrics for the server's
view (spec-decode counters, generation tokens, preemptions) and sample the load gauges. The pure parts
(level point, acceptance, early stop) are separate functions so they test without an engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import math
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
from specpilot.api.profile import Acceptance, LatencyStats, LevelPoint, Run
from specpilot import specdec
from specpilot.perf.bench_model import DEFAULT_WARMUP_REQUESTS, SATURATION_GAIN, default_warmup, saturated
from specpilot.vllm_page import SPEC_DECODE_ACCEPTED_TOKENS_TOTAL

from . import loadgen
from .loadgen import CompletionRequest
from .metrics import LoadSamples, ServerDeltas, sampling_load, scrape, server_deltas
from .workloads import Prompt

SLO_TPOT_PERCENTILE = 90
"""A level breaks the TPOT SLO when this percentile of its requests' TPOT is above it."""
DISABLE_VLLM_ENV = "SPECPILOT_BENCH_DISABLE_VLLM"
"""Set to 1 to use specpilot's load generator even where vLLM is installed (to compare the two, or where an
installed vLLM fails to import)."""
TOKENS_PER_WORD = 1.3
"""Prompt tokens per whitespace-separated word, for an engine without /tokenize (English text, BPE tokenizers)."""
RETOKENIZE_MARGIN_TOKENS = 8
"""A truncated prompt keeps this many tokens fewer than the room: re-tokenizing decoded text can merge differently."""
ACCEPTANCE_CROSSCHECK_TOLERANCE = 0.10
"""How far (relative) the engine's accepted-token counter may exceed what its streams showed before the level is
refused (see `counters_problem`)."""
TOKENIZE_PARALLELISM = 16
"""/tokenize calls in flight while the prompts are fitted (one at a time costs a round trip per prompt)."""


class EngineDisagrees(RuntimeError):
    """What the engine reports (its counters, its usage) disagrees with what its streams showed the bench: the
    engine runs code the tenant chose, so the result is refused rather than published."""


def stream_accepted_tokens(result: dict[str, Any]) -> int:
    """Draft tokens the streams show accepted: per successful request, its output tokens beyond one per streamed
    chunk (a decode step sends a request one chunk carrying its token and the drafts accepted with it; the first
    chunk is the prefill's token). Chunks are 1 + the request's inter-token gaps, which both load generators
    record per chunk. A server that merges steps into one chunk (a slow reader) makes this larger, never smaller."""
    total = 0
    for n, itl, error in zip(result["output_lens"], result["itls"], result["errors"], strict=False):
        if error is None or error == "":
            total += max(0, int(n) - (1 + len(itl)))
    return total


def counters_problem(concurrency: int, result: dict[str, Any], deltas: ServerDeltas, warmup_tokens: int) -> str | None:
    """Why the engine's acceptance counters cannot be what it served at this level (None: they agree).

    One-sided: the accepted-token counter (its delta over the level, warm-up included) may not exceed the
    accepted tokens the streams showed by more than ACCEPTANCE_CROSSCHECK_TOLERANCE, plus the warm-up requests'
    tokens and one token per request (their first chunks). Streams merged by a slow reader only raise the
    streams' figure, so an honest engine passes; an engine that claims more acceptance than it delivered does not."""
    server = deltas.num_accepted_tokens
    if not server:
        return None
    seen = stream_accepted_tokens(result)
    completed = int(result.get("completed") or 0)
    allowed = seen * (1 + ACCEPTANCE_CROSSCHECK_TOLERANCE) + warmup_tokens + completed
    if server <= allowed:
        return None
    return (f"at concurrency {concurrency} the engine's {SPEC_DECODE_ACCEPTED_TOKENS_TOTAL} rose by {server}, "
            f"but its streams showed {seen} accepted tokens (output tokens beyond one per chunk over "
            f"{completed} requests; allowed up to {allowed:.0f}: +{ACCEPTANCE_CROSSCHECK_TOLERANCE:.0%}, "
            f"{warmup_tokens} warm-up tokens and one per request): the engine's acceptance is not what it served")


def output_problem(concurrency: int, result: dict[str, Any], requests: Sequence[CompletionRequest]) -> str | None:
    """Why the output tokens the engine reported cannot be true (None: plausible): more than a request's
    max_tokens (the bench asked for exactly that many)."""
    for i, (n, request) in enumerate(zip(result["output_lens"], requests, strict=False)):
        if n and n > request.expected_output_len:
            return (f"at concurrency {concurrency} the engine reported {n} output tokens for request {i}, which asked "
                    f"for at most {request.expected_output_len} (max_tokens): its usage is not what it served")
    return None


def use_vllm_generator(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether levels are measured with vLLM's load generator (True) or specpilot's `loadgen` (False).

    The Job's image has vLLM, whose generator is what `vllm bench serve` numbers come from, so it is used
    wherever vLLM is installed. `specpilot demo` (the sandbox's simulated engine, a plain `pip install
    specpilot`) and any other install without vLLM use `loadgen`, which returns the same result shape.
    """
    if environ.get(DISABLE_VLLM_ENV, "").strip().lower() not in ("", "0", "false", "no"):
        return False
    if environ.get(loadgen.CLOCK_FILE_ENV, "").strip():
        return False  # only specpilot's generator reads a simulated engine's virtual clock
    return importlib.util.find_spec("vllm") is not None


@dataclass(frozen=True)
class Slo:
    """Latency targets for goodput and for stopping early (None: not set)."""

    tpot_ms: float | None = None
    ttft_ms: float | None = None

    def goodput_config(self) -> dict[str, float]:
        """vLLM's goodput config: metric -> milliseconds."""
        return {k: v for k, v in (("tpot", self.tpot_ms), ("ttft", self.ttft_ms)) if v is not None}


def latency_stats(values_s: Sequence[float]) -> LatencyStats:
    """Mean and p50/p90/p99 of latencies given in seconds, in milliseconds."""
    if not values_s:
        return LatencyStats()
    ms = np.asarray(values_s, dtype=float) * 1000.0
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return LatencyStats(mean=float(ms.mean()), p50=float(p50), p90=float(p90), p99=float(p99))


def level_point(concurrency: int, result: dict[str, Any], deltas: ServerDeltas, load: LoadSamples) -> LevelPoint:
    """One level's point from the load generator's result (vLLM's `benchmark()` dict, or loadgen's of the
    same shape: per-request lists) and the server's deltas."""
    ok = [e is None or e == "" for e in result["errors"]]
    output_lens = [n for n, good in zip(result["output_lens"], ok) if good]
    ttfts = [t for t, good in zip(result["ttfts"], ok) if good]
    latencies = [t for t, good in zip(result["latencies"], ok) if good]
    itls = [x for xs, good in zip(result["itls"], ok) if good for x in xs]
    tpots = [(lat - ttft) / (n - 1) for lat, ttft, n in zip(latencies, ttfts, output_lens) if n > 1]
    rates = [n / lat for n, lat in zip(output_lens, latencies) if lat > 0]
    cv = statistics.pstdev(rates) / statistics.fmean(rates) if len(rates) > 1 and statistics.fmean(rates) > 0 else None
    return LevelPoint(
        concurrency=concurrency,
        completed=result["completed"],
        failed=result.get("failed", len(ok) - sum(ok)),
        duration_s=result["duration"],
        request_throughput=result["request_throughput"],
        output_throughput=result["output_throughput"],
        goodput=result.get("request_goodput"),
        ttft_ms=latency_stats(ttfts),
        tpot_ms=latency_stats(tpots),
        itl_ms=latency_stats(itls),
        e2e_latency_ms=latency_stats(latencies),
        output_throughput_cv=cv,
        generation_tokens=deltas.generation_tokens,
        num_drafts=deltas.num_drafts,
        num_draft_tokens=deltas.num_draft_tokens,
        num_accepted_tokens=deltas.num_accepted_tokens,
        accepted_per_position=deltas.accepted_per_position,
        mean_running=load.mean_running,
        mean_waiting=load.mean_waiting,
        kv_cache_usage=load.peak_kv_cache_usage,
        preemptions=deltas.preemptions,
    )


def run_acceptance(points: Sequence[LevelPoint]) -> Acceptance | None:
    """Acceptance of a speculative run, from the server counters summed over its levels.

    p_j = accepted at position j / drafts. Drafts per request-step f as `specpilot.specdec`
    defines it for every reader of vLLM's counters: request-steps = generated - accepted - completed
    requests (a request's first token comes from its prefill, not from a decode step).
    """
    drafts = sum(p.num_drafts or 0 for p in points)
    if drafts == 0:
        return None
    accepted = sum(p.num_accepted_tokens or 0 for p in points)
    generated = sum(p.generation_tokens or 0 for p in points)
    completed = sum(p.completed or 0 for p in points if p.generation_tokens)
    positions = max(len(p.accepted_per_position) for p in points)
    per_position = specdec.acceptance_per_position(
        drafts, [sum(p.accepted_per_position[j] for p in points if j < len(p.accepted_per_position))
                 for j in range(positions)])
    drafts_per_step = specdec.drafts_per_request_step(drafts, generated, accepted, completed) or 1.0
    return Acceptance(per_position=[min(1.0, p) for p in per_position], drafts_per_step=drafts_per_step,
                      mean_acceptance_length=specdec.mean_acceptance_length(drafts, accepted))


def stop_reason(points: Sequence[LevelPoint], slo: Slo) -> str | None:
    """Why the sweep should stop after the levels measured so far (None: go on).

    Saturated: output throughput rose by less than SATURATION_GAIN at each of the last two steps
    (`specpilot.perf.bench_model.saturated`, the rule the simulator's Jobs follow too).
    SLO broken: the last two levels both missed the TPOT (or TTFT) SLO at its percentile.
    """
    if saturated([p.output_throughput for p in points]):
        return (f"saturated: output throughput gained under {SATURATION_GAIN:.0%} at concurrency "
                    f"{points[-2].concurrency} and {points[-1].concurrency}")
    if len(points) >= 2 and all(_breaks_slo(p, slo) for p in points[-2:]):
        return (f"SLO broken at concurrency {points[-2].concurrency} and {points[-1].concurrency} "
                f"(p{SLO_TPOT_PERCENTILE} TPOT {points[-1].tpot_ms.p90:.1f} ms)" if slo.tpot_ms is not None
                else f"SLO broken at concurrency {points[-2].concurrency} and {points[-1].concurrency}")
    return None


def _breaks_slo(point: LevelPoint, slo: Slo) -> bool:
    tpot = point.tpot_ms.p90
    ttft = point.ttft_ms.p90
    return ((slo.tpot_ms is not None and tpot is not None and tpot > slo.tpot_ms)
            or (slo.ttft_ms is not None and ttft is not None and ttft > slo.ttft_ms))


def estimated_prompt_len(text: str) -> int:
    """Tokens of a prompt estimated from its words (the engine's usage.prompt_tokens corrects it later)."""
    return max(1, math.ceil(len(text.split()) * TOKENS_PER_WORD))


def truncated_by_estimate(text: str, room_tokens: int) -> str:
    """The prompt cut at a word boundary so that its estimated length fits `room_tokens` (at least one word)."""
    if estimated_prompt_len(text) <= room_tokens:
        return text
    words = text.split()
    return " ".join(words[: max(1, math.floor((room_tokens - RETOKENIZE_MARGIN_TOKENS) / TOKENS_PER_WORD))])


async def _tokenize(session: aiohttp.ClientSession, base_url: str, model_id: str, text: str) -> list[int] | None:
    """The prompt's token ids from the engine's /tokenize; None when the engine has no such endpoint."""
    async with session.post(f"{base_url}/tokenize", json={"model": model_id, "prompt": text}) as r:
        if r.status in (404, 405):
            return None
        r.raise_for_status()
        return (await r.json())["tokens"]


async def fit_prompts(base_url: str, model_id: str, prompts: Sequence[Prompt],
                      max_model_len: int | None) -> list[CompletionRequest]:
    """The level requests, truncated so that prompt plus output fit the engine's context (the engine would
    reject a longer one).

    Prompt lengths are exact from the engine's /tokenize (vLLM's server has it). An engine without it (404)
    gets estimated lengths, `TOKENS_PER_WORD` per word, and word-boundary truncation; the load generator
    replaces each estimate with the engine's `usage.prompt_tokens` once the request has run.
    """
    if not prompts:
        return []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        # The first answer tells whether the engine tokenizes at all; the rest go TOKENIZE_PARALLELISM at a time.
        first = await _tokenize(session, base_url, model_id, prompts[0].text)
        if first is None:
            print(f"[specpilot-bench] {base_url} has no /tokenize: prompt lengths are estimated at "
                  f"{TOKENS_PER_WORD} tokens per word", file=sys.stderr, flush=True)
            token_lists: list[list[int] | None] = [None] * len(prompts)
        else:
            limit = asyncio.Semaphore(TOKENIZE_PARALLELISM)

            async def tokenize(text: str) -> list[int] | None:
                async with limit:
                    return await _tokenize(session, base_url, model_id, text)

            token_lists = [first, *await asyncio.gather(*(tokenize(p.text) for p in prompts[1:]))]
        out = []
        for prompt, tokens in zip(prompts, token_lists, strict=True):
            max_tokens = prompt.max_tokens if not max_model_len else min(prompt.max_tokens, max_model_len // 2)
            room = (max_model_len - max_tokens) if max_model_len else None
            if tokens is None:
                text = truncated_by_estimate(prompt.text, room) if room else prompt.text
                out.append(CompletionRequest(text, estimated_prompt_len(text), max_tokens))
                continue
            text = prompt.text
            if room is not None and len(tokens) > room:
                tokens = tokens[: max(1, room - RETOKENIZE_MARGIN_TOKENS)]
                async with session.post(f"{base_url}/detokenize", json={"model": model_id, "tokens": tokens}) as r:
                    r.raise_for_status()
                    text = (await r.json())["prompt"]
            out.append(CompletionRequest(text, len(tokens), max_tokens))
    return out


async def _vllm_benchmark(base_url: str, model_id: str, requests: Sequence[CompletionRequest], warmup_requests: int,
                          concurrency: int, slo: Slo, temperature: float, ignore_eos: bool) -> dict[str, Any]:
    try:
        from vllm.benchmarks.datasets import SampleRequest
        from vllm.benchmarks.serve import TaskType, benchmark
    except Exception as exc:  # noqa: BLE001 - a broken install fails in many ways (e.g. a mismatched torchvision)
        raise RuntimeError(f"vLLM is installed but its load generator does not import ({type(exc).__name__}: "
                           f"{exc}); fix the install, or set {DISABLE_VLLM_ENV}=1 to use specpilot's") from exc

    samples = [SampleRequest(prompt=r.prompt, prompt_len=r.prompt_len, expected_output_len=r.expected_output_len)
               for r in requests]
    # vLLM's generator prints its report; stdout is reserved for our result JSON.
    with contextlib.redirect_stdout(sys.stderr):
        return await benchmark(
            task_type=TaskType.GENERATION, endpoint_type="openai",
            api_url=f"{base_url}/v1/completions", base_url=base_url,
            model_id=model_id, model_name=model_id, tokenizer=None, input_requests=samples,
            logprobs=None, request_rate=math.inf, burstiness=1.0, disable_tqdm=True,
            num_warmups=warmup_requests, profile=False,
            selected_percentile_metrics=["ttft", "tpot", "itl", "e2el"],
            selected_percentiles=[50.0, 90.0, 99.0], ignore_eos=ignore_eos,
            goodput_config_dict=slo.goodput_config(), max_concurrency=concurrency,
            lora_modules=None, extra_headers=None, extra_body={"temperature": temperature},
            ready_check_timeout_sec=0,
        )


async def _loadgen_benchmark(base_url: str, model_id: str, requests: Sequence[CompletionRequest],
                             warmup_requests: int, concurrency: int, slo: Slo, temperature: float,
                             ignore_eos: bool) -> dict[str, Any]:
    return await loadgen.benchmark(f"{base_url}/v1/completions", model_id, requests, concurrency,
                                   num_warmups=warmup_requests, ignore_eos=ignore_eos,
                                   extra_body={"temperature": temperature}, goodput_config=slo.goodput_config())


async def measure_level(base_url: str, model_id: str, requests: Sequence[CompletionRequest], warmup_requests: int,
                        concurrency: int, slo: Slo, temperature: float, ignore_eos: bool) -> LevelPoint:
    """Warm up, then send `requests` keeping `concurrency` in flight; return the level's point."""
    generate = _vllm_benchmark if use_vllm_generator() else _loadgen_benchmark
    async with aiohttp.ClientSession() as session:
        before = await scrape(session, base_url)
        async with sampling_load(session, base_url) as load:
            result = await generate(base_url, model_id, requests, warmup_requests, concurrency, slo, temperature,
                                    ignore_eos)
        after = await scrape(session, base_url)
    # Warm-up requests land between the two scrapes too; they are few and shaped like the level's.
    deltas = server_deltas(before, after)
    warmup_tokens = warmup_requests * (requests[0].expected_output_len if requests else 0)
    problem = output_problem(concurrency, result, requests) or counters_problem(concurrency, result, deltas,
                                                                                warmup_tokens)
    if problem:
        raise EngineDisagrees(problem)
    return level_point(concurrency, result, deltas, load)


async def sweep(run: Run, base_url: str, model_id: str,
                requests_by_level: Mapping[int, list[CompletionRequest]]
                | Sequence[tuple[int, list[CompletionRequest]]],
                warmup_requests: int, slo: Slo, temperature: float, ignore_eos: bool, early_stop: bool = True) -> Run:
    """Measure every level into `run` (appending as it goes, so a cancelled sweep keeps what it measured).

    `requests_by_level`: concurrency -> requests, or (concurrency, requests) pairs in the order to measure
    them, where a level may come back (a repeated level: one point per measurement)."""
    started = time.monotonic()
    plan = list(requests_by_level.items()) if isinstance(requests_by_level, Mapping) else list(requests_by_level)
    print(f"[specpilot-bench] k={run.num_speculative_tokens}: load generator "
          f"{'vllm.benchmarks.serve' if use_vllm_generator() else 'specpilot_bench.loadgen'}",
          file=sys.stderr, flush=True)
    try:
        for index, (concurrency, requests) in enumerate(plan):
            warmup = warmup_requests or default_warmup(concurrency)
            point = await measure_level(base_url, model_id, requests, warmup, concurrency, slo, temperature,
                                        ignore_eos)
            run.points.append(point)
            run.acceptance = run_acceptance(run.points)
            print(f"[specpilot-bench] k={run.num_speculative_tokens} c={concurrency}: "
                  f"{point.output_throughput:.1f} tok/s, {point.completed} ok, {point.failed} failed, "
                  f"{point.duration_s:.1f} s", file=sys.stderr, flush=True)
            reason = stop_reason(run.points, slo) if early_stop else None
            if reason and index != len(plan) - 1:
                run.stopped_early = reason
                break
    finally:
        run.wall_s = time.monotonic() - started + (run.engine_start_s or 0.0)
    return run
