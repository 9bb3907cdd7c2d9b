"""Request logs (`--trace FILE.csv`): column conventions, timestamps or seconds, --trace-scale, bounds, bad rows,
and the shipped log the `log` scenario replays."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from specpilot.sim.requestlog import DRAIN_S, LogLimits, RequestLog, read_request_log
from specpilot.sim.traces import CsvTrace, TraceError, parse_trace

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, text: str, name: str = "log.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_azure_columns_with_timestamps(tmp_path):
    path = _write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                            "2023-11-16 18:15:46.6805900,374,44\n"
                            "2023-11-16 18:15:50.1805900,396,109\n"
                            "2023-11-16 18:16:46.6805900,879,20\n")
    log = parse_trace(str(path))
    assert isinstance(log, RequestLog)
    assert np.allclose(log.arrival_s, [0.0, 3.5, 60.0])
    assert list(log.input_tokens) == [374, 396, 879] and list(log.output_tokens) == [44, 109, 20]
    assert log.duration_s == pytest.approx(60.0 + DRAIN_S)


def test_seconds_columns_any_case_extra_columns_and_comments(tmp_path):
    path = _write(tmp_path, "# a comment\nrequest_id,Arrival_S,input_tokens,output_tokens\n"
                            "a,10.0,100,20\nb,12.5,200,30\n\nc,11.0,300,40\n")
    log = read_request_log(path)
    # time runs from the first request; rows out of order are sorted
    assert np.allclose(log.arrival_s, [0.0, 1.0, 2.5])
    assert list(log.input_tokens) == [100, 300, 200]


def test_trace_scale_compresses_time(tmp_path):
    path = _write(tmp_path, "arrival_s,input_tokens,output_tokens\n0,10,10\n10,10,10\n30,10,10\n")
    log = parse_trace(str(path), scale=2.0)
    assert np.allclose(log.arrival_s, [0.0, 5.0, 15.0]) and log.scale == 2.0
    assert log.arrivals_between(0.0, 10.0) == 2


def test_a_rate_csv_is_still_a_rate_trace_and_refuses_a_scale(tmp_path):
    path = _write(tmp_path, "time_s,arrival_rate_rps\n0,1\n60,2\n")
    assert isinstance(parse_trace(str(path)), CsvTrace)
    with pytest.raises(TraceError, match="--trace-scale applies to a request log"):
        parse_trace(str(path), scale=2.0)
    with pytest.raises(TraceError, match="--trace-scale applies to a request log"):
        parse_trace("constant:10", scale=2.0)


@pytest.mark.parametrize(("row", "message"), [
    ("5,abc,10", "line 3: input_tokens must be a whole number of tokens (got 'abc'); fix or drop the row"),
    ("5,10.5,10", "line 3: input_tokens must be a whole number"),
    ("5,10,-1", "line 3: output_tokens must be a whole number of tokens >= 0"),
    ("yesterday,10,10", "line 3: arrival 'yesterday' is neither seconds nor a date and time"),
    ("2023-11-16 18:15:46,10,10", "line 3: arrival '2023-11-16 18:15:46' is a timestamp but earlier rows give"),
    ("5,10", "line 3: expected 3 columns"),
    ("-1,10,10", "line 3: arrival must be seconds >= 0"),
    ("5,10,200000", "line 3: output_tokens 200000 is over the 100000 tokens one request may have"),
])
def test_a_bad_row_names_its_line_and_the_fix(tmp_path, row, message):
    path = _write(tmp_path, f"arrival_s,input_tokens,output_tokens\n0,10,10\n{row}\n")
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_request_log(path)


def test_what_is_read_is_bounded(tmp_path):
    path = _write(tmp_path, "arrival_s,input_tokens,output_tokens\n" + "".join(f"{i},1,2\n" for i in range(5)))
    with pytest.raises(TraceError, match="more than 3 requests; cut the log"):
        read_request_log(path, limits=LogLimits(max_rows=3))
    with pytest.raises(TraceError, match="bytes is over the 10 read"):
        read_request_log(path, limits=LogLimits(max_bytes=10))
    with pytest.raises(TraceError, match="header must name an arrival"):
        read_request_log(_write(tmp_path, "when,in,out\n0,1,2\n", "other.csv"))
    with pytest.raises(TraceError, match="--trace-scale must be > 0"):
        read_request_log(path, scale=0.0)


def test_the_shipped_log_is_generated_and_bursty_at_ten_seconds():
    sys.path.insert(0, str(REPO / "scripts"))
    import make_request_log

    shipped = REPO / "operator" / "specpilot" / "data" / "request-log.csv"
    assert shipped.read_text() == make_request_log.make_log(make_request_log.LogShape())
    log = read_request_log(shipped)
    assert 2000 <= log.requests <= 10000
    assert 0.3 <= log.window_cv(10.0) <= 1.5


def test_any_trace_runs_on_a_fleet_scenario(tmp_path, capsys):
    import json

    from specpilot.cli import main

    rng = np.random.default_rng(3)
    arrivals = np.sort(rng.uniform(0.0, 300.0, 1500))
    rows = "".join(f"{a:.3f},{int(i)},{int(o)}\n" for a, i, o in
                   zip(arrivals, rng.integers(50, 800, 1500), rng.integers(20, 400, 1500), strict=True))
    path = _write(tmp_path, "arrival_s,input_tokens,output_tokens\n" + rows)
    out = tmp_path / "out"
    assert main(["simulate", "--fleet", "default", "--fast", "--trace", str(path), "--trace-scale", "2",
                 "--slo-ttft-ms", "1000", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "(--trace, in place of the scenario's)" in printed and "1500 logged requests" in printed
    assert "TTFT <= 1000 ms" in printed
    report = json.loads((out / "fleet-report.json").read_text())[0]
    assert report["slo_ttft_ms"] == 1000 and "at 2x its rate" in report["trace_described"]
    for placement in report["placements"].values():
        assert placement["requests_arrived"] == 1500  # each logged request routed to exactly one pool
        assert 0 <= placement["slo_attainment"] <= placement["tpot_attainment"] <= 1


def test_a_logs_pools_are_profiled_on_its_own_lengths():
    from specpilot.sim.fleet import FleetConfig
    from specpilot.sim.mixed import SCENARIOS, prepare
    from specpilot.sim.workloads import request_lengths

    rng = np.random.default_rng(5)
    log = RequestLog(duration_s=100.0, arrival_s=np.sort(rng.uniform(0, 90, 400)),
                     input_tokens=rng.lognormal(np.log(1500), 0.5, 400).astype(int),
                     output_tokens=rng.lognormal(np.log(1200), 0.4, 400).astype(int))
    sharegpt = request_lengths("sharegpt")
    lengths = log.lengths(sharegpt)
    assert lengths.prompt.mean == pytest.approx(log.input_tokens.mean())
    assert lengths.output.mean == pytest.approx(log.output_tokens.mean())
    assert lengths.prompt.sigma == pytest.approx(0.5, abs=0.05) and lengths.output.sigma == pytest.approx(0.4, abs=0.05)
    assert lengths.acceptance_sigma == sharegpt.acceptance_sigma  # a log records lengths, not predictability
    # the shipped log's pools: profiled on its long requests, so their curves are slower than ShareGPT's
    scenario = SCENARIOS["log"].fast()
    trace = scenario.load_trace()
    config = FleetConfig(startup_s=15.0)
    logged = prepare(scenario, trace, config)
    chat = prepare(scenario, parse_trace("diurnal:40:10:0.25"), config)
    for mine, theirs in zip(logged, chat, strict=True):
        assert mine.setup.lengths.mean_prompt_tokens > 4 * theirs.setup.lengths.mean_prompt_tokens
        assert mine.sd_pool.curve[-1].tpot_ms > theirs.sd_pool.curve[-1].tpot_ms
