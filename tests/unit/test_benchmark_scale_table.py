"""benchmarks/operator_scale.py's growth table: how each figure grows with N, median / worst over the runs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "operator_scale", Path(__file__).resolve().parents[2] / "benchmarks" / "operator_scale.py")
operator_scale = importlib.util.module_from_spec(spec)
sys.modules.setdefault("operator_scale", operator_scale)  # its dataclasses look their module up
spec.loader.exec_module(operator_scale)


def _run(count: int, steady_p95_s: float, rss: float, per_s: float, not_serving: int = 0) -> dict:
    steady = {"stage": "steady state (60 s)", "p50_s": 0.01, "p95_s": steady_p95_s, "p99_s": 2 * steady_p95_s,
              "reconciles_per_s": per_s, "api_requests_per_reconcile": {"get": 1.3},
              "operator_cpu_ms_per_reconcile": 9.0}
    return {"settings": {"count": count}, "stages": [steady],
            "total": {"operator_cpu_ms_per_reconcile": 18.0},
            "latency_seen_by_client": {"created_to_phase": {"p95_s": 0.5}, "published_to_serving": {"p95_s": 9.0},
                                       "not_serving": {f"model-{i}": "Profiling" for i in range(not_serving)}},
            "operator": {"rss_mib": rss, "peak_rss_mib": rss + 10},
            "machine": {"load_average_1m": {"min": 0.1, "max": 1.5}}}


def test_each_n_gets_its_median_and_its_worst_run():
    table = operator_scale.growth_table([
        _run(200, 0.030, 130.0, 13.3), _run(100, 0.020, 110.0, 6.7), _run(200, 0.040, 140.0, 13.1),
        _run(200, 3.900, 135.0, 9.0, not_serving=2)])
    header, rule, *rows = table.splitlines()
    columns = [c.strip() for c in header.strip("|").split("|")]
    by_n = {row.strip("|").split("|")[0].strip(): [c.strip() for c in row.strip("|").split("|")] for row in rows}
    assert list(by_n) == ["100", "200"]  # ordered by N
    n200 = dict(zip(columns, by_n["200"]))
    assert n200["runs"] == "3"
    assert n200["steady reconcile p95 (ms)"] == "40 / 3,900"  # median / worst: a bimodal run shows
    assert n200["RSS end MiB"] == "135 / 140"
    assert n200["steady reconciles/s"] == "13.1 / 9"  # fewer reconciles per second is the worse
    assert n200["not Serving"] == "0 / 2"
    n100 = dict(zip(columns, by_n["100"]))
    assert n100["steady reconcile p95 (ms)"] == "20"  # one run: no worst beside it
