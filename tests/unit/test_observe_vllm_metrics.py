"""The shared arithmetic of both observation sources: counter increases, acceptance, histogram quantiles."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specpilot.observe import vllm_metrics as vm
from specpilot_sandbox.exporter import VllmMetricsState, render_metrics

INF = math.inf


def test_counter_increase_counts_a_drop_as_a_restart_from_zero():
    # 10 -> 20 (+10), restart, 5 (+5 since the restart), 15 (+10)
    assert vm.counter_increase([10, 20, 5, 15]) == 25
    assert vm.counter_increase([10, 20, 0]) == 10
    assert vm.counter_increase([7]) == 0
    assert vm.counter_increase([]) == 0


@given(st.lists(st.lists(st.floats(0, 1e6), min_size=1, max_size=8), min_size=1, max_size=4))
def test_counter_increase_over_restarts_is_the_sum_of_each_life(increments_per_life):
    """Each list is one life of the pod: its counter starts at 0 and grows by the increments."""
    samples, expected = [], 0.0
    for increments in increments_per_life:
        value = 0.0
        samples.append(value)
        for step in increments:
            value += step
            samples.append(value)
        expected += value
    assert vm.counter_increase(samples) == pytest.approx(expected)


def test_histogram_quantile_interpolates_inside_the_bucket_like_prometheus():
    buckets = ((0.025, 0.0), (0.05, 100.0), (0.1, 100.0), (INF, 100.0))
    # rank 95 of 100 lies in (0.025, 0.05]: 0.025 + 0.025 * 95/100
    assert vm.histogram_quantile(0.95, buckets) == pytest.approx(0.04875)
    # rank 15 of 30: 5 of the 20 observations into (1, 2]
    assert vm.histogram_quantile(0.5, ((1.0, 10.0), (2.0, 30.0), (INF, 30.0))) == pytest.approx(1.25)
    # The first bucket starts at 0.
    assert vm.histogram_quantile(0.5, ((1.0, 10.0), (INF, 10.0))) == pytest.approx(0.5)


def test_histogram_quantile_in_the_inf_bucket_is_the_largest_finite_bound():
    assert vm.histogram_quantile(0.95, ((0.1, 1.0), (0.2, 2.0), (INF, 100.0))) == 0.2


def test_histogram_quantile_of_nothing_is_none():
    assert vm.histogram_quantile(0.95, ((0.1, 0.0), (INF, 0.0))) is None
    assert vm.histogram_quantile(0.95, ()) is None
    assert vm.histogram_quantile(0.95, ((0.1, 3.0),)) is None  # no +Inf bucket: not a histogram


def test_histogram_quantile_forces_bucket_counts_monotonic():
    # The 0.2 bucket was scraped a moment before the 0.1 bucket and reads lower.
    assert vm.histogram_quantile(0.5, ((0.1, 10.0), (0.2, 9.0), (INF, 10.0))) == pytest.approx(0.05)


def test_histogram_quantile_rejects_a_quantile_outside_0_1():
    with pytest.raises(ValueError, match="quantile q"):
        vm.histogram_quantile(95, ((0.1, 1.0), (INF, 1.0)))


def test_spec_decode_summary_from_counter_increases():
    counts = vm.SpecDecodeCounts(drafts=100, draft_tokens=300, accepted_tokens=170,
                                 accepted_per_position=(80, 60, 30))
    # 400 request-steps emitted 400 tokens of their own plus 170 accepted drafts.
    summary = vm.spec_decode_summary(counts, generation_tokens=570)
    assert summary.acceptance_per_position == pytest.approx([0.8, 0.6, 0.3])
    assert summary.drafts_per_step == pytest.approx(100 / 400)
    assert summary.mean_acceptance_length == pytest.approx(2.7)


def test_spec_decode_summary_when_off_or_idle():
    assert vm.spec_decode_summary(None, 1000) == vm.SpecDecodeSummary([], None, None)
    no_drafts = vm.SpecDecodeCounts(0, 0, 0, (0, 0))
    # SD on, tokens generated, yet n-gram found nothing to propose: f is measured as 0.
    assert vm.spec_decode_summary(no_drafts, 500) == vm.SpecDecodeSummary([], 0.0, None)
    assert vm.spec_decode_summary(no_drafts, 0) == vm.SpecDecodeSummary([], None, None)


def _snapshot(generation, drafts=None, per_position=(), buckets=((0.05, 0.0), (INF, 0.0))):
    spec_decode = None
    if drafts is not None:
        spec_decode = vm.SpecDecodeCounts(drafts, drafts * len(per_position), sum(per_position), per_position)
    return vm.VllmSnapshot(running=1, waiting=0, kv_cache_usage=0.1, generation_tokens=generation,
                           spec_decode=spec_decode, tpot_buckets=buckets)


def test_window_increase_survives_a_restart_and_sd_switching_on():
    snapshots = [
        _snapshot(100, buckets=((0.05, 2.0), (INF, 2.0))),
        _snapshot(150, buckets=((0.05, 4.0), (INF, 5.0))),
        # Restarted with SD on (K=2): every counter starts again from 0.
        _snapshot(30, drafts=10, per_position=(8, 4), buckets=((0.05, 1.0), (INF, 1.0))),
        _snapshot(60, drafts=20, per_position=(16, 9), buckets=((0.05, 1.0), (INF, 3.0))),
    ]
    increase = vm.window_increase(snapshots)
    assert increase.generation_tokens == 50 + 30 + 30
    assert increase.spec_decode == vm.SpecDecodeCounts(20, 40, 25, (16, 9))
    assert increase.tpot_buckets == ((0.05, 2.0 + 1.0), (INF, 3.0 + 1.0 + 2.0))


def test_counter_increases_add_up_over_pods_of_different_k():
    a = vm.CounterIncrease(10, vm.SpecDecodeCounts(4, 12, 5, (3, 1, 1)), ((0.05, 1.0), (INF, 2.0)))
    b = vm.CounterIncrease(20, vm.SpecDecodeCounts(6, 6, 3, (3,)), ((0.05, 2.0), (INF, 2.0)))
    off = vm.CounterIncrease(5, None, ())
    total = a + b + off
    assert total.generation_tokens == 35
    assert total.spec_decode == vm.SpecDecodeCounts(10, 18, 8, (6, 1, 1))
    assert total.tpot_buckets == ((0.05, 3.0), (INF, 4.0))


def test_concurrency_histogram_weights_whole_requests():
    assert vm.concurrency_histogram([2, 2.0000001, 3, 1, math.nan]) == [(1.0, 0.25), (2.0, 0.5), (3.0, 0.25)]
    assert vm.concurrency_histogram([]) == []


TWO_ENGINES = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 5.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="1",model_name="m"} 0.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.2
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.4
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="m"} 100.0
vllm:generation_tokens_total{engine="1",model_name="m"} 50.0
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 10.0
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 20.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 20.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_total{engine="1",model_name="m"} 10.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="1",model_name="m",position="1"} 3.0
# TYPE vllm:request_time_per_output_token_seconds histogram
vllm:request_time_per_output_token_seconds_bucket{engine="0",le="0.05",model_name="m"} 2.0
vllm:request_time_per_output_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 3.0
vllm:request_time_per_output_token_seconds_bucket{engine="1",le="0.05",model_name="m"} 1.0
vllm:request_time_per_output_token_seconds_bucket{engine="1",le="+Inf",model_name="m"} 1.0
vllm:request_time_per_output_token_seconds_count{engine="0",model_name="m"} 3.0
vllm:request_time_per_output_token_seconds_sum{engine="0",model_name="m"} 0.3
"""


def test_parse_snapshot_adds_up_a_pods_engines():
    snapshot = vm.parse_snapshot(TWO_ENGINES)
    assert snapshot.running == 8
    assert snapshot.waiting == 1
    assert snapshot.kv_cache_usage == pytest.approx(0.3)
    assert snapshot.generation_tokens == 150
    assert snapshot.spec_decode == vm.SpecDecodeCounts(20, 40, 22, (15, 7))
    assert snapshot.tpot_buckets == ((0.05, 3.0), (INF, 4.0))


def test_parse_snapshot_without_sd_and_of_a_page_that_is_not_vllm():
    without_sd = "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\n"
    assert vm.parse_snapshot(without_sd).spec_decode is None
    with pytest.raises(ValueError, match="no vllm:num_requests_running"):
        vm.parse_snapshot("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 1.5\n")


def test_exporter_counters_follow_the_configured_rates():
    now = [0.0]
    state = VllmMetricsState(clock=lambda: now[0])
    state.set_rates(request_steps_per_second=100, drafts_per_step=0.5, acceptance_per_position=[0.8, 0.4],
                    finished_requests_per_second=2, tpot_s=0.03)
    now[0] = 10.0
    state.set_rates(request_steps_per_second=50)
    now[0] = 20.0
    snapshot = vm.parse_snapshot(render_metrics(state).decode())
    steps = 100 * 10 + 50 * 10
    drafts = 0.5 * steps
    assert snapshot.spec_decode == vm.SpecDecodeCounts(
        drafts=pytest.approx(drafts), draft_tokens=pytest.approx(2 * drafts), accepted_tokens=pytest.approx(
            1.2 * drafts), accepted_per_position=pytest.approx((0.8 * drafts, 0.4 * drafts)))
    assert snapshot.generation_tokens == pytest.approx(steps + 1.2 * drafts)
    assert snapshot.tpot_buckets[2] == (0.05, pytest.approx(40.0))  # 30 ms lies in (25 ms, 50 ms]
    assert snapshot.tpot_buckets[1] == (0.025, 0.0)

    state.restart()
    restarted = vm.parse_snapshot(render_metrics(state).decode())
    assert restarted.generation_tokens == 0
    assert restarted.spec_decode == vm.SpecDecodeCounts(0, 0, 0, (0, 0))


def test_exporter_hides_spec_decode_counters_while_sd_is_off():
    state = VllmMetricsState()
    text = render_metrics(state).decode()
    assert vm.SPEC_DECODE_DRAFTS_TOTAL not in text
    assert 'vllm:cache_config_info{block_size="16"' in text


def test_acceptance_from_a_handful_of_drafts_is_not_measured():
    """A schedule that drafts only in the few steps whose batch dips below its crossover leaves a handful of
    drafts in a window: their rate is noise, and it must not read as drift from the profile."""
    few = vm.SpecDecodeCounts(drafts=vm.MIN_DRAFTS_FOR_ACCEPTANCE - 1, draft_tokens=99, accepted_tokens=40,
                              accepted_per_position=(40,))
    summary = vm.spec_decode_summary(few, generation_tokens=2000)
    assert summary.acceptance_per_position == [] and summary.mean_acceptance_length is None
    assert summary.drafts_per_step == pytest.approx(99 / 1960)
    enough = vm.SpecDecodeCounts(drafts=vm.MIN_DRAFTS_FOR_ACCEPTANCE, draft_tokens=100, accepted_tokens=70,
                                 accepted_per_position=(70,))
    assert vm.spec_decode_summary(enough, 2000).acceptance_per_position == pytest.approx([0.7])
