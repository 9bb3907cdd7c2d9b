"""The observer's PromQL: which pods a pool selects, and how values are quoted into queries."""

from __future__ import annotations

import re

import pytest

from specpilot.observe import promql


@pytest.mark.parametrize(("pod", "belongs"), [
    ("chat-l4-7d9f8b6c5-abcde", True),
    ("chat-l4-big-7d9f8b6c5-abcde", False),  # the pool chat-l4-big of the same deployment
    ("chat-l4-7d9f8b6c5", False),  # not a Deployment's pod name
    ("xchat-l4-7d9f8b6c5-abcde", False),
    ("chat-l4-7d9f8b6c5-abcde-extra", False),
])
def test_pool_pod_regex_selects_only_the_deployments_pods(pod, belongs):
    # PromQL anchors regexes itself; the explicit anchors make the pattern mean the same everywhere.
    assert bool(re.search(promql.pool_pod_regex("chat-l4"), pod)) is belongs


def test_pool_pod_regex_escapes_dots():
    regex = promql.pool_pod_regex("chat.v1-l4")
    assert re.search(regex, "chat.v1-l4-5f6d7-abcde")
    assert not re.search(regex, "chatxv1-l4-5f6d7-abcde")


def test_pod_selector_quotes_values_for_promql():
    assert promql.pod_selector("llm", r"^a\.b-[a-z0-9]+$") == r'{namespace="llm",pod=~"^a\\.b-[a-z0-9]+$"}'
    assert promql.pod_selector('we"ird', "x", namespace_label="kubernetes_namespace",
                               pod_label="pod_name") == r'{kubernetes_namespace="we\"ird",pod_name=~"x"}'


def test_durations_are_whole_seconds_or_milliseconds():
    assert promql.duration(300) == "300s"
    assert promql.duration(0.2) == "200ms"
    assert promql.duration(6.25) == "6250ms"
    assert promql.duration(0) == "1ms"


def test_queries_read_as_documented():
    selector = promql.pod_selector("llm", promql.pool_pod_regex("chat-h100"))
    assert promql.pool_quantile(0.95, "vllm:request_time_per_output_token_seconds", selector, 300) == (
        "histogram_quantile(0.95, sum by (le) (rate(vllm:request_time_per_output_token_seconds_bucket"
        '{namespace="llm",pod=~"^chat-h100-[a-z0-9]+-[a-z0-9]+$"}[300s])))')
    assert promql.mean_per_replica("vllm:num_requests_running", selector, 300, 10) == (
        "avg_over_time(avg(sum by (pod) (vllm:num_requests_running"
        '{namespace="llm",pod=~"^chat-h100-[a-z0-9]+-[a-z0-9]+$"}))[300s:10s])')
