"""Every PromQL query the observer sends, as small functions a platform team can read and reuse.

A pool's pods are selected by namespace and a pod-name regex (the serving Deployment `<sdep>-<pool>`
names its pods `<sdep>-<pool>-<replicaset hash>-<suffix>`). For a pool `chat-h100` in namespace `llm`,
a 300 s window, a 10 s sampling step and 180 s staleness, the observer asks:

    newest sample      max(max_over_time(timestamp(vllm:num_requests_running{S})[300s:10s]))
    replicas reporting count(count_over_time(vllm:num_requests_running{S}[180s]))
    running / replica  avg_over_time(avg(sum by (pod) (vllm:num_requests_running{S}))[300s:10s])
    running, pool      avg_over_time(sum(vllm:num_requests_running{S})[300s:10s])
    KV cache usage     avg_over_time(avg(vllm:kv_cache_usage_perc{S})[300s:10s])
    tokens / s         sum(rate(vllm:generation_tokens_total{S}[300s]))
    counter increase   sum(increase(vllm:spec_decode_num_drafts_total{S}[300s]))
    per position       sum by (position) (increase(vllm:spec_decode_num_accepted_tokens_per_pos_total{S}[300s]))
    TPOT p95           histogram_quantile(0.95,
                         sum by (le) (rate(vllm:request_time_per_output_token_seconds_bucket{S}[300s])))
    concurrency        sum by (pod) (vllm:num_requests_running{S})   as a range query, step 10s

and, once for a deployment whose status keeps no demand history yet (its fleet planner's forecast starts from
it), over all of its pools' pods `^(?:chat-a100|chat-h100)-[a-z0-9]+-[a-z0-9]+$`:

    demand history     sum(rate(vllm:generation_tokens_total{S}[300s]))   as a range query over the last
                                                                          30 min, step 28.125s

where S is `namespace="llm",pod=~"^chat-h100-[a-z0-9]+-[a-z0-9]+$"`. Gauges are time-averaged through a
subquery so that a pool total is the average of the pool's sum at each step (pods that come and go count
only while they are up); counters use increase()/rate(), which handle pod restarts. A pod with several
engines (data parallel) is summed into one replica.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from specpilot import vllm_page


def pool_pod_regex(deployment_name: str) -> str:
    """Regex for the pods of a Deployment: `<deployment>-<replicaset hash>-<pod suffix>`.

    Anchored and without dashes in the two generated parts, so the pods of `chat-l4` do not match the
    pods of a Deployment `chat-l4-big`.
    """
    return f"^{_literal(deployment_name)}-[a-z0-9]+-[a-z0-9]+$"


def pods_regex(deployment_names: Sequence[str]) -> str:
    """Regex for the pods of several Deployments (a deployment's pools), each as `pool_pod_regex` anchors it."""
    return f"^(?:{'|'.join(_literal(name) for name in deployment_names)})-[a-z0-9]+-[a-z0-9]+$"


def _literal(name: str) -> str:
    """A Kubernetes name as a regex matching only itself. Names hold [a-z0-9.-]; escaping only what is special
    keeps the regex readable."""
    return "".join(c if c.isalnum() or c == "-" else re.escape(c) for c in name)


def pod_selector(namespace: str, pod_name_regex: str, *, namespace_label: str = "namespace",
                 pod_label: str = "pod") -> str:
    """Label matchers for a pool's pods: `{namespace="llm",pod=~"^chat-h100-...$"}`."""
    return f"{{{namespace_label}={_string(namespace)},{pod_label}=~{_string(pod_name_regex)}}}"


def newest_sample_time(selector: str, window_s: float, step_s: float) -> str:
    """Unix time of the pool's newest running-requests sample inside the window (empty: no series).

    A subquery because timestamp() needs an instant vector; after a failed scrape Prometheus writes a
    staleness marker, so a stopped pod drops out instead of repeating its last sample.
    """
    return (f"max(max_over_time(timestamp({vllm_page.NUM_REQUESTS_RUNNING}{selector})"
            f"[{duration(window_s)}:{duration(step_s)}]))")


def replicas_reporting(selector: str, recent_s: float) -> str:
    """Number of pods with at least one running-requests sample in the last `recent_s` seconds."""
    return f"count(count_over_time({vllm_page.NUM_REQUESTS_RUNNING}{selector}[{duration(recent_s)}]))"


def mean_per_replica(metric: str, selector: str, window_s: float, step_s: float, pod_label: str = "pod") -> str:
    """Time-average over the window of the mean, across pods, of a per-pod gauge (engines summed)."""
    return (f"avg_over_time(avg(sum by ({pod_label}) ({metric}{selector}))"
            f"[{duration(window_s)}:{duration(step_s)}])")


def pool_total(metric: str, selector: str, window_s: float, step_s: float) -> str:
    """Time-average over the window of the pool's summed gauge."""
    return f"avg_over_time(sum({metric}{selector})[{duration(window_s)}:{duration(step_s)}])"


def mean_gauge(metric: str, selector: str, window_s: float, step_s: float) -> str:
    """Time-average over the window of the mean of a gauge across all of the pool's series."""
    return f"avg_over_time(avg({metric}{selector})[{duration(window_s)}:{duration(step_s)}])"


def pool_rate(counter: str, selector: str, window_s: float) -> str:
    """Per-second growth of a counter over the window, summed over the pool."""
    return f"sum(rate({counter}{selector}[{duration(window_s)}]))"


def pool_increase(counter: str, selector: str, window_s: float) -> str:
    """Growth of a counter over the window, summed over the pool (empty when no pod exports it)."""
    return f"sum(increase({counter}{selector}[{duration(window_s)}]))"


def pool_increase_by(counter: str, label: str, selector: str, window_s: float) -> str:
    """Growth of a counter over the window per value of `label`, summed over the pool."""
    return f"sum by ({label}) (increase({counter}{selector}[{duration(window_s)}]))"


def pool_quantile(q: float, histogram: str, selector: str, window_s: float) -> str:
    """The q-quantile of a histogram's observations in the window, over the whole pool."""
    return f"histogram_quantile({q:g}, sum by (le) (rate({histogram}_bucket{selector}[{duration(window_s)}])))"


def running_per_pod(selector: str, pod_label: str = "pod") -> str:
    """Each pod's running requests (engines summed): the series of the concurrency range query."""
    return f"sum by ({pod_label}) ({vllm_page.NUM_REQUESTS_RUNNING}{selector})"


def duration(seconds: float) -> str:
    """A PromQL duration: `300s`, or milliseconds (`1500ms`) when not a whole number of seconds."""
    milliseconds = max(1, round(seconds * 1000))
    return f"{milliseconds // 1000}s" if milliseconds % 1000 == 0 else f"{milliseconds}ms"


def _string(value: str) -> str:
    """A double-quoted PromQL string literal (Go escaping: backslashes and quotes)."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
