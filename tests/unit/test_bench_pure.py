"""The pure parts of specpilot-bench: /metrics deltas, acceptance, early stop, run plan, merge, workloads."""

from __future__ import annotations

import json

import pytest
from specpilot.api.profile import Acceptance, LevelPoint, ProfilePhase, Run, SpeculationProfileStatus
from specpilot_bench.metrics import LoadSamples, parse_metrics, server_deltas
from specpilot_bench.profiles import (
    interpolated_output_throughput,
    merged_status,
    parse_speculative_config,
    planned_ks,
    run_speculative_config,
    validation,
)
from specpilot_bench.sweep import Slo, level_point, run_acceptance, stop_reason
from specpilot_bench.workloads import WorkloadError, load_prompts

LABELS = 'engine="0",model_name="m"'


def scrape_text(drafts: float, draft_tokens: float, accepted: float, per_pos: list[float], generated: float) -> str:
    lines = [
        "# TYPE vllm:spec_decode_num_drafts counter", f"vllm:spec_decode_num_drafts_total{{{LABELS}}} {drafts}",
        "# TYPE vllm:spec_decode_num_draft_tokens counter",
        f"vllm:spec_decode_num_draft_tokens_total{{{LABELS}}} {draft_tokens}",
        "# TYPE vllm:spec_decode_num_accepted_tokens counter",
        f"vllm:spec_decode_num_accepted_tokens_total{{{LABELS}}} {accepted}",
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
        *[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{LABELS},position="{i}"}} {v}'
          for i, v in enumerate(per_pos)],
        "# TYPE vllm:generation_tokens counter", f"vllm:generation_tokens_total{{{LABELS}}} {generated}",
        "# TYPE vllm:num_requests_running gauge", f"vllm:num_requests_running{{{LABELS}}} 3.0",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{{LABELS},block_size="16",num_gpu_blocks="100",kv_cache_size_tokens="1600"}} 1.0',
    ]
    return "\n".join(lines) + "\n"


def test_server_deltas_and_capacity():
    before = parse_metrics(scrape_text(10, 30, 20, [9, 7, 4], 100))
    after = parse_metrics(scrape_text(40, 120, 80, [29, 31, 20], 300))
    d = server_deltas(before, after)
    assert (d.num_drafts, d.num_draft_tokens, d.num_accepted_tokens, d.generation_tokens) == (30, 90, 60, 200)
    assert d.accepted_per_position == [20, 24, 16]
    assert d.preemptions is None  # not exported by this scrape
    assert after.speculative_positions() == 3
    assert after.kv_capacity_tokens() == 1600
    samples = LoadSamples()
    samples.add(after)
    assert samples.mean_running == 3.0 and samples.mean_waiting is None


def point(c: int, throughput: float, tpot_p90: float | None = None, **counters) -> LevelPoint:
    return LevelPoint(concurrency=c, output_throughput=throughput, tpot_ms={"p90": tpot_p90}, **counters)


def test_run_acceptance_from_counters():
    points = [point(1, 10, num_drafts=10, num_accepted_tokens=15, generation_tokens=35, accepted_per_position=[8, 5, 2]),
              point(2, 20, num_drafts=10, num_accepted_tokens=10, generation_tokens=30, accepted_per_position=[6, 3, 1])]
    acc = run_acceptance(points)
    assert acc.per_position == [0.7, 0.4, 0.15]
    assert acc.mean_acceptance_length == pytest.approx(1 + 25 / 20)
    assert acc.drafts_per_step == pytest.approx(20 / (65 - 25))
    assert run_acceptance([point(1, 10, generation_tokens=30)]) is None


def test_stop_reason_saturation_and_slo():
    assert stop_reason([point(1, 100), point(2, 180), point(4, 300)], Slo()) is None
    assert "saturated" in stop_reason([point(1, 100), point(2, 102), point(4, 103)], Slo())
    assert stop_reason([point(1, 100), point(2, 102)], Slo()) is None  # one flat step is not enough
    slo = Slo(tpot_ms=50)
    assert stop_reason([point(1, 100, 40), point(2, 200, 60)], slo) is None
    assert "SLO broken" in stop_reason([point(1, 100, 40), point(2, 200, 60), point(4, 400, 70)], slo)


def test_level_point_from_vllm_result():
    from specpilot_bench.metrics import ServerDeltas

    result = {"errors": ["", "", "boom"], "output_lens": [11, 21, 0], "ttfts": [0.1, 0.2, 0.0],
              "latencies": [1.1, 2.2, 0.0], "itls": [[0.1] * 10, [0.1] * 20, []], "completed": 2, "failed": 1,
              "duration": 3.0, "request_throughput": 0.66, "output_throughput": 10.6, "request_goodput": 0.5}
    deltas = ServerDeltas(32, None, None, None, [], 0)
    p = level_point(4, result, deltas, LoadSamples(running=[2, 4], waiting=[0, 1], kv_cache_usage=[0.1, 0.3]))
    assert (p.completed, p.failed, p.goodput, p.generation_tokens) == (2, 1, 0.5, 32)
    assert p.tpot_ms.p50 == pytest.approx(100.0)
    assert p.ttft_ms.mean == pytest.approx(150.0)
    assert (p.mean_running, p.mean_waiting, p.kv_cache_usage) == (3, 0.5, 0.3)


def test_parse_speculative_config_and_capped_schedule():
    method, schedule = parse_speculative_config(json.dumps({
        "method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 5,
        "num_speculative_tokens_per_batch_size": [[1, 1, 3], [2, 256, 0]]}))
    assert method.method == "ngram" and method.prompt_lookup_max == 5
    assert run_speculative_config(method, 3, schedule)["num_speculative_tokens_per_batch_size"] == [[1, 1, 3],
                                                                                                   [2, 256, 0]]
    assert run_speculative_config(method, 1, schedule)["num_speculative_tokens_per_batch_size"] == [[1, 1, 1],
                                                                                                   [2, 256, 0]]
    extra, _ = parse_speculative_config('{"method": "suffix", "suffix_decoding_max_tree_depth": 24}')
    assert extra.speculative_config(2)["suffix_decoding_max_tree_depth"] == 24
    with pytest.raises(ValueError, match="--speculative-config"):
        parse_speculative_config('{"method": "draft_model"}')  # needs a model
    with pytest.raises(ValueError, match="numSpeculativeTokens"):
        parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 2, '
                                 '"num_speculative_tokens_per_batch_size": [[1, 4, 5]]}')


def test_planned_ks():
    method, _ = parse_speculative_config('{"method": "ngram", "num_speculative_tokens": 5}')
    assert planned_ks(None) == [0]
    assert planned_ks(method) == [1, 5]
    assert planned_ks(method, 3) == [1, 3, 5]
    with pytest.raises(ValueError, match="--validate-k"):
        planned_ks(method, 5)


def test_interpolation_is_exact_at_the_ends_and_validation_measures_the_middle():
    acc = Acceptance(per_position=[0.8, 0.6, 0.4], drafts_per_step=1.0)
    assert interpolated_output_throughput(100, 150, acc, 3, 1) == pytest.approx(100)
    assert interpolated_output_throughput(100, 150, acc, 3, 3) == pytest.approx(150)
    middle = interpolated_output_throughput(100, 150, acc, 3, 2)
    run_1 = Run(num_speculative_tokens=1, points=[point(1, 100)])
    run_k = Run(num_speculative_tokens=3, points=[point(1, 150)], acceptance=acc)
    run_m = Run(num_speculative_tokens=2, points=[point(1, middle * 1.1)])
    check = validation(run_1, run_k, run_m)
    assert check.num_speculative_tokens == 2
    assert check.max_relative_error == pytest.approx(abs(middle - middle * 1.1) / (middle * 1.1))


def test_merged_status_keeps_other_jobs_runs():
    current = SpeculationProfileStatus(phase=ProfilePhase.RUNNING, attempts=2, engine_starts=1,
                                       runs=[Run(num_speculative_tokens=1, points=[point(1, 10)])]).dump()
    new = SpeculationProfileStatus(phase=ProfilePhase.RUNNING, engine_starts=1,
                                   runs=[Run(num_speculative_tokens=4, points=[point(1, 12)])])
    merged = merged_status(current, new, [1, 4])
    assert [r.num_speculative_tokens for r in merged.runs] == [1, 4]
    assert merged.phase == "Succeeded" and merged.attempts == 2 and merged.engine_starts == 2
    failed = new.model_copy(update={"phase": ProfilePhase.FAILED})
    assert merged_status(current, failed, [1, 4]).phase == "Failed"


def test_workloads_load_offline(tmp_path):
    for name in ("json-extraction", "random", "humaneval", "sharegpt"):
        prompts = load_prompts(name, 5, output_len=32, seed=1, input_len=16)
        assert len(prompts) == 5 and all(p.text and p.max_tokens == 32 for p in prompts)
    assert load_prompts("json-extraction", 3, output_len=8, seed=1) == load_prompts("json-extraction", 3,
                                                                                 output_len=8, seed=1)
    extraction = load_prompts("json-extraction", 1, output_len=8)[0].text
    assert '"order_id"' in extraction and "Extract the fields" in extraction
    jsonl = tmp_path / "prompts.jsonl"
    jsonl.write_text('{"prompt": "a", "max_tokens": 4}\n\n{"prompt": "b"}\n')
    assert [(p.text, p.max_tokens) for p in load_prompts("custom", 3, output_len=16, file=jsonl)] == [
        ("a", 4), ("b", 16), ("a", 4)]
    jsonl.write_text('{"text": "a"}\n')
    with pytest.raises(WorkloadError, match="prompts.jsonl:1"):
        load_prompts("custom", 1, output_len=16, file=jsonl)
