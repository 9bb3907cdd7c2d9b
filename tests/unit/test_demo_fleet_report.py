"""The demo's fleet placement block, from a result built by hand (no demo run)."""

from __future__ import annotations

from specpilot_sandbox.demo.report import fleet_lines
from specpilot_sandbox.demo.run import DemoResult, PhaseResult, TimelineSample, placement_of
from specpilot_sandbox.demo.scenario import Phase

STATUS = {
    "fleet": {"costPerMtok": 0.19, "reason": "..."},
    "pools": [
        {"name": "a100", "sku": "A100", "trafficShare": 0.4, "fleetTargetReplicas": 1, "costPerMtok": 0.23},
        {"name": "h100", "sku": "H100", "trafficShare": 0.6, "fleetTargetReplicas": 2, "costPerMtok": 0.16,
         "full": True},
        {"name": "h200", "sku": None},  # not placed yet
        {"name": "b200", "sku": "B200", "trafficShare": 0.0, "costPerMtok": None},  # held: no profile yet
    ],
}


def _sample(at_s: float, share: dict[str, float], cost: float) -> TimelineSample:
    return TimelineSample(at_s, 10, {}, {}, share=share, fleet_cost=cost)


def test_placement_of_reads_the_placed_pools_only() -> None:
    placed = placement_of(STATUS)
    assert set(placed) == {"a100", "h100", "b200"}
    assert placed["h100"] == {"share": 0.6, "replicas": 2, "cost_per_mtok": 0.16, "full": True, "sku": "H100"}


def test_each_phase_and_the_join_are_told_in_words() -> None:
    busy = PhaseResult(Phase("busy", 30, 10), 0, 10, placement=placement_of(STATUS), fleet=STATUS["fleet"])
    quiet = PhaseResult(Phase("quiet", 4, 10), 10, 20)  # no placement (no load yet): left out
    result = DemoResult(phases=[quiet, busy], joined_pool="h200", joined_at_s=12.0, timeline=[
        _sample(11, {"a100": 0.4, "h100": 0.6}, 0.19),
        _sample(15, {"a100": 0.4, "h100": 0.6}, 0.19),
        _sample(18, {"a100": 0.2, "h100": 0.5, "h200": 0.3}, 0.15),
    ])
    lines = fleet_lines(result)
    assert lines[1] == ("  busy: a100 40% (1 replica, $0.230/Mtok); b200 0% (its own replicas until profiled, -); "
                        "h100 60% (2 replicas, $0.160/Mtok, full); fleet $0.190/Mtok")
    assert lines[2] == ("  h200 joined at 12 s: before, a100 40%, h100 60%, fleet $0.190/Mtok; placed 6 s after "
                        "joining; at the end a100 20%, h100 50%, h200 30%, fleet $0.150/Mtok")
    assert len(lines) == 3


def test_a_pool_that_never_got_placed_is_said_so_and_nothing_is_shown_without_a_placement() -> None:
    busy = PhaseResult(Phase("busy", 30, 10), 0, 10, placement=placement_of(STATUS), fleet=STATUS["fleet"])
    result = DemoResult(phases=[busy], joined_pool="h200", joined_at_s=5.0,
                        timeline=[_sample(6, {"a100": 0.4, "h100": 0.6}, 0.19)])
    assert "not placed by the end of the run" in fleet_lines(result)[-1]
    assert fleet_lines(DemoResult(phases=[PhaseResult(Phase("quiet", 4, 10), 0, 10)])) == []
