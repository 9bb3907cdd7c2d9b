"""The engine arguments the operator writes into a pool's Deployment start the real vLLM engine (CPU build)
and speculate by the schedule they carry."""

from __future__ import annotations

import sys

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specpilot.api import SpeculativeDeploymentSpec
from specpilot.api.schedule import from_vllm
from specpilot.manifests.serving import serving_deployment

pytestmark = pytest.mark.vllm


async def test_ngram_pool_deployment_args_start_the_real_engine(tiny_models, cpu_engine_args, engine_env, tmp_path,
                                                                engine_serves):
    from specpilot_bench.engine import LaunchedEngine, free_port

    port = free_port()
    spec = SpeculativeDeploymentSpec.model_validate({
        "model": {"id": str(tiny_models.target), "servedName": "tiny", "maxModelLen": 512,
                  "extraArgs": [a for a in cpu_engine_args if a not in ("--max-model-len", "512")]},
        "methods": [{"method": "ngram", "numSpeculativeTokens": 3, "promptLookupMax": 3}],
        "gpuPools": [{"name": "cpu", "nodeSelector": {}}],
        "serving": {"port": port},
    })
    schedule = from_vllm([[1, 1, 3], [2, 256, 0]])
    deployment = serving_deployment(sdep_name="tiny", namespace="team", uid="u1", spec=spec, pool=spec.gpu_pools[0],
                                    method=spec.methods[0], num_speculative_tokens=3, schedule=schedule,
                                    replicas=1)
    engine = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "engine")
    command = [sys.executable if part == "python3" else part for part in engine["command"]] + engine["args"]

    async with LaunchedEngine(command, port, tmp_path / "engine.log", 240, env=engine_env) as info:
        assert info.model_id == "tiny"
        await engine_serves(info.base_url, "tiny", max_tokens=24)
        async with aiohttp.ClientSession() as session, session.get(f"{info.base_url}/metrics") as response:
            text = await response.text()
    samples = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples
               if not s.labels.get("position")}
    # One request alone is batch size 1: the schedule's K=3 range, so drafts were proposed.
    assert samples.get("vllm:spec_decode_num_drafts_total", 0) > 0
