"""Per-request SLO attainment (`sim.fleet`): a request counts only within both its TTFT and its TPOT SLO, and
one unfinished at the end is a miss."""

from __future__ import annotations

import numpy as np
import pytest

from specpilot.sim.fleet import Action, FleetConfig, FleetSetup, Mode, simulate
from specpilot.sim.requestlog import RequestLog

SETUP = FleetSetup("meta-llama/Llama-3.1-8B-Instruct", "H100-SXM")
CONFIG = FleetConfig(max_num_seqs=8, startup_s=0.0, bin_s=10.0)


class _Plain:
    """One replica without speculation throughout."""

    name = "plain"
    method = None

    def __init__(self, replicas: int = 1) -> None:
        self.replicas = replicas
        self.modes = {"off": Mode("off", False, (0,) * CONFIG.max_num_seqs)}

    def start(self) -> Action:
        return Action(self.replicas, "off")

    def control(self, observation) -> Action:
        return Action(self.replicas, "off")


def _log(arrivals, inputs, outputs, duration_s) -> RequestLog:
    return RequestLog(duration_s=duration_s, arrival_s=np.asarray(arrivals, dtype=float),
                      input_tokens=np.asarray(inputs), output_tokens=np.asarray(outputs), source="test")


def test_a_request_within_tpot_but_late_ttft_is_a_miss():
    # Sixteen requests at once on one replica of 8 slots: the second eight queue behind the first
    # (each ~100 tokens, about a second), so their TTFT is about a second while their TPOT is as fast as the
    # first eight's. A 500 ms TTFT SLO misses exactly the queued ones.
    log = _log(np.zeros(16), [100] * 16, [100] * 16, 30.0)
    loose = simulate(_Plain(), log, SETUP, CONFIG, slo_tpot_ms=50.0, slo_ttft_ms=None)
    tight = simulate(_Plain(), log, SETUP, CONFIG, slo_tpot_ms=50.0, slo_ttft_ms=500.0)
    assert loose.requests_arrived == tight.requests_arrived == 16
    assert loose.requests_completed == tight.requests_completed == 16
    assert tight.tpot_met == 16 and tight.tpot_attainment == 1.0
    assert tight.ttft_met == 8 and tight.ttft_attainment == 0.5
    assert tight.slo_met == 8 and tight.slo_attainment == 0.5
    assert loose.slo_attainment == 1.0
    # $/Mtok within SLO: the same dollars over the tokens of the requests within both SLOs only
    assert tight.slo_output_tokens == pytest.approx(8 * 100)
    assert tight.cost_per_mtok_within_slo == pytest.approx(tight.cost_usd / 800 * 1e6)


def test_a_late_tpot_is_a_miss_whatever_the_ttft():
    log = _log(np.zeros(4), [100] * 4, [100] * 4, 30.0)
    result = simulate(_Plain(), log, SETUP, CONFIG, slo_tpot_ms=0.01, slo_ttft_ms=10_000.0)
    assert result.ttft_met == 4 and result.tpot_met == 0 and result.slo_attainment == 0.0


def test_an_unfinished_request_is_a_miss():
    # Two short requests finish; a 4,000-token answer arriving at 5 s cannot finish within the 10 s run.
    log = _log([0.0, 0.0, 5.0], [100, 100, 100], [50, 50, 4000], 10.0)
    result = simulate(_Plain(), log, SETUP, CONFIG, slo_tpot_ms=50.0, slo_ttft_ms=2000.0)
    assert result.requests_arrived == 3 and result.requests_completed == 2
    assert result.slo_met == 2 and result.slo_attainment == pytest.approx(2 / 3)


def test_a_request_never_admitted_is_a_miss():
    log = _log([0.0, 1.0], [100, 100], [50, 50], 5.0)
    result = simulate(_Plain(replicas=0), log, SETUP, CONFIG, slo_tpot_ms=50.0, slo_ttft_ms=2000.0)
    assert result.requests_arrived == 2 and result.requests_completed == 0 and result.slo_attainment == 0.0


def test_a_log_is_replayed_with_its_own_arrivals_and_lengths():
    arrivals = [0.5, 1.25, 2.0, 7.5]
    log = _log(arrivals, [10, 20, 30, 40], [5, 6, 7, 8], 20.0)
    result = simulate(_Plain(), log, SETUP, CONFIG, slo_tpot_ms=50.0)
    assert result.requests_arrived == 4 and result.requests_completed == 4
    assert result.output_tokens == pytest.approx(5 + 6 + 7 + 8)
