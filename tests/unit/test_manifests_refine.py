"""The refinement Job: benchmark_job(..., refine=RefineRun(round, levels, ks, repeat, append, part)) and its name.

The builder turns the parameters into specpilot-bench flags that the bench's own parser reads back, names
the Job per round (never the profile's benchmark Job), and refuses parameters that make no round."""

from __future__ import annotations

import pytest
from specpilot.manifests import names
from specpilot.manifests.benchmark import RefineRun, benchmark_job
from specpilot_bench.cli import build_parser as build_bench_parser
from tests.unit.test_manifests_objects import (
    BENCH_IMAGE,
    NAMESPACE,
    bench_of,
    flag_value,
    profile_owner,
    profile_spec_for,
    sdep_name_of,
    spec_of,
    validate,
)


def refine_job(method_index: int | None = 0, refine: RefineRun | None = None) -> tuple[dict, str]:
    spec = spec_of("realistic")
    method = None if method_index is None else spec.methods[method_index]
    profile = profile_spec_for(spec, method)
    name = profile.object_name()
    job = benchmark_job(profile_name=name, namespace=NAMESPACE, profile_spec=profile, spec=spec,
                        pool=spec.gpu_pools[0], bench_image=BENCH_IMAGE, owner=profile_owner(name),
                        sdep_name=sdep_name_of("realistic"), refine=refine)
    return job, name


def test_refine_job_names_are_per_round_and_distinct_from_the_benchmark_job():
    profile = "h100-sxm-eagle3-0526d0818e"
    assert names.refine_job_name(profile, 1) == f"refine-{profile}-r1"
    assert names.refine_job_name(profile, 2) != names.refine_job_name(profile, 1)
    assert names.refine_job_name(profile, 1) != names.bench_job_name(profile)
    long = names.refine_job_name("x" * 80, 12)
    assert len(long) <= 63 and long.endswith("-r12")
    with pytest.raises(ValueError):
        names.refine_job_name(profile, 0)
    assert names.refine_job_name(profile, 1, 2) == f"refine-{profile}-r1-2"
    with pytest.raises(ValueError):
        names.refine_job_name(profile, 1, 0)


def test_a_refinement_job_carries_the_bench_flags_and_its_own_name():
    job, name = refine_job(0, RefineRun(round=2, levels=[64, 32, 64], ks=[1, 0], repeat=3))
    validate(job)
    assert job["metadata"]["name"] == names.refine_job_name(name, 2)
    labels = job["spec"]["template"]["metadata"]["labels"]
    assert labels["specpilot.io/refine-round"] == "2" == job["metadata"]["labels"]["specpilot.io/refine-round"]
    assert labels["specpilot.io/profile"] == name
    args = bench_of(job["spec"]["template"]["spec"])["args"]
    assert flag_value(args, "--levels") == "32,64"
    parsed = build_bench_parser().parse_args(args)
    assert parsed.job_name == job["metadata"]["name"] and parsed.profile_name == name
    assert (parsed.levels, parsed.ks, parsed.repeat, parsed.append) == ([32, 64], [0, 1], 3, True)
    assert parsed.supervisor_url and not parsed.launch
    # the engine's command line is the engine container's: the bench carries none
    assert not any(a.startswith("--engine-arg") for a in args)


def test_without_a_round_the_job_is_the_profiles_benchmark_job():
    plain, name = refine_job(0)
    assert plain["metadata"]["name"] == names.bench_job_name(name)
    assert "specpilot.io/refine-round" not in plain["metadata"]["labels"]
    parsed = build_bench_parser().parse_args(bench_of(plain["spec"]["template"]["spec"])["args"])
    assert (parsed.ks, parsed.repeat, parsed.append) == (None, 1, False)
    only_round, _ = refine_job(None, RefineRun(round=1))  # a baseline round at the profile's levels
    parsed = build_bench_parser().parse_args(bench_of(only_round["spec"]["template"]["spec"])["args"])
    assert parsed.append and parsed.levels == plain_levels(plain)


def plain_levels(job: dict) -> list[int]:
    return [int(c) for c in flag_value(bench_of(job["spec"]["template"]["spec"])["args"], "--levels").split(",")]


@pytest.mark.parametrize(("run", "match"), [
    (RefineRun(round=0), "counts from 1"),
    (RefineRun(round=1, part=0), "from 1"),
    (RefineRun(round=1, repeat=0), "repeat must be"),
    (RefineRun(round=1, levels=[0, 4]), "levels must be"),
    (RefineRun(round=1, levels=[4, 10**9]), r"levels must be concurrencies in 1..4096"),
    (RefineRun(round=1, levels=["--rm"]), r"levels must be concurrencies in 1..4096"),
    (RefineRun(round=1, ks=[9]), "ks must lie in 0..4"),
])
def test_parameters_that_make_no_round_are_refused(run, match):
    with pytest.raises(ValueError, match=match):
        refine_job(0, run)


def test_a_baseline_round_measures_only_k0():
    with pytest.raises(ValueError, match=r"ks must lie in 0..0"):
        refine_job(None, RefineRun(round=1, ks=[1]))


def test_the_jobs_of_one_profile_in_one_round_have_names_of_their_own():
    first, name = refine_job(0, RefineRun(round=1, levels=[64], ks=[1], repeat=5, part=1))
    second, _ = refine_job(0, RefineRun(round=1, levels=[64, 96], ks=[4], repeat=3, part=2))
    assert first["metadata"]["name"] == names.refine_job_name(name, 1, 1) != second["metadata"]["name"]
    parsed = build_bench_parser().parse_args(bench_of(second["spec"]["template"]["spec"])["args"])
    assert parsed.job_name == second["metadata"]["name"] and (parsed.ks, parsed.repeat) == ([4], 3)
