"""specpilot-bench without vLLM: its own load generator, prompt fitting without /tokenize, and the CLI end to end.

A fake engine (aiohttp, in this file) streams completions the way vLLM does, K+1 tokens per step with
every draft accepted, and counts them in vLLM-named /metrics. The load generator is checked against it
(concurrency, errors, TTFT/ITL, the result shape `level_point` reads); the CLI runs against it in a
subprocess with vLLM and torch hidden, as on a laptop with a plain `pip install specpilot`. The same file
is the engine the `--launch --engine-module test_bench_loadgen` test starts: `python -m test_bench_loadgen`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from specpilot.api.validate import validate_custom_resource
from specpilot_bench import loadgen
from specpilot_bench.loadgen import CompletionRequest
from specpilot_bench.metrics import LoadSamples, ServerDeltas
from specpilot_bench.sweep import (
    DISABLE_VLLM_ENV,
    Slo,
    estimated_prompt_len,
    fit_prompts,
    level_point,
    truncated_by_estimate,
    use_vllm_generator,
)
from specpilot_bench.workloads import Prompt

HERE = Path(__file__).resolve().parent
MODEL = "fake/model"
LABELS = f'engine="0",model_name="{MODEL}"'
HIDE_VLLM_AND_TORCH = ("import sys; sys.modules.update(vllm=None, torch=None); "
                       "from specpilot_bench.cli import main; sys.exit(main())")
"""Run the CLI as if neither were installed: a None entry makes both `import` and `find_spec` miss them."""


class FakeEngine:
    """A vLLM-shaped OpenAI completions server; every step emits K+1 tokens (all drafts accepted).

    Prompts steer failures: "FAIL-HTTP" gets a 500, "FAIL-STREAM" an error event after its first chunk,
    "NO-USAGE" a stream without the usage chunk. With `gate` set, no request streams before `gate` of them
    have arrived (or 10 s passed), so the first `gate` requests are provably in flight together.
    """

    def __init__(self, k: int = 0, first_token_s: float = 0.02, step_s: float = 0.005, gate: int = 0,
                 tokenize: bool = False, max_model_len: int = 512) -> None:
        self.k = k
        self.first_token_s = first_token_s
        self.step_s = step_s
        self.gate = gate
        self.tokenize = tokenize
        self.max_model_len = max_model_len
        self.arrived = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.payloads: list[dict] = []
        self.generation_tokens = 0
        self.drafts = 0
        self.accepted_per_position = [0] * k
        self._gate_open = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()

        async def health(_: web.Request) -> web.Response:
            return web.Response(text="")

        async def version(_: web.Request) -> web.Response:
            return web.json_response({"version": "fake-0"})

        async def models(_: web.Request) -> web.Response:
            return web.json_response({"data": [{"id": MODEL, "max_model_len": self.max_model_len}]})

        async def metrics(_: web.Request) -> web.Response:
            return web.Response(text=self.metrics_text())

        app.router.add_get("/health", health)
        app.router.add_get("/version", version)
        app.router.add_get("/v1/models", models)
        app.router.add_get("/metrics", metrics)
        app.router.add_post("/v1/completions", self.completions)
        if self.tokenize:
            app.router.add_post("/tokenize", self.tokenize_words)
        return app

    def metrics_text(self) -> str:
        lines = ["# TYPE vllm:generation_tokens counter",
                 f"vllm:generation_tokens_total{{{LABELS}}} {self.generation_tokens}",
                 "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{LABELS}}} {self.in_flight}",
                 "# TYPE vllm:cache_config_info gauge",
                 f'vllm:cache_config_info{{{LABELS},block_size="16",kv_cache_size_tokens="4096"}} 1.0']
        if self.k:
            accepted = sum(self.accepted_per_position)
            lines += ["# TYPE vllm:spec_decode_num_drafts counter",
                      f"vllm:spec_decode_num_drafts_total{{{LABELS}}} {self.drafts}",
                      "# TYPE vllm:spec_decode_num_draft_tokens counter",
                      f"vllm:spec_decode_num_draft_tokens_total{{{LABELS}}} {self.drafts * self.k}",
                      "# TYPE vllm:spec_decode_num_accepted_tokens counter",
                      f"vllm:spec_decode_num_accepted_tokens_total{{{LABELS}}} {accepted}",
                      "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
                      *[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{LABELS},position="{j}"}} {n}'
                        for j, n in enumerate(self.accepted_per_position)]]
        return "\n".join(lines) + "\n"

    async def tokenize_words(self, request: web.Request) -> web.Response:
        body = await request.json()
        return web.json_response({"tokens": list(range(len(body["prompt"].split())))})

    async def completions(self, request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        self.payloads.append(payload)
        self.arrived += 1
        if self.arrived >= self.gate:
            self._gate_open.set()
        prompt = payload["prompt"]
        if "FAIL-HTTP" in prompt:
            return web.json_response({"error": {"message": "boom"}}, status=500)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        counted = [True]

        def finished() -> None:
            # Called before the stream's last write: the client cannot start its next request before
            # reading that write, so the count never overstates the client's concurrency.
            if counted.pop():
                self.in_flight -= 1
            counted.append(False)

        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._gate_open.wait(), 10)
            return await self._stream(request, payload, finished)
        finally:
            finished()

    async def _stream(self, request: web.Request, payload: dict, finished) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(data: dict | str) -> None:
            await response.write(f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode())

        await asyncio.sleep(self.first_token_s)
        remaining = payload["max_tokens"]
        while remaining > 0:
            accepted = min(self.k, remaining - 1)
            if self.k:
                self.drafts += 1
                for j in range(accepted):
                    self.accepted_per_position[j] += 1
            self.generation_tokens += accepted + 1
            remaining -= accepted + 1
            await send({"choices": [{"index": 0, "text": " tok" * (accepted + 1)}]})
            if "FAIL-STREAM" in payload["prompt"]:
                finished()
                await send({"error": {"message": "engine died", "code": 500}})
                return response
            if remaining:
                await asyncio.sleep(self.step_s)
        if "NO-USAGE" not in payload["prompt"]:
            await send({"choices": [], "usage": {"prompt_tokens": len(payload["prompt"].split()),
                                                 "completion_tokens": payload["max_tokens"]}})
        finished()
        await send("[DONE]")
        return response


@contextlib.asynccontextmanager
async def serving(engine: FakeEngine):
    """The fake engine on a free loopback port; yields its base URL."""
    runner = web.AppRunner(engine.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def requests(n: int, max_tokens: int = 6, words: int = 5) -> list[CompletionRequest]:
    return [CompletionRequest(" ".join(["word"] * words) + f" {i}", words + 1, max_tokens) for i in range(n)]


@pytest.mark.parametrize("concurrency", [1, 3, 120])
async def test_keeps_exactly_the_concurrency_in_flight(concurrency):
    # 120 is above aiohttp's default connection pool (100): the pool must not cap the level.
    engine = FakeEngine(gate=concurrency, first_token_s=0.0, step_s=0.0)
    async with serving(engine) as url:
        result = await loadgen.benchmark(f"{url}/v1/completions", MODEL, requests(concurrency + 5), concurrency)
    assert engine.max_in_flight == concurrency
    assert result["completed"] == concurrency + 5 and result["failed"] == 0


async def test_sends_what_vllms_generator_sends_and_warms_up_first():
    engine = FakeEngine()
    level = requests(3, max_tokens=7)
    async with serving(engine) as url:
        result = await loadgen.benchmark(f"{url}/v1/completions", MODEL, level, 2, num_warmups=2, ignore_eos=True,
                                         extra_body={"temperature": 0.5})
    assert [p["prompt"] for p in engine.payloads] == [level[0].prompt] * 2 + [r.prompt for r in level]
    assert engine.payloads[0] == {"model": MODEL, "prompt": level[0].prompt, "max_tokens": 7, "stream": True,
                                  "stream_options": {"include_usage": True}, "ignore_eos": True,
                                  "temperature": 0.5}
    # warm-up requests are not part of the result
    assert result["completed"] == 3 and len(result["errors"]) == 3


async def test_ttft_itl_and_output_tokens_per_request():
    engine = FakeEngine(k=2, first_token_s=0.05, step_s=0.02)
    # prompt_len 99: an estimate, which the engine's usage.prompt_tokens (the words here) replaces
    level = [CompletionRequest(f"six words of prompt number {i}", 99, 9) for i in range(2)]
    level.append(CompletionRequest("six words NO-USAGE in this prompt", 99, 9))
    async with serving(engine) as url:
        result = await loadgen.benchmark(f"{url}/v1/completions", MODEL, level, 3)
    assert result["errors"] == ["", "", ""]
    # 9 tokens in steps of 3: three chunks. The usage count wins; without usage, chunks are all we know.
    assert result["output_lens"] == [9, 9, 3]
    assert result["input_lens"] == [6, 6, 99]
    for ttft, itls, latency in zip(result["ttfts"], result["itls"], result["latencies"]):
        # Causal bounds (the engine sleeps 50 ms before the first chunk and 20 ms between chunks),
        # minus asyncio's timer slack.
        assert ttft >= 0.045 and latency >= 0.085
        assert len(itls) == 2 and all(itl >= 0 for itl in itls)
        assert latency == pytest.approx(ttft + sum(itls))
    assert result["total_output_tokens"] == 21
    assert result["output_throughput"] == pytest.approx(21 / result["duration"])


async def test_errors_are_counted_and_leave_no_tokens():
    engine = FakeEngine()
    level = [*requests(2), CompletionRequest("FAIL-HTTP", 1, 4), CompletionRequest("FAIL-STREAM", 1, 4)]
    async with serving(engine) as url:
        result = await loadgen.benchmark(f"{url}/v1/completions", MODEL, level, 4)
    assert result["completed"] == 2 and result["failed"] == 2
    assert result["errors"][:2] == ["", ""]
    assert result["errors"][2].startswith("HTTP 500") and "boom" in result["errors"][2]
    assert "engine died" in result["errors"][3]
    assert result["output_lens"][2:] == [0, 0] and result["itls"][2:] == [[], []]


async def test_unreachable_engine_fails_every_request():
    async with serving(FakeEngine()) as url:
        pass  # stopped: nothing listens there any more
    result = await loadgen.benchmark(f"{url}/v1/completions", MODEL, requests(3), 2)
    assert result["completed"] == 0 and result["failed"] == 3
    assert all("ClientConnectorError" in e for e in result["errors"])


async def test_goodput_counts_requests_within_the_slo():
    engine = FakeEngine(first_token_s=0.05)
    async with serving(engine) as url:
        api = f"{url}/v1/completions"
        loose = await loadgen.benchmark(api, MODEL, requests(3), 3, goodput_config={"ttft": 60_000, "tpot": 60_000})
        tight = await loadgen.benchmark(api, MODEL, requests(3), 3, goodput_config={"ttft": 1})
        unset = await loadgen.benchmark(api, MODEL, requests(3), 3)
    assert loose["request_goodput"] == pytest.approx(loose["request_throughput"])
    assert tight["request_goodput"] == 0
    assert unset["request_goodput"] is None


async def test_level_point_reads_the_result():
    engine = FakeEngine(k=2)
    level = [*requests(4, max_tokens=9), CompletionRequest("FAIL-HTTP", 1, 9)]
    async with serving(engine) as url:
        result = await loadgen.benchmark(f"{url}/v1/completions", MODEL, level, 2,
                                         goodput_config=Slo(tpot_ms=60_000).goodput_config())
    deltas = ServerDeltas(generation_tokens=36, num_drafts=12, num_draft_tokens=24, num_accepted_tokens=24,
                          accepted_per_position=[12, 12], preemptions=None)
    point = level_point(2, result, deltas, LoadSamples(running=[2.0]))
    assert (point.completed, point.failed) == (4, 1)
    assert point.output_throughput == pytest.approx(36 / result["duration"])
    assert point.goodput == pytest.approx(point.request_throughput)
    assert point.ttft_ms.p50 > 0 and point.e2e_latency_ms.p90 >= point.ttft_ms.p90
    assert point.tpot_ms.mean > 0 and point.itl_ms.mean > 0
    assert point.num_accepted_tokens == 24 and point.mean_running == 2.0


def test_disable_switch_selects_our_generator():
    assert not use_vllm_generator({DISABLE_VLLM_ENV: "1"})
    assert use_vllm_generator({DISABLE_VLLM_ENV: "0"}) == use_vllm_generator({})


async def test_a_broken_vllm_install_names_the_switch(monkeypatch):
    from specpilot_bench.sweep import _vllm_benchmark

    monkeypatch.setitem(sys.modules, "vllm", None)  # as a failed import leaves it
    with pytest.raises(RuntimeError, match=f"{DISABLE_VLLM_ENV}=1"):
        await _vllm_benchmark("http://127.0.0.1:9", MODEL, requests(1), 0, 1, Slo(), 0.0, True)


def test_estimated_prompt_length_and_truncation():
    text = " ".join(f"w{i}" for i in range(100))
    assert estimated_prompt_len(text) == 130
    assert truncated_by_estimate(text, 200) == text
    cut = truncated_by_estimate(text, 60)
    assert text.startswith(cut) and estimated_prompt_len(cut) <= 60 - 8


async def test_fit_prompts_tokenizes_where_the_engine_can_and_estimates_where_it_cannot():
    prompts = [Prompt("one two three four", 8), Prompt(" ".join(["long"] * 400), 300)]
    async with serving(FakeEngine(tokenize=True)) as url:
        exact = await fit_prompts(url, MODEL, prompts, None)
    async with serving(FakeEngine(tokenize=False)) as url:
        estimated = await fit_prompts(url, MODEL, prompts, 512)
    assert exact == [CompletionRequest("one two three four", 4, 8), CompletionRequest(prompts[1].text, 400, 300)]
    assert estimated[0] == CompletionRequest("one two three four", 6, 8)
    # max_tokens capped at half the context; the prompt cut to fit the other half
    assert estimated[1].expected_output_len == 256 and estimated[1].prompt_len <= 256


async def test_fit_prompts_tokenizes_in_parallel_and_keeps_the_order():
    prompts = [Prompt(" ".join(["w"] * n), 8) for n in range(1, 60)]
    async with serving(FakeEngine(tokenize=True)) as url:
        fitted = await fit_prompts(url, MODEL, prompts, None)
    assert [r.prompt_len for r in fitted] == list(range(1, 60))
    assert [r.prompt for r in fitted] == [p.text for p in prompts]
    assert await fit_prompts(url, MODEL, [], None) == []


def test_cli_imports_neither_vllm_nor_torch_and_helps_without_them():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, specpilot_bench.cli; "
         "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch')))"],
        capture_output=True, text=True, check=True)
    assert loaded.stdout.strip() == "[]"
    helped = subprocess.run([sys.executable, "-c", HIDE_VLLM_AND_TORCH, "--help"], capture_output=True, text=True)
    assert helped.returncode == 0, helped.stderr
    assert "--engine-module" in helped.stdout


BENCH_ARGS = ["--model", MODEL, "--levels", "1,2", "--requests-per-level", "4", "--output-len", "12",
              "--workload", "random", "--input-len", "12", "--sku", "H100-SXM", "--engine-start-timeout", "30",
              "--no-early-stop"]
SPECULATIVE_CONFIG = json.dumps({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 4})


def check_speculative_run(run: dict, k: int) -> None:
    assert run["numSpeculativeTokens"] == k
    assert [p["concurrency"] for p in run["points"]] == [1, 2]
    for point in run["points"]:
        assert point["completed"] == 4 and point["failed"] == 0
        assert point["outputThroughput"] > 0 and point["ttftMs"]["p50"] > 0
    # every draft accepted: (k+1) tokens per step (12 output tokens divide into whole steps for k=1 and k=2)
    assert run["acceptance"]["meanAcceptanceLength"] == pytest.approx(k + 1)
    assert run["acceptance"]["perPosition"] == [1.0] * k


@pytest.mark.parametrize("hide", ["vllm-and-torch-absent", "vllm-disabled"])
async def test_sidecar_profile_without_vllm(hide, tmp_path, crds):
    engine = FakeEngine(k=2)
    out = tmp_path / "profile.yaml"
    async with serving(engine) as url:
        if hide == "vllm-and-torch-absent":
            command = [sys.executable, "-c", HIDE_VLLM_AND_TORCH]
            env = dict(os.environ)
            env.pop(DISABLE_VLLM_ENV, None)
        else:
            command = [sys.executable, "-m", "specpilot_bench", "--no-calibration"]
            env = dict(os.environ, **{DISABLE_VLLM_ENV: "1"})
        proc = await asyncio.create_subprocess_exec(
            *command, "--engine-url", url, *BENCH_ARGS, "--speculative-config", SPECULATIVE_CONFIG,
            "--output", str(out), env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        stdout, stderr = await asyncio.wait_for(proc.communicate(), 60)
    log = stderr.decode()
    assert proc.returncode == 0, log[-3000:]
    assert "load generator specpilot_bench.loadgen" in log
    assert "has no /tokenize: prompt lengths are estimated" in log
    (doc,) = yaml.safe_load_all(out.read_text())
    assert json.loads(stdout) == [doc]
    assert validate_custom_resource(crds["SpeculationProfile"], doc) == []
    status = doc["status"]
    assert status["engineVersion"] == "fake-0" and status["kvCapacityTokens"] == 4096
    (run,) = status["runs"]
    check_speculative_run(run, 2)
    if hide == "vllm-and-torch-absent":
        assert status["hardware"] == {"backend": "not-measured", "deviceCount": 0}
        assert "hardware calibration not measured" in log
    else:
        assert "hardware" not in status


def test_launch_starts_the_named_engine_module_with_vllms_args(tmp_path, crds):
    out = tmp_path / "profiles.yaml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               SPECPILOT_BENCH_ENGINE_MODULE="test_bench_loadgen")
    proc = subprocess.run(
        [sys.executable, "-c", HIDE_VLLM_AND_TORCH, "--launch", *BENCH_ARGS, "--speculative-config",
         SPECULATIVE_CONFIG, "--skip-baseline", "--engine-arg=--time-scale=10", "--engine-args", "--sku H100-SXM",
         "--log-dir", str(tmp_path / "logs"), "--output", str(out)],
        env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (method,) = yaml.safe_load_all(out.read_text())
    assert validate_custom_resource(crds["SpeculationProfile"], method) == []
    assert method["status"]["phase"] == "Succeeded"
    assert method["spec"]["engineImage"] == "test_bench_loadgen"  # no distribution provides the module
    runs = {r["numSpeculativeTokens"]: r for r in method["status"]["runs"]}
    assert sorted(runs) == [1, 2] and method["status"]["engineStarts"] == 2
    for k, run in runs.items():
        check_speculative_run(run, k)
    logs = sorted((tmp_path / "logs").iterdir())
    assert len(logs) == 2
    for log in logs:
        received = json.loads(log.read_text().split("engine argv: ", 1)[1].splitlines()[0])
        assert received[received.index("--model") + 1] == MODEL
        assert "--time-scale=10" in received and received[received.index("--sku") + 1] == "H100-SXM"


class LyingEngine(FakeEngine):
    """Claims every draft accepted (K+1 tokens per step in its counters) but streams one token per chunk: what a
    tenant's engine code could do to make speculation look better than it served. With `inflate_usage`, its
    usage reports ten times the tokens instead."""

    def __init__(self, k: int, inflate_usage: bool = False) -> None:
        super().__init__(k=k)
        self.inflate_usage = inflate_usage

    async def _stream(self, request: web.Request, payload: dict, finished) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def send(data: dict | str) -> None:
            await response.write(f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode())

        n = payload["max_tokens"]
        for _ in range(n):  # one token per chunk, as without speculation
            await send({"choices": [{"index": 0, "text": " tok"}]})
        steps = -(-n // (self.k + 1))  # what the counters claim: every draft accepted
        self.drafts += steps
        for j in range(self.k):
            self.accepted_per_position[j] += steps
        self.generation_tokens += n
        usage = n * 10 if self.inflate_usage else n
        await send({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": usage}})
        finished()
        await send("[DONE]")
        return response


@pytest.mark.parametrize("inflate_usage", [False, True], ids=["acceptance-counters", "usage"])
async def test_a_lying_engine_is_refused_with_its_reason(monkeypatch, inflate_usage):
    """The bench measures what it can see: counters claiming more accepted drafts than the streams carried, or
    usage claiming more tokens than were asked for, refuse the level with the reason."""
    from specpilot_bench.sweep import EngineDisagrees, measure_level

    monkeypatch.setenv(DISABLE_VLLM_ENV, "1")
    engine = LyingEngine(k=3, inflate_usage=inflate_usage)
    async with serving(engine) as url:
        with pytest.raises(EngineDisagrees) as refused:
            await measure_level(url, MODEL, requests(8, max_tokens=32), 1, 2, Slo(), 0.0, True)
    text = str(refused.value)
    if inflate_usage:
        assert "reported 320 output tokens for request 0, which asked for at most 32" in text
    else:
        assert "vllm:spec_decode_num_accepted_tokens_total rose by" in text and "streams showed 0" in text


async def test_an_honest_speculating_engine_passes_the_cross_check(monkeypatch):
    from specpilot_bench.sweep import measure_level

    monkeypatch.setenv(DISABLE_VLLM_ENV, "1")
    async with serving(FakeEngine(k=3)) as url:
        point = await measure_level(url, MODEL, requests(8, max_tokens=32), 1, 2, Slo(), 0.0, True)
    assert point.num_accepted_tokens and point.output_throughput > 0


def test_the_cross_check_allows_streams_merged_by_a_slow_reader():
    """A slow reader gets several steps in one chunk: the streams then show more accepted tokens than the
    counters, which is no lie."""
    from specpilot_bench.sweep import counters_problem

    result = {"output_lens": [32, 32], "itls": [[0.01] * 3, [0.01] * 3], "errors": ["", ""], "completed": 2}
    def deltas(accepted: int) -> ServerDeltas:
        return ServerDeltas(generation_tokens=64, num_drafts=8, num_draft_tokens=24, num_accepted_tokens=accepted,
                            accepted_per_position=[], preemptions=0)

    honest = deltas(40)
    assert counters_problem(4, result, honest, warmup_tokens=0) is None
    lying = deltas(200)
    assert "rose by 200" in counters_problem(4, result, lying, warmup_tokens=0)


async def test_an_endless_metrics_body_is_cut_and_refused(monkeypatch):
    """/metrics comes from the engine container: a body past the bound is refused, not read to the end."""
    from specpilot_bench import metrics

    monkeypatch.setattr(metrics, "MAX_METRICS_BYTES", 100_000)

    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(10_000):  # 1 GB if read to the end
            await response.write(b"#" * 100_000 + b"\n")
        return response

    app = web.Application()
    app.router.add_get("/metrics", endless)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        import aiohttp

        async with aiohttp.ClientSession() as session:
            with pytest.raises(ValueError, match="longer than 100000 bytes"):
                await metrics.scrape(session, f"http://127.0.0.1:{runner.addresses[0][1]}")
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> None:
    """Serve the fake engine as `python -m test_bench_loadgen` with vLLM's server arguments."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-model-len", type=int, default=512)
    parser.add_argument("--speculative-config")
    args, _ = parser.parse_known_args(argv)
    print(f"engine argv: {json.dumps(sys.argv[1:] if argv is None else argv)}", flush=True)
    k = json.loads(args.speculative_config)["num_speculative_tokens"] if args.speculative_config else 0

    async def serve() -> None:
        runner = web.AppRunner(FakeEngine(k=k, max_model_len=args.max_model_len).app())
        await runner.setup()
        await web.TCPSite(runner, args.host, args.port).start()
        await asyncio.Event().wait()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
