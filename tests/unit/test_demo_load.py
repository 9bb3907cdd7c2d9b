"""The demo's load driver against a simulated engine on a virtual clock: what its clients measure is, request
for request, the host-free replay of the same engine at the same load (the basis of the demo's table), even
while another process keeps a core busy. Nothing asserts on wall time."""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest
from specpilot_bench.clock import read_clock
from specpilot_sandbox.demo.load import InFlight, LoadDriver, demo_prompts
from specpilot_sandbox.engine import build_config, make_core, running_engine, tokenize
from specpilot_sandbox.engine_core import closed_loop_ms_per_token

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
OUTPUT_LEN = 16


async def test_the_clients_measure_the_replay_of_the_same_engine_at_each_phase(tmp_path, busy_core):
    """Two phases (8 requests in flight, then 24, each beginning with its clients arriving together): at each,
    the requests held on the engine's clock average the phase's concurrency, and the mean ms per token of the
    requests after the first burst is the replay's for the same prompts in the same turn. Without speculation
    the engine is deterministic, so the two agree to rounding."""
    clock_file = tmp_path / "clock"
    argv = ["--model", MODEL, "--sku", "A100-80GB-SXM"]
    prompt_tokens = tuple(len(tokenize(p)) for p in demo_prompts())
    # At 4x real time the host cannot keep up with every step: the virtual clock takes it out.
    async with running_engine([*argv, "--port", "0", "--time-scale", "4", "--clock-file", str(clock_file)]) as engine:
        url = engine.base_url
        clock = read_clock(clock_file)
        async with LoadDriver(lambda: [("pool", url)], MODEL, OUTPUT_LEN, clock_of=lambda _: clock) as driver:
            for concurrency in (8, 24):
                await driver.set_concurrency(0, together=True)
                before, started = driver.held(), time.monotonic()
                await driver.set_concurrency(concurrency)
                deadline = started + 60
                while sum(1 for s in driver.samples if s.sent_at >= started and s.turn >= concurrency) < 40:
                    assert time.monotonic() < deadline, f"{len(driver.samples)} requests, {driver.errors} errors"
                    await asyncio.sleep(0.1)
                after, ended = driver.held(), time.monotonic()
                area0, then, _ = before.get(url, (0.0, after[url][2], None))
                area1, now, _ = after[url]
                assert (area1 - area0) / (now - then) == pytest.approx(concurrency, rel=0.02)
                measured = [s.ms_per_token for s in driver.samples
                            if started <= s.sent_at and s.finished_at <= ended and s.turn >= concurrency]
                replay = closed_loop_ms_per_token(make_core(build_config(argv)), concurrency, prompt_tokens,
                                                  OUTPUT_LEN, num_requests=len(measured))
                assert statistics.fmean(measured) == pytest.approx(replay, rel=0.005), concurrency
    assert driver.errors == 0


def test_a_worker_stays_on_its_replica_while_that_one_is_among_the_least_loaded():
    endpoints = [("a", "http://a"), ("b", "http://b"), ("c", "http://c")]
    driver = LoadDriver(lambda: list(endpoints), MODEL, 8, prompts=("x",))
    driver._outstanding = {"http://a": 2, "http://b": 3, "http://c": 2}
    for _ in range(20):  # a tie: the worker's own replica, not a random one of the tied
        assert driver._pick("http://a") == ("a", "http://a")
        assert driver._pick("http://c") == ("c", "http://c")
    # A replica with more in flight than another (a new pod joined with none): the worker moves.
    driver._outstanding = {"http://a": 3, "http://b": 3, "http://c": 0}
    assert driver._pick("http://a") == ("c", "http://c")


def test_the_requests_held_integrate_over_the_replicas_clock():
    held = InFlight()
    held.advance(10.0)
    held.count = 2
    held.advance(11.0)  # two for a second
    held.count = 1
    held.advance(11.0)  # the clock stood still: nothing added
    held.advance(13.0)  # one for two seconds
    assert (held.area, held.since, held.last) == (4.0, 10.0, 13.0)
