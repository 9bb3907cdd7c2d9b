"""The typed models and the CRD schema accept the examples and reject bad input with a clear message."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from specpilot.api import CandidateMethod, SpeculationProfileSpec, SpeculativeDeploymentSpec
from specpilot.api.base import format_validation_error
from specpilot.api.schedule import (
    ScheduleRange,
    compress,
    from_vllm,
    k_at,
    schedule_problems,
    summary,
    to_vllm,
)
from specpilot.api.validate import validate_custom_resource
from tests.conftest import REPO, load_example

SDEP_EXAMPLES = ["llama-70b-h100-h200.yaml", "minimal.yaml"]


@pytest.mark.parametrize("name", SDEP_EXAMPLES)
def test_examples_validate_against_crd_and_models(crds, name):
    doc = load_example(name)
    assert validate_custom_resource(crds["SpeculativeDeployment"], doc) == []
    SpeculativeDeploymentSpec.model_validate(doc["spec"])


def test_profile_example_validates(crds):
    from specpilot.api import SpeculationProfile

    doc = load_example("speculationprofile-h100-eagle3.yaml")
    assert validate_custom_resource(crds["SpeculationProfile"], doc) == []
    profile = SpeculationProfile.model_validate(doc)
    assert profile.status.phase == "Succeeded"
    assert {r.num_speculative_tokens for r in profile.status.runs} >= {1, profile.spec.method.num_speculative_tokens}


def _set(doc: dict, path: str, value):
    node = doc
    keys = path.split(".")
    for key in keys[:-1]:
        node = node[int(key)] if key.isdigit() else node[key]
    last = keys[-1]
    if value is _DELETE:
        del node[last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value
    return doc


_DELETE = object()

# (what to change in the realistic example, text the CRD/CEL check must report, text the model must report)
INVALID = [
    ("spec.methods.1.model", _DELETE, "needs `model`", "spec.methods[1]: method eagle3 needs `model`"),
    ("spec.methods.0.promptLookupMin", 6, "promptLookupMin must be <= promptLookupMax",
     "promptLookupMin must be <= promptLookupMax (got 6 > 5)"),
    ("spec.methods.0.model", "some/model", "draft without weights", "drafts without weights: remove `model`"),
    ("spec.gpuPools.1.name", "h100", "Duplicate value", "pool names must be unique"),
    ("spec.gpuPools.0.pricePerGpuHour", -3, "less than or equal to the minimum",
     "spec.gpuPools[0].pricePerGpuHour: Input should be greater than 0 (got -3)"),
    ("spec.serving.minReplicas", 9, "minReplicas must be <= maxReplicas", "minReplicas must be <= maxReplicas (got 9 > 8)"),
    ("spec.gpuPools.0.minReplicas", 7, "minReplicas must be <= maxReplicas", "(got 7 > 6)"),
    ("spec.serving.rollout", {"maxSurge": 0}, "maxSurge and maxUnavailable cannot both be 0",
     "spec.serving.rollout: maxSurge and maxUnavailable cannot both be 0"),
    ("spec.serving.rollout", {"progressDeadlineSeconds": 30}, "less than the minimum of 60",
     "spec.serving.rollout.progressDeadlineSeconds: Input should be greater than or equal to 60"),
    ("spec.methods.2.name", "eagle3", "candidate names must be unique", "same name 'eagle3' as methods[1]"),
    ("spec.methods.0.method", "lookahead", "is not one of", "spec.methods[0].method: Input should be"),
    ("spec.profiling.concurrencyLevels", [1, 4, 4], "Duplicate value in a set", "ascending and unique"),
    ("spec.profiling.workload.name", "custom", "custom workload needs `file`", "custom workload needs `file`"),
    ("spec.serving.replicas", 3, "unknown field", "spec.serving.replicas: is not a known field"),
    ("spec.gpuPools.0.name", "H100_pool", "does not match", "spec.gpuPools[0].name: String should match pattern"),
    ("spec.model.tensorParallelSize", 0, "less than the minimum", "spec.model.tensorParallelSize: Input should be greater than or equal to 1"),
    ("spec.methods", [], "should be non-empty", "spec.methods: List should have at least 1 item"),
]


@pytest.mark.parametrize("path,value,crd_text,model_text", INVALID, ids=[c[0] + "=" + repr(c[1])[:20] for c in INVALID])
def test_invalid_resources_are_rejected_with_clear_messages(crds, path, value, crd_text, model_text):
    doc = _set(copy.deepcopy(load_example("llama-70b-h100-h200.yaml")), path, value)
    problems = validate_custom_resource(crds["SpeculativeDeployment"], doc)
    assert any(crd_text in p for p in problems), problems
    with pytest.raises(ValidationError) as exc:
        SpeculativeDeploymentSpec.model_validate(doc["spec"])
    assert model_text in format_validation_error(exc.value)


def test_extra_args_owned_by_specpilot_are_refused():
    doc = load_example("minimal.yaml")
    doc["spec"]["model"]["extraArgs"] = ["--enable-prefix-caching", "--speculative-config={}"]
    with pytest.raises(ValidationError) as exc:
        SpeculativeDeploymentSpec.model_validate(doc["spec"])
    assert ("spec.model.extraArgs: [1] ('--speculative-config={}') sets --speculative-config, which specpilot owns"
            in format_validation_error(exc.value))


def test_profile_spec_is_immutable(crds):
    doc = load_example("speculationprofile-h100-eagle3.yaml")
    changed = copy.deepcopy(doc)
    changed["spec"]["sku"] = "H200"
    assert any("spec is immutable" in p for p in validate_custom_resource(crds["SpeculationProfile"], changed, old=doc))
    status_only = copy.deepcopy(doc)
    status_only["status"]["phase"] = "Failed"
    assert validate_custom_resource(crds["SpeculationProfile"], status_only, old=doc) == []


def test_profile_name_is_deterministic_and_ignores_measurement_settings():
    base = {"model": {"id": "meta-llama/Llama-3.1-8B-Instruct"}, "sku": "H100-SXM",
            "engineImage": "vllm/vllm-openai:v0.32.0", "concurrencyLevels": [1, 2, 4],
            "method": {"method": "eagle3", "model": "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", "name": "e3"}}
    a = SpeculationProfileSpec.model_validate(base)
    b = SpeculationProfileSpec.model_validate({**base, "concurrencyLevels": [1, 8], "requestsPerLevel": 5,
                                               "method": {**base["method"], "name": "other"}})
    c = SpeculationProfileSpec.model_validate({**base, "engineImage": "vllm/vllm-openai:v0.33.0"})
    assert a.object_name() == b.object_name()
    assert a.object_name() != c.object_name()
    assert a.object_name().startswith("h100-sxm-eagle3-")
    assert len(a.object_name()) <= 63
    baseline = SpeculationProfileSpec.model_validate({k: v for k, v in base.items() if k != "method"})
    assert baseline.is_baseline and "-baseline-" in baseline.object_name()


def test_speculative_config_for_each_family():
    ngram = CandidateMethod(method="ngram", prompt_lookup_max=5)
    schedule = from_vllm([[1, 8, 4], [9, 32, 2], [33, 512, 0]])
    cfg = ngram.speculative_config(schedule=schedule)
    assert cfg == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 5,
                   "num_speculative_tokens_per_batch_size": [[1, 8, 4], [9, 32, 2], [33, 512, 0]]}
    eagle = CandidateMethod(method="eagle3", model="org/head", num_speculative_tokens=3,
                            extra_config={"disable_padded_drafter_batch": True})
    assert eagle.speculative_config() == {"disable_padded_drafter_batch": True, "method": "eagle3",
                                          "num_speculative_tokens": 3, "model": "org/head"}
    with pytest.raises(ValueError, match="must be <= the method's numSpeculativeTokens 3"):
        eagle.speculative_config(schedule=from_vllm([[1, 4, 5], [5, 8, 0]]))
    assert not CandidateMethod(method="suffix").supports_dynamic_schedule
    with pytest.raises(ValidationError, match="extraConfig may not set"):
        CandidateMethod(method="ngram", extra_config={"num_speculative_tokens": 9})


def test_schedule_rules_match_vllm():
    assert schedule_problems(from_vllm([[1, 16, 5], [17, 64, 3], [65, 512, 0]]), max_k=5) == []
    assert "must be 1" in schedule_problems(from_vllm([[2, 8, 1]]))[0]
    assert "overlaps" in schedule_problems(from_vllm([[1, 8, 1], [8, 9, 0]]))[0]
    assert schedule_problems([]) == ["the schedule must have at least one range"]
    with pytest.raises(ValidationError, match="fromBatchSize must be <= toBatchSize"):
        ScheduleRange(from_batch_size=5, to_batch_size=4, num_speculative_tokens=1)
    gap = from_vllm([[1, 16, 3], [32, 128, 2]])
    assert [k_at(gap, b) for b in (1, 16, 17, 31, 32, 500)] == [3, 3, 3, 3, 2, 2]
    assert k_at(gap, 1, max_k=2) == 2
    assert summary(from_vllm([[1, 16, 5], [17, 64, 3], [65, 512, 0]])) == "1-16:5,17-64:3,65+:0"


@given(st.lists(st.integers(min_value=0, max_value=8), min_size=1, max_size=300), st.integers(1, 1024))
def test_compress_is_lossless_and_valid(dense, max_batch):
    ranges = compress(dense, max_batch)
    assert schedule_problems(ranges, max_k=8) == []
    assert [k_at(ranges, b) for b in range(1, len(dense) + 1)] == dense
    assert k_at(ranges, len(dense) + 50) == dense[-1]
    assert from_vllm(to_vllm(ranges)) == ranges


def test_vllm_accepts_our_schedules():
    dynamic = pytest.importorskip("vllm.v1.spec_decode.dynamic.utils")
    ranges = compress([4, 4, 3, 3, 3, 1, 0, 0], 256)
    parsed = dynamic.validate_and_normalize_dynamic_sd_schedule(to_vllm(ranges))
    assert [list(p) for p in parsed] == to_vllm(ranges)
    lookup = dynamic.build_dynamic_sd_schedule_lookup(to_vllm(ranges), 256, 4)
    assert lookup[1:] == [k_at(ranges, b) for b in range(1, 257)]


def test_every_example_file_is_checked():
    names = {p.name for p in (REPO / "examples").glob("*.yaml")}
    # the baseline profile is checked against the EAGLE-3 profile and the twin in tests/unit/test_examples.py
    profiles = {"speculationprofile-h100-eagle3.yaml", "speculationprofile-h100-baseline.yaml"}
    assert names == set(SDEP_EXAMPLES) | profiles
