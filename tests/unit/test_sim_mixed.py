"""Mixed-fleet simulation (`specpilot simulate --fleet`): placements of A100/H100/H200 pools sharing one load."""

from __future__ import annotations

import json

import numpy as np
import pytest

from specpilot.cli import main
from specpilot.sim.fleet import FleetConfig
from specpilot.sim.mixed import PLACEMENTS, SCENARIOS, compare
from specpilot.sim.mixed_report import fleet_verdict


@pytest.fixture(scope="module")
def fast_default():
    return compare(SCENARIOS["default"].fast(), FleetConfig(startup_s=15.0))


def test_every_placement_runs_within_the_pools_bounds(fast_default):
    assert [r.placement for r in fast_default.results] == list(PLACEMENTS)
    gpus = {p.spec.name: p.spec.gpus for p in fast_default.prepared}
    for result in fast_default.results:
        timeline = result.timeline
        total = sum(timeline.shares.values())
        assert np.allclose(total, 1.0)
        for name, replicas in timeline.replicas.items():
            assert replicas.max() <= gpus[name]
            assert (replicas >= (1 if name == "a100" else 0)).all()  # the A100 pool keeps one replica
        assert result.requests_arrived > 1000
        assert 0 < result.slo_attainment <= 1 and result.gpu_hours > 0


def test_service_placements_split_per_serving_pod(fast_default):
    for placement in ("even-split", "specpilot-service"):
        timeline = fast_default.result(placement).timeline
        late = len(timeline.times_s) // 2  # past the start-up of the first replicas
        count = sum(r[late] for r in timeline.replicas.values())
        for name, shares in timeline.shares.items():
            assert shares[late] == pytest.approx(timeline.replicas[name][late] / count, abs=0.2)


def test_speculation_aware_placement_beats_the_sd_unaware_optimiser(fast_default):
    verdict = fleet_verdict(fast_default)
    # At a 15 ms TPOT SLO, EAGLE-3 lets every GPU type hold more load within the SLO.
    assert verdict.vs_no_sd > 0.05
    spec, plain = fast_default.result("specpilot"), fast_default.result("cost-optimal-no-sd")
    assert spec.gpu_hours < plain.gpu_hours
    # the verdict names the source of each saving against the baseline that isolates it
    words = verdict.words()
    assert f"{verdict.vs_even_split:.1%} less than even-split, from placing traffic by cost per token" in words
    assert "less than specpilot-service, from weighted routing alone" in words
    assert (f"{verdict.vs_no_sd:.1%} less than cost-optimal-no-sd, from speculation, as each replica holds more "
            f"requests within the SLO") in words


def test_fleet_flag_writes_the_plot_and_reports(tmp_path, capsys):
    assert main(["simulate", "--fleet", "default", "--fast", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "mixed fleet default" in printed and "specpilot-service" in printed
    assert (tmp_path / "fleet-default.png").stat().st_size > 10_000
    report = json.loads((tmp_path / "fleet-report.json").read_text())
    assert set(report[0]["placements"]) == set(PLACEMENTS)
    assert "| specpilot |" in (tmp_path / "fleet-report.md").read_text()


def test_unknown_fleet_scenario_is_refused(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--fleet", "nope"])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_a_loose_slo_fleet_serves_its_main_type_without_the_drafter_that_costs_it_capacity():
    """The simulated fleet decides its pools as the operator does for a deployment it places: under the
    loose-slo scenario's 30 ms the H100 engine holds more tokens/s within the SLO without EAGLE-3."""
    from specpilot.sim.mixed import prepare
    from specpilot.sim.traces import parse_trace

    scenario = SCENARIOS["loose-slo"]
    prepared = {p.spec.name: p for p in prepare(scenario, parse_trace(scenario.trace), FleetConfig())}
    assert prepared["h100"].sd_method is None
    assert "in a fleet placed by cost per token" in prepared["h100"].planning.dynamic.decision.reason
    assert prepared["h100"].sd_pool.curve == prepared["h100"].plain_pool.curve
    # At the default's 15 ms every pool keeps EAGLE-3: there it holds more within the SLO.
    tight = SCENARIOS["default"]
    assert all(p.sd_method == "eagle3" for p in prepare(tight, parse_trace(tight.trace), FleetConfig()))
