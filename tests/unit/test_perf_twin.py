"""Digital twin: anchors to published vLLM measurements, physics, memory, and the synthetic benchmark."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specpilot.perf.acceptance import METHODS, AcceptanceProfile
from specpilot.perf.catalog import DEFAULT_CATALOG
from specpilot.perf.models import BUILTIN_MODELS, resolve_model
from specpilot.perf.twin import InsufficientMemoryError, Twin, TwinCalibration

H100 = DEFAULT_CATALOG.resolve("H100-SXM")
LLAMA_8B = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
LLAMA_70B = resolve_model("meta-llama/Llama-3.3-70B-Instruct")
BASELINE = Twin(H100, LLAMA_8B)
EAGLE3 = Twin(H100, LLAMA_8B, method="eagle3", workload="sharegpt")


def published_step_s(batch, context_len, query_tokens=1):
    """Linear fit of vLLM step times on H100 + Llama-3.1-8B, plus the 1.21 ms per-step overhead."""
    return 3.93e-8 * batch * context_len + 2.10e-5 * batch * query_tokens + 5.89e-3 + 1.21e-3


@pytest.mark.parametrize("batch", [1, 2, 4, 8, 16, 32, 48, 64, 96, 128])
@pytest.mark.parametrize("context_len", [512, 1024, 2048])
def test_baseline_step_within_15_percent_of_published_fit(batch, context_len):
    twin_s = BASELINE.target_step_time_s(batch, 1, context_len)
    assert twin_s == pytest.approx(published_step_s(batch, context_len), rel=0.15)


def test_step_is_memory_bound_at_small_batch_and_compute_bound_at_large():
    # batch 1: verifying 4 tokens costs about as much as decoding 1
    assert BASELINE.target_step_time_s(1, 4, 1024) < 1.02 * BASELINE.target_step_time_s(1, 1, 1024)
    # batch 256: 4 query tokens per sequence cost well over 1.5x one
    assert BASELINE.target_step_time_s(256, 4, 1024) > 1.5 * BASELINE.target_step_time_s(256, 1, 1024)
    # a faster-memory GPU helps the memory-bound step more than the compute-bound one
    h200 = Twin(DEFAULT_CATALOG.resolve("H200"), LLAMA_8B)
    small = BASELINE.target_step_time_s(1, 1, 1024) / h200.target_step_time_s(1, 1, 1024)
    large = BASELINE.target_step_time_s(512, 4, 256) / h200.target_step_time_s(512, 4, 256)
    assert small > large


def test_eagle_draft_cost_anchor():
    # EAGLE draft ~2.1 ms for k ~ 3-5 on H100 at small batch
    for k in (3, 4, 5):
        assert 1.5e-3 <= EAGLE3.draft_time_s(1, k, 1024) <= 3.2e-3
    assert EAGLE3.draft_time_s(1, 4, 1024) == pytest.approx(2.1e-3, rel=0.25)
    # vLLM #20780: EAGLE-1 adds 2.1 / 2.75 / 3.6 ms per step at k = 2 / 3 / 4 (TPOT x AL - 7.07 ms)
    eagle = Twin(H100, LLAMA_8B, method="eagle")
    for k, measured in ((2, 2.11e-3), (3, 2.75e-3), (4, 3.6e-3)):
        added = eagle.step_time_s(1, k, 1024) - eagle.step_time_s(1, 0, 1024)
        assert added == pytest.approx(measured, rel=0.2)


def test_eagle3_speedup_anchor_falls_with_batch():
    speedup_1 = EAGLE3.speedup(1, 3, 1024)
    speedup_128 = EAGLE3.speedup(128, 3, 1024)
    assert 1.6 <= speedup_1 <= 2.1
    assert 1.0 <= speedup_128 <= 1.35
    speedups = [EAGLE3.speedup(b, 3, 1024) for b in (1, 4, 16, 32, 64, 128, 256)]
    assert speedups == sorted(speedups, reverse=True)


def test_best_k_shrinks_with_batch():
    best = [EAGLE3.best_k(batch, 8, 1024) for batch in range(1, 257)]
    assert all(a >= b for a, b in zip(best, best[1:]))
    assert best[-1] < best[0]
    assert best[0] >= 3  # vLLM #20780 found k = 4 best for EAGLE-3 at batch 1


def test_ngram_on_chat_turns_into_a_loss_at_high_load():
    ngram = Twin(H100, LLAMA_8B, method="ngram", workload="sharegpt")
    assert ngram.speedup(1, 3, 1024) > 1.0
    assert ngram.speedup(512, 5, 512) < 1.0
    assert ngram.draft_time_s(1, 3, 1024) < 1e-3  # host lookup: ~free
    extraction = Twin(H100, LLAMA_8B, method="ngram", workload="json-extraction")
    assert extraction.speedup(1, 5, 1024) > ngram.speedup(1, 5, 1024)


def test_tokens_per_step_goodput_and_tpot_agree():
    k, batch, context_len = 3, 16, 1024
    e_k = EAGLE3.tokens_per_step(k)
    assert e_k == pytest.approx(1 + sum(EAGLE3.acceptance.per_position[:3]))
    step = EAGLE3.step_time_s(batch, k, context_len)
    assert EAGLE3.goodput_tok_s(batch, k, context_len) == pytest.approx(batch * e_k / step)
    assert EAGLE3.tpot_s(batch, k, context_len) == pytest.approx(step / e_k)
    assert EAGLE3.step_time_s(batch, 0, context_len) == BASELINE.step_time_s(batch, 0, context_len)


def test_k_outside_the_profile_is_rejected():
    with pytest.raises(ValueError, match="k must be 0 for a twin without a speculative method"):
        BASELINE.step_time_s(1, 1, 1024)
    with pytest.raises(ValueError, match="k must be within 0..16"):
        EAGLE3.step_time_s(1, 17, 1024)
    medusa = Twin(H100, LLAMA_8B, method="medusa")
    assert medusa.acceptance.max_k == medusa.drafter.num_attention_heads == 5


def test_custom_acceptance_profile_drives_the_twin():
    perfect = Twin(H100, LLAMA_8B, method="eagle3", acceptance=AcceptanceProfile((1.0, 1.0, 1.0)))
    assert perfect.tokens_per_step(3) == 4.0
    assert perfect.speedup(1, 3, 1024) > EAGLE3.speedup(1, 3, 1024)


def test_kv_capacity_h100_llama_8b():
    tokens = BASELINE.kv_capacity_tokens(0.9)
    assert 300_000 <= tokens <= 600_000
    assert BASELINE.kv_capacity_tokens(0.5) < tokens
    assert BASELINE.max_concurrency(2048) == tokens // 2048
    # a draft model's weights and its own KV cache leave room for fewer tokens than an EAGLE head
    draft_model = Twin(H100, LLAMA_8B, method="draft_model")
    assert draft_model.kv_capacity_tokens() < EAGLE3.kv_capacity_tokens() < tokens
    assert Twin(H100, LLAMA_8B, method="ngram").kv_capacity_tokens() == tokens


def test_70b_on_one_h100_does_not_fit_and_says_use_tensor_parallelism():
    twin = Twin(H100, LLAMA_70B)
    with pytest.raises(InsufficientMemoryError, match=r"tensor_parallel_size >= 2") as excinfo:
        twin.kv_capacity_tokens()
    assert "Llama-3.3-70B" in str(excinfo.value) and "H100-SXM" in str(excinfo.value)
    with pytest.raises(InsufficientMemoryError):
        twin.max_concurrency(1024)
    tp4 = Twin(H100, LLAMA_70B, tensor_parallel_size=4)
    assert tp4.kv_capacity_tokens() > 100_000


def test_tensor_parallelism_shortens_the_memory_bound_step():
    tp1 = Twin(H100, LLAMA_70B, tensor_parallel_size=1).step_time_s(1, 0, 1024)
    tp4 = Twin(H100, LLAMA_70B, tensor_parallel_size=4).step_time_s(1, 0, 1024)
    assert tp1 / 4 < tp4 < tp1 / 2  # all-reduces and fixed overhead keep it from scaling perfectly


@pytest.mark.parametrize("method", METHODS)
def test_every_method_runs_on_every_builtin_sku(method):
    for gpu in DEFAULT_CATALOG:
        twin = Twin(gpu, LLAMA_8B, method=method)
        assert twin.goodput_tok_s(8, 3, 1024) > 0
        assert twin.kv_capacity_tokens() > 0


def test_calibration_validation():
    with pytest.raises(ValueError, match="compute_efficiency"):
        TwinCalibration(compute_efficiency=1.5)
    with pytest.raises(ValueError, match="drafter and acceptance need a speculative method"):
        Twin(H100, LLAMA_8B, drafter=BUILTIN_MODELS["Llama-3.2-1B"])


# ---- properties --------------------------------------------------------------------------------------------

twins = st.sampled_from([
    BASELINE,
    EAGLE3,
    Twin(H100, LLAMA_8B, method="ngram", workload="json-extraction"),
    Twin(H100, LLAMA_8B, method="draft_model"),
    Twin(DEFAULT_CATALOG.resolve("L40S"), LLAMA_8B, method="medusa"),
    Twin(DEFAULT_CATALOG.resolve("B200"), LLAMA_70B, tensor_parallel_size=2, method="eagle3"),
    Twin(DEFAULT_CATALOG.resolve("MI300X"), resolve_model("Qwen/Qwen3-8B"), method="mtp", workload="humaneval"),
])
batches = st.integers(min_value=1, max_value=1024)
contexts = st.integers(min_value=1, max_value=32768)


@settings(max_examples=300, deadline=None)
@given(twin=twins, batch=batches, extra=st.integers(min_value=1, max_value=512), context_len=contexts,
       k=st.integers(min_value=0, max_value=5))
def test_step_time_monotonic_in_batch(twin, batch, extra, context_len, k):
    k = min(k, twin.acceptance.max_k)
    assert twin.step_time_s(batch + extra, k, context_len) >= twin.step_time_s(batch, k, context_len)


@settings(max_examples=300, deadline=None)
@given(twin=twins, batch=batches, context_len=contexts, k=st.integers(min_value=0, max_value=4))
def test_step_time_monotonic_in_k_and_rates_positive(twin, batch, context_len, k):
    if k + 1 > twin.acceptance.max_k:
        k = max(0, twin.acceptance.max_k - 1)
    k_next = min(k + 1, twin.acceptance.max_k)
    assert twin.step_time_s(batch, k_next, context_len) >= twin.step_time_s(batch, k, context_len)
    assert twin.goodput_tok_s(batch, k, context_len) > 0
    assert twin.tpot_s(batch, k, context_len) > 0


# ---- synthetic benchmark --------------------------------------------------------------------------------------


def test_benchmark_point_is_consistent_with_the_step_model():
    point = EAGLE3.benchmark_point(concurrency=1, k=3, prompt_len=512, output_len=257)
    e_k = EAGLE3.tokens_per_step(3)
    context_len = 512 + 257 / 2
    assert point["itl_ms"] > point["tpot_ms"]  # one ITL sample spans E_k tokens under SD
    assert point["tpot_ms"] == pytest.approx(EAGLE3.tpot_s(1, 3, context_len) * 1e3, rel=0.1)
    assert point["output_throughput_tok_s"] == pytest.approx(point["request_throughput"] * 257)
    assert 10 < point["ttft_ms"] < 100  # 512-token prefill of an 8B model on an H100
    # SD counters: prefix-truncated acceptance, consistent totals
    assert point["num_draft_tokens"] == 3 * point["num_drafts"]
    assert point["num_accepted_tokens"] == sum(point["accepted_per_position"])
    rates = [n / point["num_drafts"] for n in point["accepted_per_position"]]
    assert rates == pytest.approx(list(EAGLE3.acceptance.per_position[:3]), abs=0.01)
    assert 1 + point["num_accepted_tokens"] / point["num_drafts"] == pytest.approx(e_k, abs=0.01)


def test_benchmark_point_throughput_saturates_and_latency_grows():
    points = [BASELINE.benchmark_point(c, 0, 1024, 256) for c in (1, 4, 16, 64, 256)]
    throughputs = [p["output_throughput_tok_s"] for p in points]
    tpots = [p["tpot_ms"] for p in points]
    assert throughputs == sorted(throughputs) and tpots == sorted(tpots)
    assert points[0]["num_drafts"] == 0 and points[0]["accepted_per_position"] == []


def test_benchmark_point_beyond_kv_capacity_queues():
    twin = Twin(DEFAULT_CATALOG.resolve("L40S"), LLAMA_8B)
    fits = twin.max_concurrency(8192 + 512)
    at_capacity = twin.benchmark_point(fits, 0, 8192, 512)
    beyond = twin.benchmark_point(4 * fits, 0, 8192, 512)
    assert beyond["output_throughput_tok_s"] == pytest.approx(at_capacity["output_throughput_tok_s"])
    assert beyond["ttft_ms"] > 2 * at_capacity["ttft_ms"]


def test_benchmark_point_sampling_and_noise():
    quiet = EAGLE3.benchmark_point(16, 5, 1024, 256)
    sampled = EAGLE3.benchmark_point(16, 5, 1024, 256, rng=np.random.default_rng(7), noise=0.05)
    again = EAGLE3.benchmark_point(16, 5, 1024, 256, rng=np.random.default_rng(7), noise=0.05)
    assert sampled == again  # reproducible with a seeded generator
    per_position = sampled["accepted_per_position"]
    assert all(a >= b for a, b in zip(per_position, per_position[1:]))
    assert sampled["num_drafts"] == pytest.approx(quiet["num_drafts"], rel=0.05)
    assert sampled["output_throughput_tok_s"] != quiet["output_throughput_tok_s"]
    assert sampled["output_throughput_tok_s"] == pytest.approx(quiet["output_throughput_tok_s"], rel=0.3)
    ngram = Twin(H100, LLAMA_8B, method="ngram", workload="sharegpt").benchmark_point(4, 3, 1024, 256)
    steps = ngram["num_requests"] * 255 / Twin(H100, LLAMA_8B, method="ngram").tokens_per_step(3)
    assert ngram["num_drafts"] == pytest.approx(0.30 * steps, rel=0.01)  # drafts only where a match exists


def test_benchmark_point_validates_arguments():
    with pytest.raises(ValueError, match="output_len must be >= 2"):
        EAGLE3.benchmark_point(1, 3, 512, 1)
    with pytest.raises(ValueError, match="concurrency"):
        EAGLE3.benchmark_point(0, 3, 512, 64)
