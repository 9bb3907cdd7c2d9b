"""`specpilot plan` says what it is unsure of (issue 14): `refine` per group in -o json, words in the table."""

from __future__ import annotations

import json

import yaml
from specpilot.cli import main
from specpilot.sim.synthetic import Scenario, synthetic_profiles

SCENARIO = Scenario("H100-SXM", "Qwen/Qwen3-8B", "eagle3")


def write_profiles(tmp_path, noise: float) -> str:
    baseline, method = synthetic_profiles(SCENARIO, noise=noise, seed=3)
    path = tmp_path / "profiles.yaml"
    path.write_text(yaml.safe_dump_all([baseline.dump(), method.dump()]))
    return str(path)


def test_json_carries_the_refinement_of_each_group(tmp_path, capsys):
    assert main(["plan", "--profile", write_profiles(tmp_path, 0.05), "-o", "json"]) == 0
    (group,) = json.loads(capsys.readouterr().out)
    refine = group["refine"]
    assert refine["done"] is False and refine["budgetLevels"] == 72 and refine["spentLevels"] == 0
    assert refine["uncertain"] and refine["requests"] and refine["jobs"]
    assert sum(j["measuredLevels"] for j in refine["jobs"]) == refine["requestedLevels"] <= 72
    assert {r["profile"] for r in refine["requests"]} <= {"baseline", "eagle3"}


def test_the_table_says_which_crossovers_are_uncertain_and_what_settles_them(tmp_path, capsys):
    assert main(["plan", "--profile", write_profiles(tmp_path, 0.05), "--refine-budget", "40"]) == 0
    out = capsys.readouterr().out
    assert "uncertain: eagle3 SD off above 230 concurrent requests: the gain there is known to ±2.3%" in out
    assert "refine: measuring these narrows it" in out
    assert "--append" in out and "specpilot-bench --profile-name h100-sxm-baseline-" in out


def test_noise_free_profiles_have_nothing_to_refine(tmp_path, capsys):
    assert main(["plan", "--profile", write_profiles(tmp_path, 0.0), "-o", "json"]) == 0
    (group,) = json.loads(capsys.readouterr().out)
    assert group["refine"]["done"] is True and group["refine"]["requests"] == []
    assert main(["plan", "--profile", write_profiles(tmp_path, 0.0)]) == 0
    assert "uncertain:" not in capsys.readouterr().out
