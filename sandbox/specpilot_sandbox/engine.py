"""A simulated vLLM OpenAI server: the engine `specpilot demo` and the tests run where there is no GPU.

`python -m specpilot_sandbox.engine` takes the arguments the operator gives vLLM (`manifests.engine`:
--model, --revision, --served-model-name, --tensor-parallel-size, --data-parallel-size, --max-model-len,
--gpu-memory-utilization, --port, --host, --speculative-config, and --max-num-seqs,
--max-num-batched-tokens, --kv-cache-memory-bytes); any other argument is ignored with a log line. The
simulation flags say what it stands for:

  --sku              GPU type (catalog SKU or node label; env SPECPILOT_SIM_SKU; default H100-SXM)
  --workload         acceptance priors and natural output lengths (env SPECPILOT_SIM_WORKLOAD; sharegpt)
  --time-scale       simulated seconds per wall second, e.g. 20 runs 20x faster than the real engine
                     (env SPECPILOT_SIM_TIME_SCALE; default 1)
  --seed             random seed of acceptance and output lengths
  --startup-delay-s  simulated model-load time before /health answers 200 (env SPECPILOT_SIM_STARTUP_DELAY_S)
  --clock-file       run on a virtual clock published in this file, which a client on the same host reads
                     (env SPECPILOT_SIM_CLOCK_FILE; see `sandbox.clock`): what the benchmark Jobs and the demo's
                     clients measure, so that profiles and served latencies hold the twin's figures on any host

It serves /health, /v1/models, /version, /tokenize, /detokenize, /v1/completions and
/v1/chat/completions (streamed as server-sent events or not) and /metrics with vLLM's metric names;
the engine behind them (`engine_core`) batches continuously and takes its step times, KV capacity and
acceptance from the digital twin of (SKU, model, method, workload). Unknown model ids are simulated with
Llama-3.1-8B's shape. Without a clock file every reported time (HTTP latencies and /metrics alike) is
wall-clock seconds: the time scale divides the twin's step times, so the engine simply runs faster. With one,
/metrics report simulated seconds of the virtual clock.

Prompts are "tokenized" four UTF-8 bytes to a token (about one token per four characters, and /detokenize
inverts /tokenize exactly); the generated text is filler words, one per token.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import numpy as np
from aiohttp import web
from prometheus_client.core import Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector, CollectorRegistry

from specpilot.api.methods import NO_DYNAMIC_SCHEDULE, SpeculativeMethod, method_family
from specpilot.api.schedule import ScheduleRange, from_vllm, k_at, schedule_problems, summary
from specpilot.perf.acceptance import WORKLOADS, acceptance_profile
from specpilot.perf.catalog import DEFAULT_CATALOG, GpuSpec, UnknownGpuError
from specpilot.perf.models import ModelShape, UnknownModelError, default_drafter, resolve_model
from specpilot.perf.twin import Twin
from specpilot.sim.workloads import request_lengths

from .clock import CLOCK_FILE_ENV, VirtualClock, WallClock
from .engine_core import BLOCK_SIZE, EngineCore, EngineMetrics, SimRequest
from .exporter import CONTENT_TYPE, render_metrics

__all__ = ["EngineConfig", "EngineConfigError", "SimulatedEngine", "build_config", "build_parser", "main",
           "running_engine"]

log = logging.getLogger("specpilot_sandbox.engine")

EMULATED_VLLM_VERSION = "0.32.0"
"""The vLLM release whose API and metric names the simulation follows."""
DEFAULT_SKU = "H100-SXM"
FALLBACK_MODEL = "Llama-3.1-8B"
DEFAULT_MAX_MODEL_LEN = 32768
"""Context length when --max-model-len is not given (lowered to what the KV cache holds)."""
DEFAULT_COMPLETION_MAX_TOKENS = 16
"""/v1/completions' max_tokens when the request has none (vLLM's default)."""
_BYTES_PER_TOKEN = 4
_FILLER = ("the", "model", "answers", "with", "a", "few", "plain", "words", "and", "then", "some", "more")


class EngineConfigError(ValueError):
    """The arguments describe an engine vLLM would refuse to start; the message names the flag and the fix."""


@dataclasses.dataclass(frozen=True)
class EngineConfig:
    """Everything the simulated engine needs, resolved from the command line."""

    model: str
    served_model_names: tuple[str, ...]
    twin: Twin
    speculative_method: str | None
    num_speculative_tokens: int
    schedule: tuple[ScheduleRange, ...] | None
    data_parallel_size: int
    max_model_len: int
    kv_capacity_tokens: int
    max_num_seqs: int
    max_num_batched_tokens: int
    workload: str
    time_scale: float
    seed: int
    startup_delay_s: float
    host: str
    port: int
    clock_file: str | None = None
    """Where the virtual clock is published (None: the engine runs on the wall clock)."""

    def k_at_batch(self, batch_size: int) -> int:
        """K vLLM uses for a step of `batch_size` requests: the schedule's, else the fixed K."""
        if self.schedule is None:
            return self.num_speculative_tokens
        return k_at(self.schedule, batch_size, max_k=self.num_speculative_tokens)


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        return float(value)
    except ValueError:
        raise EngineConfigError(f"environment variable {name} must be a number (got {value!r})") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specpilot_sandbox.engine", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    vllm = p.add_argument_group("vLLM server arguments")
    vllm.add_argument("--model", default="meta-llama/Llama-3.1-8B-Instruct", help="model id (sets the twin's shape)")
    vllm.add_argument("--revision", help="model revision (recorded only)")
    vllm.add_argument("--tokenizer", help="accepted for compatibility; prompts are counted, not tokenized")
    vllm.add_argument("--served-model-name", nargs="+", help="names the API answers to (default: --model)")
    vllm.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    vllm.add_argument("--data-parallel-size", "-dp", type=int, default=1,
                      help="engines behind one server, each with its own GPUs, KV cache and batch")
    vllm.add_argument("--max-model-len", type=int, help=f"context length (default {DEFAULT_MAX_MODEL_LEN}, "
                      "capped at what the KV cache holds)")
    vllm.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    vllm.add_argument("--kv-cache-memory-bytes", type=int, help="KV cache size per GPU, instead of the share of "
                      "memory --gpu-memory-utilization leaves")
    vllm.add_argument("--max-num-seqs", type=int, default=256, help="requests per engine step at most")
    vllm.add_argument("--max-num-batched-tokens", type=int, default=8192, help="tokens per engine step at most")
    vllm.add_argument("--host", default="127.0.0.1", help="address to bind (a simulation: loopback by default)")
    vllm.add_argument("--port", type=int, default=8000, help="port to bind (0: any free port)")
    vllm.add_argument("--speculative-config", help="vLLM speculative config JSON (method, num_speculative_tokens, "
                      "num_speculative_tokens_per_batch_size, model)")
    sim = p.add_argument_group("simulation")
    sim.add_argument("--sku", default=os.environ.get("SPECPILOT_SIM_SKU") or None,
                     help=f"GPU type (env SPECPILOT_SIM_SKU; default {DEFAULT_SKU})")
    sim.add_argument("--workload", default=os.environ.get("SPECPILOT_SIM_WORKLOAD") or "sharegpt",
                     help=f"acceptance priors and output lengths: {', '.join(WORKLOADS)} (env SPECPILOT_SIM_WORKLOAD)")
    sim.add_argument("--time-scale", type=float, default=None,
                     help="simulated seconds per wall second (env SPECPILOT_SIM_TIME_SCALE; default 1)")
    sim.add_argument("--seed", type=int, default=0, help="random seed")
    sim.add_argument("--startup-delay-s", type=float, default=None,
                     help="simulated seconds of model loading before /health is 200 (env "
                     "SPECPILOT_SIM_STARTUP_DELAY_S; default 0)")
    sim.add_argument("--clock-file", default=os.environ.get(CLOCK_FILE_ENV) or None,
                     help=f"run on a virtual clock published in this file (env {CLOCK_FILE_ENV})")
    return p


def _resolve_shape(model: str) -> ModelShape:
    try:
        return resolve_model(model)
    except UnknownModelError:
        log.info("model %s is not one the twin knows; simulating %s's shape", model, FALLBACK_MODEL)
        return resolve_model(FALLBACK_MODEL)


def _speculation(text: str | None, data_parallel_size: int) -> tuple[str | None, int, tuple[ScheduleRange, ...] | None,
                                                                   str | None]:
    """(method, K, schedule, draft model id) from --speculative-config, with vLLM's refusals."""
    if not text:
        return None, 0, None, None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EngineConfigError(f"--speculative-config must be a JSON object ({exc})") from None
    if not isinstance(config, dict) or "method" not in config:
        raise EngineConfigError('--speculative-config must be a JSON object with "method", e.g. '
                                '{"method": "eagle3", "num_speculative_tokens": 3}')
    method = str(config["method"])
    try:
        SpeculativeMethod(method)
    except ValueError:
        raise EngineConfigError(f"--speculative-config method {method!r} is not one vLLM knows; use one of "
                                f"{', '.join(m.value for m in SpeculativeMethod)}") from None
    k = config.get("num_speculative_tokens")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise EngineConfigError(f"--speculative-config num_speculative_tokens must be an integer >= 1 (got {k!r})")
    schedule = None
    entries = config.get("num_speculative_tokens_per_batch_size")
    if entries is not None:
        try:
            ranges = from_vllm(entries)
        except (TypeError, ValueError) as exc:
            raise EngineConfigError(f"--speculative-config num_speculative_tokens_per_batch_size: {exc}") from None
        problems = schedule_problems(ranges, max_k=k)
        if problems:
            raise EngineConfigError("--speculative-config num_speculative_tokens_per_batch_size: "
                                    + "; ".join(problems))
        if SpeculativeMethod(method) in NO_DYNAMIC_SCHEDULE:
            raise EngineConfigError(f"method {method} cannot take num_speculative_tokens_per_batch_size (vLLM 0.32 "
                                    "crashes with it): drop the schedule or use another method")
        if data_parallel_size > 1:
            log.info("num_speculative_tokens_per_batch_size is ignored with data_parallel_size > 1 (as vLLM "
                     "does): every step speculates %d tokens", k)
        else:
            schedule = tuple(ranges)
    return method, k, schedule, config.get("model")


def _twin(gpu: GpuSpec, shape: ModelShape, tp: int, method: str | None, k: int, draft_model: str | None,
          workload: str) -> Twin:
    if method is None:
        return Twin(gpu, shape, tp, workload=workload)
    family = method_family(method)
    drafter = None
    if family == "draft_model" and draft_model:
        with contextlib.suppress(UnknownModelError):
            drafter = resolve_model(draft_model)
    elif family == "medusa":
        drafter = default_drafter("medusa", shape, num_medusa_heads=max(5, k))  # one head per position
    acceptance = acceptance_profile(family, workload, max(k, Twin.MAX_K))
    return Twin(gpu, shape, tp, method=family, drafter=drafter, workload=workload, acceptance=acceptance)


def build_config(argv: Sequence[str] | None = None) -> EngineConfig:
    """Parses the command line (unknown arguments are logged and ignored) into an EngineConfig."""
    args, unknown = build_parser().parse_known_args(argv)
    if unknown:
        log.info("ignoring arguments the simulated engine does not model: %s", " ".join(unknown))
    time_scale = args.time_scale if args.time_scale is not None else _env_float("SPECPILOT_SIM_TIME_SCALE", 1.0)
    startup_delay_s = (args.startup_delay_s if args.startup_delay_s is not None
                       else _env_float("SPECPILOT_SIM_STARTUP_DELAY_S", 0.0))
    if time_scale <= 0:
        raise EngineConfigError(f"--time-scale must be > 0 (got {time_scale})")
    if startup_delay_s < 0:
        raise EngineConfigError(f"--startup-delay-s must be >= 0 (got {startup_delay_s})")
    if args.clock_file and args.data_parallel_size > 1:
        raise EngineConfigError("--clock-file takes one engine core: drop --data-parallel-size (the virtual clock "
                                "follows one batch's steps)")
    if args.workload not in WORKLOADS:
        raise EngineConfigError(f"--workload must be one of {', '.join(WORKLOADS)} (got {args.workload!r})")
    for flag, value in (("--tensor-parallel-size", args.tensor_parallel_size),
                        ("--data-parallel-size", args.data_parallel_size), ("--max-num-seqs", args.max_num_seqs),
                        ("--max-num-batched-tokens", args.max_num_batched_tokens)):
        if value < 1:
            raise EngineConfigError(f"{flag} must be >= 1 (got {value})")
    sku = args.sku
    if not sku:
        sku = DEFAULT_SKU
        log.info("no --sku (or SPECPILOT_SIM_SKU): simulating %s", sku)
    try:
        gpu = DEFAULT_CATALOG.resolve(sku)
    except UnknownGpuError as exc:
        raise EngineConfigError(f"--sku: {exc}") from None
    shape = _resolve_shape(args.model)
    method, k, schedule, draft_model = _speculation(args.speculative_config, args.data_parallel_size)
    tp = args.tensor_parallel_size
    twin = _twin(gpu, shape, tp, method, k, draft_model, args.workload)
    if args.kv_cache_memory_bytes is not None:
        per_token = shape.kv_bytes_per_token_per_gpu(tp)
        if twin.drafter is not None:
            per_token += twin.drafter.kv_bytes_per_token_per_gpu(tp)
        capacity = args.kv_cache_memory_bytes // per_token
    else:
        if not 0 < args.gpu_memory_utilization <= 1:
            raise EngineConfigError(f"--gpu-memory-utilization must be within (0, 1] "
                                    f"(got {args.gpu_memory_utilization})")
        try:
            capacity = twin.kv_capacity_tokens(args.gpu_memory_utilization)
        except ValueError as exc:
            raise EngineConfigError(str(exc)) from None
    # A lone request at full context must still fit with its k + 1 lookahead slots.
    longest = (capacity // BLOCK_SIZE) * BLOCK_SIZE - 1 - k
    if args.max_model_len is not None:
        if args.max_model_len > longest:
            raise EngineConfigError(
                f"--max-model-len {args.max_model_len} is more than the KV cache holds ({capacity} tokens on "
                f"{tp} x {gpu.sku}, {longest} usable for one sequence): lower --max-model-len or give the cache "
                f"more memory (--gpu-memory-utilization, --tensor-parallel-size)")
        max_model_len = args.max_model_len
    else:
        if longest < 1:
            raise EngineConfigError(f"the KV cache holds {capacity} tokens, too few for one sequence: give it more "
                                    f"memory (--gpu-memory-utilization, --kv-cache-memory-bytes)")
        max_model_len = min(DEFAULT_MAX_MODEL_LEN, longest)
    return EngineConfig(
        model=args.model, served_model_names=tuple(args.served_model_name or [args.model]), twin=twin,
        speculative_method=method, num_speculative_tokens=k, schedule=schedule,
        data_parallel_size=args.data_parallel_size, max_model_len=max_model_len, kv_capacity_tokens=capacity,
        max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
        workload=args.workload, time_scale=time_scale, seed=args.seed, startup_delay_s=startup_delay_s,
        host=args.host, port=args.port, clock_file=args.clock_file)


# ---- tokens ----------------------------------------------------------------------------------------------
def tokenize(text: str) -> list[int]:
    """Four UTF-8 bytes per token, so a prompt of n characters counts about n / 4 tokens."""
    data = text.encode()
    return [int.from_bytes(data[i:i + _BYTES_PER_TOKEN].ljust(_BYTES_PER_TOKEN, b"\0"), "big")
            for i in range(0, len(data), _BYTES_PER_TOKEN)]


def detokenize(tokens: Sequence[int]) -> str:
    """The inverse of `tokenize` (a cut through a multi-byte character drops that character)."""
    data = b"".join(int(t).to_bytes(_BYTES_PER_TOKEN, "big") for t in tokens)
    return data.rstrip(b"\0").decode(errors="ignore")


def filler_text(start: int, count: int) -> str:
    return "".join(" " + _FILLER[i % len(_FILLER)] for i in range(start, start + count))


class _RequestError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def response(self) -> web.Response:
        kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}.get(self.status, "Error")
        return web.json_response({"object": "error", "message": self.message, "type": kind, "param": None,
                                  "code": self.status}, status=self.status)


@web.middleware
async def _request_errors(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except _RequestError as exc:
        return exc.response()


# ---- the server ------------------------------------------------------------------------------------------
class _MergedCollector(Collector):
    """Families of several data-parallel engines, one family per name (label `engine` tells them apart)."""

    def __init__(self, states: Sequence[EngineMetrics]) -> None:
        self._states = states

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for state in self._states:
            for family in state.metric_families():
                if family.name in merged:
                    merged[family.name].samples.extend(family.samples)
                else:
                    merged[family.name] = family
        return iter(merged.values())


DRAIN_TIMEOUT_S = 5.0
"""On SIGTERM, how long requests in flight may take to finish before they are aborted (wall seconds; the
sandbox's kubelet kills a pod 10 s after SIGTERM)."""


def make_core(config: EngineConfig, rank: int = 0, clock: WallClock | VirtualClock | None = None) -> EngineCore:
    """The engine core of one data-parallel rank of the engine `config` describes (on the wall clock unless
    `clock` is given)."""
    k = config.num_speculative_tokens
    return EngineCore(config.twin, k_at_batch=config.k_at_batch, max_k=k,
                      kv_capacity_tokens=config.kv_capacity_tokens, max_num_seqs=config.max_num_seqs,
                      max_num_batched_tokens=config.max_num_batched_tokens, time_scale=config.time_scale,
                      seed=config.seed + rank, clock=clock,
                      metrics=EngineMetrics(model_name=config.served_model_names[0], engine=str(rank),
                                            num_gpu_blocks=config.kv_capacity_tokens // BLOCK_SIZE,
                                            acceptance_per_position=config.twin.acceptance.per_position[:k]))


class SimulatedEngine:
    """The HTTP server and its engine cores (one per data-parallel rank). `await start()`, `await stop()`."""

    def __init__(self, config: EngineConfig) -> None:
        self.config = config
        self.clock = VirtualClock(config.clock_file) if config.clock_file else None
        self.cores = [make_core(config, rank, self.clock) for rank in range(config.data_parallel_size)]
        self.loaded = asyncio.Event()
        self._lengths = request_lengths(config.workload).output
        self._length_rng = np.random.default_rng(config.seed + 7919)
        self._ids = itertools.count()
        self._tasks: list[asyncio.Task] = []
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    # ---- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> str:
        """Binds the server, starts the cores, and marks the model loaded after the startup delay."""
        self._runner = web.AppRunner(self._app(), access_log=None, handle_signals=False,
                                     shutdown_timeout=2.0,
                                     # A client that goes away aborts its request, as vLLM's handlers do.
                                     handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.base_url = f"http://{host}:{port}"
        self._tasks = [asyncio.create_task(core.run(), name=f"engine-core-{i}") for i, core in enumerate(self.cores)]
        self._tasks.append(asyncio.create_task(self._load(), name="engine-load"))
        c = self.config
        twin = c.twin
        speculation = (f"{c.speculative_method} K={c.num_speculative_tokens}"
                       + (f" schedule {summary(c.schedule)}" if c.schedule else "") if c.speculative_method
                       else "no speculation")
        log.info("simulated vLLM %s serving %s (%s shape) on %s x %s, %s, workload %s; KV cache %d tokens, "
                 "max model len %d, time scale %g%s; listening on %s", EMULATED_VLLM_VERSION, c.model,
                 twin.model.name, twin.tensor_parallel_size, twin.gpu.sku, speculation, c.workload,
                 c.kv_capacity_tokens, c.max_model_len, c.time_scale,
                 f", virtual clock in {c.clock_file}" if c.clock_file else "", self.base_url)
        return self.base_url

    async def _load(self) -> None:
        await asyncio.sleep(self.config.startup_delay_s / self.config.time_scale)
        self.loaded.set()
        log.info("model loaded; /health is OK")

    async def drain(self, timeout_s: float) -> None:
        """Stops taking connections and lets the requests in flight finish, for at most `timeout_s`: a pod
        that is rolled away or scaled down does not cut off what it is generating."""
        if self._runner is not None:
            for site in list(self._runner.sites):
                await site.stop()
        deadline = asyncio.get_running_loop().time() + timeout_s
        while any(core.load for core in self.cores) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for core in self.cores:
            core.shutdown()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self.clock is not None:
            self.clock.close()
            core = self.cores[0]
            held, short = core.arrival_windows
            # Windows that close short are expected at the end of each level; requests that arrive after their
            # window closed mean the host answered slower than the window, and those steps ran a smaller batch.
            log.info("virtual clock: %d arrival windows, %d closed short, %d requests arrived late (typical wait "
                     "%.1f ms per request)", held, short, core.late_arrivals, 1000 * core.arrival_wait_s)

    # ---- HTTP ------------------------------------------------------------------------------------------
    def _app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20, middlewares=[_request_errors])
        app.router.add_get("/health", self._health)
        app.router.add_get("/version", self._version)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._detokenize)
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/v1/chat/completions", self._chat_completions)
        return app

    async def _health(self, _: web.Request) -> web.Response:
        return web.Response(status=200 if self.loaded.is_set() else 503)

    async def _version(self, _: web.Request) -> web.Response:
        return web.json_response({"version": f"{EMULATED_VLLM_VERSION}+specpilot.sim"})

    async def _models(self, _: web.Request) -> web.Response:
        if not self.loaded.is_set():
            raise _RequestError(503, "the model is still loading")
        created = int(time.time())
        return web.json_response({"object": "list", "data": [
            {"id": name, "object": "model", "created": created, "owned_by": "vllm", "root": self.config.model,
             "parent": None, "max_model_len": self.config.max_model_len}
            for name in self.config.served_model_names]})

    async def _metrics(self, _: web.Request) -> web.Response:
        if len(self.cores) == 1:
            body = render_metrics(self.cores[0].metrics)
        else:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(_MergedCollector([core.metrics for core in self.cores]))
            body = generate_latest(registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        if "messages" in body:
            tokens = tokenize(_chat_prompt(body["messages"]))
        else:
            tokens = tokenize(str(body.get("prompt", "")))
        return web.json_response({"count": len(tokens), "max_model_len": self.config.max_model_len,
                                  "tokens": tokens})

    async def _detokenize(self, request: web.Request) -> web.Response:
        body = await _json_body(request)
        tokens = body.get("tokens")
        if not isinstance(tokens, list) or not all(isinstance(t, int) and 0 <= t < 2**32 for t in tokens):
            raise _RequestError(400, "tokens must be a list of token ids from /tokenize")
        return web.json_response({"prompt": detokenize(tokens)})

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=False)

    async def _chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, chat=True)

    async def _generate(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        if not self.loaded.is_set():
            raise _RequestError(503, "the model is still loading")
        body = await _json_body(request)
        model = self._check_model(body.get("model"))
        sim = self._sim_request(body, self._prompt_tokens(body, chat), chat)
        core = min(self.cores, key=lambda c: c.load)
        sim.arrival_s = core.now()
        core.add_request(sim)
        request_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        try:
            if body.get("stream"):
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return await self._stream(request, sim, request_id, model, chat, include_usage)
            return await self._complete(sim, request_id, model, chat)
        except ConnectionResetError:  # the client went away mid-stream; its request is dropped below
            return web.Response(status=499)
        finally:
            core.abort(sim)

    def _check_model(self, model: object) -> str:
        if model is None:
            return self.config.served_model_names[0]
        if model not in self.config.served_model_names:
            raise _RequestError(404, f"The model `{model}` does not exist.")
        return str(model)

    def _prompt_tokens(self, body: dict[str, Any], chat: bool) -> int:
        if chat:
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise _RequestError(400, "messages must be a non-empty list of {role, content}")
            return max(1, len(tokenize(_chat_prompt(messages))))
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return max(1, len(tokenize(prompt)))
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return len(prompt)
        raise _RequestError(400, "prompt must be one string or one list of token ids (the simulated engine "
                                 "serves one prompt per request)")

    def _sim_request(self, body: dict[str, Any], prompt_tokens: int, chat: bool) -> SimRequest:
        if body.get("n") not in (None, 1):
            raise _RequestError(400, f"n must be 1 (got {body.get('n')!r}): the simulated engine returns one choice")
        room = self.config.max_model_len - prompt_tokens
        max_tokens = body.get("max_completion_tokens") if chat else None
        max_tokens = max_tokens if max_tokens is not None else body.get("max_tokens")
        if max_tokens is None:
            max_tokens = room if chat else DEFAULT_COMPLETION_MAX_TOKENS
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise _RequestError(400, f"max_tokens must be an integer >= 1 (got {max_tokens!r})")
        if prompt_tokens + max_tokens > self.config.max_model_len:
            raise _RequestError(400, (
                f"This model's maximum context length is {self.config.max_model_len} tokens. However, you "
                f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, {max_tokens} "
                f"in the completion). Please reduce the length of the messages or completion."))
        min_tokens = body.get("min_tokens") or 0
        if not isinstance(min_tokens, int) or min_tokens < 0:
            raise _RequestError(400, f"min_tokens must be an integer >= 0 (got {min_tokens!r})")
        stop_at = max_tokens
        if not body.get("ignore_eos"):
            natural = int(self._lengths.sample(self._length_rng, 1)[0])
            stop_at = max(min(max_tokens, natural), min(min_tokens, max_tokens), 1)
        return SimRequest(prompt_tokens=prompt_tokens, max_tokens=max_tokens, stop_at_tokens=stop_at)

    async def _complete(self, sim: SimRequest, request_id: str, model: str, chat: bool) -> web.Response:
        reason = None
        while reason is None:
            _, reason = await sim.outputs.get()
        text = filler_text(0, sim.generated)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": reason, "stop_reason": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "stop_reason": None}
        return web.json_response({"id": request_id, "object": "chat.completion" if chat else "text_completion",
                                  "created": int(time.time()), "model": model, "choices": [choice],
                                  "usage": _usage(sim)})

    async def _stream(self, request: web.Request, sim: SimRequest, request_id: str, model: str, chat: bool,
                      include_usage: bool) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        created = int(time.time())
        head = {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
                "created": created, "model": model}

        def event(payload: dict[str, Any]) -> str:
            return f"data: {json.dumps({**head, **payload}, separators=(',', ':'))}\n\n"

        def chunk(text: str, reason: str | None) -> str:
            if chat:
                choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": reason}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            return event({"choices": [choice]})

        if chat:
            await response.write(event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                     "logprobs": None, "finish_reason": None}]}).encode())
        offset, reason = 0, None
        while reason is None:
            tokens, reason = await sim.outputs.get()
            while reason is None and not sim.outputs.empty():
                # A slow reader gets what piled up as one chunk (as vLLM does when a step yields several
                # tokens): on a shared CPU, per-token events would make the client, not the engine, the limit.
                more, reason = sim.outputs.get_nowait()
                tokens += more
            await response.write(chunk(filler_text(offset, tokens), reason).encode())
            offset += tokens
        if include_usage:
            await response.write(event({"choices": [], "usage": _usage(sim)}).encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _usage(sim: SimRequest) -> dict[str, int]:
    return {"prompt_tokens": sim.prompt_tokens, "completion_tokens": sim.generated,
            "total_tokens": sim.prompt_tokens + sim.generated}


def _chat_prompt(messages: object) -> str:
    if not isinstance(messages, list):
        raise _RequestError(400, "messages must be a list of {role, content}")
    parts = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # OpenAI content parts
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"{message.get('role', 'user') if isinstance(message, dict) else 'user'}: {content or ''}\n")
    return "".join(parts)


async def _json_body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise _RequestError(400, "the request body must be JSON") from None
    if not isinstance(body, dict):
        raise _RequestError(400, "the request body must be a JSON object")
    return body


@contextlib.asynccontextmanager
async def running_engine(argv: Sequence[str]) -> AsyncIterator[SimulatedEngine]:
    """`async with running_engine(["--port", "0", ...]) as engine:` serves at engine.base_url in this loop."""
    engine = SimulatedEngine(build_config(argv))
    await engine.start()
    try:
        yield engine
    finally:
        await engine.stop()


async def _serve(config: EngineConfig) -> None:
    engine = SimulatedEngine(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await engine.start()
    try:
        await stop.wait()
        log.info("shutting down: draining the requests in flight (at most %g s)", DRAIN_TIMEOUT_S)
        await engine.drain(DRAIN_TIMEOUT_S)
    finally:
        await engine.stop()


def main(argv: Sequence[str] | None = None) -> int:
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                            format="%(levelname)s %(asctime)s [specpilot-sim] %(message)s")
    try:
        config = build_config(argv)
        asyncio.run(_serve(config))
    except EngineConfigError as exc:
        log.error("%s", exc)
        return 1
    except OSError as exc:  # the port is taken, the host is not ours
        log.error("cannot serve: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
