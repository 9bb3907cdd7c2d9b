"""Profiles that cannot be poisoned: a result no GPU can produce is refused with the bound it breaks, and a
profile's identity covers everything that changes what is measured, so two deployments that measure
different things never share (or overwrite) one profile."""

from __future__ import annotations

import copy
import math

import pytest

from specpilot.api import SpeculativeDeploymentSpec
from specpilot.config import OperatorConfig
from specpilot.policy.needs import profile_spec
from specpilot.perf.plausibility import SAFETY_FACTOR, result_problems
from specpilot.sim.synthetic import Scenario, synthetic_profiles
from tests.conftest import load_example


def _profile(method: str | None = "eagle3", sku: str = "H100-SXM") -> dict:
    baseline, speculative = synthetic_profiles(Scenario(sku=sku, model_id="meta-llama/Llama-3.1-8B-Instruct",
                                                        method=method or "eagle3", max_k=4), noise=0.05, seed=3)
    chosen = baseline if method is None else speculative
    return chosen.model_dump(mode="json", by_alias=True, exclude_none=True)


@pytest.mark.parametrize("sku", ["A100-80GB-SXM", "H100-SXM", "H200", "B200", "L40S", "MI300X"])
@pytest.mark.parametrize("method", [None, "eagle3", "ngram", "draft_model"])
def test_real_looking_results_pass(sku, method):
    assert result_problems(_profile(method, sku)) == []


def test_the_committed_example_passes():
    assert result_problems(load_example("speculationprofile-h100-eagle3.yaml")) == []


def _poison(path: str, value) -> dict:
    body = _profile()
    node = body
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if key.isdigit() else node[key]
    node[int(keys[-1]) if keys[-1].isdigit() else keys[-1]] = value
    return body


# (id, field, poisoned value, text the refusal must contain)
POISONED = [
    ("1e308-tokens-per-s", "status.runs.0.points.0.outputThroughput", 1e308,
     "status.runs[0].points[0].outputThroughput is 1e+308 tokens/s at concurrency 1 and K=1, above the physical bound"),
    ("10x-roofline", "status.runs.1.points.3.outputThroughput", None, "above the physical bound"),
    ("inf", "status.runs.1.points.0.outputThroughput", math.inf, "is inf: a measurement must be a finite number"),
    ("nan", "status.runs.0.points.0.tpotMs.p50", math.nan, "is nan: a measurement must be a finite number"),
    ("negative", "status.runs.0.points.0.ttftMs.p50", -5.0, "status.runs[0].points[0].ttftMs.p50 is -5.0: a "
     "measurement cannot be negative"),
    ("acceptance-above-1", "status.runs.1.acceptance.perPosition", [1.7, 0.5, 0.3, 0.2], "is outside [0, 1]"),
    ("acceptance-rising", "status.runs.1.acceptance.perPosition", [0.3, 0.5, 0.7, 0.9], "rises with the position"),
    ("too-many-positions", "status.runs.1.acceptance.perPosition", [0.5] * 9, "has 9 positions, more than K=4"),
    ("mean-acceptance-length", "status.runs.1.acceptance.meanAcceptanceLength", 12.0,
     "meanAcceptanceLength is 12, more than K+1 = 5"),
    ("k-beyond-method", "status.runs.1.numSpeculativeTokens", 9, "numSpeculativeTokens is 9, more than the method's 4"),
    ("kv-capacity", "status.kvCapacityTokens", 10**12, "status.kvCapacityTokens is 1000000000000, more than"),
    ("not-a-number", "status.runs.0.points.0.outputThroughput", "fast", "the result does not parse"),
]


@pytest.mark.parametrize("case_id,path,value,expected", POISONED, ids=[c[0] for c in POISONED])
def test_poisoned_results_are_refused_naming_the_bound(case_id, path, value, expected):
    if case_id == "10x-roofline":
        body = _profile()
        point = body["status"]["runs"][1]["points"][3]
        point["outputThroughput"] = point["outputThroughput"] * 10 * SAFETY_FACTOR * 6
        problems = result_problems(body)
    else:
        problems = result_problems(_poison(path, value))
    assert problems and any(expected in p for p in problems), problems
    assert all(len(p) < 1000 for p in problems)


# ----- identity -----

def _identity_name(**changes) -> str:
    doc = copy.deepcopy(load_example("minimal.yaml")["spec"])
    for path, value in changes.items():
        node = doc
        keys = path.split("__")
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    spec = SpeculativeDeploymentSpec.model_validate(doc)
    return profile_spec(spec, "H100-SXM", spec.methods[-1], OperatorConfig()).object_name()


@pytest.mark.parametrize("path,value", [
    ("model__image", "vllm/vllm-openai:v0.33.0"),
    ("model__extraArgs", ["--enforce-eager"]),
    ("model__env", [{"name": "VLLM_ATTENTION_BACKEND", "value": "FLASHINFER"}]),
    ("model__resources", {"limits": {"cpu": "4"}}),
    ("model__gpuMemoryUtilization", 0.5),
    ("profiling__image", "ghcr.io/specpilot/specpilot-bench:0.2.0"),
    ("profiling__podOverrides", {"containers": [{"name": "bench", "env": [{"name": "OMP_NUM_THREADS",
                                                                          "value": "1"}]}]}),
])
def test_what_changes_a_measurement_changes_the_profile(path, value):
    assert _identity_name(**{path: value}) != _identity_name()


def _mounting(volume: dict) -> dict:
    """profiling.podOverrides mounting `volume` at /models in the engine container."""
    return {"containers": [{"name": "engine", "volumeMounts": [{"name": "models", "mountPath": "/models"}]}],
            "volumes": [{"name": "models", **volume}]}


@pytest.mark.parametrize("first,second", [
    ({"persistentVolumeClaim": {"claimName": "llama-weights"}}, {"persistentVolumeClaim": {"claimName": "other"}}),
    ({"configMap": {"name": "weights-a"}}, {"configMap": {"name": "weights-b"}}),
    ({"secret": {"secretName": "a"}}, {"secret": {"secretName": "b"}}),
    ({"image": {"reference": "registry.example/llama@sha256:" + "a" * 64}},
     {"image": {"reference": "registry.example/llama@sha256:" + "b" * 64}}),
    ({"csi": {"driver": "s3.csi.example", "volumeAttributes": {"bucket": "a"}}},
     {"csi": {"driver": "s3.csi.example", "volumeAttributes": {"bucket": "b"}}}),
])
def test_different_weights_mounted_at_one_path_are_different_profiles(first, second):
    assert _identity_name(profiling__podOverrides=_mounting(first)) != \
        _identity_name(profiling__podOverrides=_mounting(second))


def test_a_volume_no_container_mounts_leaves_the_profile_as_it_was():
    overrides = _mounting({"emptyDir": {}})
    base = _identity_name(profiling__podOverrides=overrides)
    unmounted = {**overrides, "volumes": [*overrides["volumes"], {"name": "spare", "configMap": {"name": "x"}}]}
    assert _identity_name(profiling__podOverrides=unmounted) == base


def test_an_image_with_a_digest_is_named_by_its_digest():
    from specpilot.api.profile import image_identity

    digest = "sha256:" + "c" * 64
    assert image_identity(f"vllm/vllm-openai:v0.32.0@{digest}") == f"vllm/vllm-openai@{digest}"
    assert image_identity(f"registry:5000/vllm@{digest}") == f"registry:5000/vllm@{digest}"
    assert image_identity("registry:5000/vllm:v1") == "registry:5000/vllm:v1"
    assert _identity_name(model__image=f"vllm/vllm-openai:v0.32.0@{digest}") == \
        _identity_name(model__image=f"vllm/vllm-openai:latest@{digest}")
    assert _identity_name(model__image=f"vllm/vllm-openai@{digest}") != \
        _identity_name(model__image="vllm/vllm-openai@sha256:" + "d" * 64)


@pytest.mark.parametrize("path,value", [
    ("serving__maxReplicas", 9),
    ("model__servedName", "chat"),
    ("profiling__podOverrides", {"priorityClassName": "batch"}),
])
def test_what_does_not_change_a_measurement_keeps_the_profile(path, value):
    assert _identity_name(**{path: value}) == _identity_name()


# ----- tight bounds from the claimed SKU and model (issue 25) -----

def test_ten_times_the_measured_throughput_is_refused():
    """A lying engine streaming 10x what the GPU did: far below the old 4 x 4-bit bound, above the tight one."""
    body = _profile("eagle3", "H100-SXM")
    for run in body["status"]["runs"]:
        for point in run["points"]:
            point["outputThroughput"] *= 10
    problems = result_problems(body)
    # the streams' token count (outputThroughput x durationS) no longer fits the requests or the engine's count
    assert problems and all("above the physical bound" in p or "can carry at outputLen" in p
                            or "fewer than the 1.638e+05 tokens its streams carried" in p for p in problems), problems
    assert "above the physical bound" in problems[0], problems
    assert "1.25 x the memory/compute roofline of H100-SXM" in problems[0]


def test_the_bound_at_concurrency_1_is_the_bandwidth_roofline_with_a_stated_margin():
    from specpilot.perf.plausibility import THROUGHPUT_MARGIN, bound_table

    table = bound_table()
    # Llama-3.1-8B (7.5B streamed bf16 parameters) on an H100 (3.35 TB/s): 2.25 ms per step at least
    assert THROUGHPUT_MARGIN == 1.25
    assert round(table["H100-SXM"][0]) == 279 and round(table["H100-SXM"][1]) == 1395
    assert table["H100-SXM"][1] < 17850 / 10  # the old bound at K=4
    assert round(table["B200"][0]) == 666 and round(table["L40S"][0]) == 72


@pytest.mark.parametrize("value", [-0.0, 0.0])
def test_a_non_positive_throughput_is_refused(value):
    body = _profile("eagle3")
    for run in body["status"]["runs"]:
        for point in run["points"]:
            point["outputThroughput"] = value
    problems = result_problems(body)
    assert problems and ("cannot be negative" in problems[0] or "must have a positive throughput" in problems[0])


def test_a_concurrency_beyond_the_spec_is_refused():
    body = _profile("eagle3")
    body["status"]["runs"][1]["points"][0]["concurrency"] = 10**9
    problems = result_problems(body)
    assert any("concurrency is 1000000000, not a level the operator asked for" in p for p in problems), problems


def test_an_unknown_sku_or_model_keeps_a_generous_bound_and_says_so():
    body = _profile("eagle3")
    body["spec"]["sku"] = "cpu"
    point = body["status"]["runs"][0]["points"][0]
    point["outputThroughput"] = 1e9
    problems = result_problems(body)
    assert problems and "SKU 'cpu' not in the catalog, so a generous bound" in problems[0], problems
    body = _profile("eagle3")
    body["spec"]["model"]["id"] = "/models/tiny-llama"
    assert result_problems(body) == []


def test_a_quantized_engine_is_bounded_at_4_bits():
    from specpilot.api.profile import SpeculationProfile
    from specpilot.perf.plausibility import throughput_bound

    plain = SpeculationProfile.model_validate(_profile("eagle3"))
    body = _profile("eagle3")
    body["spec"]["engine"] = {"extraArgs": ["--quantization", "fp8"]}
    bound = throughput_bound(SpeculationProfile.model_validate(body))
    assert bound.quantized and bound.bytes_per_weight == 0.5
    assert bound.ceiling(1, 0) == pytest.approx(4 * throughput_bound(plain).ceiling(1, 0))


def test_a_refinement_level_is_accepted_only_where_a_round_asked_for_it():
    """A refinement round measures between the sweep's levels or past its largest: the operator records the
    round's levels in the profile's metadata when it starts the round, and a point is accepted at those and the
    spec's levels only (anything else a bench could write, up to the largest batch or not, is refused)."""
    from specpilot.perf.plausibility import REFINE_LEVELS_ANNOTATION

    body = _profile("eagle3")
    body["spec"]["concurrencyLevels"] = [c for c in body["spec"]["concurrencyLevels"] if c <= 128]
    point = body["status"]["runs"][1]["points"][-1]
    point["concurrency"] = 165
    problems = result_problems(body)
    assert any("points[11].concurrency is 165, not a level the operator asked for: spec.concurrencyLevels "
               "[1, 2, 4, 8, 16, 32, 48, 64, 96, 128] (no refinement round asked for others)" in p
               for p in problems), problems
    body["metadata"]["annotations"] = {REFINE_LEVELS_ANNOTATION: "61,165"}
    assert not [p for p in result_problems(body) if "concurrency is 165" in p]
    point["concurrency"] = 200
    assert any("concurrency is 200, not a level the operator asked for" in p and "refinement round's [61, 165]" in p
               for p in result_problems(body))


def test_refine_levels_annotation_merges_rounds():
    from specpilot.perf.plausibility import refine_levels_annotation

    assert refine_levels_annotation(None, [101, 61]) == "61,101"
    assert refine_levels_annotation("61,101", (230, 61)) == "61,101,230"
