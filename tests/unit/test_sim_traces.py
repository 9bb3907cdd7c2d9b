"""Load traces of `specpilot simulate`: shapes, the --trace forms, CSV parsing and its errors."""

from __future__ import annotations

import numpy as np
import pytest

from specpilot.sim.traces import (
    BurstTrace,
    ConstantTrace,
    CsvTrace,
    DiurnalTrace,
    TraceError,
    parse_trace,
    read_csv_trace,
)


def test_constant_trace_is_flat_over_its_duration():
    trace = parse_trace("constant:12.5:600")
    assert isinstance(trace, ConstantTrace)
    assert trace.duration_s == 600
    assert np.all(trace.rate_rps(np.linspace(0, 600, 50)) == 12.5)


def test_diurnal_trace_has_trough_at_start_and_end_and_peak_halfway():
    trace = parse_trace("diurnal:100:20:3")
    assert isinstance(trace, DiurnalTrace)
    assert trace.duration_s == 3 * 3600
    rates = trace.rate_rps(np.array([0.0, 1.5 * 3600, 3 * 3600, 0.75 * 3600]))
    assert rates[0] == pytest.approx(20)
    assert rates[1] == pytest.approx(100)
    assert rates[2] == pytest.approx(20)
    assert rates[3] == pytest.approx(60)
    assert trace.max_rps() == pytest.approx(100, rel=1e-3)
    assert trace.mean_rps() == pytest.approx(60, rel=1e-2)


def test_diurnal_without_hours_is_a_full_day():
    assert parse_trace("diurnal:10:1").duration_s == 86400


def test_bursts_trace_bursts_every_period_after_the_first():
    trace = parse_trace("bursts:5:50:600:60", default_duration_s=1800)
    assert isinstance(trace, BurstTrace)
    t = np.array([30.0, 610.0, 659.0, 661.0, 1210.0])
    assert list(trace.rate_rps(t)) == [5, 50, 50, 5, 50]


def test_with_duration_keeps_the_shape():
    trace = parse_trace("diurnal:100:20:2").with_duration(1800)
    assert trace.duration_s == 1800
    assert trace.rate_rps(np.array([3600.0]))[0] == pytest.approx(100)


@pytest.mark.parametrize("text", ["constant", "constant:abc", "diurnal:10", "sawtooth:1:2", "bursts:1",
                                  "diurnal:5:10:3", "constant:-1", "bursts:1:5:60:120"])
def test_bad_trace_specs_name_the_forms_or_the_field(text):
    with pytest.raises(TraceError) as err:
        parse_trace(text)
    message = str(err.value)
    assert "diurnal" in message or "must be" in message


def test_csv_trace_interpolates_between_rows_and_skips_a_header(tmp_path):
    path = tmp_path / "load.csv"
    path.write_text("time_s,arrival_rate_rps\n# comment\n100,10\n200,30\n400,30\n")
    trace = read_csv_trace(path)
    assert isinstance(trace, CsvTrace)
    assert trace.duration_s == 300  # time runs from the first row
    assert list(trace.rate_rps(np.array([0.0, 50.0, 100.0, 300.0]))) == pytest.approx([10, 20, 30, 30])
    assert parse_trace(str(path)).duration_s == 300


@pytest.mark.parametrize("body, line, words", [
    ("0,1\n10,x\n", 2, "must be numbers"),
    ("0,1\n10,-2\n", 2, "must be >= 0"),
    ("0,1\n10,2\n5,3\n", 3, "must increase"),
    ("0,1\n10\n", 2, "two columns"),
    ("t,r\n0,1\nfoo,2\n", 3, "must be numbers"),
])
def test_csv_errors_name_the_file_and_line(tmp_path, body, line, words):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(TraceError) as err:
        read_csv_trace(path)
    assert f"bad.csv line {line}" in str(err.value)
    assert words in str(err.value)


def test_csv_needs_two_rows_and_a_readable_file(tmp_path):
    path = tmp_path / "one.csv"
    path.write_text("0,5\n")
    with pytest.raises(TraceError, match="at least two rows"):
        read_csv_trace(path)
    with pytest.raises(TraceError, match="cannot read"):
        read_csv_trace(tmp_path / "missing.csv")
