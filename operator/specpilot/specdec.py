"""The speculative-decoding arithmetic, each quantity defined once.

Imported by every reader of vLLM's counters and every model of a step: the benchmark Job
(`specpilot_bench.sweep`, `specpilot_bench.profiles`), live observation (`observe.vllm_metrics`), the planner
(`policy.surface`, `policy.planner`), the twin (`perf.acceptance`, `perf.twin`) and the simulator
(`sim.synthetic`). Pure arithmetic on numbers, importing nothing of specpilot, so any layer may use it.

The counters are vLLM's (v1, 0.3x; `vllm/v1/spec_decode/metrics.py`, `SpecDecodingStats`), summed over a run
or increased over a window:

- `num_drafts` (`vllm:spec_decode_num_drafts_total`): one per request per step that verified drafts. Drafts
  proposed after a request's last step are never verified, so never counted;
- `num_draft_tokens`: the draft tokens those steps proposed (num_drafts * k for a chain of k);
- `num_accepted_tokens`: the draft tokens those steps accepted;
- `num_accepted_tokens_per_pos[j]`: the drafts whose token at position j (0-based) was accepted;
- `vllm:generation_tokens_total` counts every output token, including each request's first one, which its
  prefill step samples.

Derived quantities:

- per-position acceptance p_j = num_accepted_tokens_per_pos[j] / num_drafts (vLLM's own rate);
- mean acceptance length = 1 + num_accepted_tokens / num_drafts (vLLM's, tokens per drafted step);
- drafts per request-step f = num_drafts / request-steps. A decode step of one request (a request-step) emits
  one token of its own plus the drafts it accepted, and only decode steps verify drafts, so over finished
  requests request-steps = generated tokens - accepted tokens - finished requests (the finished requests'
  first tokens came from prefill, not from a decode step). Leaving the finished requests out counts one step
  too many per request: f comes out low by about 1 / (decode steps per request), 0.8% for 256-token outputs at
  2 tokens per step. Where they are not known (a live window reads no request counter) pass 0 and accept that
  bias; everything else passes them. f is 1 for model drafters, below 1 for n-gram (it drafts only on a match);
- tokens per step with k drafts E_k = 1 + f * sum_{j<=k} p_j (docs/decisions.md): prefix truncation of a
  K-draft run is exact for chain drafts, a k-draft run accepting min(a, k) where the K run accepted a;
- verified tokens per sequence and step with k drafts q_k = 1 + f * k (what the target model's forward pass
  computes for one sequence).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "acceptance_per_position",
    "drafts_per_request_step",
    "mean_acceptance_length",
    "request_steps",
    "tokens_per_step",
    "tokens_per_step_curve",
    "verified_tokens_per_step",
]


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


def mean_acceptance_length(drafts: float, accepted_tokens: float) -> float:
    """1 + num_accepted_tokens / num_drafts: tokens a drafted request-step emits (drafts must be > 0)."""
    return 1.0 + accepted_tokens / drafts


def acceptance_per_position(drafts: float, accepted_per_position: Sequence[float]) -> list[float]:
    """p_j = num_accepted_tokens_per_pos[j] / num_drafts for every counted position (drafts must be > 0)."""
    return [accepted / drafts for accepted in accepted_per_position]


def tokens_per_step(per_position: Sequence[float], drafts_per_step: float, k: int) -> float:
    """E_k = 1 + f * sum_{j<=k} p_j; positions past the measured ones accept nothing."""
    return 1.0 + drafts_per_step * sum(per_position[:k])


def tokens_per_step_curve(per_position: Sequence[float], drafts_per_step: float, max_k: int) -> tuple[float, ...]:
    """E_0 .. E_max_k (see `tokens_per_step`)."""
    return tuple(tokens_per_step(per_position, drafts_per_step, k) for k in range(max_k + 1))


def verified_tokens_per_step(drafts_per_step: float, k: int) -> float:
    """q_k = 1 + f * k: tokens the target verifies per sequence and step with k drafts."""
    return 1.0 + drafts_per_step * k
