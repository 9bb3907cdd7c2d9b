"""vLLM's /metrics page: the metric names as vLLM (v1, 0.3x) serves them, and the one bounded parser of a page.

Every reader and writer of the page takes the names from here: the observer (`observe.vllm_metrics`,
`observe.prometheus`, `observe.promql`), the sandbox package's test exporter (`specpilot_sandbox.exporter`),
simulated engine (`specpilot_sandbox.engine_core`) and demo (`specpilot_sandbox.demo.run`), and the benchmark
Job (`specpilot_bench.metrics`). What the speculative-decoding counters mean, and the rates derived from them,
is `specpilot.specdec`.
Imports nothing of specpilot, so any layer may use it.
"""

from __future__ import annotations

from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"
GENERATION_TOKENS_TOTAL = "vllm:generation_tokens_total"
PROMPT_TOKENS_TOTAL = "vllm:prompt_tokens_total"
NUM_PREEMPTIONS_TOTAL = "vllm:num_preemptions_total"
REQUEST_SUCCESS_TOTAL = "vllm:request_success_total"
SPEC_DECODE_DRAFTS_TOTAL = "vllm:spec_decode_num_drafts_total"
SPEC_DECODE_DRAFT_TOKENS_TOTAL = "vllm:spec_decode_num_draft_tokens_total"
SPEC_DECODE_ACCEPTED_TOKENS_TOTAL = "vllm:spec_decode_num_accepted_tokens_total"
SPEC_DECODE_ACCEPTED_PER_POS_TOTAL = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
POSITION_LABEL = "position"
"""Label of SPEC_DECODE_ACCEPTED_PER_POS_TOTAL: the draft position, "0" .. "K-1"."""
TPOT_SECONDS = "vllm:request_time_per_output_token_seconds"
"""Histogram of each finished request's time per output token (per token even under SD, unlike
ITL_SECONDS, whose samples span a whole engine step)."""
TTFT_SECONDS = "vllm:time_to_first_token_seconds"
ITL_SECONDS = "vllm:inter_token_latency_seconds"
E2E_SECONDS = "vllm:e2e_request_latency_seconds"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
"""Info metric whose labels carry the KV cache's configuration (num_gpu_blocks, block_size, ...)."""
ENGINE_LABEL = "engine"
MODEL_NAME_LABEL = "model_name"

MAX_SAMPLES = 10_000
"""Default bound on samples read from one page (vLLM serves a few hundred)."""

Samples = dict[str, list[tuple[dict[str, str], float]]]
"""A parsed page: sample name -> (labels, value) of each of its samples, in page order."""


class TooManySamples(ValueError):
    """The page holds more samples than allowed: refused as a whole."""


def parse_samples(text: str, *, max_samples: int = MAX_SAMPLES) -> Samples:
    """Reads a page in the Prometheus text format into its samples.

    The page comes from an engine running code the tenant chose, so it is bounded: more than `max_samples`
    samples refuse the page (TooManySamples). Raises ValueError when it is not a page in the text format; the
    message never quotes the page.
    """
    samples: Samples = defaultdict(list)
    count = 0
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                count += 1
                if count > max_samples:
                    raise TooManySamples(f"more than {max_samples} samples (metricsReadLimits.maxSeries): refused")
                samples[sample.name].append((dict(sample.labels), float(sample.value)))
    except TooManySamples:
        raise
    except (ValueError, TypeError, KeyError, IndexError) as error:
        # The parser's own message quotes the offending line: never pass it on.
        raise ValueError("not a page in the Prometheus text format") from error
    return dict(samples)
