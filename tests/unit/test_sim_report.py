"""The verdicts `specpilot simulate` ends with: where specpilot's saving comes from, against which baseline.

A replica costs the same per hour whatever it runs, so the single-pool verdict judges specpilot+autoscale on
$/Mtok against no SD autoscaled to the same TPOT SLO (speculation saves replicas) and specpilot on latency
against no SD at the same fixed replicas; the fleet verdict names placement, routing and speculation.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from specpilot.cli import main
from specpilot.sim.fleet import SimResult
from specpilot.sim.mixed_report import Against, FleetVerdict
from specpilot.sim.report import verdict

PRICE = 2.5
"""Dollars per GPU-hour of every made-up run."""


def run(policy: str, gpu_hours: float, *, attainment: float = 1.0, tpot_p50_ms: float = 10.0,
        replicas: tuple[float, ...] = (2.0, 2.0), output_tokens: float = 10e6) -> SimResult:
    """A made-up run: 10,000 requests, the given GPU-hours at PRICE, the share `attainment` within both SLOs."""
    arrived = 10_000
    met = round(attainment * arrived)
    return SimResult(policy, None, 3600.0, arrived, arrived, output_tokens, gpu_hours, gpu_hours * PRICE, 15.0,
                     met, tpot_p50_ms, tpot_p50_ms * 1.3, 20.0, 40.0, 0,
                     {"replicas": np.array(replicas)}, [], slo_ttft_ms=2000.0, ttft_met=arrived, slo_met=met,
                     slo_output_tokens=output_tokens * attainment)


def fixed(no_sd_tpot: float = 11.8, specpilot_tpot: float = 6.2) -> list[SimResult]:
    """The fixed-replica pair at 4 replicas for an hour: the same cost, different latency."""
    return [run("no-sd", 4.0, tpot_p50_ms=no_sd_tpot, attainment=0.977, replicas=(4.0, 4.0)),
            run("specpilot", 4.0, tpot_p50_ms=specpilot_tpot, replicas=(4.0, 4.0))]


def test_a_win_names_the_autoscaled_baseline_the_figures_and_fewer_replica_hours():
    results = [*fixed(), run("specpilot+autoscale", 3.3, replicas=(2.0, 3.0)),
               run("no-sd+autoscale", 3.75, replicas=(3.0, 4.0))]
    v = verdict(results)
    words = v.words()
    assert v.wins
    assert words.startswith("specpilot+autoscale pays $0.8250/Mtok against $0.9375 for no SD autoscaled to the "
                            "same 15 ms TPOT SLO (12.0% less, 100.0% of requests within SLO for both)")
    assert "speculation lets each replica hold more requests within the SLO" in words
    assert "12.0% fewer replica-hours (3.30 against 3.75 GPU-hours)" in words
    # the fixed-replica policies are compared on latency, their cost being the same
    assert ("at the same 4 fixed replicas speculation changes latency, not cost: TPOT p50 6.2 ms with specpilot's "
            "schedule against 11.8 ms without SD, 100.0% of requests within SLO against 97.7%, at the same "
            "$1.0000/Mtok") in words


def test_a_win_at_equal_replica_hours_says_the_plain_replicas_fell_behind():
    results = [run("specpilot+autoscale", 4.0), run("no-sd+autoscale", 4.0, output_tokens=9e6)]
    words = verdict(results).words()
    assert "as many replica-hours (4.00 against 4.00 GPU-hours) and serves 11.1% more tokens" in words
    assert "fall behind the load" in words


def test_no_saving_on_the_same_replicas_says_so_and_why():
    results = [*fixed(), run("specpilot+autoscale", 2.0), run("no-sd+autoscale", 2.0)]
    v = verdict(results)
    words = v.words()
    assert not v.wins
    assert words.startswith("specpilot+autoscale does not save: it pays $0.5000/Mtok, no less than $0.5000 for no "
                            "SD autoscaled to the same 15 ms TPOT SLO")
    assert "both autoscalers ran the same replicas throughout" in words
    assert "changes latency, not cost" in words  # the fixed-replica clause still says what speculation did


def test_a_dearer_autoscaler_says_speculation_saved_no_replicas():
    results = [run("specpilot+autoscale", 2.2, replicas=(2.0, 3.0)), run("no-sd+autoscale", 2.0)]
    words = verdict(results).words()
    assert "it pays $0.5500/Mtok, 10.0% more than $0.5000" in words
    assert "speculation did not let it run fewer replicas (2.20 against 2.00 GPU-hours)" in words


def test_cheaper_by_missing_requests_is_not_a_win():
    results = [run("specpilot+autoscale", 1.5, attainment=0.9, replicas=(1.0, 2.0)), run("no-sd+autoscale", 2.0)]
    v = verdict(results)
    assert not v.wins
    words = v.words()
    assert ("(25.0% less) but keeps fewer requests within the SLO (90.0% of requests within SLO against 100.0%)"
            in words)
    assert "not a like-for-like saving" in words


def test_a_slower_schedule_at_fixed_replicas_says_so():
    words = verdict(fixed(no_sd_tpot=10.0, specpilot_tpot=10.4)).words()
    assert "TPOT p50 10.4 ms with specpilot's schedule against 10.0 ms without SD (slower:" in words


def test_without_the_like_for_like_pairs_there_is_nothing_to_say():
    assert verdict([run("no-sd", 2.0)]).words() == "no policies to compare like with like"


def test_simulate_fast_prints_and_records_the_verdict(tmp_path, capsys):
    assert main(["simulate", "--fast", "--quiet", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "report.json").read_text())["comparisons"][0]["verdict"]
    assert report["wins"] and report["autoscaled"]["against"] == "no-sd+autoscale"
    assert report["autoscaled"]["gpu_hours_change_percent"] < 0
    assert report["fixed_replicas"]["against"] == "no-sd"
    assert "for no SD autoscaled to the same 15 ms TPOT SLO" in report["words"]
    assert f"**Verdict:** {report['words']}." in (tmp_path / "report.md").read_text()


def fleet(*against: Against, carriers=("h100", "h200")) -> FleetVerdict:
    return FleetVerdict(0.1, 0.135, True, carriers, cost_per_mtok=0.2587, slo_attainment=1.0, against=against)


def test_the_fleet_verdict_names_placement_routing_and_speculation():
    words = fleet(Against("even-split", 0.101, 0.051, 0.053, 0.834),
                  Against("specpilot-service", 0.234, 0.199, 0.05, 0.948),
                  Against("cost-optimal-no-sd", 0.135, 0.092, 0.06, 1.0)).words()
    assert words.startswith("specpilot pays $0.2587/Mtok with 100.0% of requests within SLO: ")
    assert ("10.1% less than even-split, from placing traffic by cost per token across GPU types with weighted "
            "routing (5.1% fewer GPU-hours, 5.3% cheaper per GPU-hour, 83.4% within SLO there)") in words
    assert "23.4% less than specpilot-service, from weighted routing alone (19.9% fewer GPU-hours" in words
    assert ("13.5% less than cost-optimal-no-sd, from speculation, as each replica holds more requests within the "
            "SLO and the most traffic moves from h200 to h100 (9.2% fewer GPU-hours, 6.0% cheaper per GPU-hour)"
            ) in words


def test_cheaper_gpu_hours_with_the_same_main_carrier_are_named():
    words = fleet(Against("cost-optimal-no-sd", 0.195, 0.131, 0.073, 0.999), carriers=("h100", "h100")).words()
    assert ("19.5% less than cost-optimal-no-sd, from speculation, as each replica holds more requests within the SLO "
            "and more of the load goes to cheaper GPU types (13.1% fewer GPU-hours, 7.3% cheaper per GPU-hour, "
            "99.9% within SLO there)") in words


def test_a_fleet_baseline_specpilot_does_not_beat_is_said_plainly():
    words = fleet(Against("cost-optimal-no-sd", -0.026, -0.028, 0.002, 1.0), carriers=("h100", "h100")).words()
    assert "2.6% more than cost-optimal-no-sd: speculation saves nothing here (2.8% more GPU-hours)" in words
    words = fleet(Against("even-split", -0.022, 0.0, -0.022, 1.0)).words()
    assert ("2.2% more than even-split: placing traffic by cost per token across GPU types with weighted routing "
            "saves nothing here (2.2% dearer per GPU-hour)") in words
    # dearer than a baseline that misses the SLO: what specpilot pays for
    words = fleet(Against("even-split", -0.022, -0.088, 0.06, 0.973)).words()
    assert ("2.2% more than even-split, which keeps only 97.3% within SLO: specpilot pays for keeping the rest "
            "within it (8.8% more GPU-hours, 6.0% cheaper per GPU-hour)") in words
    words = fleet(Against("specpilot-service", 0.002, 0.0, 0.0, 0.9995)).words()
    assert "as much as specpilot-service: weighted routing saves nothing here" in words
