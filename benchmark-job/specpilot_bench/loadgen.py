"""specpilot's own load generator: closed-loop streaming /v1/completions at a fixed concurrency, no vLLM needed.

It does what `vllm.benchmarks.serve.benchmark()` does for the bench (sweep.py uses vLLM's where vLLM is
installed) and returns the same result dict, so `sweep.level_point` reads either: warm-up requests first
(the first request, repeated, as vLLM does), then every request with at most `max_concurrency` in flight,
each streamed with `ignore_eos`, `max_tokens`, `temperature` and `stream_options.include_usage`. Per request
it records success or the error, output tokens (the server's `usage`, else the number of streamed chunks),
TTFT, the inter-token latencies between chunks and the end-to-end latency, all from `time.perf_counter`, or,
where `SPECPILOT_SIM_CLOCK_FILE` names a simulated engine's virtual clock (the demo's sandbox sets it for its
benchmark Jobs), from that clock: then the level is timed in the simulated GPU's seconds, not the host's.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from .clock import CLOCK_FILE_ENV as CLOCK_FILE_ENV  # the sweep reads the variable's name here
from .clock import Clock, clock_from_environment, wall_clock

EXTRA_CHUNKS = 16
"""Chunks a stream may carry beyond its max_tokens (a chunk with no text while the detokenizer waits for the rest
of a character); every further one is refused, so an engine cannot stream forever."""
REQUEST_TIMEOUT_S = 6 * 60 * 60
"""A whole level's requests may queue behind each other on a slow engine; vLLM's generator allows the same."""


@dataclass(frozen=True)
class CompletionRequest:
    """One request of a level: the prompt, its length in tokens (exact or estimated) and the tokens to generate.

    The same three fields as vLLM's `SampleRequest`, which sweep.py builds from it for vLLM's generator.
    """

    prompt: str
    prompt_len: int
    expected_output_len: int


@dataclass
class CompletionOutput:
    """What one streamed request measured (times in seconds). `error` is "" on success, as in vLLM's output."""

    success: bool = False
    error: str = ""
    prompt_len: int = 0
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    start_time: float = 0.0
    generated_text: str = ""


def completion_payload(model_id: str, request: CompletionRequest, ignore_eos: bool,
                       extra_body: dict[str, Any] | None) -> dict[str, Any]:
    """The /v1/completions body vLLM's generator sends for one request."""
    payload: dict[str, Any] = {
        "model": model_id,
        "prompt": request.prompt,
        "max_tokens": request.expected_output_len,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if ignore_eos:
        payload["ignore_eos"] = True
    payload.update(extra_body or {})
    return payload


def level_clock(environ=os.environ) -> Clock:
    """What the load generator times with: `time.perf_counter`, or the virtual clock `CLOCK_FILE_ENV` names."""
    return clock_from_environment(environ)


def _error_text(data: dict[str, Any]) -> str:
    error = data["error"]
    return str(error.get("message", error)) if isinstance(error, dict) else str(error)


async def send_completion(session: aiohttp.ClientSession, api_url: str, model_id: str, request: CompletionRequest,
                          ignore_eos: bool = True, extra_body: dict[str, Any] | None = None,
                          clock: Clock = wall_clock) -> CompletionOutput:
    """Stream one completion and time it: TTFT at the first chunk with choices, an ITL at each one after."""
    output = CompletionOutput(prompt_len=request.prompt_len)
    chunks = 0
    usage_tokens: int | None = None
    start = output.start_time = clock()
    last = start
    try:
        async with session.post(api_url, json=completion_payload(model_id, request, ignore_eos, extra_body)) as r:
            if r.status != 200:
                output.error = f"HTTP {r.status}: {(await r.text())[:500]}"
                return output
            async for raw in r.content:
                line = raw.decode("utf-8", errors="replace").strip()
                # SSE: events are "data: ..." lines; blank lines separate them, ":" lines are comments (pings).
                if not line.startswith("data:"):
                    continue
                message = line.removeprefix("data:").strip()
                if message == "[DONE]":
                    break
                data = json.loads(message)
                if "error" in data:
                    output.error = f"the engine aborted the stream: {_error_text(data)}"
                    return output
                if data.get("choices"):
                    if chunks >= request.expected_output_len + EXTRA_CHUNKS:
                        output.error = (f"the engine streamed more than {chunks} chunks for max_tokens "
                                        f"{request.expected_output_len}: the stream is not what was asked for")
                        return output
                    now = clock()
                    if chunks == 0:
                        output.ttft = now - start
                    else:
                        output.itl.append(now - last)
                    last = now
                    chunks += 1
                    output.generated_text += data["choices"][0].get("text") or ""
                if usage := data.get("usage"):
                    usage_tokens = usage.get("completion_tokens")
                    if usage.get("prompt_tokens") is not None:
                        output.prompt_len = usage["prompt_tokens"]
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        output.error = f"{type(exc).__name__}: {exc}"
        return output
    if chunks == 0:
        output.error = "the stream ended without a token (no TTFT to measure)"
        return output
    output.success = True
    # One chunk can carry several tokens (speculative decoding): the server's count is the true one.
    output.output_tokens = usage_tokens if usage_tokens is not None else chunks
    output.latency = last - start
    return output


def is_good(output: CompletionOutput, goodput_config: dict[str, float]) -> bool:
    """Whether a successful request met every SLO of the goodput config (metric -> ms: ttft, tpot, e2el).

    As in vLLM, a request of one output token has TPOT 0.
    """
    tpot = (output.latency - output.ttft) / (output.output_tokens - 1) if output.output_tokens > 1 else 0.0
    measured_s = {"ttft": output.ttft, "tpot": tpot, "e2el": output.latency}
    return all(measured_s[metric] <= limit_ms / 1000.0 for metric, limit_ms in goodput_config.items())


def benchmark_result(outputs: Sequence[CompletionOutput], duration_s: float,
                     goodput_config: dict[str, float] | None = None) -> dict[str, Any]:
    """The result dict of vLLM's `benchmark()` (the keys the bench reads and their neighbours) from the outputs.

    A failed request counts 0 output tokens, and its TTFT, latency and ITLs are empty, as in vLLM's.
    """
    done = [o for o in outputs if o.success]
    output_lens = [o.output_tokens if o.success else 0 for o in outputs]
    total_input = sum(o.prompt_len for o in done)
    total_output = sum(output_lens)
    good = sum(is_good(o, goodput_config) for o in done) if goodput_config else 0
    return {
        "duration": duration_s,
        "completed": len(done),
        "failed": len(outputs) - len(done),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(done) / duration_s,
        "request_goodput": good / duration_s if goodput_config else None,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
        "input_lens": [o.prompt_len for o in outputs],
        "output_lens": output_lens,
        "ttfts": [o.ttft for o in outputs],
        "itls": [o.itl for o in outputs],
        "latencies": [o.latency for o in outputs],
        "start_times": [o.start_time for o in outputs],
        "generated_texts": [o.generated_text for o in outputs],
        "errors": [o.error for o in outputs],
    }


async def benchmark(api_url: str, model_id: str, requests: Sequence[CompletionRequest], max_concurrency: int, *,
                    num_warmups: int = 0, ignore_eos: bool = True, extra_body: dict[str, Any] | None = None,
                    goodput_config: dict[str, float] | None = None, clock: Clock | None = None) -> dict[str, Any]:
    """Warm up, then send every request keeping at most `max_concurrency` in flight; vLLM's result shape.

    Closed loop: a request starts when one in flight finishes, so the engine sees `max_concurrency`
    requests for the whole level (with `ignore_eos`). The duration runs from sending the level's requests
    to the end of the last one, warm-up excluded. Timed by `clock`, by default the one the environment names
    (`level_clock`).
    """
    if max_concurrency < 1:
        raise ValueError(f"max_concurrency must be >= 1 (got {max_concurrency})")
    if not requests:
        raise ValueError("requests is empty: a level needs at least one request to measure")
    slots = asyncio.Semaphore(max_concurrency)
    clock = level_clock() if clock is None else clock
    # The semaphore limits the requests in flight; the connector must not add a lower limit of its own.
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60)
    async with aiohttp.ClientSession(connector=connector,
                                     timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as session:

        async def limited(request: CompletionRequest) -> CompletionOutput:
            async with slots:
                return await send_completion(session, api_url, model_id, request, ignore_eos, extra_body, clock)

        if num_warmups > 0:
            await asyncio.gather(*(limited(requests[0]) for _ in range(num_warmups)))
        started = clock()
        outputs = await asyncio.gather(*(limited(r) for r in requests))
        duration_s = clock() - started
    return benchmark_result(outputs, duration_s, goodput_config)
