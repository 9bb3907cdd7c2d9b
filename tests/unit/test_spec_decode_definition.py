"""One definition of drafts per request-step (specpilot.specdec) for the benchmark Job, the
planner and live observation: the same counters give the same f everywhere."""

from __future__ import annotations

import pytest
from specpilot.api.profile import LevelPoint, Run
from specpilot.observe import vllm_metrics as vm
from specpilot.specdec import drafts_per_request_step, request_steps
from specpilot.policy.surface import acceptance_from_run
from specpilot_bench.sweep import run_acceptance


def _points() -> list[LevelPoint]:
    # 2 levels of an n-gram run: 40 and 80 requests of 64 tokens, drafts in part of the steps
    return [LevelPoint(concurrency=1, output_throughput=10, completed=40, generation_tokens=40 * 64,
                       num_drafts=600, num_accepted_tokens=700, accepted_per_position=[400, 200, 100]),
            LevelPoint(concurrency=4, output_throughput=30, completed=80, generation_tokens=80 * 64,
                       num_drafts=1300, num_accepted_tokens=1500, accepted_per_position=[800, 450, 250])]


def test_request_steps_leave_out_each_requests_first_token():
    # a request of 64 tokens whose drafts were accepted 20 times took 64 - 20 - 1 decode steps
    assert request_steps(64, 20, 1) == 43
    assert drafts_per_request_step(43, 64, 20, 1) == 1.0
    assert drafts_per_request_step(10, 20, 20, 0) is None
    assert drafts_per_request_step(50, 64, 20, 1) == 1.0  # capped


def test_the_bench_the_planner_and_live_observation_agree():
    points = _points()
    drafts, accepted = 1900, 2200
    generated, completed = 120 * 64, 120
    expected = drafts / (generated - accepted - completed)
    assert expected < 1
    bench = run_acceptance(points).drafts_per_step
    _, planner = acceptance_from_run(Run(num_speculative_tokens=3, points=points), model_drafter=False)
    live = vm.spec_decode_summary(vm.SpecDecodeCounts(drafts, 0.0, accepted, (1200.0, 650.0, 350.0)), generated,
                                  finished_requests=completed).drafts_per_step
    assert bench == pytest.approx(expected)
    assert planner == pytest.approx(expected)
    assert live == pytest.approx(expected)
    # a window without the request counter keeps the one-step-per-request bias, and only that
    unknown = vm.spec_decode_summary(vm.SpecDecodeCounts(drafts, 0.0, accepted, ()), generated).drafts_per_step
    assert unknown == pytest.approx(drafts / (generated - accepted))
