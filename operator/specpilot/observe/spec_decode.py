"""The one definition of drafts per request-step, read off vLLM's counters.

Used alike by the benchmark Job (`specpilot_bench.sweep.run_acceptance`, a profile's acceptance), the planner
(`policy.surface.acceptance_from_run`, from a profile's per-level counters) and live observation
(`observe.vllm_metrics.spec_decode_summary`, from counter increases over a window).

What vLLM (v1, 0.3x) counts:

- `vllm:generation_tokens_total` counts every output token, including each request's first one, which its
  prefill step samples;
- `vllm:spec_decode_num_drafts_total` counts one draft per request per step that verified drafts, and
  `vllm:spec_decode_num_accepted_tokens_total` the draft tokens those steps accepted. Drafts proposed after a
  request's last step are never verified, so never counted.

A decode step of one request (a request-step) emits one token of its own plus the drafts it accepted, and
only decode steps verify drafts. So over finished requests

    request-steps = generated tokens - accepted tokens - finished requests

(the finished requests' first tokens came from prefill, not from a decode step), and the share of
request-steps that carried a draft is f = drafts / request-steps. Leaving the finished requests out counts one
step too many per request: f comes out low by about 1 / (decode steps per request), 0.8% for 256-token
outputs at 2 tokens per step. Where the finished requests are not known (a live window reads no request
counter) pass 0 and accept that bias; everything else passes them.
"""

from __future__ import annotations

__all__ = ["drafts_per_request_step", "request_steps"]


def request_steps(generated_tokens: float, accepted_tokens: float, finished_requests: float = 0.0) -> float:
    """Decode steps summed over requests: generated - accepted - finished (see the module)."""
    return generated_tokens - accepted_tokens - finished_requests


def drafts_per_request_step(drafts: float, generated_tokens: float, accepted_tokens: float,
                            finished_requests: float = 0.0) -> float | None:
    """f = drafts / request-steps, capped at 1; None when the counters hold no request-step."""
    steps = request_steps(generated_tokens, accepted_tokens, finished_requests)
    if not steps > 0:
        return None
    return min(1.0, drafts / steps)
