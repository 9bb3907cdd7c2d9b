"""The plausibility checks of a profile's measured figures, one class at a time: each refusal names the field
and the bound it breaks (perf/plausibility.py)."""

from __future__ import annotations

import pytest

from specpilot.api.profile import LevelPoint, SpeculationProfile
from specpilot.perf.plausibility import (
    REFINE_LEVELS_ANNOTATION,
    latency_problems,
    request_problems,
    result_problems,
    throughput_bound,
    token_problems,
    weight_precision,
)
from specpilot.sim.synthetic import Scenario, synthetic_profiles

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def _profile(method: str | None = "eagle3", extra_args: list[str] | None = None) -> dict:
    baseline, speculative = synthetic_profiles(Scenario(sku="H100-SXM", model_id=LLAMA, method=method or "eagle3",
                                                        max_k=4), noise=0.05, seed=3)
    body = (baseline if method is None else speculative).model_dump(mode="json", by_alias=True, exclude_none=True)
    if extra_args is not None:
        body["spec"]["engine"] = {"extraArgs": extra_args}
    return body


def _bound(body: dict):
    return throughput_bound(SpeculationProfile.model_validate(body))


def _point(body: dict, run: int = 1, index: int = 0) -> dict:
    return body["status"]["runs"][run]["points"][index]


# ----- the weights' bytes come from the model and its weights' flags, never the KV cache's dtype -----

@pytest.mark.parametrize("args", [["--kv-cache-dtype=fp8"], ["--kv-cache-dtype", "fp8"],
                                  ["--kv_cache_dtype", "fp8_e4m3"], ["--dtype", "auto"], ["--enforce-eager"], []])
def test_the_kv_cache_dtype_leaves_the_weights_as_they_are(args):
    precision = weight_precision(LLAMA, None, args)
    assert not precision.quantized and precision.dtype_bytes is None


@pytest.mark.parametrize("model_id,revision,args,basis", [
    (LLAMA, None, ["--quantization", "fp8"], "--quantization fp8"),
    (LLAMA, None, ["--quantization=awq"], "--quantization awq"),
    (LLAMA, None, ["-q", "gptq"], "--q gptq"),
    (LLAMA, None, ["--quant=fp8"], "--quant fp8"),
    (LLAMA, None, ["--load-format", "bitsandbytes"], "--load-format bitsandbytes"),
    ("RedHatAI/Llama-3.1-8B-Instruct-FP8", None, [], "'fp8' in"),
    (LLAMA, "gptq-4bit-32g", [], "'gptq' in 'gptq-4bit-32g'"),
])
def test_quantized_weights_are_read_from_the_model_and_its_weight_flags(model_id, revision, args, basis):
    precision = weight_precision(model_id, revision, args)
    assert precision.quantized and basis in precision.basis


def test_a_kv_cache_in_fp8_keeps_the_bf16_bound():
    """A throughput 2.8x the bf16 roofline passed when the KV cache's fp8 made the bound a 4-bit one."""
    body = _profile("eagle3", ["--kv-cache-dtype=fp8"])
    bound = _bound(body)
    assert not bound.quantized and bound.bytes_per_weight == 2.0
    assert bound.ceiling(1, 1) == pytest.approx(_bound(_profile("eagle3")).ceiling(1, 1))
    point = _point(body)
    point["outputThroughput"] = 2.8 * bound.ceiling(1, 1)
    problems = result_problems(body)
    assert any("status.runs[1].points[0].outputThroughput" in p and "above the physical bound" in p
               and "at 2 bytes" in p for p in problems), problems


def test_dtype_float32_doubles_the_bytes_a_step_reads():
    bound = _bound(_profile("eagle3", ["--dtype=float32"]))
    assert bound.bytes_per_weight == 4.0 and "--dtype (4 bytes)" in bound.basis
    assert bound.ceiling(1, 0) == pytest.approx(_bound(_profile("eagle3")).ceiling(1, 0) / 2)


# ----- latencies against the step-time floor -----

@pytest.mark.parametrize("field,stat", [("tpotMs", "p50"), ("tpotMs", "p90"), ("itlMs", "p50"), ("itlMs", "mean")])
def test_a_tpot_or_itl_faster_than_a_step_is_refused(field, stat):
    body = _profile("eagle3")
    _point(body)[field][stat] = 1e-6
    problems = result_problems(body)
    floor = _bound(body).token_floor_ms(4)
    assert any(p.startswith(f"status.runs[1].points[0].{field}.{stat} 1e-06 ms is below the step-time floor "
                            f"{floor:.3g} ms per token at K=4 (1.25 x the memory/compute roofline of H100-SXM")
               for p in problems), problems


def test_the_token_floor_allows_k_plus_1_tokens_per_step():
    bound = _bound(_profile("eagle3"))
    assert bound.token_floor_ms(4) == pytest.approx(bound.token_floor_ms(0) / 5)
    point = LevelPoint(concurrency=1, output_throughput=100, tpotMs={"p50": bound.token_floor_ms(4) * 1.01})
    assert latency_problems("p", point, 4, bound) == []
    assert latency_problems("p", point, 3, bound)  # at K=3 a step carries one token fewer


def test_a_first_token_faster_than_a_forward_pass_is_refused():
    body = _profile(None)
    _point(body, 0, 2)["ttftMs"]["p50"] = 0.001
    problems = result_problems(body)
    assert any("status.runs[0].points[2].ttftMs.p50 0.001 ms is below one forward pass" in p for p in problems)


# ----- token counts against what the streams carried -----

def test_generation_tokens_beyond_the_streams_are_refused():
    body = _profile("eagle3")
    point = _point(body)
    point["generationTokens"] *= 10
    problems = result_problems(body)
    assert any(p.startswith("status.runs[1].points[0].generationTokens is 163840, more than the 1.638e+04 tokens "
                            "its streams carried (outputThroughput x durationS) allow") for p in problems), problems


def test_accepted_tokens_beyond_the_drafts_are_refused():
    body = _profile("eagle3")
    point = _point(body)
    point["numAcceptedTokens"] = point["numDraftTokens"] * 10
    problems = result_problems(body)
    assert any(p.startswith(f"status.runs[1].points[0].numAcceptedTokens is {point['numAcceptedTokens']}, more "
                            f"than the numDraftTokens {point['numDraftTokens']}") for p in problems), problems


@pytest.mark.parametrize("change,expected", [
    ({"numDraftTokens": 10**6}, "numDraftTokens is 1000000, more than K=4 per draft"),
    ({"acceptedPerPosition": [10**6, 10**6, 10**6, 10**6]}, "exceeds the numDrafts"),
    ({"numDrafts": 10**6, "numDraftTokens": 4 * 10**6}, "numDrafts is 1000000, more than the"),
    ({"generationTokens": 100}, "generationTokens is 100, fewer than"),
])
def test_counters_that_disagree_with_each_other_are_refused(change, expected):
    body = _profile("eagle3")
    run = body["status"]["runs"][-1]
    run["points"][0].update(change)
    run.pop("acceptance", None)  # the run's aggregate would be refused too
    problems = result_problems(body)
    assert any(expected in p for p in problems), problems


def test_drafts_in_a_run_without_speculation_are_refused():
    body = _profile(None)
    _point(body, 0, 0)["numDrafts"] = 5
    assert any("counts drafts or accepted tokens in a run without speculation (K=0)" in p
               for p in result_problems(body))


def test_streams_carrying_more_than_output_len_per_request_are_refused():
    point = LevelPoint(concurrency=1, completed=4, duration_s=10.0, output_throughput=200.0)
    problems = token_problems("p", point, 0, 256, 64)
    assert problems == ["p.outputThroughput x durationS is 2000 tokens, more than the 4 requests (completed + "
                        "failed) can carry at outputLen 256 each (1024)"]


# ----- request counts against what was asked, the duration and the rate -----

def test_a_trillion_completed_requests_are_refused():
    body = _profile("eagle3")
    _point(body)["completed"] = 10**12
    problems = result_problems(body)
    assert any(p.startswith("status.runs[1].points[0].completed + failed is 1000000000000, more than the 64 "
                            "requests the level sends (max(spec.requestsPerLevel 64, 2 x concurrency 1))")
               for p in problems), problems
    assert any("status.runs[1].points[0].completed is 1000000000000, more than" in p and "in durationS" in p
               for p in problems), problems


def test_request_rate_and_running_requests_are_bounded():
    bound = _bound(_profile("eagle3"))
    point = LevelPoint(concurrency=8, completed=64, duration_s=10.0, request_throughput=64.0, output_throughput=100,
                       goodput=100.0, mean_running=80.0)
    problems = request_problems("p", point, 64, bound)
    assert any(p.startswith("p.requestThroughput is 64/s, more than completed / durationS = 6.4/s") for p in problems)
    assert any(p.startswith("p.goodput is 100/s, more than the requestThroughput 64/s") for p in problems)
    assert "p.meanRunning is 80, more than the concurrency 8 the client kept in flight" in problems
    no_duration = LevelPoint(concurrency=1, request_throughput=1e9, output_throughput=100)
    assert any("more than 1 requests at a time of one forward pass" in p
               for p in request_problems("p", no_duration, 64, bound))


def test_a_level_sends_its_requests_and_warm_up_as_the_bench_does():
    from specpilot.perf import plausibility
    from specpilot_bench import cli, sweep

    assert plausibility.MIN_WAVES == cli.MIN_WAVES
    assert plausibility.DEFAULT_WARMUP_REQUESTS == sweep.DEFAULT_WARMUP_REQUESTS


# ----- only the levels the operator asked for -----

def test_a_level_neither_the_spec_nor_a_refinement_round_asked_for_is_refused():
    body = _profile("eagle3")
    _point(body)["concurrency"] = 3
    assert any(p.startswith("status.runs[1].points[0].concurrency is 3, not a level the operator asked for: "
                            "spec.concurrencyLevels [1, 2, 4, 8") for p in result_problems(body))
    body["metadata"]["annotations"] = {REFINE_LEVELS_ANNOTATION: "3"}
    assert not [p for p in result_problems(body) if "concurrency is 3" in p]


def test_real_looking_results_pass_every_check():
    for method in (None, "eagle3", "ngram", "draft_model"):
        assert result_problems(_profile(method)) == []
