"""The demo's fleet placement block and plots, from a result built by hand (no demo run): one $/Mtok per phase
and pool wherever the report prints it (the table's), the join told in the phases' own figures, K drawn at 0 for
a pool that serves unprofiled, every move of the shares labelled, the cost plot's axis and percentages read."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from specpilot_sandbox.demo.report import (  # noqa: E402
    Row,
    cost_figure,
    fleet_lines,
    measured_fleet_cost,
    percent,
    timeline_figure,
    write_reports,
)
from specpilot_sandbox.demo.run import Demo, DemoResult, PhaseResult, TimelineSample, placement_of  # noqa: E402
from specpilot_sandbox.demo.scenario import Phase, fast_scenario  # noqa: E402

WINDOW_S = 30.0

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

LAST_STATUS = {  # the last phase: h200 joined, serves unprofiled at its own replicas
    "fleet": {"costPerMtok": 0.52, "reason": "..."},
    "pools": [
        {"name": "a100", "sku": "A100", "trafficShare": 1 / 3, "fleetTargetReplicas": 1, "costPerMtok": 0.35},
        {"name": "h100", "sku": "H100", "trafficShare": 1 / 3, "fleetTargetReplicas": 1, "costPerMtok": 0.48},
        {"name": "h200", "sku": "H200", "trafficShare": 1 / 3, "costPerMtok": 0.67},
    ],
}


def _sample(at_s: float, share: dict[str, float], cost: float, k: dict[str, int] | None = None) -> TimelineSample:
    return TimelineSample(at_s, 10, {}, k or {}, share=share, fleet_cost=cost)


def _row(phase_index: int, phase: str, pool: str, price: float, requests: int, ms: float | None,
         replicas: int = 1) -> Row:
    """A table row as `summary_rows` builds it: $/Mtok from the measured ms/token (`COST_BASIS`)."""
    tokens = None if ms is None else requests * 1000 / ms
    cost = None if tokens is None else price / (3600 * tokens) * 1e6
    return Row(phase=phase, pool=pool, sku=pool.upper(), concurrency_per_replica=float(requests), method="eagle3",
               k_specpilot=2, drafts_per_request_step=1.0, ms_per_token_measured=ms, ms_per_token_no_sd=10.0,
               ms_per_token_always_sd=9.0, ms_per_token_specpilot_engine=9.0, ms_per_token_scheduled_off=10.5,
               cost_specpilot=cost, cost_no_sd=1.0, cost_always_sd=0.9, vs_better_fixed_percent=None if ms is None
               else round(100 * (ms / 9.0 - 1), 1), phase_index=phase_index, replicas=replicas,
               price_per_gpu_hour=price, tokens_per_second_per_replica=tokens)


def _result() -> tuple[DemoResult, list[Row]]:
    """quiet (nothing placed yet), busy (a100 and h100 placed), then quiet again, which h200 joins as it begins
    and serves unprofiled; after the trace its load holds while h200 is profiled, and the operator's estimate
    moves on."""
    trace = 100.0  # the trace began 100 s into the demo: the phases' times are the demo's
    quiet = PhaseResult(Phase("quiet", 4, 10), trace + 0, trace + 10)  # no placement (no load yet): left out
    busy = PhaseResult(Phase("busy", 30, 10), trace + 10, trace + 20, placement=placement_of(STATUS),
                       fleet=STATUS["fleet"])
    last = PhaseResult(Phase("quiet", 4, 10), trace + 21, trace + 31, placement=placement_of(LAST_STATUS),
                       fleet=LAST_STATUS["fleet"])
    rows = [_row(0, "quiet", "a100", 1.8, 2, 7.0), _row(0, "quiet", "h100", 2.5, 2, 4.5),
            _row(1, "busy", "a100", 1.8, 15, 14.0), _row(1, "busy", "h100", 2.5, 15, 7.5, replicas=2),
            _row(2, "quiet", "a100", 1.8, 1, 6.5), _row(2, "quiet", "h100", 2.5, 1, 4.2),
            _row(2, "quiet", "h200", 3.5, 1, 5.2)]
    result = DemoResult(phases=[quiet, busy, last], joined_pool="h200", joined_at_s=20.5, trace_started_s=trace,
                        timeline=[
                            _sample(12, {"a100": 0.4, "h100": 0.6}, 0.19, {"a100": 2, "h100": 2}),
                            _sample(20, {"a100": 0.4, "h100": 0.6}, 0.19, {"a100": 2, "h100": 2}),
                            # h200 in the plan before a pod of it is ready: no share yet, and K absent (no pod)
                            _sample(22, {"a100": 0.4, "h100": 0.6, "h200": 0.0}, 0.3, {"a100": 4, "h100": 4}),
                            # its pod ready: a third each; it serves unprofiled, K 0
                            _sample(25, {p: 1 / 3 for p in ("a100", "h100", "h200")}, 0.52,
                                    {"a100": 4, "h100": 4, "h200": 0}),
                            _sample(31, {p: 1 / 3 for p in ("a100", "h100", "h200")}, 0.52,
                                    {"a100": 4, "h100": 4, "h200": 0}),
                            # after the trace: h200 profiled, the operator's window now holds only quiet load
                            _sample(45, {p: 1 / 3 for p in ("a100", "h100", "h200")}, 1.74,
                                    {"a100": 4, "h100": 4, "h200": 4}),
                        ])
    return result, rows


def _figures(text: str) -> list[str]:
    return re.findall(r"\$(\d+\.\d+)/Mtok", text)


def test_placement_of_reads_the_placed_pools_only() -> None:
    placed = placement_of(STATUS)
    assert set(placed) == {"a100", "h100", "b200"}
    assert placed["h100"] == {"share": 0.6, "replicas": 2, "cost_per_mtok": 0.16, "full": True, "sku": "H100"}


def test_each_phase_prints_the_tables_dollars_per_mtok_and_names_the_operators_estimate() -> None:
    """One $/Mtok per phase and pool: the fleet line's is the table row's specpilot column, and the fleet's
    measured figure is the serving replicas' price over their tokens/s on the same basis; the operator's own
    figure is printed only as its estimate, and its definition is printed with it."""
    result, rows = _result()
    lines = fleet_lines(result, rows, WINDOW_S)
    busy = next(line for line in lines if line.startswith("  busy:"))
    a100, h100 = (r for r in rows if r.phase_index == 1)
    assert busy == (f"  busy: a100 40% (1 replica, ${a100.cost_specpilot:.3f}/Mtok); b200 0% (its own replicas until "
                    f"profiled, served nothing measured); h100 60% (2 replicas, ${h100.cost_specpilot:.3f}/Mtok, "
                    f"full); fleet ${measured_fleet_cost([a100, h100]):.3f}/Mtok measured, the operator's estimate "
                    "$0.190/Mtok")
    # Not the operator's per-pool figures (0.23, 0.16): those are at the load its window holds.
    assert "0.230" not in busy and "0.160" not in busy
    definitions = next(line for line in lines if "operator's estimate (status.fleet.costPerMtok" in line)
    assert "table's basis" in definitions and f"{WINDOW_S:g} s" in definitions
    # The quiet phase without a placement is left out.
    assert [line.split(":")[0].strip() for line in lines[1:3]] == ["busy", "quiet"]


def test_the_fleets_measured_cost_is_the_tables_basis() -> None:
    _, rows = _result()
    one = rows[0]
    assert measured_fleet_cost([one]) == pytest.approx(one.cost_specpilot)
    # Two pools: dollars per hour over tokens per second, replicas counted (not a mean of the rows' figures).
    a100, h100 = rows[2], rows[3]
    dollars = a100.price_per_gpu_hour + 2 * h100.price_per_gpu_hour
    tokens = a100.tokens_per_second_per_replica + 2 * h100.tokens_per_second_per_replica
    assert measured_fleet_cost([a100, h100]) == pytest.approx(dollars / (3600 * tokens) * 1e6)
    assert measured_fleet_cost([a100, _row(1, "busy", "h100", 2.5, 15, None)]) is None


def test_the_join_line_agrees_with_the_last_phase_and_the_after_trace_figure_is_said_to_be_after() -> None:
    """The join's "at the end" is the last phase's line, figure for figure; what the operator estimated later,
    while the trace's last load held and the new pool was profiled, is a line of its own saying so."""
    result, rows = _result()
    lines = fleet_lines(result, rows, WINDOW_S)
    last = next(line for line in lines if line.startswith("  quiet:"))
    join = next(line for line in lines if line.startswith("  h200 joined"))
    at_end = join.split("at the end of that phase, ")[1]
    last_fleet = last.split("; fleet ")[1]
    assert _figures(at_end) == _figures(last_fleet)  # measured, then the operator's estimate
    assert at_end.startswith("a100 33%, h100 33%, h200 33%, fleet ")
    assert "as the quiet phase began: before, a100 40%, b200 0%, h100 60% (the busy line above)" in join
    # h200 took its share when its pod was ready (25 s), not when it entered the plan at 0% (22 s).
    assert "it took a share 4 s after joining, when a pod of it was ready" in join
    after = next(line for line in lines if line.startswith("  After the trace"))
    assert "14 s more while h200 was profiled" in after and "its estimate $1.740/Mtok" in after
    assert "1.740" not in join


def test_an_unprofiled_serving_pool_is_drawn_at_k_0_and_every_share_move_is_labelled() -> None:
    result, rows = _result()
    fig = timeline_figure(plt, result, rows)
    try:
        load, k_axis, shares, cost = fig.axes[0], fig.axes[1], fig.axes[2], fig.axes[3]
        h200 = next(line for line in k_axis.get_lines() if line.get_label() == "h200")
        # 0 while it serves unprofiled, 4 once profiled: drawn, not left to the legend alone.
        assert list(h200.get_xdata()) == [25, 31, 45] and list(h200.get_ydata()) == [0, 0, 4]
        # Its share is drawn from when the plan holds it (0 % until its pod is ready), not at 0 before it joined.
        share = next(line for line in shares.get_lines() if line.get_label() == "h200: planned share")
        assert [y == y for y in share.get_ydata()] == [False, False, True, True, True, True]
        labels = [t.get_text() for t in shares.texts]
        assert labels == ["h200 ready: the Service splits over 3 pools' pods: a100 33%, h100 33%, h200 33%"]
        # The fleet's $/Mtok panel: the report's measured figures beside the operator's estimate, on enough ticks.
        assert {t.get_text() for t in cost.texts} >= {f"{measured_fleet_cost(rows[2:4]):.2f}"}
        assert cost.get_yscale() == "log" and len(_visible_ticks(cost)) >= 3
    finally:
        plt.close(fig)


def test_the_cost_plots_axis_has_ticks_and_every_percentage_is_the_tables_and_explained() -> None:
    _, rows = _result()
    fig = cost_figure(plt, rows)
    try:
        ax = fig.axes[0]
        assert ax.get_yscale() == "log" and len(_visible_ticks(ax)) >= 3
        shown = [t.get_text() for t in ax.texts]
        assert shown == [percent(r.vs_better_fixed_percent) for r in rows]
        assert any("vs better fixed" in t.get_text() for t in fig.texts)
    finally:
        plt.close(fig)


def _visible_ticks(ax) -> list[str]:
    """The y axis's labelled major ticks inside its limits, as drawn."""
    ax.figure.canvas.draw()
    low, high = ax.get_ylim()
    return [t.get_text() for t, v in zip(ax.get_yticklabels(), ax.get_yticks(), strict=True)
            if low <= v <= high and t.get_text()]


def test_a_rounded_zero_reads_plus_zero() -> None:
    assert percent(-0.04) == "+0.0%" and percent(-0.06) == "-0.1%" and percent(None) == "-"


def test_a_pool_that_never_got_placed_is_said_so_and_nothing_is_shown_without_a_placement() -> None:
    busy = PhaseResult(Phase("busy", 30, 10), 0, 10, placement=placement_of(STATUS), fleet=STATUS["fleet"])
    result = DemoResult(phases=[busy], joined_pool="h200", joined_at_s=5.0, trace_started_s=0.0,
                        timeline=[_sample(6, {"a100": 0.4, "h100": 0.6}, 0.19)])
    assert "it took no share by the end of the run" in fleet_lines(result, [], WINDOW_S)[-1]
    assert fleet_lines(DemoResult(phases=[PhaseResult(Phase("quiet", 4, 10), 0, 10)]), [], WINDOW_S) == []


def test_the_json_names_both_dollars_per_mtok(tmp_path: Path) -> None:
    import json

    result, rows = _result()
    result.stages, result.wall_s = [("starting", 0.0)], 1.0
    write_reports(result, fast_scenario(), rows, tmp_path)
    fleet = json.loads((tmp_path / "demo.json").read_text())["fleet"]
    busy = fleet[0]
    assert busy["fleet_cost_per_mtok_measured"] == pytest.approx(measured_fleet_cost(rows[2:4]))
    assert busy["operator_fleet_cost_per_mtok"] == 0.19
    assert busy["pools"]["a100"]["cost_per_mtok_measured"] == pytest.approx(rows[2].cost_specpilot)
    assert busy["pools"]["a100"]["operator_cost_per_mtok"] == 0.23


class _Driver:
    def __init__(self, in_flight: dict[str, int]) -> None:
        self._in_flight = in_flight

    def in_flight(self, url: str) -> int:
        return self._in_flight.get(url, 0)


def test_the_sampled_k_of_a_pool_serving_unprofiled_is_0_not_missing(tmp_path: Path) -> None:
    """The timeline's K per pool: the decided schedule at the batch for a profiled pool, 0 for one that serves
    without a method (a GPU type still being profiled), nothing for a pool without a ready pod."""
    demo = Demo(fast_scenario(), tmp_path)
    demo.status = lambda: {"pools": [
        {"name": "a100", "decision": {"method": "eagle3", "numSpeculativeTokens": 1, "schedule": [
            {"fromBatchSize": 1, "toBatchSize": 64, "numSpeculativeTokens": 1},
            {"fromBatchSize": 65, "toBatchSize": 256, "numSpeculativeTokens": 0}]}},
        {"name": "h200", "decision": {"source": "none"}},
        {"name": "b200", "decision": {}},  # no ready pod
    ]}
    demo.endpoints = lambda: [("a100", "http://a"), ("h200", "http://h")]
    demo.driver = _Driver({"http://a": 100, "http://h": 3})
    assert demo._k_in_force() == {"a100": 0, "h200": 0}
    demo.driver = _Driver({"http://a": 4, "http://h": 3})
    assert demo._k_in_force() == {"a100": 1, "h200": 0}
