"""`specpilot simulate --fast`: writes plots, markdown and JSON and exits 0; bad input exits 2 with the fix."""

from __future__ import annotations

import json

from specpilot.cli import main


def test_fast_run_writes_plots_and_reports(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["simulate", "--fast", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    for name in ("speedup-H100-SXM.png", "timeline-H100-SXM.png", "report.md", "report.json"):
        assert (out / name).stat().st_size > 0
        assert name in printed
    assert (out / "speedup-H100-SXM.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "specpilot+autoscale" in printed and "$/Mtok" in printed
    report = json.loads((out / "report.json").read_text())
    comparison = report["comparisons"][0]
    policies = [p["policy"] for p in comparison["policies"]]
    assert policies[0] == "no-sd" and "specpilot" in policies and "specpilot+autoscale" in policies
    assert comparison["decision"]["method"] == "eagle3"
    for policy in comparison["policies"]:
        assert policy["output_tok_s"] > 0 and 0 <= policy["slo_attainment"] <= 1
        assert len(policy["timeseries"]["t_s"]) == len(policy["timeseries"]["replicas"]) > 10
    markdown = (out / "report.md").read_text()
    assert "| specpilot |" in markdown and "![timeline-H100-SXM]" in markdown


def test_csv_trace_and_two_gpus(tmp_path, capsys):
    trace = tmp_path / "load.csv"
    trace.write_text("time_s,arrival_rate_rps\n0,2\n120,6\n240,2\n")
    out = tmp_path / "sim"
    assert main(["simulate", "--quiet", "--trace", str(trace), "--gpu", "H100-SXM", "--gpu", "NVIDIA-A100-SXM4-80GB",
                 "--methods", "ngram:3", "--replicas", "1", "--max-replicas", "2", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert [c["sku"] for c in report["comparisons"]] == ["H100-SXM", "A100-80GB-SXM"]
    assert (out / "timeline-A100-80GB-SXM.png").exists()


def test_bad_inputs_exit_2_naming_the_flag(tmp_path, capsys):
    assert main(["simulate", "--quiet", "--trace", "weekly:3", "--out", str(tmp_path)]) == 2
    assert "--trace 'weekly:3'" in capsys.readouterr().err
    assert main(["simulate", "--quiet", "--methods", "eagle9", "--out", str(tmp_path)]) == 2
    assert "--methods: unknown method 'eagle9'" in capsys.readouterr().err
    assert main(["simulate", "--quiet", "--gpu", "TPU-v5", "--out", str(tmp_path)]) == 2
    assert "unknown GPU" in capsys.readouterr().err
    assert main(["simulate", "--quiet", "--duration", "soon", "--out", str(tmp_path)]) == 2
    assert "--duration" in capsys.readouterr().err
