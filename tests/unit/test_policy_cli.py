"""`specpilot plan` end to end on profile files written to a temporary directory."""

from __future__ import annotations

import json

import pytest
import yaml

from specpilot.cli import main
from specpilot.sim.synthetic import Scenario, synthetic_profiles

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def profile_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("profiles")
    docs = []
    for method in ("eagle3", "ngram"):
        baseline, profile = synthetic_profiles(Scenario("H100-SXM", MODEL, method), noise=0.0)
        docs.append(profile.dump())
    methods = directory / "methods.yaml"
    methods.write_text(yaml.safe_dump_all(docs))
    base = directory / "baseline.json"
    base.write_text(json.dumps(baseline.dump()))
    return methods, base


def test_table(profile_files, capsys):
    methods, base = profile_files
    assert main(["plan", "--profile", str(methods), str(base), "--slo-tpot-ms", "50"]) == 0
    out = capsys.readouterr().out
    assert "H100-SXM" in out and "chosen: eagle3" in out
    line = next(x for x in out.splitlines() if x.startswith("--speculative-config"))
    config = json.loads(line.split("'")[1])
    assert config["method"] == "eagle3" and config["num_speculative_tokens_per_batch_size"][0][0] == 1
    assert "ngram" in out and "concurrency" in out


def test_json_with_histogram_and_cost_objective(profile_files, tmp_path, capsys):
    methods, base = profile_files
    histogram = tmp_path / "load.csv"
    histogram.write_text("concurrency,weight\n4,1\n16,3\n")
    assert main(["plan", "--profile", str(methods), str(base), "--concurrency-histogram", str(histogram),
                 "--objective", "cost", "--price-per-gpu-hour", "2", "-o", "json"]) == 0
    [group] = json.loads(capsys.readouterr().out)
    assert group["decision"]["method"] == "eagle3"
    assert "observed load" in group["decision"]["reason"]
    rows = {r["candidate"]: r for r in group["candidates"]}
    assert rows["eagle3"]["costPerMtok"] == pytest.approx(2 / (3600 * rows["eagle3"]["expectedGoodputTokS"]) * 1e6)
    assert group["speculativeConfig"]["num_speculative_tokens"] == group["decision"]["numSpeculativeTokens"]


def test_clear_errors_exit_2(profile_files, tmp_path, capsys):
    methods, _ = profile_files
    assert main(["plan", "--profile", str(methods)]) == 2
    assert "no baseline" in capsys.readouterr().err
    assert main(["plan", "--profile", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml: cannot read" in capsys.readouterr().err
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("kind: SpeculativeDeployment\napiVersion: specpilot.io/v1alpha1\n")
    assert main(["plan", "--profile", str(wrong)]) == 2
    assert "not a SpeculationProfile" in capsys.readouterr().err
    broken = tmp_path / "broken.yaml"
    broken.write_text("kind: SpeculationProfile\nspec: {sku: H100}\n")
    assert main(["plan", "--profile", str(broken)]) == 2
    assert "broken.yaml" in capsys.readouterr().err


def test_the_table_flags_a_crossover_the_profiles_place_less_precisely_than_the_minimum_gain(tmp_path, capsys):
    docs = []
    for method in ("eagle3", "ngram"):
        baseline, profile = synthetic_profiles(Scenario("H100-SXM", MODEL, method), noise=0.05, seed=1)
        docs.append(profile.dump())
    docs.append(baseline.dump())
    path = tmp_path / "noisy.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    assert main(["plan", "--profile", str(path), "-o", "json"]) == 0
    rows = {r["candidate"]: r for r in json.loads(capsys.readouterr().out)[0]["candidates"]}
    uncertainty = rows["ngram"]["crossoverUncertaintyPercent"]
    assert rows["ngram"]["crossoverConcurrency"] is not None and 2.0 < uncertainty < 6.0
    assert rows["baseline"]["crossoverUncertaintyPercent"] is None

    assert main(["plan", "--profile", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{rows['ngram']['crossoverConcurrency']} ±{uncertainty:.1f}%" in out
    assert "note: the gain at the crossover is known to" in out and "more than the 2% minimum gain" in out
    assert main(["plan", "--profile", str(path), "--min-gain", "10"]) == 0
    assert "note: the gain at the crossover" not in capsys.readouterr().out
