"""specpilot-bench refinement: --levels, --ks, --repeat and --append (issue 14).

The pure parts (measuring order, appending points within the status bounds, the merged status, the store
publishing each point once) and the CLI end to end against the fake engine of test_bench_loadgen
(`--launch --engine-module test_bench_loadgen`): a profile, then a round that re-measures one level of one
run twice and appends it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from specpilot.api.deployment_spec import Workload
from specpilot.api.methods import CandidateMethod
from specpilot.api.profile import LevelPoint, ProfilePhase, ProfileTarget, Run, SpeculationProfileSpec, \
    SpeculationProfileStatus
from specpilot.api.validate import validate_custom_resource
from specpilot.policy.surface import RunCurve
from specpilot_bench.cli import build_parser, measuring_order, selected_ks
from specpilot_bench.profiles import MAX_POINTS_PER_RUN, append_runs, capped_points, merged_status
from specpilot_bench.publish import ProfileStore

HERE = Path(__file__).resolve().parent


def pt(c: int, t: float = 100.0, **kw) -> LevelPoint:
    return LevelPoint(concurrency=c, output_throughput=t, **kw)


def spec(levels=(1, 2, 4), method: CandidateMethod | None = None) -> SpeculationProfileSpec:
    return SpeculationProfileSpec(model=ProfileTarget(id="m"), sku="H100-SXM", engine_image="vllm:1",
                                  workload=Workload(name="random", input_len=8, output_len=16),
                                  concurrency_levels=list(levels), requests_per_level=4, method=method)


def test_flags_parse_and_ks_are_checked_against_the_profile():
    args = build_parser().parse_args(["--profile-name", "p", "--levels", "16,32", "--ks", "2,0", "--repeat", "3",
                                      "--append"])
    assert (args.levels, args.ks, args.repeat, args.append) == ([16, 32], [0, 2], 3, True)
    assert build_parser().parse_args(["--model", "m"]).levels is None  # standalone default applies later
    eagle = CandidateMethod(method="eagle3", model="d", num_speculative_tokens=4)
    assert selected_ks([1, 4], eagle, None) == [1, 4]
    assert selected_ks([1, 4], eagle, [0, 2]) == [0, 2]
    with pytest.raises(ValueError, match="K is 4"):
        selected_ks([1, 4], eagle, [5])
    with pytest.raises(ValueError, match="baseline profile runs only k=0"):
        selected_ks([0], None, [1])


@pytest.mark.parametrize("levels", ["1,1000000000", "--rm", "1\n--port=80", "0,4", ",".join(["5"] * 3)])
def test_hostile_levels_are_refused_before_anything_runs(levels, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(["--profile-name", "p", "--levels", levels])
    assert exit_info.value.code == 2
    assert "--levels" in capsys.readouterr().err


def test_measuring_order_interleaves_repeats_with_fresh_prompts():
    s = spec(levels=(2, 8))
    plain = measuring_order(s)
    assert [c for c, _ in plain] == [2, 8]
    order = measuring_order(s, repeat=3)
    assert [c for c, _ in order] == [2, 8, 2, 8, 2, 8]
    assert [len(p) for _, p in order] == [4, 16, 4, 16, 4, 16]
    assert order[:2] == plain  # the first pass is the plain sweep's
    texts = [tuple(p.text for p in prompts) for _, prompts in order]
    assert len(set(texts)) == 6  # no repeat re-sends an earlier one's prompts (the prefix cache would serve it)
    later = measuring_order(s, repeat=1, round_index=6)  # a later refinement round samples afresh
    assert {tuple(p.text for p in ps) for _, ps in later}.isdisjoint(texts)


def test_appended_points_join_the_run_of_the_same_k_and_count_in_the_fit():
    old = [Run(num_speculative_tokens=0, points=[pt(1), pt(2), pt(4)]),
           Run(num_speculative_tokens=4, points=[pt(1, num_drafts=10, num_accepted_tokens=5,
                                                     accepted_per_position=[3, 1, 1, 0], generation_tokens=40)])]
    new = [Run(num_speculative_tokens=4, points=[pt(1, 120, num_drafts=10, num_accepted_tokens=9,
                                                    accepted_per_position=[5, 2, 1, 1], generation_tokens=40)]),
           Run(num_speculative_tokens=2, points=[pt(2)])]
    runs = append_runs(old, new)
    assert [r.num_speculative_tokens for r in runs] == [0, 2, 4]
    assert [p.output_throughput for p in runs[2].points] == [100, 120]
    assert runs[2].acceptance.per_position == [8 / 20, 3 / 20, 2 / 20, 1 / 20]
    curve = RunCurve.from_run(runs[2])
    assert curve.levels == (1,) and curve.counts == (2,)  # the repeated level weighs twice in the fit
    assert curve.seconds_per_token[0] == pytest.approx((1 / 100 + 1 / 120) / 2)


def test_appending_keeps_the_status_bound_dropping_the_oldest_repeats_first():
    points = [pt(1, 1.0), pt(2, 2.0)] + [pt(4, float(i + 10)) for i in range(MAX_POINTS_PER_RUN)]
    kept = capped_points(points)
    assert len(kept) == MAX_POINTS_PER_RUN
    assert [p.concurrency for p in kept[:2]] == [1, 2]  # the single measurements stay
    assert kept[-1].output_throughput == MAX_POINTS_PER_RUN + 9  # the newest repeat stays
    assert kept[2].output_throughput == 12.0  # the two oldest repeats of level 4 went


def test_merged_status_appends_and_a_failed_round_leaves_the_profile_usable():
    stored = SpeculationProfileStatus(phase=ProfilePhase.SUCCEEDED, engine_starts=1,
                                      runs=[Run(num_speculative_tokens=0, points=[pt(1), pt(2)])]).dump()
    round_ = SpeculationProfileStatus(phase=ProfilePhase.RUNNING, engine_starts=1,
                                      runs=[Run(num_speculative_tokens=0, points=[pt(2, 90)])])
    merged = merged_status(stored, round_, [0], append=True)
    assert merged.phase == ProfilePhase.SUCCEEDED and merged.engine_starts == 2
    assert [p.concurrency for p in merged.runs[0].points] == [1, 2, 2]
    failed = round_.model_copy(update={"phase": ProfilePhase.FAILED, "reason": "Timeout"})
    merged = merged_status(stored, failed, [0], append=True)
    assert merged.phase == ProfilePhase.SUCCEEDED and merged.reason == "refinement failed: Timeout"
    assert len(merged.runs[0].points) == 3
    replaced = merged_status(stored, round_, [0])  # without --append a run replaces the stored one
    assert [p.concurrency for p in replaced.runs[0].points] == [2]


class FakeApi:
    def __init__(self, status: dict) -> None:
        self.obj = {"metadata": {"resourceVersion": "1"}, "status": status}
        self.patches = 0

    def get(self, namespace, name):
        return self.obj

    def patch_status(self, namespace, name, body):
        self.patches += 1  # a merge patch, as the API server applies it
        self.obj = {"metadata": {"resourceVersion": str(self.patches + 1)},
                    "status": {**self.obj["status"], **body["status"]}}


def test_the_bench_never_writes_the_operators_fields():
    """phase, reason, message and attempts are the operator's: a Job's publish leaves them as they are, whatever
    the bench concluded (issue 25: a forged phase from the benchmark identity is what the operator ignores)."""
    api = FakeApi({"phase": "Running", "reason": "Measuring", "attempts": 1})
    store = ProfileStore(api, "p", "ns", token="t")
    failed = SpeculationProfileStatus(phase=ProfilePhase.FAILED, reason="EngineStartFailed", message="log tail",
                                      runs=[Run(num_speculative_tokens=0, points=[pt(1)])])
    store.publish(failed, [0])
    stored = api.obj["status"]
    assert (stored["phase"], stored["reason"], stored["attempts"]) == ("Running", "Measuring", 1)
    assert "message" not in stored and stored["runs"][0]["points"] and stored["seal"]


def test_the_store_appends_each_point_once_across_publishes():
    api = FakeApi(SpeculationProfileStatus(phase=ProfilePhase.SUCCEEDED, engine_starts=2, runs=[
        Run(num_speculative_tokens=1, points=[pt(1), pt(2)]),
        Run(num_speculative_tokens=3, points=[pt(1), pt(2)])]).dump())
    store = ProfileStore(api, "p", "ns", append=True)
    run = Run(num_speculative_tokens=3, points=[pt(2, 110)])
    status = SpeculationProfileStatus(phase=ProfilePhase.RUNNING, engine_starts=1, runs=[run])
    store.publish(status, [1, 3])
    run.points.append(pt(2, 120))
    store.publish(status, [1, 3])
    store.publish(status.model_copy(update={"phase": ProfilePhase.SUCCEEDED}), [1, 3])
    published = SpeculationProfileStatus.model_validate(api.obj["status"])
    assert [p.output_throughput for p in published.run(3).points] == [100, 100, 110, 120]
    assert len(published.run(1).points) == 2
    assert published.engine_starts == 3 and published.phase == ProfilePhase.SUCCEEDED


def test_cli_appends_a_repeated_level_to_a_profile_file(tmp_path, crds):
    from test_bench_loadgen import BENCH_ARGS, HIDE_VLLM_AND_TORCH, SPECULATIVE_CONFIG

    out = tmp_path / "profiles.yaml"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
               SPECPILOT_BENCH_ENGINE_MODULE="test_bench_loadgen")
    common = [sys.executable, "-c", HIDE_VLLM_AND_TORCH, "--launch", *BENCH_ARGS, "--speculative-config",
              SPECULATIVE_CONFIG, "--engine-arg=--time-scale=10", "--log-dir", str(tmp_path / "logs"),
              "--output", str(out)]
    first = subprocess.run(common, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr[-3000:]
    before = list(yaml.safe_load_all(out.read_text()))
    refine = [*common, "--append", "--levels", "2", "--repeat", "2", "--ks", "2"]
    second = subprocess.run(refine, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr[-3000:]
    after = list(yaml.safe_load_all(out.read_text()))
    assert [d["metadata"]["name"] for d in after] == [d["metadata"]["name"] for d in before]
    assert after[0] == before[0]  # the baseline was not measured this round: kept as it was
    method = after[1]
    assert validate_custom_resource(crds["SpeculationProfile"], method) == []
    assert method["spec"] == before[1]["spec"]
    status = method["status"]
    runs = {r["numSpeculativeTokens"]: r for r in status["runs"]}
    assert runs[1] == {r["numSpeculativeTokens"]: r for r in before[1]["status"]["runs"]}[1]
    assert [p["concurrency"] for p in runs[2]["points"]] == [1, 2, 2, 2]
    assert status["phase"] == "Succeeded" and status["engineStarts"] == 3
