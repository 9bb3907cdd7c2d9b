"""`specpilot run`: start the operator (also `python -m specpilot`)."""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import faulthandler
import json
import logging
import os
import re
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:  # the operator's modules load only for `specpilot run` (skipping_imports)
    from .connection import Connection
    from .context import Context


class JsonFormatter(logging.Formatter):
    """One JSON object per line: what log pipelines (Loki, Cloud Logging) parse without configuration."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        ref = getattr(record, "k8s_ref", None)
        if isinstance(ref, dict):
            entry["object"] = {k: ref.get(k) for k in ("namespace", "name", "kind") if ref.get(k)}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


def configure_logging(fmt: str, verbose: bool) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("kubernetes.client.rest", "urllib3", "aiohttp.access"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class UnreachableServerLines(logging.Filter):
    """One line per attempt to reach an API server that does not answer, naming the server, the cause, the next
    try and the fix. kopf logs each failed attempt as `Request attempt #2/9 failed; will retry: GET https://...
    -> ClientConnectorError(ConnectionKey(...eight fields...), ConnectionRefusedError(...))`, once for each
    request in flight (its /api and /apis lookups: the same attempt twice), and when it gives up, the error with
    its chained tracebacks. Set on the log handler, so every kopf logger's records pass through it; any other
    record, and any other error (an HTTP error, a TLS failure), passes unchanged; an unreachable server's error
    logged with its traceback (kopf's task that gave up, asyncio's report of a request left behind) keeps only
    what failed and the cause."""

    ATTEMPT = re.compile(r"Request attempt #(?P<n>\d+)(?:/(?P<of>\d+))? failed; (?P<then>will retry|escalating): "
                         r"(?P<method>[A-Z]+) (?P<url>\S+) -> (?P<error>\w+)\((?P<detail>.*)", re.S)
    REPEAT_S = 2.0
    """The same line again within this long (another request's identical attempt) is dropped."""

    def __init__(self, server: str, fix: str, backoffs: tuple[float, ...]) -> None:
        super().__init__()
        self.server, self.fix, self.backoffs = server.rstrip("/"), fix, backoffs
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        from .kube import UNREACHABLE_ERRORS, is_unreachable, unreachable_cause

        match = self.ATTEMPT.match(str(record.msg)) if record.name.startswith("kopf") and not record.args else None
        if match and match["error"] in UNREACHABLE_ERRORS:
            cause = unreachable_cause(f"{match['error']}({match['detail']}")
            n = int(match["n"])
            if match["then"] == "will retry":
                of = f" of {match['of']}" if match["of"] else ""
                delay = f" in {self.backoffs[n - 1]:g}s" if n <= len(self.backoffs) else ""
                then, level = f"retrying{delay} (attempt {n}{of})", logging.WARNING
            else:
                then, level = f"giving up after {n} attempts", logging.ERROR
            text = f"{self.unreachable(match['url'], cause)}; {then}; {self.fix}"
        elif record.exc_info and is_unreachable(exc := record.exc_info[1]):
            # A task that gave up on it (kopf's observer; asyncio's report of the request it left behind): the
            # attempts above said why, so what failed and the cause, without the chained tracebacks.
            what = record.getMessage().splitlines()[0].split(":")[0]
            cause = unreachable_cause(f"{exc!r} {exc.__cause__!r}")
            text, level = f"{what}: {self.unreachable(self.server, cause)}", record.levelno
        else:
            return True
        now = time.monotonic()
        if now - self._last.get(text, float("-inf")) < self.REPEAT_S:
            return False
        if len(self._last) > 64:
            self._last.clear()
        self._last[text] = now
        record.msg, record.args, record.exc_info, record.exc_text = text, (), None, None
        record.levelno, record.levelname = level, logging.getLevelName(level)
        return True

    def unreachable(self, url: str, cause: str) -> str:
        """`cannot reach the Kubernetes API server at SERVER (CAUSE)`: the connection's server, or the URL's."""
        if url == self.server or url.startswith(self.server + "/"):
            url = self.server  # with its path, where a proxy serves the API below one
        else:
            parts = urlsplit(url)
            url = f"{parts.scheme}://{parts.netloc}"
        return f"cannot reach the Kubernetes API server at {url} ({cause})"


def unreachable_fix(kubeconfig: str | None, context: str | None) -> str:
    """What to check when the API server does not answer: the kubeconfig's server and context, or in a pod
    (no kubeconfig given, as Connection.load decides) the pod's way to the API server."""
    if not (kubeconfig or context or os.environ.get("KUBECONFIG")) and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return ("check that the control plane is up and that the pod may reach it (KUBERNETES_SERVICE_HOST, a "
                "NetworkPolicy's egress)")
    return ("check the kubeconfig's server and context (--kubeconfig, --context; `kubectl cluster-info` uses the "
            "same), or that the cluster is up")


def cluster_unreachable_message(kubeconfig: str | None, err: Exception) -> str:
    """The one line `specpilot run` prints when it finds no cluster to talk to, with the fix."""
    source = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    detail = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return (f"specpilot run: no Kubernetes cluster configured ({source}: {detail}); point --kubeconfig or KUBECONFIG "
            "at a kubeconfig, or run the operator in a cluster (helm install specpilot charts/specpilot), or try "
            "`specpilot demo`, which brings its own API server")


MALLOC_ARENAS = 2
"""glibc malloc arenas the operator may use. glibc gives threads arenas of their own (up to 8 per core), each
keeping the memory it freed, for no speed in an operator whose work is on one event loop. Threads remain (the
metrics server, asyncio's executor), so the cap stays. MALLOC_ARENA_MAX, when set, wins."""


def limit_malloc_arenas(arenas: int = MALLOC_ARENAS) -> bool:
    """Cap glibc's malloc arenas (mallopt M_ARENA_MAX) unless MALLOC_ARENA_MAX says otherwise; False where the C
    library is not glibc (musl has no arenas) or the call is refused."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-8, arenas))  # -8: M_ARENA_MAX in glibc's malloc.h
    except (OSError, AttributeError):
        return False


MALLOC_TRIM_S = 30
"""How often the operator hands glibc's free heap pages back to the system (malloc_trim). glibc keeps what a
burst of reconciliations freed in its heap for reuse, idle for good once the burst is over; a trim is cheap
next to the interval (docs/operator.md has the figures)."""


def start_malloc_trim(every_s: float = MALLOC_TRIM_S) -> threading.Event | None:
    """Call glibc's malloc_trim(0) every `every_s` seconds from a daemon thread (it takes each arena's lock, as
    malloc does; the event loop is not held up). Returns the Event that stops it; None where the C library is
    not glibc."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int

    def loop() -> None:
        while not stop.wait(every_s):
            trim(0)

    stop = threading.Event()
    threading.Thread(target=loop, name="specpilot-malloc-trim", daemon=True).start()
    return stop


GC_THRESHOLDS = (10_000, 20, 10)
"""The garbage collector's thresholds for the operator (CPython's are 700, 10, 10). With CPython's, a
reconciliation's short-lived objects (models, plans, JSON), alive across its awaits, are promoted into the old
generation and then collected by full collections that walk every object the operator holds, a large share of
its CPU at a thousand deployments. A young generation of 10,000 lets them die young; a much larger one frees the
garbage of a longer period in bulk and leaves the allocator's arenas fragmented (docs/operator.md has the
measurements, benchmarks/operator_scale.py makes them). SPECPILOT_GC_THRESHOLDS="700,10,10" sets others."""
GC_THRESHOLDS_ENV = "SPECPILOT_GC_THRESHOLDS"


def tune_collector(value: str | None = None) -> tuple[int, ...]:
    """Freeze what start-up made (gc.freeze: the imports' objects are never walked again) and set the
    collector's thresholds (GC_THRESHOLDS, or SPECPILOT_GC_THRESHOLDS: up to three integers). Returns them."""
    import gc

    value = os.environ.get(GC_THRESHOLDS_ENV, "") if value is None else value
    try:
        thresholds = tuple(int(v) for v in value.split(",")) if value.strip() else GC_THRESHOLDS
        if len(thresholds) > 3 or any(not 0 <= t < 2**31 for t in thresholds):  # gc takes C ints
            raise ValueError(value)
    except ValueError:
        raise SystemExit(f"{GC_THRESHOLDS_ENV}={value!r}: give one to three integers from 0 to 2147483647, "
                         f"e.g. 10000,20,10 "
                         f"(unset it for the default {','.join(map(str, GC_THRESHOLDS))})") from None
    gc.collect()
    gc.freeze()
    gc.set_threshold(*thresholds)
    return thresholds


TRACEMALLOC_ENV = "SPECPILOT_TRACEMALLOC"
"""Off unless set: a number of frames (e.g. 1, or 10 for tracebacks) makes the operator trace its Python
allocations from the start (tracemalloc, which slows it and costs memory of its own: for finding where memory
goes, never in production) and print the top allocations to stderr on SIGUSR2 and once at exit. `allocators`
traces nothing and prints only the allocators' figures (glibc's heap, CPython's small-object arenas: what the
RSS holds beyond live objects; tracemalloc hides the latter)."""
TRACEMALLOC_TOP = 40
"""How many lines a tracemalloc dump prints."""


def enable_tracemalloc(value: str | None = None) -> bool:
    """Start tracemalloc when SPECPILOT_TRACEMALLOC (or `value`) asks for it; `kill -USR2 <pid>` then prints the
    top allocations by line (and by traceback when more than one frame is kept), or with `allocators` only the
    allocators' figures. False when it is off."""
    import atexit
    import tracemalloc

    value = os.environ.get(TRACEMALLOC_ENV, "") if value is None else value
    if not value or value == "0":
        return False
    if value != "allocators":
        try:
            frames = max(1, int(value))
        except ValueError:
            frames = 1
        tracemalloc.start(frames)
    _time_collections()
    signal.signal(signal.SIGUSR2, lambda *_: dump_tracemalloc())
    atexit.register(dump_tracemalloc)
    return True


_GC_SECONDS = [0.0, 0.0, 0.0]
"""Seconds the garbage collector ran, per generation, since `_time_collections` (diagnostics only)."""


def _time_collections() -> None:
    """Time every collection (gc.callbacks), so a dump says how much of the process's CPU went to the
    collector: a full collection walks every tracked object, so its cost grows with what the operator holds."""
    import gc
    import time as _time

    started = [0.0]

    def callback(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = _time.perf_counter()
        else:
            _GC_SECONDS[info.get("generation", 2)] += _time.perf_counter() - started[0]

    gc.callbacks.append(callback)


def gc_time_summary() -> str:
    """The collector's runs and seconds per generation (seconds only while `_time_collections` runs)."""
    import gc

    return "gc runs and seconds by generation: " + ", ".join(
        f"gen{g} {stats['collections']} runs {_GC_SECONDS[g]:.2f} s" for g, stats in enumerate(gc.get_stats()))


def dump_tracemalloc(out=None, top: int = TRACEMALLOC_TOP) -> None:
    """Print the top `top` allocation sites of the traced memory to `out` (stderr): by line, and with each
    site's traceback when tracemalloc keeps more than one frame; then the allocators' figures (only those when
    nothing is traced)."""
    import gc
    import tracemalloc

    out = out or sys.stderr
    if not tracemalloc.is_tracing():
        before = malloc_summary()
        found, garbage = _collect_census()
        print(f"allocators: {before}\ngc: a full collection found {found} unreachable objects; then: "
              f"{malloc_summary()}\n{gc_time_summary()}\n{garbage}\n{gc_types_summary()}", file=out, flush=True)
        return
    gc.collect()
    snapshot = tracemalloc.take_snapshot().filter_traces((
        tracemalloc.Filter(False, tracemalloc.__file__), tracemalloc.Filter(False, "<frozen importlib._bootstrap>")))
    current, peak = tracemalloc.get_traced_memory()
    lines = [f"tracemalloc: traced {current / 2**20:.1f} MiB now, {peak / 2**20:.1f} MiB at peak; "
             f"top {top} by line:"]
    for stat in snapshot.statistics("lineno")[:top]:
        lines.append(f"  {stat.size / 2**20:8.2f} MiB {stat.count:9d} blocks  {stat.traceback[0]}")
    if tracemalloc.get_traceback_limit() > 1:
        lines.append(f"tracemalloc: top {top} by traceback:")
        for stat in snapshot.statistics("traceback")[:top]:
            lines.append(f"  {stat.size / 2**20:8.2f} MiB {stat.count:9d} blocks")
            lines.extend(f"      {frame}" for frame in stat.traceback.format(most_recent_first=True))
    lines.append(f"allocators: {malloc_summary()}")
    lines.append(gc_time_summary())
    print("\n".join(lines), file=out, flush=True)


def _collect_census(top: int = 25) -> tuple[int, str]:
    """A full collection that keeps what it finds unreachable (gc.DEBUG_SAVEALL) long enough to count it by
    type: which objects make the reference cycles the collector has to find (each one is CPU for the collector
    and, freed in bulk, fragmentation for the allocator). Returns the count and the census."""
    import gc
    from collections import Counter

    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        found = gc.collect()
        counts = Counter(f"{type(o).__module__}.{type(o).__qualname__}" for o in gc.garbage)
    finally:
        gc.garbage.clear()
        gc.set_debug(0)
    gc.collect()  # saved, they were not freed: free them now (else every later census counts them again)
    lines = [f"unreachable objects by type (top {top}):"]
    lines += [f"  {count:9d}  {name}" for name, count in counts.most_common(top)]
    return found, "\n".join(lines)


def gc_types_summary(top: int = 25) -> str:
    """The objects the garbage collector tracks (containers: dicts, lists, tasks, frames, models), counted by
    type with their shallow sizes: which kind of object the live heap is made of, at no tracing cost. Strings,
    floats and ints are not tracked by the collector and show only through the containers holding them."""
    import gc
    from collections import Counter

    counts: Counter = Counter()
    sizes: Counter = Counter()
    for obj in gc.get_objects():
        kind = type(obj)
        name = f"{kind.__module__}.{kind.__qualname__}"
        counts[name] += 1
        sizes[name] += sys.getsizeof(obj, 0)
    lines = [f"gc-tracked objects: {sum(counts.values())} ({sum(sizes.values()) / 2**20:.1f} MiB shallow); "
             f"top {top} types by shallow size:"]
    lines += [f"  {size / 2**20:8.2f} MiB {counts[name]:9d}  {name}" for name, size in sizes.most_common(top)]
    lines.append(f"top {top} types by count:")
    lines += [f"  {sizes[name] / 2**20:8.2f} MiB {count:9d}  {name}" for name, count in counts.most_common(top)]
    return "\n".join(lines)


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def malloc_summary() -> str:
    """Where the memory tracemalloc does not see is: glibc's heap (in use, free but kept, mmapped) and
    CPython's small-object arenas (sys._debugmallocstats, parsed). Empty parts where unavailable."""
    import io
    import re
    import tempfile

    parts = []
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = _MallInfo2
        info = libc.mallinfo2()
        parts.append(f"glibc heap {info.arena / 2**20:.1f} MiB (in use {info.uordblks / 2**20:.1f}, free "
                     f"{info.fordblks / 2**20:.1f}), mmapped {info.hblkhd / 2**20:.1f} MiB in {info.hblks} blocks")
    except (OSError, AttributeError):
        pass
    try:  # _debugmallocstats writes to the C stderr: catch it through a temporary file on fd 2
        with tempfile.TemporaryFile() as tmp:
            saved = os.dup(2)
            try:
                sys.stderr.flush()
                os.dup2(tmp.fileno(), 2)
                sys._debugmallocstats()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            tmp.seek(0)
            text = io.TextIOWrapper(tmp, errors="replace").read()

        def number(pattern: str) -> float:  # MiB
            return sum(int(v.replace(",", "")) for v in re.findall(pattern + r"\s*=\s*([\d,]+)", text, re.M)) / 2**20

        arenas = number(r"^\d+ arenas \* \d+ bytes/arena")
        if arenas:
            used, free = number(r"^# bytes in allocated blocks"), number(r"^# bytes in available blocks")
            unused = number(r"^\d+ unused pools \* \d+ bytes")
            parts.append(f"pymalloc arenas {arenas:.1f} MiB (in blocks {used:.1f}, free in pools {free:.1f}, "
                         f"unused pools {unused:.1f})")
    except (OSError, AttributeError):
        pass
    return "; ".join(parts)


UNUSED_OPTIONAL_IMPORTS = ("kubernetes", "kubernetes_validate")
"""Optional packages kopf imports when they are installed and the operator never uses: kopf recognises the
official Kubernetes client's model objects (`kubernetes`, about 20 MiB of generated classes), and that client
imports kubernetes_validate (with jsonschema and its format checkers). The operator speaks JSON dicts over
aiohttp (kube.py); they are installed beside it for the sandbox, the e2e tests and `specpilot validate`.
Skipped while the operator's modules load; a kubeconfig user with an exec plugin still loads the client later
(connection.py)."""


@contextlib.contextmanager
def skipping_imports(names: tuple[str, ...] = UNUSED_OPTIONAL_IMPORTS):
    """While inside, `import <name>` raises ImportError for each of `names` not imported yet (so an optional
    import falls back as where the package is absent); afterwards they import normally again."""
    skipped = [name for name in names if name not in sys.modules]
    for name in skipped:
        sys.modules[name] = None  # type: ignore[assignment]  # None in sys.modules: ImportError on import
    try:
        yield
    finally:
        for name in skipped:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def cmd_run(args: argparse.Namespace) -> int:
    with skipping_imports():
        import kopf

        from .handlers import register as register_handlers
        from .kube import Connection
    limit_malloc_arenas()  # before any thread starts
    start_malloc_trim()
    tune_collector()  # after the imports: what they made is frozen out of every later collection
    enable_tracemalloc()  # off unless SPECPILOT_TRACEMALLOC is set
    configure_logging(args.log_format, args.verbose)
    # `kill -USR1 <pid>` prints every thread's stack to stderr: what a stuck operator is waiting on.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if args.all_namespaces and args.namespace:
        raise SystemExit("give either --all-namespaces or --namespace, not both")
    try:
        connection = Connection.load(args.kubeconfig, args.context)
    except Exception as err:  # ConfigError, the client's for an exec plugin, a bad file: one line, no traceback
        raise SystemExit(cluster_unreachable_message(args.kubeconfig, err)) from None
    ctx = _operator_context(args, connection)
    registry = kopf.OperatorRegistry()
    peering = args.peering is not None
    register_handlers(registry, ctx, peering=peering)
    backoffs = kopf.OperatorSettings().networking.error_backoffs  # what kopf waits between attempts
    backoffs = tuple(backoffs) if isinstance(backoffs, (list, tuple)) else ()
    lines = UnreachableServerLines(connection.server, unreachable_fix(args.kubeconfig, args.context), backoffs)
    for handler in logging.getLogger().handlers:
        handler.addFilter(lines)
    logging.getLogger("specpilot").info(
        "specpilot operator starting: namespaces=%s peering=%s server=%s",
        ",".join(args.namespace) or "all", args.peering or "standalone", connection.host)
    try:
        kopf.run(
            registry=registry,
            standalone=not peering,
            peering_name=args.peering,
            clusterwide=args.all_namespaces or not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=f"http://{_host(args.liveness_address)}:{args.liveness_port}/healthz"
            if args.liveness_port else None,
            memo=ctx,
        )
    except Exception as exc:
        from .kube import is_unreachable, unreachable_cause

        if not is_unreachable(exc):
            raise
        # kopf gave up after its retries, each logged in one line above: the same, not a traceback
        cause = unreachable_cause(f"{exc!r} {exc.__cause__!r}")
        raise SystemExit(f"specpilot run: {lines.unreachable(connection.server, cause)}; gave up after kopf's "
                         f"retries; {lines.fix}") from None
    return 0


def _operator_context(args: argparse.Namespace, connection: Connection) -> Context:
    """The operator's Context: its config, the API client counting its requests in the metrics (served on
    --metrics-port), and the result key that seals the benchmark Jobs' results. Its modules are loaded with
    the handlers' (before the collector freezes start-up)."""
    from ..api import seal
    from ..config import load_config
    from .context import Context
    from .kube import Kube
    from .metrics import OperatorMetrics

    config = load_config(args.config)
    metrics = OperatorMetrics()
    if args.metrics_port:
        metrics.serve(args.metrics_port, addr=args.metrics_address)
    ctx = Context(kube=Kube(connection, on_request=lambda verb, resource: metrics.api_requests.labels(
        verb, resource).inc()), config=config, metrics=metrics, connection=connection)
    key = os.environ.get(seal.KEY_ENV, "")
    if len(key) >= 32:
        ctx.result_key = key.encode()
    else:
        logging.getLogger("specpilot").warning(
            "%s is not set (or shorter than 32 characters): using a key drawn at start, so profiles measured "
            "before a restart are measured again; the Helm chart sets it from a Secret", seal.KEY_ENV)
    return ctx


def _host(address: str) -> str:
    """An address as the host part of a URL (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def add_run_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, else KUBECONFIG or ~/.kube/config)")
    p.add_argument("--context", help="kubeconfig context to use")
    p.add_argument("--namespace", "-n", action="append", default=[],
                   help="watch this namespace (repeatable); default: all namespaces")
    p.add_argument("--all-namespaces", "-A", action="store_true", help="watch every namespace")
    p.add_argument("--config", help="operator config file (YAML): Prometheus URL, images, GPU prices")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--standalone", action="store_true", help="no peering (one replica); the default")
    group.add_argument("--peering", metavar="NAME", help="KopfPeering name for high availability (several replicas)")
    p.add_argument("--liveness-port", type=int, default=8080, help="port of the /healthz endpoint (0: off)")
    p.add_argument("--metrics-port", type=int, default=9090, help="port of the operator's /metrics (0: off)")
    p.add_argument("--liveness-address", default="0.0.0.0",
                   help="address /healthz listens on (default: every interface; the kubelet's probes need the pod IP)")
    p.add_argument("--metrics-address", default="0.0.0.0",
                   help="address /metrics listens on (default: every interface; 127.0.0.1 when nothing scrapes it)")
    p.add_argument("--log-format", choices=("plain", "json"), default="plain")
    p.add_argument("--verbose", "-v", action="store_true")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the operator")
    add_run_arguments(p)
    p.set_defaults(func=cmd_run)
