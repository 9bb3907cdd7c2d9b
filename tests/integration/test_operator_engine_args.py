"""The engine arguments the operator writes into a pool's serving Deployment start the real vLLM engine (CPU
build) for every speculative method that engine runs, and it drafts by the schedule they carry.

Each case builds the pool's Deployment with `serving_deployment`, as the operator does once it has decided
(method, K and the schedule `[[1,1,K],[2,256,0]]`), runs the engine container's command line and reads the
engine's own speculative-decoding counters from /metrics:

- one request alone (batch size 1, the schedule's K range): it drafts, K tokens per draft (an n-gram
  drafter may find fewer), and the per-position acceptance counters have K positions, fall with the
  position and add up to the accepted tokens;
- then four requests at once (batch size 4, the schedule's 0 range): only the steps where one of them ran
  alone (while the others arrived or after they finished) may draft. Four requests drafting at every step
  would draft about four times what the one alone did; they must draft at most half of it.

Medusa, which vLLM 0.32 cannot run under a schedule, is served with a constant K, as the operator's restart
strategy serves a method: then the four requests draft K tokens at every step too.

Drafters are the tiny models of `tests/tiny_models.py`. The methods vLLM 0.32's CPU build cannot run
(suffix, mlp_speculator, ngram_gpu) are listed in docs/testing.md with what the engine says.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specpilot.api import SpeculativeDeploymentSpec
from specpilot.api.schedule import from_vllm
from specpilot.manifests.serving import serving_deployment

pytestmark = pytest.mark.vllm

OUTPUT_TOKENS = 48
AT_ONCE = 4
PROMPT = "def add(a, b):"


@dataclass(frozen=True)
class Case:
    method: dict
    """The candidate as a SpeculativeDeployment lists it (model paths filled in by `resolve`)."""
    target: str = "target"
    """Which tiny model the pool serves (a TinyModels field)."""
    drafts_k_tokens: bool = True
    """Every draft has K tokens (a model drafter); an n-gram drafter proposes fewer when its match runs out."""
    dynamic: bool = True
    """Served with the schedule; else with a constant K, as the operator serves a method under the restart
    strategy (one it cannot give a schedule)."""

    @property
    def k(self) -> int:
        return self.method["numSpeculativeTokens"]

    def resolve(self, models) -> dict:
        method = dict(self.method)
        if "model" in method:
            method["model"] = str(getattr(models, method["model"]))
        return method


CASES = {
    # Used by the demo and the examples.
    "ngram": Case({"method": "ngram", "numSpeculativeTokens": 3, "promptLookupMax": 3}, drafts_k_tokens=False),
    "eagle3": Case({"method": "eagle3", "model": "eagle3", "numSpeculativeTokens": 4}),
    # The target drafts for itself (as in test_bench_vllm); draftTensorParallelSize as in the 70B example.
    "draft_model": Case({"method": "draft_model", "model": "target", "numSpeculativeTokens": 3,
                         "draftTensorParallelSize": 1}),
    # Other methods the CPU engine runs with a drafter this small (eagle runs too: left out for time, it is
    # the same proposer as eagle3 in vLLM).
    # vLLM 0.32's Medusa proposer asserts that every step drafts the configured K (spec_decode/medusa.py):
    # under a schedule the engine dies at the first step whose K differs. So a constant K.
    "medusa": Case({"method": "medusa", "model": "medusa", "numSpeculativeTokens": 3}, dynamic=False),
    # MiMo's MTP layer predicts one token (vLLM asserts spec_step_idx == 0 for it).
    "mtp": Case({"method": "mtp", "numSpeculativeTokens": 1}, target="mtp_target"),
}


@dataclass(frozen=True)
class Counters:
    drafts: float
    draft_tokens: float
    accepted: float
    accepted_per_position: dict[int, float]

    def __sub__(self, before: Counters) -> Counters:
        return Counters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                        self.accepted - before.accepted,
                        {p: v - before.accepted_per_position.get(p, 0) for p, v in self.accepted_per_position.items()})


async def counters(session: aiohttp.ClientSession, base_url: str) -> Counters:
    """The engine's speculative-decoding counters (vllm:spec_decode_*_total)."""
    async with session.get(f"{base_url}/metrics") as response:
        text = await response.text()
    totals: dict[str, float] = {}
    per_position: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:spec_decode_num_accepted_tokens_per_pos_total":
                per_position[int(sample.labels["position"])] = sample.value
            elif sample.name.startswith("vllm:spec_decode_") and sample.name.endswith("_total"):
                totals[sample.name] = sample.value
    return Counters(totals["vllm:spec_decode_num_drafts_total"], totals["vllm:spec_decode_num_draft_tokens_total"],
                    totals["vllm:spec_decode_num_accepted_tokens_total"], per_position)


async def complete(session: aiohttp.ClientSession, base_url: str, model: str) -> int:
    """One greedy completion of exactly OUTPUT_TOKENS tokens; returns the tokens generated."""
    async with session.post(f"{base_url}/v1/completions", json={
            "model": model, "prompt": PROMPT, "max_tokens": OUTPUT_TOKENS, "temperature": 0,
            "ignore_eos": True}) as response:
        assert response.status == 200, await response.text()
        return (await response.json())["usage"]["completion_tokens"]


@pytest.mark.parametrize("name", list(CASES))
async def test_pool_deployment_args_start_the_real_engine_and_draft_by_the_schedule(
        name, tiny_models, cpu_engine_args, engine_env, tmp_path):
    from specpilot_bench.engine import LaunchedEngine, free_port

    case = CASES[name]
    port = free_port()
    spec = SpeculativeDeploymentSpec.model_validate({
        "model": {"id": str(getattr(tiny_models, case.target)), "servedName": "tiny", "maxModelLen": 512,
                  "extraArgs": [a for a in cpu_engine_args if a not in ("--max-model-len", "512")]},
        "methods": [case.resolve(tiny_models)],
        "gpuPools": [{"name": "cpu", "nodeSelector": {}}],
        "serving": {"port": port},
    })
    k = case.k
    schedule = from_vllm([[1, 1, k], [2, 256, 0]]) if case.dynamic else None
    deployment = serving_deployment(sdep_name="tiny", namespace="team", uid="u1", spec=spec, pool=spec.gpu_pools[0],
                                    method=spec.methods[0], num_speculative_tokens=k, schedule=schedule,
                                    replicas=1)
    engine = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "engine")
    command = [sys.executable if part == "python3" else part for part in engine["command"]] + engine["args"]

    async with LaunchedEngine(command, port, tmp_path / "engine.log", 240, env=engine_env) as info, \
            aiohttp.ClientSession() as session:
        assert info.model_id == "tiny"
        start = await counters(session, info.base_url)
        assert await complete(session, info.base_url, "tiny") == OUTPUT_TOKENS
        after_alone = await counters(session, info.base_url)
        tokens = await asyncio.gather(*[complete(session, info.base_url, "tiny") for _ in range(AT_ONCE)])
        assert tokens == [OUTPUT_TOKENS] * AT_ONCE
        after_batch = await counters(session, info.base_url)

    alone, batch = after_alone - start, after_batch - after_alone
    # Batch size 1: the schedule's K.
    assert alone.drafts > 0, f"{name}: one request alone drafted nothing"
    if case.drafts_k_tokens:
        assert alone.draft_tokens == k * alone.drafts, f"{name}: drafts of other than K={k} tokens: {alone}"
    else:
        assert 0 < alone.draft_tokens <= k * alone.drafts, alone
    assert sorted(alone.accepted_per_position) == list(range(k))
    per_position = [alone.accepted_per_position[p] for p in range(k)]
    assert per_position == sorted(per_position, reverse=True)
    assert sum(per_position) == alone.accepted <= alone.draft_tokens
    if not case.dynamic:
        # A constant K: every request drafts K tokens at every step, alone or not.
        assert batch.drafts > alone.drafts and batch.draft_tokens == k * batch.drafts, (alone, batch)
        return
    # Batch size 4: the schedule's 0.
    assert batch.drafts <= alone.drafts / 2, (
        f"{name}: {AT_ONCE} requests at once drafted {batch.drafts:g} times, one alone {alone.drafts:g}: "
        "the engine speculated at batch size > 1, where the schedule says 0")
    assert batch.draft_tokens <= k * batch.drafts
