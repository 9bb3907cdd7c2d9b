"""The engine supervisor: runs in the benchmark pod's engine container and starts or stops the engine when the
bench asks, over loopback HTTP.

The benchmark pod keeps tenant code away from the tokens: the engine (model code, plugins, the tenant's
environment and mounts) runs in the `engine` container, which holds no ServiceAccount token and no result
token; the `bench` container holds both and measures the engine over localhost. A profile needs several
engine starts (the baseline, or the method at k=1 and at its K), so the engine container runs this small
supervisor instead of the engine itself. The bench says only which run: `PUT /engine {"k": K}`. The engine's
command line is fixed by the supervisor's own arguments, which the operator sets: the command (everything
after `--`) and the `--speculative-config` of each k (`--config-for-k K=JSON`). Nothing the bench sends
reaches a command line but the choice among those.

    python3 supervisor.py --listen 127.0.0.1:8090 --config-for-k '4={"method":"ngram",...}' \\
        -- python3 -m vllm.entrypoints.openai.api_server --model M --host 127.0.0.1 --port 8000 ...

Endpoints: `PUT /engine` (body `{"k": int}`: stop the running engine, start the one for k), `GET /engine`
(`{"k", "running", "exitCode", "logTail", "hubAnswer"}`), `DELETE /engine` (stop it), `GET /healthz` (the bench's
heartbeat), `POST /shutdown` (the bench is done: stop the engine and exit 0, so the pod completes).
The bench calls at least every `HEARTBEAT_S`; after `--idle-exit-s` without a call (the bench died without
saying so) the supervisor stops the engine and exits 1, so a pod never holds its GPUs for nothing.

Standard library only, one file: the operator copies it into the engine container (whose image is the
tenant's engine image, which has Python but not specpilot) and runs it with that image's `python3`;
`specpilot-bench engine-supervisor` runs the same code.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

SPECULATIVE_CONFIG_FLAG = "--speculative-config"
MAX_REQUEST_BYTES = 1024
"""A control request is `{"k": 3}`: anything longer is refused unread."""
LOG_TAIL_LINES = 25
LOG_TAIL_BYTES = 8192
TERMINATION_LINES = 10
TERMINATION_BYTES = 4096
"""What the kubelet keeps of a termination message."""
HUB_ANSWER_LINES = 4
HUB_ANSWER_LINE_CHARS = 240
HUB_ANSWER_SCAN_BYTES = 256 * 1024
"""A failed engine's log is searched this far back for the Hugging Face Hub's answer, and at most these lines of it
are kept."""
HUB_ANSWER = re.compile(r"\b40[134] (?:Client Error|Unauthorized|Forbidden|Not Found)\b|gated repo|Not Found for url|"
                        r"is restricted|not a valid (?:model|git) identifier")
"""Lines that carry the Hub's refusal of a download (an HTTP status, a gated, missing or private repository, a
missing revision). Only selected here, for the operator to read (specpilot.policy.model_access decides what they
mean): vLLM wraps the Hub's error in its own, and a traceback later its status has scrolled out of the tail."""
STOP_GRACE_S = 30
HEARTBEAT_S = 30
"""How often the bench calls while it runs (GET /healthz)."""
DEFAULT_IDLE_EXIT_S = 600


def _config_for_k(text: str) -> tuple[int, str]:
    k, sep, config = text.partition("=")
    try:
        value = int(k)
        json.loads(config)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--config-for-k takes K=JSON, e.g. 4='{{\"method\":\"ngram\"}}' "
                                         f"(got {text[:200]!r})") from exc
    if not sep or value < 1:
        raise argparse.ArgumentTypeError(f"--config-for-k takes K=JSON with K >= 1 (got {text[:200]!r})")
    return value, config


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="specpilot-bench engine-supervisor", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", default="127.0.0.1:8090", help="HOST:PORT the control endpoint listens on "
                   "(loopback: only the pod's bench container reaches it)")
    p.add_argument("--config-for-k", type=_config_for_k, action="append", default=[], metavar="K=JSON",
                   help="the engine's --speculative-config for a run at k (repeatable); k=0 runs without one")
    p.add_argument("--idle-exit-s", type=float, default=DEFAULT_IDLE_EXIT_S, help="exit (code 1) after this many "
                   f"seconds without a call from the bench (it calls every {HEARTBEAT_S} s while it runs)")
    p.add_argument("--log-dir", type=Path, default=Path("/tmp/specpilot-engine-logs"),  # noqa: S108 - in the pod
                   help="engine logs go here, one file per start")
    p.add_argument("--termination-log", type=Path, default=Path("/dev/termination-log"),
                   help="where the last lines of an engine that failed go for the kubelet (the container's "
                        "termination message; written only when the file exists, as in a pod)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- the engine's command line (without "
                   "--speculative-config)")
    return p


class Supervisor:
    """One engine process at a time, started for the k the bench asks for."""

    def __init__(self, command: list[str], configs: dict[int, str], log_dir: Path,
                 termination_log: Path | None = None) -> None:
        self.command = command
        self.configs = configs
        self.log_dir = log_dir
        self.termination_log = termination_log
        self.exit_noted: subprocess.Popen | None = None
        self.hub_answer = ""
        self.process: subprocess.Popen | None = None
        self.k: int | None = None
        self.log_path: Path | None = None
        self.starts = 0
        self.lock = threading.Lock()
        self.last_call = time.monotonic()
        self.exit_code: int | None = None

    def command_for(self, k: int) -> list[str]:
        if k == 0:
            return list(self.command)
        return [*self.command, SPECULATIVE_CONFIG_FLAG, self.configs[k]]

    def start(self, k: int) -> None:
        with self.lock:
            self._stop()
            self.starts += 1
            self.log_dir.mkdir(parents=True, exist_ok=True)
            self.log_path = self.log_dir / f"{self.starts:02d}-k{k}.log"
            self.hub_answer = ""
            command = self.command_for(k)
            env = dict(os.environ)
            if env.get("VLLM_CPU_KVCACHE_SPACE", "0").strip() == "":
                env.pop("VLLM_CPU_KVCACHE_SPACE")  # an empty value crashes the CPU engine
            with self.log_path.open("ab") as log:
                log.write(f"$ {' '.join(command)}\n".encode())
                log.flush()
                self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
            self.k = k

    def stop(self) -> None:
        with self.lock:
            self._stop()

    def _stop(self) -> None:
        """SIGTERM to the engine's process group (vLLM shuts down cleanly on it), then SIGKILL."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def state(self) -> dict[str, Any]:
        with self.lock:
            process = self.process
            code = None if process is None else process.poll()
            if code:
                self._note_exit(process, code)
            return {"k": self.k, "running": process is not None and code is None, "exitCode": code,
                    "logTail": self._log_tail(), "hubAnswer": self.hub_answer if code else ""}

    def _note_exit(self, process: subprocess.Popen, code: int) -> None:
        """An engine that failed: its last log lines, after the Hub's answer when the log has one above them, go
        to this container's log and termination message (the kubelet records it in the pod's status, where the
        operator reads why the Job failed). Once per start."""
        if self.exit_noted is process:
            return
        self.exit_noted = process
        tail = "\n".join(self._log_tail().splitlines()[-TERMINATION_LINES:])
        self.hub_answer = "\n".join(line for line in self._hub_lines() if line not in tail)
        head = f"the engine for k={self.k} exited with code {code}"
        if self.hub_answer:
            head += f"; the Hugging Face Hub's answer, earlier in its log:\n{self.hub_answer}\nits log ends with"
        print(f"[engine-supervisor] {head}:\n{tail}", file=sys.stderr, flush=True)
        path = self.termination_log
        if path is not None and path.is_file():
            # The tail gives way: the Hub's answer is what says why, and a long line at the end must not cut it.
            first = f"{head}:\n".encode(errors="replace")[:TERMINATION_BYTES]
            data = first + tail.encode(errors="replace")[-(TERMINATION_BYTES - len(first)):]
            with contextlib.suppress(OSError):
                path.write_bytes(data[:TERMINATION_BYTES])

    def _hub_lines(self) -> list[str]:
        """The first distinct lines of the engine's log (its last HUB_ANSWER_SCAN_BYTES) that carry the Hub's
        refusal of a download (HUB_ANSWER), each cut to HUB_ANSWER_LINE_CHARS."""
        if self.log_path is None:
            return []
        found: list[str] = []
        with contextlib.suppress(OSError), self.log_path.open("rb") as f:
            f.seek(max(0, self.log_path.stat().st_size - HUB_ANSWER_SCAN_BYTES))
            for line in f.read().decode("utf-8", errors="replace").splitlines():
                line = line.strip()[:HUB_ANSWER_LINE_CHARS]
                if HUB_ANSWER.search(line) and line not in found:
                    found.append(line)
                    if len(found) == HUB_ANSWER_LINES:
                        break
        return found

    def _log_tail(self) -> str:
        if self.log_path is None:
            return ""
        with contextlib.suppress(OSError), self.log_path.open("rb") as f:
            f.seek(max(0, self.log_path.stat().st_size - LOG_TAIL_BYTES))
            lines = deque(f.read().decode("utf-8", errors="replace").splitlines(), maxlen=LOG_TAIL_LINES)
            return "\n".join(lines)
        return ""


def handler_for(supervisor: Supervisor) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            if self.command == "GET":
                return  # the heartbeat and the start-up polling: one line each would bury the engine's log
            print(f"[engine-supervisor] {self.command} {self.path}: {format % args}", file=sys.stderr, flush=True)

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def handle_one_request(self) -> None:
            supervisor.last_call = time.monotonic()
            super().handle_one_request()

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            if self.path != "/shutdown":
                self._reply(404, {"error": f"no such endpoint {self.path[:100]}"})
                return
            supervisor.stop()
            supervisor.exit_code = 0
            self._reply(200, {"ok": True})
            threading.Thread(target=self.server.shutdown, daemon=True).start()

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/healthz":
                self._reply(200, {"ok": True})
            elif self.path == "/engine":
                self._reply(200, supervisor.state())
            else:
                self._reply(404, {"error": f"no such endpoint {self.path[:100]}"})

        def do_DELETE(self) -> None:  # noqa: N802
            if self.path != "/engine":
                self._reply(404, {"error": f"no such endpoint {self.path[:100]}"})
                return
            supervisor.stop()
            self._reply(200, supervisor.state())

        def do_PUT(self) -> None:  # noqa: N802
            if self.path != "/engine":
                self._reply(404, {"error": f"no such endpoint {self.path[:100]}"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = -1
            if not 0 < length <= MAX_REQUEST_BYTES:
                self._reply(400, {"error": f'send {{"k": K}} with a Content-Length of at most {MAX_REQUEST_BYTES}'})
                return
            try:
                k = json.loads(self.rfile.read(length))["k"]
            except (ValueError, KeyError, TypeError):
                self._reply(400, {"error": 'the body must be {"k": K}'})
                return
            allowed = sorted({0, *supervisor.configs})
            if not isinstance(k, int) or isinstance(k, bool) or k not in allowed:
                self._reply(400, {"error": f"k must be one of {allowed} (the runs this engine container was "
                                           f"given; got {str(k)[:40]})"})
                return
            supervisor.start(k)
            self._reply(200, supervisor.state())

    return Handler


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        build_parser().error("give the engine's command line after --")
    host, _, port = args.listen.rpartition(":")
    supervisor = Supervisor(command, dict(args.config_for_k), args.log_dir, args.termination_log)
    server = ThreadingHTTPServer((host or "127.0.0.1", int(port)), handler_for(supervisor))

    def on_term(*_: object) -> None:
        # The pod is ending (the bench finished): stop the engine with it.
        threading.Thread(target=server.shutdown, daemon=True).start()

    def watchdog() -> None:
        while supervisor.exit_code is None:
            time.sleep(min(5.0, args.idle_exit_s))
            if time.monotonic() - supervisor.last_call > args.idle_exit_s and supervisor.exit_code is None:
                print(f"[engine-supervisor] no call from the bench for {args.idle_exit_s:.0f} s: stopping",
                      file=sys.stderr, flush=True)
                supervisor.exit_code = 1
                server.shutdown()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    threading.Thread(target=watchdog, daemon=True).start()
    print(f"[engine-supervisor] listening on {args.listen}; runs k in {sorted({0, *supervisor.configs})}",
          file=sys.stderr, flush=True)
    try:
        server.serve_forever()
    finally:
        supervisor.stop()
        server.server_close()
    return supervisor.exit_code or 0


if __name__ == "__main__":
    sys.exit(main())
