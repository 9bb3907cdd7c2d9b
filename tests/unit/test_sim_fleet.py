"""Fleet simulator mechanics: TPOT against the twin, KV-limited queueing, start-up delay, surge rollouts."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specpilot.sim.fleet import Action, FleetConfig, FleetSetup, Mode, simulate
from specpilot.sim.traces import ConstantTrace

SIZE = 64
SETUP = FleetSetup("meta-llama/Llama-3.1-8B-Instruct", "H100-SXM", workload="random")


@dataclasses.dataclass
class Scripted:
    """A policy that asks for `replicas`/`mode` from time `switch_at_s` on (and `start` before)."""

    modes: dict[str, Mode]
    start_replicas: int
    start_mode: str
    replicas: int
    mode: str
    switch_at_s: float = 0.0
    name: str = "scripted"
    method: str | None = "eagle3"

    def start(self) -> Action:
        return Action(self.start_replicas, self.start_mode)

    def control(self, observation) -> Action:
        if observation.t_s >= self.switch_at_s:
            return Action(self.replicas, self.mode)
        return Action(self.start_replicas, self.start_mode)


OFF = Mode("off", False, (0,) * SIZE)
ON = Mode("on", True, (3,) * SIZE)


def fixed(mode: Mode, replicas: int = 1) -> Scripted:
    return Scripted({mode.name: mode}, replicas, mode.name, replicas, mode.name)


def test_single_replica_at_low_load_reproduces_the_twins_tpot():
    config = FleetConfig(max_num_seqs=SIZE)
    trace = ConstantTrace(duration_s=1800, rps=0.02)
    lengths = SETUP.lengths
    context = lengths.mean_prompt_tokens + lengths.mean_output_tokens / 2
    plain = simulate(fixed(OFF), trace, SETUP, config, seed=1)
    assert plain.requests_completed >= 20
    assert plain.tpot_p50_ms == pytest.approx(SETUP.twin(None).tpot_s(1, 0, context) * 1e3, rel=0.03)
    speculative = simulate(fixed(ON), trace, SETUP, config, seed=1)
    twin = SETUP.twin("eagle3")
    assert speculative.tpot_p50_ms == pytest.approx(twin.tpot_s(1, 3, context) * 1e3, rel=0.05)
    assert speculative.tpot_p50_ms < 0.9 * plain.tpot_p50_ms  # random text: EAGLE-3 accepts little
    # at batch 1 nothing waits: TTFT is prefill plus about half a step
    assert plain.ttft_p50_ms < 3 * SETUP.twin(None).prefill_time_s(lengths.mean_prompt_tokens) * 1e3


def test_requests_queue_when_the_kv_cache_is_full():
    # 25% of an H100 leaves the 8B model a KV cache of a few dozen 1.3k-token requests
    config = FleetConfig(max_num_seqs=256, gpu_memory_utilization=0.25)
    kv_tokens = SETUP.twin(None).kv_capacity_tokens(0.25)
    fits = kv_tokens / (0.9 * SETUP.lengths.prompt.mean + 0.9 * SETUP.lengths.output.mean)
    assert fits < 100
    trace = ConstantTrace(duration_s=600, rps=8)
    result = simulate(fixed(OFF, 1), trace, SETUP, config, seed=2)
    ts = result.timeseries
    assert ts["running_per_replica"].max() <= fits + 1
    assert ts["queue"][len(ts["queue"]) // 2:].min() > 10  # the backlog grows: requests wait for KV
    assert result.ttft_p95_ms > 10_000
    assert result.requests_completed < result.requests_arrived
    # the same load with the whole memory runs without queueing
    roomy = simulate(fixed(OFF, 1), trace, SETUP, FleetConfig(max_num_seqs=256), seed=2)
    assert roomy.ttft_p95_ms < 1000


def test_a_new_replica_serves_only_after_its_startup_delay_but_is_billed_from_the_start():
    config = FleetConfig(max_num_seqs=SIZE, startup_s=120, control_interval_s=15, bin_s=1)
    policy = Scripted({"off": OFF}, 1, "off", 2, "off", switch_at_s=15)
    result = simulate(policy, ConstantTrace(duration_s=300, rps=2), SETUP, config, max_replicas=2)
    ts = result.timeseries
    t = ts["t_s"]
    assert np.all(ts["serving_replicas"][(t >= 0) & (t < 135)] == 1)
    assert np.all(ts["serving_replicas"][t >= 135] == 2)
    assert np.all(ts["replicas"][(t >= 15) & (t < 135)] == 2)
    assert np.all(ts["replicas"][t < 15] == 1)
    assert result.gpu_hours == pytest.approx((15 + 2 * 285) / 3600)


def test_restart_rollout_surges_first_and_never_drops_serving_capacity():
    config = FleetConfig(max_num_seqs=SIZE, startup_s=60, control_interval_s=15, bin_s=1)
    policy = Scripted({"off": OFF, "on": ON}, 3, "off", 3, "on", switch_at_s=30)
    result = simulate(policy, ConstantTrace(duration_s=600, rps=3), SETUP, config, max_replicas=3)
    ts = result.timeseries
    assert result.rollouts == 1
    # maxUnavailable 0: three replicas serve at every moment, a fourth (the surge) is billed while it starts
    assert ts["serving_replicas_min"].min() >= 3
    t = ts["t_s"]
    rolling = (t >= 30) & (t < 30 + 3 * 60)
    # a surge replica starts at every step; an old one drains (billed until its requests finish)
    assert ts["replicas"][rolling].min() >= 4 - 1e-9
    assert ts["replicas"].max() <= 5
    # once rolled, every replica speculates at k=3 and only three are billed
    done = t >= 30 + 3 * 60 + 30
    assert np.all(ts["mean_k"][done][ts["running_per_replica"][done] > 0] == pytest.approx(3))
    assert np.all(ts["replicas"][done] == 3)
    assert np.all(ts["mean_k"][t < 30] == 0)


def test_same_seed_same_arrivals_for_every_policy():
    config = FleetConfig(max_num_seqs=SIZE)
    trace = ConstantTrace(duration_s=120, rps=5)
    a = simulate(fixed(OFF), trace, SETUP, config, seed=7)
    b = simulate(fixed(ON), trace, SETUP, config, seed=7)
    c = simulate(fixed(OFF), trace, SETUP, config, seed=8)
    assert a.requests_arrived == b.requests_arrived != c.requests_arrived


def test_a_mode_that_speculates_without_a_drafter_is_refused():
    bad = Mode("bad", False, (2,) * SIZE)
    with pytest.raises(ValueError, match="does not load a drafter"):
        simulate(fixed(bad), ConstantTrace(duration_s=10, rps=1), SETUP, FleetConfig(max_num_seqs=SIZE))


@dataclasses.dataclass
class Growing(Scripted):
    """A policy that adds a mode (another drafter) the first time it asks for it, as the operator's policy does."""

    later: Mode | None = None

    def control(self, observation) -> Action:
        if observation.t_s >= self.switch_at_s and self.later is not None:
            self.modes[self.later.name] = self.later
        return super().control(observation)


def test_a_mode_added_while_running_loads_its_own_drafter():
    config = FleetConfig(max_num_seqs=SIZE, startup_s=30, control_interval_s=15, bin_s=1)
    trace = ConstantTrace(duration_s=300, rps=0.5)
    ngram = Mode("ngram", True, (2,) * SIZE, method="ngram")
    policy = Growing({"on": ON}, 1, "on", 1, "ngram", switch_at_s=60, later=ngram)
    result = simulate(policy, trace, SETUP, config, max_replicas=1, seed=2)
    assert result.rollouts == 1
    assert any("roll out on -> ngram" in what for _, what in result.events)
    ts = result.timeseries
    busy = ts["running_per_replica"] > 0
    assert np.all(ts["mean_k"][(ts["t_s"] < 60) & busy] == pytest.approx(3))
    assert np.all(ts["mean_k"][(ts["t_s"] > 150) & busy] == pytest.approx(2))
    # the fleet observes a per-slice concurrency histogram over its window
    seen = []
    probe = Growing({"on": ON}, 1, "on", 1, "on")
    probe.control = lambda observation: (seen.append(observation), Action(1, "on"))[1]
    simulate(probe, ConstantTrace(duration_s=120, rps=2), SETUP, config, max_replicas=1)
    histogram = seen[-1].concurrency_histogram
    assert histogram and sum(w for _, w in histogram) == pytest.approx(1.0)
    assert seen[-1].window_s == config.observation_window_s
