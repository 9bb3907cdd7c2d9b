"""SLO attainment from vLLM's histograms (observe.vllm_metrics.fraction_within, policy.slo): the share of requests
within each SLO, what bucket it rests on, the bounds on the share within both, and the SloAttained condition."""

from __future__ import annotations

import math
from datetime import UTC, datetime

import pytest

from specpilot.api.deployment_spec import Policy
from specpilot.api.deployment_status import ObservedLoad, PoolStatus
from specpilot.observe import vllm_metrics as vm
from specpilot.observe.model import PoolObservation
from specpilot.policy.slo import MIN_REQUESTS, deployment_attainment, missed_event, pool_attainment, slo_condition

INF = math.inf
# 100 requests: 60 within 10 ms, 90 within 25 ms, 98 within 50 ms, 2 above 80 s.
TPOT = ((0.01, 60.0), (0.025, 90.0), (0.05, 98.0), (80.0, 98.0), (INF, 100.0))
# 100 requests: 80 within 0.5 s, 99 within 1 s.
TTFT = ((0.25, 50.0), (0.5, 80.0), (1.0, 99.0), (INF, 100.0))


def observation(tpot=TPOT, ttft=TTFT) -> PoolObservation:
    return PoolObservation(replicas_reporting=2, running_per_replica=4, waiting_per_replica=0, total_running=8,
                           total_waiting=0, generation_tokens_per_second=100.0, tpot_p95_ms=30.0,
                           acceptance_per_position=[], drafts_per_step=None, mean_acceptance_length=None,
                           kv_cache_usage=None, observed_at=datetime(2026, 12, 1, tzinfo=UTC), window_s=300,
                           concurrency_histogram=[], tpot_buckets=tpot, ttft_buckets=ttft)


def test_fraction_within_a_bucket_bound_is_exact_and_between_bounds_interpolated():
    exact = vm.fraction_within(0.025, TPOT)
    assert (exact.fraction, exact.count, exact.lower_le, exact.upper_le) == (0.9, 100.0, 0.01, 0.025)
    between = vm.fraction_within(0.0175, TPOT)  # halfway through (10, 25] ms: 60 + 30/2
    assert between.fraction == pytest.approx(0.75) and (between.lower_le, between.upper_le) == (0.01, 0.025)
    first = vm.fraction_within(0.005, TPOT)  # the first bucket starts at 0
    assert first.fraction == pytest.approx(0.3) and first.lower_le == 0.0
    beyond = vm.fraction_within(100.0, TPOT)  # past the last finite bound: the +Inf bucket is never "within"
    assert beyond.fraction == pytest.approx(0.98) and beyond.upper_le == INF


def test_fraction_within_needs_observations_and_a_whole_histogram():
    assert vm.fraction_within(0.025, ()) is None
    assert vm.fraction_within(0.025, ((0.01, 0.0), (INF, 0.0))) is None
    assert vm.fraction_within(0.025, ((0.01, 3.0), (0.025, 5.0))) is None  # no +Inf bucket
    assert vm.fraction_within(math.nan, TPOT) is None and vm.fraction_within(-1.0, TPOT) is None
    # Counts of separately scraped buckets can dip: read monotonic, as Prometheus does.
    assert vm.fraction_within(0.025, ((0.01, 6.0), (0.025, 5.0), (INF, 10.0))).fraction == pytest.approx(0.6)


def test_a_page_carries_both_latency_histograms():
    page = "\n".join([
        'vllm:num_requests_running{engine="0"} 1',
        'vllm:request_time_per_output_token_seconds_bucket{engine="0",le="0.025"} 3',
        'vllm:request_time_per_output_token_seconds_bucket{engine="0",le="+Inf"} 4',
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5"} 2',
        'vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf"} 4',
    ])
    snapshot, cut = vm.parse_page(page)
    assert snapshot.tpot_buckets == ((0.025, 3.0), (INF, 4.0))
    assert snapshot.ttft_buckets == ((0.5, 2.0), (INF, 4.0)) and cut == ()
    later, _ = vm.parse_page(page.replace("} 2", "} 7").replace('le="+Inf"} 4', 'le="+Inf"} 9'))
    assert vm.window_increase([snapshot, later]).ttft_buckets == ((0.5, 5.0), (INF, 5.0))


def test_a_pools_attainment_per_slo_and_the_bounds_on_both():
    slo = pool_attainment(observation(), Policy(tpot_slo_ms=25, ttft_slo_ms=1000))
    assert (slo.tpot_percent, slo.ttft_percent, slo.requests) == (90.0, 99.0, 100.0)
    assert (slo.tpot_bucket, slo.ttft_bucket) == ("0.01-0.025 s", "0.5-1 s")
    assert (slo.both_at_least_percent, slo.both_at_most_percent) == (89.0, 90.0)
    tpot_only = pool_attainment(observation(), Policy(tpot_slo_ms=50))
    assert tpot_only.ttft_percent is None and tpot_only.both_at_least_percent == tpot_only.tpot_percent == 98.0
    assert pool_attainment(observation(), Policy()) is None  # no SLO stated
    assert pool_attainment(observation(tpot=()), Policy(tpot_slo_ms=25)) is None  # no finished request


def test_the_deployments_attainment_weighs_its_pools_by_their_requests():
    busy = pool_attainment(observation(), Policy(tpot_slo_ms=25, ttft_slo_ms=1000))
    quiet = busy.model_copy(update={"requests": 300.0, "tpot_percent": 50.0, "ttft_percent": 100.0})
    pools = [PoolStatus(name="a", observed=ObservedLoad(slo=busy)), PoolStatus(name="b", observed=ObservedLoad(slo=quiet)),
             PoolStatus(name="c")]
    both = deployment_attainment(pools, Policy(tpot_slo_ms=25, ttft_slo_ms=1000, slo_attainment_percent=95))
    assert both.requests == 400.0 and both.tpot_percent == pytest.approx(60.0)  # (90 x 100 + 50 x 300) / 400
    assert both.ttft_percent == pytest.approx(99.75) and both.target_percent == 95
    assert deployment_attainment([PoolStatus(name="c")], Policy(tpot_slo_ms=25)) is None


@pytest.mark.parametrize("tpot,ttft,expected", [
    (99.6, 99.9, (True, "Attained")),      # at least 99.5 >= 99
    (98.0, 99.9, (False, "Missed")),        # at most 98 < 99
    (99.3, 99.4, (None, "Uncertain")),      # 98.7 .. 99.3 around 99
])
def test_the_condition_says_attained_or_missed_only_where_the_bounds_tell(tpot, ttft, expected):
    slo = pool_attainment(observation(), Policy(tpot_slo_ms=25, ttft_slo_ms=1000)).model_copy(update={
        "tpot_percent": tpot, "ttft_percent": ttft, "both_at_least_percent": round(tpot + ttft - 100, 2),
        "both_at_most_percent": min(tpot, ttft)})
    ok, reason, message = slo_condition(slo, 99, 300)
    assert (ok, reason) == expected
    assert "TPOT" in message and "bucket 0.01-0.025 s" in message
    if ok is False:
        assert "add replicas" in message


def test_too_few_requests_or_none_is_not_judged():
    slo = pool_attainment(observation(), Policy(tpot_slo_ms=25)).model_copy(update={"requests": MIN_REQUESTS - 1})
    assert slo_condition(slo, 99, 300)[:2] == (None, "TooFewRequests")
    assert slo_condition(None, 99, 300)[:2] == (None, "NotMeasured")


def test_one_event_when_the_target_starts_being_missed():
    assert missed_event(False, True, "m").reason == "SloAttainmentLow"
    assert missed_event(True, True, "m") is None and missed_event(False, False, "m") is None
