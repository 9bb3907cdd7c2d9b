"""The simulated engine's virtual clock, and what it buys: a profile measured by the benchmark's load generator on
the simulated engine equals, level for level, the host-free replay of the same requests (`closed_loop_level`),
even while another process keeps a core busy. Nothing asserts on wall time: the measured figures are compared
with the simulation's own.
"""

from __future__ import annotations

import json
import time

import pytest
from specpilot_bench import loadgen
from specpilot_bench.clock import read_clock
from specpilot_bench.sweep import default_warmup, use_vllm_generator
from specpilot_bench.workloads import load_prompts
from specpilot_sandbox.clock import VirtualClock, WallClock
from specpilot_sandbox.engine import build_config, make_core, running_engine, tokenize
from specpilot_sandbox.engine_core import closed_loop_level

MODEL = "meta-llama/Llama-3.1-8B-Instruct"
EAGLE3_K2 = json.dumps({"method": "eagle3", "num_speculative_tokens": 2})


def test_the_virtual_clock_moves_only_with_steps_however_late_the_host_is(tmp_path):
    clock = VirtualClock(tmp_path / "clock")
    read = read_clock(tmp_path / "clock")
    start = clock.now()
    clock.step(0.005, time.monotonic() + 0.005)
    time.sleep(0.05)  # the host takes ten times the step's time
    assert clock.now() == pytest.approx(start + 0.005)
    assert clock.step_end() == pytest.approx(start + 0.005)
    time.sleep(0.01)
    assert clock.now() == read() == pytest.approx(start + 0.005)  # stands still until the next step or idle
    clock.hold()
    assert read() == pytest.approx(start + 0.005)
    clock.idle()
    time.sleep(0.02)
    assert read() == pytest.approx(start + 0.005)  # nothing runs, no simulated time passes
    clock.step(0.01, time.monotonic() + 0.01)
    time.sleep(0.005)
    assert start + 0.005 < read() < start + 0.015  # within a step it runs at the step's pace


def test_a_reader_before_any_engine_reads_the_wall_clock_and_follows_the_next_engine(tmp_path):
    path = tmp_path / "clock"
    read = read_clock(path)
    assert abs(read() - time.monotonic()) < 1.0
    first = VirtualClock(path)
    first.step(10.0, time.monotonic() + 0.001)
    end = first.step_end()
    assert read() == pytest.approx(end)
    first.close()
    second = VirtualClock(path)  # the next engine of the Job: the same file, the same reader
    second.hold()
    assert read() == pytest.approx(second.now())


def _mid_write(path) -> int:
    """Leave the clock file as a writer descheduled in the middle of a write leaves it (the sequence odd)."""
    import mmap
    import struct

    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 8) as view:
        seq = struct.unpack_from("<Q", view, 0)[0]
        struct.pack_into("<Q", view, 0, seq + 1)
    return seq


def test_a_reader_waits_for_a_writer_descheduled_mid_write(tmp_path):
    """On a busy host the engine can lose the CPU in the middle of a write for a scheduler slice or more; the
    reader (the benchmark's load generator) waits for it instead of failing the benchmark Job."""
    import threading

    path = tmp_path / "clock"
    clock = VirtualClock(path)
    clock.step(1.0, time.monotonic() + 0.001)
    end = clock.step_end()
    read = read_clock(path)
    assert read() == pytest.approx(end)
    _mid_write(path)
    finisher = threading.Timer(0.2, clock.hold)  # the write completes 200 ms later (a new, even sequence)
    finisher.start()
    try:
        assert read() == pytest.approx(end)
    finally:
        finisher.join()


def test_a_reader_gives_up_on_a_writer_that_died_mid_write(tmp_path):
    path = tmp_path / "clock"
    VirtualClock(path).hold()
    _mid_write(path)
    with pytest.raises(RuntimeError, match="has been mid-write for 0.05 s: its engine died while writing it"):
        read_clock(path, writer_wait_s=0.05)()


def test_the_wall_clock_is_wall_time():
    clock = WallClock()
    assert not clock.virtual
    assert abs(clock.now() - time.monotonic()) < 0.1


def test_the_load_generator_times_with_the_clock_the_environment_names(tmp_path):
    assert loadgen.level_clock({}) is time.perf_counter
    VirtualClock(tmp_path / "c").hold()
    assert loadgen.level_clock({loadgen.CLOCK_FILE_ENV: str(tmp_path / "c")}) is not time.perf_counter
    # vLLM's generator cannot read it, so a simulated engine's clock means specpilot's generator.
    assert not use_vllm_generator({loadgen.CLOCK_FILE_ENV: str(tmp_path / "c")})


async def test_a_level_measured_on_the_virtual_clock_is_the_host_free_replay(tmp_path, monkeypatch, busy_core):
    """The bench's own load generator against the simulated engine, at levels whose batches are several times
    larger than a host keeps up with in real time, while a core is busy: every level's output throughput is
    the replay's, since the clock, the arrival windows and the settled bursts take the host out."""
    clock_file = tmp_path / "clock"
    monkeypatch.setenv(loadgen.CLOCK_FILE_ENV, str(clock_file))
    argv = ["--model", MODEL, "--sku", "A100-80GB-SXM", "--speculative-config", EAGLE3_K2]
    levels = {1: 4, 16: 32, 64: 128}
    prompts = load_prompts("sharegpt", sum(levels.values()), output_len=24, seed=0)
    by_level, start = {}, 0
    for c, n in levels.items():
        by_level[c] = [loadgen.CompletionRequest(p.text, len(tokenize(p.text)), 24) for p in prompts[start:start + n]]
        start += n
    measured = {}
    # At 20x real time no host keeps up with these batches: the clock must take it out.
    served = [*argv, "--port", "0", "--time-scale", "20", "--clock-file", str(clock_file)]
    async with running_engine(served) as engine:
        for c, requests in by_level.items():
            result = await loadgen.benchmark(f"{engine.base_url}/v1/completions", MODEL, requests, c,
                                             num_warmups=default_warmup(c))
            measured[c] = result["output_throughput"]
    core = make_core(build_config(argv))
    for c, requests in by_level.items():
        lens = [r.prompt_len for r in requests]
        warmup = default_warmup(c)
        closed_loop_level(core, lens[:1] * warmup, 24, warmup)
        replay = closed_loop_level(core, lens, 24, c).output_throughput
        assert measured[c] == pytest.approx(replay, rel=0.01), (c, measured, replay)
