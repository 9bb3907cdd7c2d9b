"""Default acceptance of speculative drafts, per method and workload: the twin's prior before profiling.

An `AcceptanceProfile` holds, for chain drafts, p_j = P(draft token j is accepted | a draft was made),
which is also P(at least j tokens accepted) and so non-increasing in j, and f = drafts per request-step
(1 for model-based drafters; the share of request-steps where n-gram / suffix matching found a proposal).
Tokens per step with k drafts E_k is `specpilot.specdec.tokens_per_step`. A k-draft run accepts min(a, k) tokens
where a is what a longer run accepts (prefix truncation), so one vector serves every k.

The defaults are estimates anchored to published measurements (sources beside each table); measured
profiles replace them. Positions past the table continue its last ratio.
"""

from __future__ import annotations

import dataclasses

from .. import specdec
from ..api.methods import METHOD_FAMILIES

__all__ = [
    "METHODS",
    "WORKLOADS",
    "AcceptanceProfile",
    "acceptance_profile",
    "expected_tokens_per_step",
]

METHODS = METHOD_FAMILIES
"""The method families with acceptance priors: api.methods.METHOD_FAMILIES (checked below)."""
WORKLOADS = ("sharegpt", "humaneval", "json-extraction", "random")
_MAX_K = 64


@dataclasses.dataclass(frozen=True, slots=True)
class AcceptanceProfile:
    """Per-position acceptance p_1..p_K of chain drafts and the drafts made per request-step."""

    per_position: tuple[float, ...]
    drafts_per_step: float = 1.0

    def __post_init__(self) -> None:
        previous = 1.0
        for j, p in enumerate(self.per_position, start=1):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"per_position[{j - 1}] must be within [0, 1] (got {p})")
            if p > previous + 1e-12:
                raise ValueError(
                    f"per_position must be non-increasing (position {j}: {p} > position {j - 1}: {previous}); "
                    f"a chain draft accepts token j only if it accepted every earlier one"
                )
            previous = p
        if not 0.0 < self.drafts_per_step <= 1.0:
            raise ValueError(f"drafts_per_step must be within (0, 1] (got {self.drafts_per_step})")

    @property
    def max_k(self) -> int:
        return len(self.per_position)

    def tokens_per_step(self, k: int) -> float:
        """E_k (`specpilot.specdec.tokens_per_step`)."""
        return expected_tokens_per_step(self, k)

    def truncated(self, k: int) -> AcceptanceProfile:
        """The profile a k-draft run would show (prefix truncation)."""
        if not 0 <= k <= self.max_k:
            raise ValueError(f"k must be within 0..{self.max_k} (got {k})")
        return AcceptanceProfile(self.per_position[:k], self.drafts_per_step)


def expected_tokens_per_step(profile: AcceptanceProfile, k: int) -> float:
    """Expected tokens a sequence gains per step with k drafts: E_k (`specpilot.specdec.tokens_per_step`)."""
    if not 0 <= k <= profile.max_k:
        raise ValueError(f"k must be within 0..{profile.max_k} (the profile's positions); got {k}")
    return specdec.tokens_per_step(profile.per_position, profile.drafts_per_step, k)


# (per-position p_1..p_8, drafts per request-step f) per method and workload.
_TABLES: dict[str, dict[str, tuple[tuple[float, ...], float]]] = {
    # EAGLE-3 (arXiv 2503.01840) on Llama-3.1-8B; chain drafts as vLLM runs them. vLLM issue #20780
    # measured acceptance length (AL) on H100, MT-bench, greedy, chat template: AL(2..7) = 2.36, 2.79,
    # 3.08, 3.32, 3.46, 3.54, i.e. p ~ (0.78, 0.58, 0.43, 0.29, 0.24, 0.14, 0.08). json-extraction takes
    # those; ShareGPT through `vllm bench serve` (raw multi-turn text, no tuned system prompt) is set ~10%
    # lower per position; HumanEval higher (the paper's code acceptance length exceeds MT-bench's).
    "eagle3": {
        "sharegpt": ((0.70, 0.47, 0.31, 0.20, 0.13, 0.08, 0.05, 0.03), 1.0),
        "humaneval": ((0.82, 0.64, 0.50, 0.38, 0.28, 0.20, 0.14, 0.10), 1.0),
        "json-extraction": ((0.78, 0.58, 0.43, 0.31, 0.22, 0.15, 0.10, 0.07), 1.0),
        "random": ((0.40, 0.16, 0.06, 0.025, 0.01, 0.004, 0.002, 0.001), 1.0),
    },
    # EAGLE (arXiv 2401.15077), checkpoint yuhuili/EAGLE-LLaMA3.1-Instruct-8B; vLLM issue #20780 AL(2..7)
    # = 2.10, 2.29, 2.39, 2.43, 2.45, 2.47 on MT-bench, i.e. p ~ (0.68, 0.42, 0.19, 0.10, 0.04, 0.02).
    "eagle": {
        "sharegpt": ((0.62, 0.35, 0.15, 0.07, 0.03, 0.015, 0.01, 0.005), 1.0),
        "humaneval": ((0.74, 0.50, 0.28, 0.16, 0.09, 0.05, 0.03, 0.02), 1.0),
        "json-extraction": ((0.68, 0.42, 0.19, 0.10, 0.04, 0.02, 0.015, 0.01), 1.0),
        "random": ((0.32, 0.10, 0.03, 0.01, 0.003, 0.001, 0.0005, 0.0002), 1.0),
    },
    # Medusa (arXiv 2401.10774): Medusa-1 heads' top-1 accuracy on Vicuna-7B falls from ~0.6 (head 1) to
    # ~0.4, ~0.3, ~0.25; a chain accepts head j only if heads 1..j-1 were right, hence the cumulative decay.
    "medusa": {
        "sharegpt": ((0.58, 0.32, 0.17, 0.09, 0.05, 0.03, 0.015, 0.008), 1.0),
        "humaneval": ((0.66, 0.41, 0.25, 0.15, 0.09, 0.05, 0.03, 0.02), 1.0),
        "json-extraction": ((0.62, 0.36, 0.20, 0.11, 0.06, 0.035, 0.02, 0.01), 1.0),
        "random": ((0.28, 0.07, 0.02, 0.005, 0.001, 0.0005, 0.0002, 0.0001), 1.0),
    },
    # MTP (DeepSeek-V3 report, arXiv 2412.19437): the second token is accepted 85-90% of the time across
    # topics; later positions reuse the one MTP layer recursively and decay like an EAGLE head.
    "mtp": {
        "sharegpt": ((0.86, 0.62, 0.43, 0.29, 0.19, 0.12, 0.08, 0.05), 1.0),
        "humaneval": ((0.90, 0.71, 0.54, 0.40, 0.29, 0.21, 0.15, 0.10), 1.0),
        "json-extraction": ((0.88, 0.66, 0.48, 0.34, 0.24, 0.16, 0.11, 0.07), 1.0),
        "random": ((0.50, 0.22, 0.09, 0.035, 0.013, 0.005, 0.002, 0.001), 1.0),
    },
    # Draft model Llama-3.2-1B for Llama-3.1-8B / 3.3-70B: per-token acceptance ~0.7 on chat, higher on
    # code (SmartSpec, arXiv 2406.14066, reports 0.6-0.8 token acceptance for small same-family drafters on
    # chat/arxiv/code); vLLM SD blog (Oct 2024): a draft model gives up to 1.5x on ShareGPT at low QPS.
    "draft_model": {
        "sharegpt": ((0.72, 0.52, 0.37, 0.27, 0.19, 0.14, 0.10, 0.07), 1.0),
        "humaneval": ((0.80, 0.64, 0.51, 0.41, 0.33, 0.26, 0.21, 0.17), 1.0),
        "json-extraction": ((0.78, 0.61, 0.48, 0.37, 0.29, 0.23, 0.18, 0.14), 1.0),
        "random": ((0.40, 0.16, 0.06, 0.025, 0.01, 0.004, 0.002, 0.001), 1.0),
    },
    # N-gram prompt lookup: proposes only when the last tokens re-occur in the context (f < 1), and a
    # match that is found is often long. vLLM SD blog (Oct 2024): up to 2.8x on CNN/DailyMail summarisation,
    # little on chat. vLLM PR #24344 measured p = 0.81, 0.74, 0.70, 0.68, 0.66 with proposals on ~55% of
    # steps on a code-editing set (drafts 993 vs 5376 tokens), the shape used for json-extraction here.
    "ngram": {
        "sharegpt": ((0.50, 0.34, 0.24, 0.17, 0.12, 0.09, 0.07, 0.05), 0.30),
        "humaneval": ((0.60, 0.45, 0.35, 0.27, 0.21, 0.17, 0.13, 0.10), 0.45),
        "json-extraction": ((0.86, 0.79, 0.74, 0.70, 0.67, 0.64, 0.61, 0.58), 0.80),
        "random": ((0.15, 0.04, 0.01, 0.003, 0.001, 0.0003, 0.0001, 0.00005), 0.05),
    },
    # Suffix decoding (Arctic Inference, arXiv 2411.04975): a suffix tree over the prompt and earlier
    # outputs matches more often than prompt lookup and speculates adaptively longer on repetitive text.
    "suffix": {
        "sharegpt": ((0.55, 0.38, 0.27, 0.20, 0.15, 0.11, 0.08, 0.06), 0.40),
        "humaneval": ((0.65, 0.50, 0.39, 0.31, 0.25, 0.20, 0.16, 0.13), 0.55),
        "json-extraction": ((0.90, 0.83, 0.77, 0.72, 0.68, 0.64, 0.61, 0.58), 0.90),
        "random": ((0.18, 0.05, 0.015, 0.004, 0.001, 0.0003, 0.0001, 0.00005), 0.06),
    },
}


if set(_TABLES) != set(METHOD_FAMILIES):  # one list of families, in api.methods
    raise ImportError(f"acceptance priors for {sorted(_TABLES)} but api.methods.METHOD_FAMILIES is "
                      f"{sorted(METHOD_FAMILIES)}")


def acceptance_profile(method: str, workload: str, max_k: int) -> AcceptanceProfile:
    """The default profile of `method` on `workload`, with positions 1..max_k."""
    table = _TABLES.get(method)
    if table is None:
        raise ValueError(f"unknown speculative method {method!r}; use one of {', '.join(METHODS)}")
    entry = table.get(workload)
    if entry is None:
        raise ValueError(f"unknown workload {workload!r}; use one of {', '.join(WORKLOADS)}")
    if not 0 <= max_k <= _MAX_K:
        raise ValueError(f"max_k must be within 0..{_MAX_K} (got {max_k})")
    per_position, drafts_per_step = entry
    values = list(per_position[:max_k])
    ratio = min(1.0, per_position[-1] / per_position[-2])
    while len(values) < max_k:
        values.append(values[-1] * ratio)
    return AcceptanceProfile(tuple(values), drafts_per_step)
