"""Request lengths per workload for the fleet simulator: prompt and output token distributions.

Means follow what the benchmark Job sends (`sim.synthetic.PROMPT_TOKENS` for prompts), so the profiles the
policies plan from and the traffic the fleet serves agree. Shapes: ShareGPT's first turns are heavy-tailed
(log-normal, wide); HumanEval prompts are function stubs and outputs short functions (narrower);
json-extraction sends a long record and gets a short answer; `random` is vLLM's random dataset (uniform
within +-10%). Each request also draws an acceptance factor (log-normal, mean 1) that scales its accepted
draft tokens: some texts are easier to guess than others, which spreads TPOT across requests.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .synthetic import PROMPT_TOKENS

__all__ = ["WORKLOAD_LENGTHS", "LengthDistribution", "RequestLengths", "request_lengths"]

MAX_PROMPT_TOKENS = 16384
MAX_OUTPUT_TOKENS = 4096


@dataclasses.dataclass(frozen=True)
class LengthDistribution:
    """Token counts with a given mean: log-normal with `sigma`, or uniform within +-`spread` when `uniform`."""

    mean: float
    sigma: float = 0.0
    uniform: bool = False
    spread: float = 0.1
    low: int = 1
    high: int = MAX_OUTPUT_TOKENS

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.uniform:
            values = rng.uniform(self.mean * (1 - self.spread), self.mean * (1 + self.spread), n)
        elif self.sigma > 0:
            # median chosen so the (unclipped) mean is `mean`
            values = rng.lognormal(np.log(self.mean) - self.sigma**2 / 2, self.sigma, n)
        else:
            values = np.full(n, self.mean)
        return np.clip(np.rint(values), self.low, self.high).astype(np.int32)


@dataclasses.dataclass(frozen=True)
class RequestLengths:
    """Prompt and output length distributions of one workload, and the per-request acceptance spread."""

    workload: str
    prompt: LengthDistribution
    output: LengthDistribution
    acceptance_sigma: float = 0.3

    @property
    def mean_prompt_tokens(self) -> int:
        return int(round(self.prompt.mean))

    @property
    def mean_output_tokens(self) -> int:
        return int(round(self.output.mean))

    def sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(prompt tokens, output tokens >= 2, acceptance factor) for n requests."""
        prompt = self.prompt.sample(rng, n)
        output = self.output.sample(rng, n)
        factor = rng.lognormal(-self.acceptance_sigma**2 / 2, self.acceptance_sigma, n)
        return prompt, output, factor


def _prompt(workload: str, sigma: float = 0.0, uniform: bool = False) -> LengthDistribution:
    return LengthDistribution(PROMPT_TOKENS[workload], sigma=sigma, uniform=uniform, low=4,
                              high=MAX_PROMPT_TOKENS)


WORKLOAD_LENGTHS: dict[str, RequestLengths] = {
    "sharegpt": RequestLengths("sharegpt", _prompt("sharegpt", sigma=0.9),
                               LengthDistribution(256, sigma=0.8, low=2), acceptance_sigma=0.3),
    "humaneval": RequestLengths("humaneval", _prompt("humaneval", sigma=0.35),
                                LengthDistribution(192, sigma=0.5, low=2), acceptance_sigma=0.25),
    "json-extraction": RequestLengths("json-extraction", _prompt("json-extraction", sigma=0.3),
                                      LengthDistribution(128, sigma=0.4, low=2), acceptance_sigma=0.2),
    "random": RequestLengths("random", _prompt("random", uniform=True),
                             LengthDistribution(256, uniform=True, low=2), acceptance_sigma=0.1),
}


def request_lengths(workload: str) -> RequestLengths:
    try:
        return WORKLOAD_LENGTHS[workload]
    except KeyError:
        raise ValueError(f"unknown workload {workload!r}; use one of {', '.join(WORKLOAD_LENGTHS)}") from None
