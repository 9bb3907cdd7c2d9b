"""The simulated vLLM engine: its OpenAI API, vLLM metrics, continuous batching, schedule and twin timing.

Engines run in the test's event loop on free ports. Nothing asserts on wall time: step durations are read
from the engine's own step log and compared with the twin's.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from specpilot.api.schedule import from_vllm, k_at
from specpilot.perf import DEFAULT_CATALOG, Twin, acceptance_profile, resolve_model
from specpilot_sandbox.engine import (
    EngineConfigError,
    build_config,
    detokenize,
    main,
    running_engine,
    tokenize,
)

EAGLE3_K3 = json.dumps({"method": "eagle3", "num_speculative_tokens": 3})
SCHEDULE = [[1, 1, 3], [2, 256, 0]]
EAGLE3_SCHEDULE = json.dumps({"method": "eagle3", "num_speculative_tokens": 3,
                              "num_speculative_tokens_per_batch_size": SCHEDULE})
MODEL = "meta-llama/Llama-3.1-8B-Instruct"


async def _eventually(predicate, tries: int = 200) -> None:
    """Polls `predicate` every 10 ms until it holds or the tries run out (the caller asserts after)."""
    for _ in range(tries):
        if predicate():
            return
        await asyncio.sleep(0.01)


async def _in_flight(session: aiohttp.ClientSession, engine, max_tokens: int) -> asyncio.Task:
    """A non-streamed completion the engine is generating (the task resolves to its response)."""
    pending = asyncio.create_task(session.post(f"{engine.base_url}/v1/completions", json={
        "prompt": "hi", "max_tokens": max_tokens, "ignore_eos": True}))
    await _eventually(lambda: engine.cores[0].running)
    return pending


def engine_args(*extra: str, time_scale: float = 10.0) -> list[str]:
    return ["--model", MODEL, "--port", "0", "--sku", "H100-SXM", "--time-scale", str(time_scale), *extra]


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def total(scrape: dict, name: str) -> float:
    return sum(value for _, value in scrape[name])


async def scrape(session: aiohttp.ClientSession, base_url: str) -> dict:
    async with session.get(f"{base_url}/metrics") as r:
        assert r.status == 200
        return samples(await r.text())


async def complete(session: aiohttp.ClientSession, base_url: str, **body) -> dict:
    async with session.post(f"{base_url}/v1/completions", json={"model": MODEL, **body}) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def stream_events(session: aiohttp.ClientSession, url: str, body: dict) -> list[str]:
    async with session.post(url, json=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers["Content-Type"].startswith("text/event-stream")
        text = await r.text()
    events = [line.removeprefix("data: ") for line in text.split("\n\n") if line.strip()]
    assert all(line.startswith("data: ") for line in text.split("\n\n") if line.strip())
    return events


async def test_health_waits_for_the_startup_delay():
    async with running_engine(engine_args("--startup-delay-s", "2", time_scale=4)) as engine:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{engine.base_url}/health") as r:
                assert r.status == 503
            async with session.get(f"{engine.base_url}/v1/models") as r:
                assert r.status == 503
            async with session.post(f"{engine.base_url}/v1/completions", json={"prompt": "hi"}) as r:
                assert r.status == 503
            await asyncio.wait_for(engine.loaded.wait(), 10)
            async with session.get(f"{engine.base_url}/health") as r:
                assert r.status == 200
            async with session.get(f"{engine.base_url}/v1/models") as r:
                models = (await r.json())["data"]
            async with session.get(f"{engine.base_url}/version") as r:
                assert (await r.json())["version"]
    assert [m["id"] for m in models] == [MODEL]
    assert models[0]["max_model_len"] == engine.config.max_model_len


async def test_completions_streaming_and_not_and_counters_move():
    async with running_engine(engine_args("--speculative-config", EAGLE3_K3)) as engine:
        url = engine.base_url
        async with aiohttp.ClientSession() as session:
            before = await scrape(session, url)
            body = await complete(session, url, prompt="one two three four " * 10, max_tokens=40, ignore_eos=True)
            assert body["choices"][0]["finish_reason"] == "length"
            assert body["usage"]["completion_tokens"] == 40
            assert body["usage"]["prompt_tokens"] == len(tokenize("one two three four " * 10))
            assert len(body["choices"][0]["text"].split()) == 40

            events = await stream_events(session, f"{url}/v1/completions", {
                "model": MODEL, "prompt": "hello", "max_tokens": 30, "ignore_eos": True, "stream": True,
                "stream_options": {"include_usage": True}})
            assert events[-1] == "[DONE]"
            chunks = [json.loads(e) for e in events[:-1]]
            usage = chunks[-1]["usage"]
            assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == 30
            text_chunks = [c["choices"][0] for c in chunks[:-1]]
            assert text_chunks[-1]["finish_reason"] == "length"
            assert all(c["finish_reason"] is None for c in text_chunks[:-1])
            assert sum(len(c["text"].split()) for c in text_chunks) == 30
            # speculation: some steps emit several tokens at once, so fewer chunks than tokens
            assert len(text_chunks) < 30
            after = await scrape(session, url)

    def grew(name: str) -> float:
        return total(after, name) - total(before, name)

    assert grew("vllm:generation_tokens_total") == 70
    assert grew("vllm:prompt_tokens_total") == body["usage"]["prompt_tokens"] + usage["prompt_tokens"]
    assert grew("vllm:request_success_total") == 2
    assert grew("vllm:e2e_request_latency_seconds_count") == 2
    assert grew("vllm:time_to_first_token_seconds_count") == 2
    assert grew("vllm:request_time_per_output_token_seconds_count") == 2
    assert grew("vllm:inter_token_latency_seconds_count") > 0
    drafts = grew("vllm:spec_decode_num_drafts_total")
    assert drafts > 0 and grew("vllm:spec_decode_num_draft_tokens_total") == 3 * drafts
    per_position = {labels["position"]: v for labels, v in after["vllm:spec_decode_num_accepted_tokens_per_pos_total"]}
    assert sorted(per_position) == ["0", "1", "2"]
    assert sum(per_position.values()) == total(after, "vllm:spec_decode_num_accepted_tokens_total")
    assert per_position["0"] >= per_position["1"] >= per_position["2"]
    # a request-step emits one token plus what it accepted (cut at max_tokens); each prefill emits one
    request_steps = sum(r.decode_batch_size for r in engine.cores[0].step_log)
    assert request_steps + 2 < 70 <= grew("vllm:spec_decode_num_accepted_tokens_total") + request_steps + 2
    for labels, _ in after["vllm:generation_tokens_total"]:
        assert labels == {"engine": "0", "model_name": MODEL}
    info = after["vllm:cache_config_info"][0][0]
    assert int(info["num_gpu_blocks"]) * int(info["block_size"]) == int(info["kv_cache_size_tokens"])
    assert int(info["kv_cache_size_tokens"]) // 16 * 16 == engine.config.kv_capacity_tokens // 16 * 16


async def test_chat_completions():
    async with running_engine(engine_args("--served-model-name", "chat-model")) as engine:
        async with aiohttp.ClientSession() as session:
            messages = [{"role": "user", "content": "Say something."}]
            async with session.post(f"{engine.base_url}/v1/chat/completions",
                                    json={"model": "chat-model", "messages": messages, "max_tokens": 12,
                                          "ignore_eos": True}) as r:
                body = await r.json()
            events = await stream_events(session, f"{engine.base_url}/v1/chat/completions",
                                         {"model": "chat-model", "messages": messages, "max_tokens": 5,
                                          "ignore_eos": True, "stream": True})
            async with session.post(f"{engine.base_url}/v1/chat/completions",
                                    json={"model": "other", "messages": messages}) as r:
                assert r.status == 404
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["completion_tokens"] == 12
    chunks = [json.loads(e) for e in events[:-1]]
    assert events[-1] == "[DONE]" and "usage" not in chunks[-1]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert sum(len(c["choices"][0]["delta"].get("content", "").split()) for c in chunks) == 5


async def test_requests_are_validated_like_vllm():
    async with running_engine(engine_args("--max-model-len", "256")) as engine:
        url = f"{engine.base_url}/v1/completions"
        async with aiohttp.ClientSession() as session:
            for body in ({"prompt": "x", "n": 2}, {"prompt": "x" * 800, "max_tokens": 100},
                         {"prompt": "x", "max_tokens": 0}, {"prompt": ["a", "b"]}):
                async with session.post(url, json=body) as r:
                    assert r.status == 400, body
                    assert (await r.json())["object"] == "error"
            default = await complete(session, engine.base_url, prompt="x", ignore_eos=True)
            async with session.post(f"{engine.base_url}/tokenize", json={"prompt": "héllo wörld, ünïcode"}) as r:
                tokens = (await r.json())["tokens"]
            async with session.post(f"{engine.base_url}/detokenize", json={"tokens": tokens}) as r:
                text = (await r.json())["prompt"]
    assert default["usage"]["completion_tokens"] == 16  # vLLM's completions default
    assert text == "héllo wörld, ünïcode" and detokenize(tokenize("abc")) == "abc"


async def test_without_eos_ignored_requests_stop_early_sometimes():
    async with running_engine(engine_args("--workload", "json-extraction", time_scale=50)) as engine:
        async with aiohttp.ClientSession() as session:
            bodies = await asyncio.gather(*[complete(session, engine.base_url, prompt="p", max_tokens=400)
                                            for _ in range(8)])
    lengths = [b["usage"]["completion_tokens"] for b in bodies]
    reasons = {b["choices"][0]["finish_reason"] for b in bodies}
    assert "stop" in reasons and min(lengths) < 400 and len(set(lengths)) > 1


async def test_schedule_speculates_alone_and_not_in_a_crowd():
    assert k_at(from_vllm(SCHEDULE), 1, 3) == 3 and k_at(from_vllm(SCHEDULE), 4, 3) == 0
    async with running_engine(engine_args("--speculative-config", EAGLE3_SCHEDULE)) as engine:
        core = engine.cores[0]
        async with aiohttp.ClientSession() as session:
            start = await scrape(session, engine.base_url)
            await complete(session, engine.base_url, prompt="alone", max_tokens=40, ignore_eos=True)
            alone = await scrape(session, engine.base_url)
            steps_alone = len(core.step_log)
            await asyncio.gather(*[complete(session, engine.base_url, prompt=f"crowd {i}", max_tokens=60,
                                            ignore_eos=True) for i in range(4)])
            crowd = await scrape(session, engine.base_url)
    drafts_alone = total(alone, "vllm:spec_decode_num_drafts_total") - total(start, "vllm:spec_decode_num_drafts_total")
    assert drafts_alone > 0
    crowd_steps = list(core.step_log)[steps_alone:]
    assert any(s.batch_size == 4 for s in crowd_steps)
    assert all(s.num_speculative_tokens == (3 if s.batch_size == 1 else 0) for s in crowd_steps)
    # drafts in the crowd phase come only from steps where one request was left alone (eagle3 drafts every step)
    drafts_crowd = total(crowd, "vllm:spec_decode_num_drafts_total") - total(alone, "vllm:spec_decode_num_drafts_total")
    assert drafts_crowd == sum(s.decode_batch_size for s in crowd_steps if s.num_speculative_tokens)
    assert drafts_crowd < sum(s.decode_batch_size for s in crowd_steps)


async def test_no_speculative_config_no_spec_decode_metrics():
    async with running_engine(engine_args()) as engine:
        async with aiohttp.ClientSession() as session:
            await complete(session, engine.base_url, prompt="x", max_tokens=8, ignore_eos=True)
            scraped = await scrape(session, engine.base_url)
    assert total(scraped, "vllm:generation_tokens_total") == 8
    assert not [name for name in scraped if name.startswith("vllm:spec_decode")]
    assert all(s.num_speculative_tokens == 0 for s in engine.cores[0].step_log)


async def test_a_full_kv_cache_makes_requests_wait_and_preempts():
    # Llama-3.1-8B holds 128 KiB of KV per token: 512 MiB is 4096 tokens, room for ~5 prompts of 700 tokens.
    args = engine_args("--kv-cache-memory-bytes", str(512 * 2**20), "--max-model-len", "1024", time_scale=20)
    async with running_engine(args) as engine:
        assert engine.config.kv_capacity_tokens == 4096
        async with aiohttp.ClientSession() as session:
            requests = [asyncio.create_task(complete(session, engine.base_url, prompt="w" * 2800, max_tokens=300,
                                                     ignore_eos=True)) for _ in range(10)]
            while True:
                scraped = await scrape(session, engine.base_url)
                arrived = total(scraped, "vllm:num_requests_running") + total(scraped, "vllm:num_requests_waiting")
                if arrived == 10 or any(r.done() for r in requests):
                    break
                await asyncio.sleep(0.005)
            bodies = await asyncio.gather(*requests)
            end = await scrape(session, engine.base_url)
    assert total(scraped, "vllm:num_requests_waiting") > 0
    assert 0.5 < total(scraped, "vllm:kv_cache_usage_perc") <= 1.0
    assert all(b["usage"]["completion_tokens"] == 300 for b in bodies)
    assert total(end, "vllm:num_preemptions_total") > 0  # running requests outgrow the cache as they decode
    assert max(s.batch_size for s in engine.cores[0].step_log) < 10


async def test_step_time_is_the_twins_divided_by_the_time_scale():
    async with running_engine(engine_args("--speculative-config", EAGLE3_K3, time_scale=8)) as engine:
        async with aiohttp.ClientSession() as session:
            await complete(session, engine.base_url, prompt="x" * 400, max_tokens=64, ignore_eos=True)
        steps = list(engine.cores[0].step_log)
        await asyncio.sleep(0.05)
        assert len(engine.cores[0].step_log) == len(steps)  # idle: no steps without requests
    twin = Twin(DEFAULT_CATALOG.resolve("H100-SXM"), resolve_model(MODEL), 1, method="eagle3")
    decode = [s for s in steps if s.decode_batch_size == 1 and s.prefill_tokens == 0]
    assert decode and all(s.num_speculative_tokens == 3 for s in decode)
    for s in decode:
        assert s.duration_s == pytest.approx(twin.step_time_s(1, 3, s.mean_context_len) / 8, rel=1e-9)
    prefill = steps[0]
    assert prefill.prefill_tokens == 100 and prefill.decode_batch_size == 0
    assert prefill.simulated_s == pytest.approx(twin.prefill_time_s(100, 1), rel=1e-9)


async def test_sampled_acceptance_follows_the_prior():
    async with running_engine(engine_args("--speculative-config",
                                          json.dumps({"method": "eagle3", "num_speculative_tokens": 5}),
                                          "--seed", "3", time_scale=200)) as engine:
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*[complete(session, engine.base_url, prompt="x", max_tokens=1500, ignore_eos=True)
                                   for _ in range(4)])
            scraped = await scrape(session, engine.base_url)
    drafts = total(scraped, "vllm:spec_decode_num_drafts_total")
    per_position = sorted(scraped["vllm:spec_decode_num_accepted_tokens_per_pos_total"],
                          key=lambda s: int(s[0]["position"]))
    measured = [v / drafts for _, v in per_position]
    prior = acceptance_profile("eagle3", "sharegpt", 5).per_position
    assert drafts > 1500
    assert measured == pytest.approx(prior, abs=0.04)


async def test_data_parallel_ranks_are_separate_engines():
    async with running_engine(engine_args("--data-parallel-size", "2", "--speculative-config", EAGLE3_SCHEDULE)) as e:
        assert e.config.schedule is None  # vLLM ignores the schedule with data parallelism
        async with aiohttp.ClientSession() as session:
            await asyncio.gather(*[complete(session, e.base_url, prompt="x", max_tokens=10, ignore_eos=True)
                                   for _ in range(2)])
            scraped = await scrape(session, e.base_url)
    assert {labels["engine"] for labels, _ in scraped["vllm:generation_tokens_total"]} == {"0", "1"}
    assert total(scraped, "vllm:generation_tokens_total") == 20
    assert {labels["position"] for labels, _ in scraped["vllm:spec_decode_num_accepted_tokens_per_pos_total"]} == {
        "0", "1", "2"}


def test_config_follows_vllms_rules(caplog):
    with caplog.at_level("INFO", logger="specpilot_sandbox.engine"):
        config = build_config(["--model", "acme/unknown-7b", "--enforce-eager", "--sku", "nvidia-h100-80gb"])
    assert config.twin.model.name == "Llama-3.1-8B" and config.twin.gpu.sku == "H100-SXM"
    assert "unknown-7b" in caplog.text and "--enforce-eager" in caplog.text
    assert config.k_at_batch(1) == 0
    scheduled = build_config(["--speculative-config", EAGLE3_SCHEDULE])
    assert [scheduled.k_at_batch(b) for b in (1, 2, 300)] == [3, 0, 0]
    fixed = build_config(["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 4})])
    assert fixed.k_at_batch(100) == 4 and fixed.twin.acceptance.drafts_per_step < 1
    bad = [
        ["--speculative-config", json.dumps({"method": "suffix", "num_speculative_tokens": 3,
                                             "num_speculative_tokens_per_batch_size": SCHEDULE})],
        ["--speculative-config", json.dumps({"method": "medusa", "num_speculative_tokens": 3,
                                             "num_speculative_tokens_per_batch_size": SCHEDULE})],
        ["--speculative-config", json.dumps({"method": "eagle3", "num_speculative_tokens": 2,
                                             "num_speculative_tokens_per_batch_size": [[2, 8, 1]]})],
        ["--speculative-config", json.dumps({"method": "eagle3", "num_speculative_tokens": 2,
                                             "num_speculative_tokens_per_batch_size": [[1, 8, 4]]})],
        ["--speculative-config", json.dumps({"method": "telepathy", "num_speculative_tokens": 2})],
        ["--speculative-config", json.dumps({"method": "eagle3"})],
        ["--max-model-len", "10000000"],
        ["--model", "meta-llama/Llama-3.3-70B-Instruct", "--sku", "L40S"],
        ["--sku", "TPU-v9"],
        ["--workload", "poetry"],
        ["--time-scale", "0"],
    ]
    for argv in bad:
        with pytest.raises(EngineConfigError):
            build_config(argv)
    assert main(["--sku", "TPU-v9"]) == 1


def test_environment_sets_the_simulation(monkeypatch):
    monkeypatch.setenv("SPECPILOT_SIM_SKU", "L40S")
    monkeypatch.setenv("SPECPILOT_SIM_WORKLOAD", "humaneval")
    monkeypatch.setenv("SPECPILOT_SIM_TIME_SCALE", "25")
    monkeypatch.setenv("SPECPILOT_SIM_STARTUP_DELAY_S", "30")
    config = build_config([])
    assert (config.twin.gpu.sku, config.workload, config.time_scale, config.startup_delay_s) == (
        "L40S", "humaneval", 25.0, 30.0)
    assert build_config(["--time-scale", "2"]).time_scale == 2.0


def test_sigterm_stops_the_process_cleanly(tmp_path):
    port_file = tmp_path / "port"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "specpilot_sandbox.engine", "--port", "0"],
                            stderr=subprocess.PIPE, text=True, env=env)
    try:
        for line in proc.stderr:
            if "listening on" in line:
                port_file.write_text(line)
                break
        assert "listening on http://127.0.0.1:" in port_file.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def test_a_client_that_goes_away_frees_its_slot():
    async with running_engine(engine_args(time_scale=1)) as engine:
        core = engine.cores[0]
        async with aiohttp.ClientSession() as session:
            response = await session.post(f"{engine.base_url}/v1/completions", json={
                "prompt": "hi", "max_tokens": 5000, "ignore_eos": True, "stream": True})
            await response.content.readany()
            assert len(core.running) == 1 and core.used_blocks > 0
            response.close()
            await _eventually(lambda: not core.running)
        # Checked while the engine still serves (its shutdown would abort everything anyway).
        assert core.running == [] and core.used_blocks == 0


async def test_a_client_that_goes_away_without_streaming_frees_its_slot_too():
    async with running_engine(engine_args(time_scale=1)) as engine:
        core = engine.cores[0]
        async with aiohttp.ClientSession() as session:
            pending = await _in_flight(session, engine, max_tokens=5000)
            assert len(core.running) == 1
            pending.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pending
        await _eventually(lambda: not core.running)
        # Still serving: the engine dropped the request itself, it did not wait for shutdown to abort it.
        assert core.running == [] and core.used_blocks == 0


async def test_stopping_aborts_requests_in_flight_so_the_server_closes_at_once():
    async with running_engine(engine_args(time_scale=1)) as engine:
        async with aiohttp.ClientSession() as session:
            pending = await _in_flight(session, engine, max_tokens=5000)
            stopping = asyncio.create_task(engine.stop())
            response = await pending
            body = await response.json()
            await stopping
    # vLLM ends what it was generating with finish_reason "abort" when it shuts down; a handler left waiting
    # would hold the server open for its whole shutdown timeout.
    assert body["choices"][0]["finish_reason"] == "abort"
    assert engine.cores[0].running == [] and engine.cores[0].used_blocks == 0


async def test_draining_finishes_requests_in_flight_and_takes_no_new_connections():
    async with running_engine(engine_args(time_scale=10)) as engine:
        async with aiohttp.ClientSession() as session:
            pending = await _in_flight(session, engine, max_tokens=40)
            draining = asyncio.create_task(engine.drain(timeout_s=30))
            response = await pending
            body = await response.json()
            await draining
        async with aiohttp.ClientSession() as fresh:
            with pytest.raises(aiohttp.ClientConnectionError):
                await fresh.get(f"{engine.base_url}/health")
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 40


def _closed_loop(concurrency: int, *extra: str, sku: str = "H100-SXM", output_len: int = 32) -> float:
    from specpilot_sandbox.engine import make_core
    from specpilot_sandbox.engine_core import closed_loop_ms_per_token

    config = build_config(["--model", MODEL, "--sku", sku, *extra])
    return closed_loop_ms_per_token(make_core(config), concurrency, 60, output_len)


def test_closed_loop_alone_is_prefill_plus_decode_steps():
    twin = Twin(DEFAULT_CATALOG.resolve("H100-SXM"), resolve_model(MODEL))
    # One request at a time: its prefill step makes the first token, then 31 decode steps at batch 1.
    steps = [twin.prefill_time_s(60, 1)] + [twin.step_time_s(1, 0, 60 + i) for i in range(1, 32)]
    assert _closed_loop(1) == pytest.approx(1000 * sum(steps) / 32, rel=0.02)


def test_closed_loop_shows_the_crossover_and_the_schedule_follows_it():
    alone = {"off": _closed_loop(1), "k3": _closed_loop(1, "--speculative-config", EAGLE3_K3)}
    crowd = {"off": _closed_loop(192, sku="A100-80GB-SXM"),
             "k3": _closed_loop(192, "--speculative-config", EAGLE3_K3, sku="A100-80GB-SXM")}
    assert alone["k3"] < 0.8 * alone["off"]  # speculation pays alone
    assert crowd["k3"] > crowd["off"]  # and costs in a crowd on the A100
    scheduled = _closed_loop(192, "--speculative-config", EAGLE3_SCHEDULE, sku="A100-80GB-SXM")
    assert scheduled < crowd["k3"]  # the schedule turns it off there
    # Queueing and prefill are in it: a crowd's per-token latency is above the decode step alone.
    twin = Twin(DEFAULT_CATALOG.resolve("A100-80GB-SXM"), resolve_model(MODEL))
    assert crowd["off"] > 1000 * twin.step_time_s(192, 0, 76)


def test_closed_loop_rejects_nonsense():
    with pytest.raises(ValueError, match="concurrency"):
        _closed_loop(0)
