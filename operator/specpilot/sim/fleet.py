"""Continuous-batching fleet simulator over the digital twin: replicas of one vLLM pool serving a load trace.

Time advances in slices (1 s by default). Within a slice every replica runs engine steps at a fixed
batch: the step time comes from a table precomputed from the twin per (batch, k, context length), so the
simulator never calls the twin in its loop, and every request is a slot in numpy arrays, never a Python
object. The mechanics, per slice:

- Arrivals are Poisson from the trace, or a request log's own arrivals and lengths replayed
  (`sim.requestlog.RequestLog`). The router keeps one FIFO queue and gives each request the free
  slot of the least-loaded serving replica (a replica has `max_num_seqs` slots); a request is admitted
  only if its whole KV footprint (prompt + output tokens) fits in what the replica's KV cache has left,
  otherwise it waits (head-of-line, as vLLM's scheduler does). Slots freed mid-slice are refilled at the
  moment they free up, so TTFT carries no slice-boundary artefact.
- Prefill of admitted prompts runs one after another on the replica (twin's prefill time) and takes that
  time away from decoding; TTFT = queueing + prefill (waiting for earlier prefills) + half a step.
- Decoding: the policy's K for the replica's batch (its speculation schedule) and the twin's step time at
  that batch, K and the replica's mean context; each request gains 1 + (E_K - 1) * a tokens per step,
  E_K the expected tokens per step from the acceptance profile and `a` its own acceptance factor.
  TPOT = (finish - first token) / (output tokens - 1), as vLLM's benchmark defines it.
- Replicas start (model load, `startup_s`) serving nothing while billed; scale-down drains a replica
  (no new requests, running ones finish). A change of speculation mode that needs a restart rolls out
  with maxSurge 1 / maxUnavailable 0: a new replica first, an old one drains once it serves.

Per-request metrics go into log-spaced histograms (0.5% bins), so memory stays flat however many
requests a run serves; a time series per bin records load, replicas, tokens and cost for the plots. SLO
attainment is counted exactly, per request: a request is within SLO when its TTFT and its TPOT are both within
theirs, decided as it completes; one still queued or running at the end is a miss.
"""

from __future__ import annotations

import collections
import dataclasses
import math
from collections.abc import Callable, Generator, Mapping
from typing import Protocol

import numpy as np

from ..perf import DEFAULT_CATALOG, Twin, resolve_model
from .requestlog import RequestLog
from .traces import LoadTrace
from .workloads import RequestLengths, request_lengths

__all__ = [
    "DEFAULT_SLO_TTFT_MS",
    "Action",
    "ArrivalChunks",
    "EngineTables",
    "FleetConfig",
    "FleetPolicy",
    "FleetSetup",
    "Mode",
    "Observation",
    "SimResult",
    "engine_tables",
    "fleet_run",
    "simulate",
]

OFF, STARTING, SERVING, DRAINING = 0, 1, 2, 3
_CONTEXT_GRID = np.geomspace(16, 65536, 25)
_PROMPT_GRID = np.geomspace(1, 65536, 33)
_HIST_EDGES_S = np.geomspace(1e-5, 1e5, 4601)  # 0.5% wide bins from 10 us to ~28 h
DEFAULT_SLO_TTFT_MS = 2000.0
"""The TTFT SLO `specpilot simulate` applies unless told otherwise: an interactive user's patience for the
first token, loose enough that only queueing (not prefill) breaks it."""


@dataclasses.dataclass(frozen=True)
class FleetSetup:
    """What the fleet runs: model on `tensor_parallel_size` x GPU SKU, serving `workload` traffic."""

    model_id: str
    sku: str
    workload: str = "sharegpt"
    tensor_parallel_size: int = 1
    price_per_gpu_hour: float | None = None
    """USD per GPU-hour; the catalog's on-demand price when unset."""
    request_lengths: RequestLengths | None = None
    """The traffic's prompt and output lengths when they are not the workload's: a request log's own
    (`RequestLog.lengths`), so its pools are profiled on the requests they serve, as a custom workload made
    of the logged prompts would be."""

    @property
    def lengths(self) -> RequestLengths:
        return self.request_lengths or request_lengths(self.workload)

    @property
    def gpu_price_per_hour(self) -> float:
        if self.price_per_gpu_hour is not None:
            return self.price_per_gpu_hour
        return DEFAULT_CATALOG.resolve(self.sku).default_price_per_gpu_hour

    def twin(self, method: str | None) -> Twin:
        """The engine's twin: with `method`'s drafter loaded, or the plain engine for None."""
        from ..api.methods import method_family

        gpu = DEFAULT_CATALOG.resolve(self.sku)
        model = resolve_model(self.model_id)
        family = method_family(method) if method else None
        return Twin(gpu, model, self.tensor_parallel_size, method=family, workload=self.workload)


@dataclasses.dataclass(frozen=True)
class FleetConfig:
    """Engine and control-loop settings shared by every policy of a comparison."""

    max_num_seqs: int = 256
    """vLLM's --max-num-seqs: requests a replica runs at once (its batch size ceiling)."""
    startup_s: float = 120.0
    """Seconds from creating a replica to serving (pull, model load, CUDA graphs): billed, serves nothing."""
    slice_s: float = 1.0
    """Simulation time step; engine steps within a slice run at one batch size."""
    control_interval_s: float = 15.0
    """How often the policy observes the fleet and acts (the operator's reconcile period)."""
    observation_window_s: float = 60.0
    """Window the policy's load observations average over (a Prometheus rate window)."""
    gpu_memory_utilization: float = 0.9
    bin_s: float | None = None
    """Time-series resolution; about 500 points over the trace when unset."""

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1 (got {self.max_num_seqs})")
        for name in ("slice_s", "control_interval_s", "observation_window_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0 (got {getattr(self, name)})")
        if self.startup_s < 0:
            raise ValueError(f"startup_s must be >= 0 (got {self.startup_s})")


@dataclasses.dataclass(frozen=True)
class Mode:
    """How a replica's engine runs: with the drafter loaded or not, and K per batch size (index 0 = batch 1)."""

    name: str
    speculative: bool
    k_by_batch_size: tuple[int, ...]
    method: str | None = None
    """The drafter a speculative mode loads; the policy's `method` when unset."""

    def k_at(self, batch_size: int) -> int:
        return self.k_by_batch_size[min(max(batch_size, 1), len(self.k_by_batch_size)) - 1]


@dataclasses.dataclass(frozen=True)
class Observation:
    """What a policy sees at a control tick: averages over the observation window."""

    t_s: float
    arrival_rate_rps: float
    running_per_replica: float
    """Mean requests running per serving replica (vllm:num_requests_running)."""
    waiting: float
    """Mean requests queued at the router and not yet admitted by any replica."""
    serving_replicas: int
    active_replicas: int
    """Serving plus starting (not draining)."""
    mode: str
    """The mode the fleet runs or rolls out to."""
    rollout_in_progress: bool
    concurrency_histogram: tuple[tuple[float, float], ...] = ()
    """Running requests per serving replica over the window: (concurrency, weight) sorted by concurrency,
    weights summing to 1, one sample per slice (what the pool's Prometheus samples show)."""
    window_s: float = 0.0
    """Length of the window the averages cover."""
    tpot_p95_ms: float | None = None
    """p95 TPOT of the requests that completed within the window (None: none did), as vLLM's histogram shows."""

    @property
    def concurrency_per_replica(self) -> float:
        """Demand per serving replica: running plus waiting requests."""
        return (self.running_per_replica * self.serving_replicas + self.waiting) / max(self.serving_replicas, 1)


@dataclasses.dataclass(frozen=True)
class Action:
    replicas: int
    mode: str


class FleetPolicy(Protocol):
    """A serving policy: the engine modes it may run and its decisions at each control tick."""

    name: str
    method: str | None
    """The method whose drafter speculative modes load unless a mode names its own (None: never speculates)."""
    modes: Mapping[str, Mode]
    """The modes the policy may ask for; a policy may add modes while it runs (the fleet picks them up)."""

    def start(self) -> Action: ...

    def control(self, observation: Observation) -> Action: ...


class EngineTables:
    """Step time per (batch, k, context), tokens per step per k, prefill time and KV capacity of one engine."""

    def __init__(self, twin: Twin, max_num_seqs: int, max_k: int, gpu_memory_utilization: float) -> None:
        self.max_k = max_k
        batches = np.arange(0, max_num_seqs + 1)
        steps = np.empty((max_num_seqs + 1, max_k + 1, len(_CONTEXT_GRID)))
        for b in batches:
            for k in range(max_k + 1):
                for c, ctx in enumerate(_CONTEXT_GRID):
                    steps[b, k, c] = twin.step_time_s(max(int(b), 1), k, float(ctx))
        self.step_s = steps
        self.tokens_per_step = np.array([twin.tokens_per_step(k) for k in range(max_k + 1)])
        self.prefill_s = np.array([twin.prefill_time_s(float(p)) for p in _PROMPT_GRID])
        self.kv_capacity_tokens = float(twin.kv_capacity_tokens(gpu_memory_utilization))

    def prefill_time_s(self, prompt_tokens: np.ndarray) -> np.ndarray:
        return np.interp(prompt_tokens, _PROMPT_GRID, self.prefill_s)


@dataclasses.dataclass
class SimResult:
    """One policy's run: headline metrics and the time series behind the plots."""

    policy: str
    method: str | None
    duration_s: float
    requests_arrived: int
    requests_completed: int
    output_tokens: float
    gpu_hours: float
    cost_usd: float
    slo_tpot_ms: float | None
    tpot_met: int
    tpot_p50_ms: float
    tpot_p95_ms: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    rollouts: int
    timeseries: dict[str, np.ndarray]
    events: list[tuple[float, str]]
    slo_ttft_ms: float | None = None
    ttft_met: int = 0
    """Completed requests whose TTFT was within its SLO."""
    slo_met: int = 0
    """Completed requests within both SLOs (TTFT and TPOT)."""
    slo_output_tokens: float = 0.0
    """Output tokens of the requests within both SLOs."""

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.duration_s

    def _share(self, met: int) -> float:
        return met / self.requests_arrived if self.requests_arrived else 1.0

    @property
    def slo_attainment(self) -> float:
        """Share of arrived requests that completed within both the TTFT and the TPOT SLO (unfinished ones,
        queued, running or never admitted at the end, count as misses)."""
        return self._share(self.slo_met)

    @property
    def tpot_attainment(self) -> float:
        """Share of arrived requests that completed within the TPOT SLO."""
        return self._share(self.tpot_met)

    @property
    def ttft_attainment(self) -> float:
        """Share of arrived requests that completed with their TTFT within its SLO."""
        return self._share(self.ttft_met)

    @property
    def cost_per_mtok_within_slo(self) -> float:
        """Dollars per million output tokens of the requests within both SLOs: what a useful token costs."""
        if self.slo_output_tokens <= 0:
            return math.inf
        return self.cost_usd / self.slo_output_tokens * 1e6

    @property
    def cost_per_mtok(self) -> float:
        if self.output_tokens <= 0:
            return math.inf
        return self.cost_usd / self.output_tokens * 1e6

    def summary(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "method": self.method,
            "output_tok_s": self.output_tok_s,
            "tpot_p50_ms": self.tpot_p50_ms,
            "tpot_p95_ms": self.tpot_p95_ms,
            "ttft_p50_ms": self.ttft_p50_ms,
            "ttft_p95_ms": self.ttft_p95_ms,
            "slo_attainment": self.slo_attainment,
            "tpot_attainment": self.tpot_attainment,
            "ttft_attainment": self.ttft_attainment,
            "slo_tpot_ms": self.slo_tpot_ms,
            "slo_ttft_ms": self.slo_ttft_ms,
            "gpu_hours": self.gpu_hours,
            "cost_usd": self.cost_usd,
            "cost_per_mtok": self.cost_per_mtok,
            "cost_per_mtok_within_slo": self.cost_per_mtok_within_slo,
            "requests_arrived": self.requests_arrived,
            "requests_completed": self.requests_completed,
            "rollouts": self.rollouts,
        }


class _Histogram:
    """Counts of values (seconds) in log-spaced bins; percentiles to the bin's geometric centre."""

    def __init__(self) -> None:
        self.counts = np.zeros(len(_HIST_EDGES_S) + 1, dtype=np.int64)

    def add(self, values_s: np.ndarray) -> None:
        if values_s.size:
            self.counts += np.bincount(np.searchsorted(_HIST_EDGES_S, values_s), minlength=len(self.counts))

    def percentile_ms(self, q: float) -> float:
        total = int(self.counts.sum())
        if total == 0:
            return math.nan
        i = int(np.searchsorted(np.cumsum(self.counts), q / 100.0 * total))
        i = min(max(i, 1), len(_HIST_EDGES_S) - 1)
        return float(math.sqrt(_HIST_EDGES_S[i - 1] * _HIST_EDGES_S[i]) * 1e3)


class _Queue:
    """The router's FIFO of requests not yet admitted, as growable numpy columns."""

    def __init__(self) -> None:
        self.arrival = np.empty(1024)
        self.length = np.empty(1024)  # prompt + output tokens
        self.output = np.empty(1024)
        self.factor = np.empty(1024)
        self.head = 0
        self.tail = 0

    def __len__(self) -> int:
        return self.tail - self.head

    def push(self, arrival: np.ndarray, length: np.ndarray, output: np.ndarray, factor: np.ndarray) -> None:
        n = arrival.size
        if n == 0:
            return
        if self.tail + n > self.arrival.size:
            size = max(2 * (len(self) + n), 1024)
            for name in ("arrival", "length", "output", "factor"):
                old = getattr(self, name)
                new = np.empty(size)
                new[: len(self)] = old[self.head:self.tail]
                setattr(self, name, new)
            self.tail -= self.head
            self.head = 0
        s = slice(self.tail, self.tail + n)
        self.arrival[s], self.length[s], self.output[s], self.factor[s] = arrival, length, output, factor
        self.tail += n

    def peek(self, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        s = slice(self.head, self.head + n)
        return self.arrival[s], self.length[s], self.output[s], self.factor[s]

    def take(self, n: int, admitted: np.ndarray | None) -> None:
        """Remove the admitted ones among the first n (all when None); the rest stay at the head in order."""
        if admitted is None:
            self.head += n
            return
        kept = np.flatnonzero(~admitted)
        if kept.size:
            src = self.head + kept
            dst = slice(self.head + n - kept.size, self.head + n)
            for col in (self.arrival, self.length, self.output, self.factor):
                col[dst] = col[src]
        self.head += n - kept.size


def _group_starts(groups: np.ndarray) -> np.ndarray:
    starts = np.empty(groups.size, dtype=bool)
    starts[:1] = True
    starts[1:] = groups[1:] != groups[:-1]
    return starts


def _group_cumsum(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Cumulative sum restarting at each group start (values >= 0, groups contiguous)."""
    total = np.cumsum(values)
    before = np.maximum.accumulate(np.where(starts, total - values, 0.0))
    return total - before


def _sequential_finish(start: np.ndarray, work: np.ndarray, starts: np.ndarray,
                       available: np.ndarray) -> np.ndarray:
    """Finish times of jobs served one after another per group (FIFO): Lindley's recursion, vectorised.

    finish_i = C_i + max(available, max_{j<=i} (start_j - C_{j-1})), C the group's cumulative work.
    """
    cum = _group_cumsum(work, starts)
    lead = start - (cum - work)
    group = np.cumsum(starts)
    offset = group * 1e9  # keeps the running maximum inside each group
    running_max = np.maximum.accumulate(lead + offset) - offset
    return cum + np.maximum(available, running_max)


class _Fleet:
    """The state of one run; `run()` advances it slice by slice.

    Slots are a (replica x max_num_seqs) grid of numpy columns; per-replica sums (running requests, KV
    reserved, prompt + output tokens) are kept up to date on admission and completion so the loop never
    recounts the grid.
    """

    def __init__(self, policy: FleetPolicy, trace: LoadTrace, setup: FleetSetup, config: FleetConfig,
                 slo_tpot_ms: float | None, max_replicas: int, seed: int,
                 tables: Callable[[str | None, int], EngineTables], slo_ttft_ms: float | None = None) -> None:
        self.policy = policy
        self.trace = trace
        self.setup = setup
        self.config = config
        self.slo_tpot_ms = slo_tpot_ms
        self.slo_tpot_s = slo_tpot_ms / 1e3 if slo_tpot_ms else math.inf
        self.slo_ttft_ms = slo_ttft_ms
        self.slo_ttft_s = slo_ttft_ms / 1e3 if slo_ttft_ms else math.inf
        self.rng = np.random.default_rng(seed)
        self.lengths = setup.lengths
        self.max_replicas = max_replicas

        S = self.S = config.max_num_seqs
        self.tables = tables
        self.mode_names: list[str] = []
        self.modes: list[Mode] = []
        self.engine_methods: list[str | None] = [None]  # engine 0: the plain engine; then one per drafter
        self.engines: list[EngineTables] = []
        self._sync_modes()

        R = self.R = max_replicas + max(2, max_replicas // 2)  # room for a surge replica and draining ones
        self.state = np.zeros(R, dtype=np.int8)
        self.ready_at = np.full(R, math.inf)
        self.mode = np.zeros(R, dtype=np.int64)
        self.debt = np.zeros(R)
        self.n_running = np.zeros(R)
        self.kv_reserved = np.zeros(R)
        self.active = np.zeros((R, S), dtype=bool)
        self.rem = np.zeros((R, S))
        self.factor = np.ones((R, S))
        self.arrival = np.zeros((R, S))
        self.first_token = np.zeros((R, S))
        self.ttft_ok = np.zeros((R, S), dtype=bool)  # decided at the first token, counted at completion
        self.length = np.zeros((R, S))  # prompt + output tokens: the KV a request reserves
        self.output = np.full((R, S), 2.0)
        self.queue = _Queue()
        self._lifecycle_changed = True
        self._freed = (_NO_INT, _NO_INT, _NO_FLOAT)  # slots the last completions freed, and when
        self._slice_tpot: list[np.ndarray] = []  # TPOTs of the requests completed in the current slice
        self.series = _Series(1, 1.0)
        self.bin = 0

        self.target_replicas = 0
        self.target_mode = 0
        self.rollouts = 0
        self.events: list[tuple[float, str]] = []

        self.tpot_hist = _Histogram()
        self.ttft_hist = _Histogram()
        self.tpot_met = 0
        self.ttft_met = 0
        self.slo_met = 0
        self.slo_tokens = 0.0
        self.arrived = 0
        self.completed = 0
        self.tokens = 0.0
        self.replica_seconds = 0.0

    def _sync_modes(self) -> None:
        """Take up the policy's modes (a policy may add some while it runs) and build the engine tables they
        need: the plain engine, and one engine per drafter method with the largest K its modes use."""
        new = [n for n in self.policy.modes if n not in self.mode_names]
        if not new and self.engines:
            return
        S = self.S
        for name in new:
            mode = self.policy.modes[name]
            if not mode.speculative and any(mode.k_by_batch_size):
                raise ValueError(f"mode {mode.name!r} speculates (K > 0) but does not load a drafter; "
                                 f"set speculative=True")
            method = mode.method or self.policy.method
            if mode.speculative and method is None:
                raise ValueError(f"mode {mode.name!r} speculates but names no method, and policy "
                                 f"{self.policy.name!r} has none")
            if mode.speculative and method not in self.engine_methods:
                self.engine_methods.append(method)
            self.mode_names.append(name)
            self.modes.append(mode)
        max_k = [0] * len(self.engine_methods)
        mode_engine = []
        for m in self.modes:
            e = self.engine_methods.index(m.method or self.policy.method) if m.speculative else 0
            mode_engine.append(e)
            max_k[e] = max(max_k[e], max(m.k_by_batch_size, default=0))
        self.engines = [self.tables(method, k) for method, k in zip(self.engine_methods, max_k, strict=True)]
        K = max(e.max_k for e in self.engines)
        steps = np.full((len(self.engines), S + 1, K + 1, len(_CONTEXT_GRID)), np.inf)
        tokens = np.ones((len(self.engines), K + 1))
        for i, e in enumerate(self.engines):
            steps[i, :, : e.max_k + 1] = e.step_s
            tokens[i, : e.max_k + 1] = e.tokens_per_step
        self.step_table = steps
        self.tokens_table = tokens
        self.kv_capacity = np.array([e.kv_capacity_tokens for e in self.engines])
        self.mode_engine = np.array(mode_engine, dtype=np.int64)
        kb = np.zeros((len(self.modes), S + 1), dtype=np.int64)
        for i, m in enumerate(self.modes):
            kb[i, 1:] = [m.k_at(b) for b in range(1, S + 1)]
        self.mode_k = kb

    # ---- replicas ----------------------------------------------------------------------------------------
    def _start_replica(self, t: float, mode: int, warm: bool = False) -> bool:
        free = np.flatnonzero(self.state == OFF)
        if free.size == 0:
            return False
        r = int(free[0])
        self.state[r] = SERVING if warm else STARTING
        self.ready_at[r] = math.inf if warm else t + self.config.startup_s
        self.mode[r] = mode
        self.debt[r] = 0.0
        return True

    def _drain(self, candidates: np.ndarray) -> None:
        """Stop a starting candidate if there is one, else drain the one running the fewest requests."""
        starting = candidates[self.state[candidates] == STARTING]
        if starting.size:
            self.state[starting[-1]] = OFF
            self.ready_at[starting[-1]] = math.inf
            return
        self.state[candidates[int(np.argmin(self.n_running[candidates]))]] = DRAINING

    def _reconcile(self, t: float) -> None:
        """Move replicas toward the target count and mode as a Deployment rollout with maxSurge 1 and
        maxUnavailable 0 would: a new-mode replica starts first, an old one drains once another serves."""
        target, mode = self.target_replicas, self.target_mode
        for _ in range(4 * self.R):
            serving = self.state == SERVING
            live = serving | (self.state == STARTING)
            old = live & (self.mode != mode)
            n_live, n_old, n_serving = int(live.sum()), int(old.sum()), int(serving.sum())
            surge = 1 if n_old else 0
            if n_old and n_serving > target and (serving & old).any():
                self._drain(np.flatnonzero(old))
            elif n_live > target + surge:
                self._drain(np.flatnonzero(old if n_old else live))
            elif n_live < target + surge:
                if not self._start_replica(t, mode):
                    return
            else:
                return

    def _apply(self, t: float, action: Action) -> None:
        replicas = int(min(max(action.replicas, 0), self.max_replicas))  # 0: a mixed fleet's idle pool
        self._sync_modes()
        if action.mode not in self.mode_names:
            raise ValueError(f"policy {self.policy.name!r} asked for mode {action.mode!r}; its modes are "
                             f"{', '.join(self.mode_names)}")
        mode = self.mode_names.index(action.mode)
        if replicas != self.target_replicas:
            self.events.append((t, f"replicas {self.target_replicas} -> {replicas}"))
        if mode != self.target_mode:
            self.events.append((t, f"roll out {self.mode_names[self.target_mode]} -> {action.mode}"))
            self.rollouts += 1
        if (replicas, mode) != (self.target_replicas, self.target_mode):
            self._lifecycle_changed = True
        self.target_replicas, self.target_mode = replicas, mode

    # ---- requests ----------------------------------------------------------------------------------------
    def _admit(self, t0: float, flat: np.ndarray, key: np.ndarray, free_at: np.ndarray | None,
               busy_until: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Fill free slots (`flat` indices into the slot grid, taken in `key` order, each free from offset
        `free_at`, else from the slice start) from the queue head. A request goes in only if its KV
        footprint fits what its replica has left; one that does not blocks the later ones bound for that
        replica (vLLM's scheduler is FIFO).

        Returns (rows, cols, prefill finish offset, prefill seconds) of the admitted requests.
        """
        n = min(len(self.queue), flat.size)
        if n == 0:
            return _NO_INT, _NO_INT, _NO_FLOAT, _NO_FLOAT
        order = np.argsort(key, kind="stable")[:n]
        arrival, length, output, factor = self.queue.peek(n)
        rows_all, cols_all = np.divmod(flat[order], self.S)
        admit = np.maximum(arrival - t0, 0.0 if free_at is None else free_at[order])
        by_replica = np.argsort(rows_all, kind="stable")  # queue order kept within each replica
        rows = rows_all[by_replica]
        kv_free = self.kv_capacity[self.mode_engine[self.mode]] - self.kv_reserved
        fits = _group_cumsum(length[by_replica], _group_starts(rows)) <= kv_free[rows]
        if fits.all():
            sel = by_replica
            admitted = None
        else:
            sel = by_replica[fits]
            admitted = np.zeros(n, dtype=bool)
            admitted[sel] = True
        arrival, length, output, factor, admit = (arrival[sel], length[sel], output[sel], factor[sel],
                                                  admit[sel])
        self.queue.take(n, admitted)  # after copying out: take() may overwrite the head
        if sel.size == 0:
            return _NO_INT, _NO_INT, _NO_FLOAT, _NO_FLOAT
        rows, cols = rows_all[sel], cols_all[sel]
        engines = self.mode_engine[self.mode[rows]]
        prompt = length - output
        if len(self.engines) == 1 or (engines == engines[0]).all():
            work = self.engines[int(engines[0])].prefill_time_s(prompt)
        else:
            work = np.empty(prompt.size)
            for e in np.unique(engines):
                on = engines == e
                work[on] = self.engines[int(e)].prefill_time_s(prompt[on])
        finish = _sequential_finish(admit, work, _group_starts(rows), busy_until[rows])
        self.active[rows, cols] = True
        self.rem[rows, cols] = output - 1.0
        self.factor[rows, cols] = factor
        self.arrival[rows, cols] = arrival
        self.length[rows, cols] = length
        self.output[rows, cols] = output
        self.n_running += np.bincount(rows, minlength=self.R)
        self.kv_reserved += np.bincount(rows, weights=length, minlength=self.R)
        self.tokens += sel.size  # each first token comes out of prefill
        return rows, cols, finish, work

    def _first_tokens(self, t0: float, rows: np.ndarray, cols: np.ndarray, finish: np.ndarray,
                      step_s: np.ndarray) -> None:
        """The first token leaves with the step that follows the prefill (half a step later on average)."""
        first = t0 + finish + 0.5 * step_s[rows]
        self.first_token[rows, cols] = first
        ttft = first - self.arrival[rows, cols]
        self.ttft_hist.add(ttft)
        self.ttft_ok[rows, cols] = ttft <= self.slo_ttft_s

    def _decode(self, t0: float, dt: float, rows: slice | np.ndarray, decode_share: np.ndarray,
                step_s: np.ndarray, k: np.ndarray, engine: np.ndarray, fresh: np.ndarray | None = None) -> int:
        """Advance the running requests of `rows` (only the `fresh` slots when given) through the slice,
        completing those that reach their output length; returns how many completed."""
        gain = self.tokens_table[engine, k] - 1.0
        rate_per_step = (decode_share / step_s)[:, None]
        factor = self.factor[rows]
        per_step = 1.0 + np.minimum(gain[:, None] * factor, k[:, None])
        active = self.active[rows] if fresh is None else fresh
        rate = np.where(active, rate_per_step * per_step, 0.0)
        begin = np.maximum(self.first_token[rows] - t0, 0.0)
        progress = np.maximum(dt - begin, 0.0) * rate
        rem = self.rem[rows]
        done = active & (progress >= rem)
        self.tokens += float(np.minimum(progress, rem).sum())
        d_rows, d_cols = np.nonzero(done)
        finish_off = begin[d_rows, d_cols] + rem[d_rows, d_cols] / rate[d_rows, d_cols]
        self.rem[rows] = rem - progress  # rem may be a view of self.rem: read it before this
        if d_rows.size == 0:
            return 0
        if isinstance(rows, np.ndarray):
            d_rows = rows[d_rows]
        self._complete(t0, d_rows, d_cols, finish_off)
        return d_rows.size

    def _complete(self, t0: float, rows: np.ndarray, cols: np.ndarray, finish_off: np.ndarray) -> None:
        tpot = (t0 + finish_off - self.first_token[rows, cols]) / (self.output[rows, cols] - 1.0)
        self.tpot_hist.add(tpot)
        self._slice_tpot.append(tpot)
        tpot_ok = tpot <= self.slo_tpot_s
        ttft_ok = self.ttft_ok[rows, cols]
        both = tpot_ok & ttft_ok
        met = int(both.sum())
        self.tpot_met += int(tpot_ok.sum())
        self.ttft_met += int(ttft_ok.sum())
        self.slo_met += met
        self.slo_tokens += float(self.output[rows, cols][both].sum())
        self.completed += rows.size
        self.series.sums["met"][self.bin] += met
        self.series.sums["completed"][self.bin] += rows.size
        self.active[rows, cols] = False
        self.rem[rows, cols] = 0.0
        self.n_running -= np.bincount(rows, minlength=self.R)
        self.kv_reserved -= np.bincount(rows, weights=self.length[rows, cols], minlength=self.R)
        self._freed = (rows, cols, finish_off)

    # ---- the loop ----------------------------------------------------------------------------------------
    def run(self, progress: Callable[[float], None] | None = None) -> SimResult:
        """Serve the trace, the policy acting at every control tick."""
        steps = self.steps(progress)
        try:
            observation = next(steps)
            while True:
                observation = steps.send(self.policy.control(observation))
        except StopIteration as done:
            return done.value

    def steps(self, progress: Callable[[float], None] | None = None
              ) -> Generator[Observation, Action, SimResult]:
        """Serve the trace slice by slice, yielding the observation at every control tick and applying the action
        sent back (`run` sends the policy's; a driver of several fleets sends its own); returns the result."""
        cfg = self.config
        dt = cfg.slice_s
        duration = self.trace.duration_s
        n_slices = int(math.ceil(duration / dt - 1e-9))
        bin_s = cfg.bin_s or dt * max(1, round(duration / 500 / dt))
        series = self.series = _Series(int(math.ceil(duration / bin_s - 1e-9)), bin_s)
        window: collections.deque = collections.deque(maxlen=max(1, int(round(cfg.observation_window_s / dt))))
        R = self.R
        all_rows = slice(None)

        self._apply(0.0, self.policy.start())
        self.events.clear()
        self.rollouts = 0
        for _ in range(self.target_replicas):
            self._start_replica(0.0, self.target_mode, warm=True)
        next_control = cfg.control_interval_s
        live = getattr(self.trace, "arrivals", None)  # a trace routed while it runs makes its own arrivals
        arrivals = (live(self.lengths, self.rng, dt) if callable(live)
                    else _LogArrivals(self.trace, self.lengths, self.rng, dt) if isinstance(self.trace, RequestLog)
                    else _ArrivalChunks(self.trace, self.lengths, self.rng, dt))
        serving = self.state == SERVING
        billed = n_serving = 0

        for i in range(n_slices):
            t0 = i * dt
            self.bin = min(int(t0 // bin_s), len(series.seconds) - 1)
            tokens_before = self.tokens
            if t0 >= next_control - 1e-9:
                next_control += cfg.control_interval_s
                action = yield self._observe(t0, window)
                self._apply(t0, action)
            if self.ready_at.min() <= t0:
                ready = self.ready_at <= t0
                self.state[ready] = SERVING
                self.ready_at[ready] = math.inf
                self._lifecycle_changed = True
            if self._lifecycle_changed:
                self._reconcile(t0)
                self._lifecycle_changed = False
                serving = self.state == SERVING
                n_serving = int(serving.sum())
            draining = self.state == DRAINING
            if draining.any():
                idle = draining & (self.n_running == 0)
                if idle.any():
                    self.state[idle] = OFF
                    self._lifecycle_changed = True
            billed = int((self.state != OFF).sum())

            columns = arrivals.slice(i)
            n_arrived = columns[0].size
            self.arrived += n_arrived
            self.queue.push(*columns)
            busy = self.debt.copy()

            # phase A: slots free at the slice start, the least-loaded replica's first
            rows_a = _NO_INT
            prefill = np.zeros(R)
            if len(self.queue):
                free = ~self.active
                free[~serving] = False
                flat = np.flatnonzero(free)
                if flat.size:
                    load = self.n_running[:, None] + np.cumsum(free, axis=1)
                    rows_a, cols_a, finish_a, work_a = self._admit(t0, flat, load.ravel()[flat], None, busy)
                    if rows_a.size:
                        prefill = np.bincount(rows_a, weights=work_a, minlength=R)
                        np.maximum.at(busy, rows_a, finish_a)
            running = self.n_running.copy()
            k = None
            if running.any():
                # batch (a request admitted late in the slice counts for the share it runs), K, step time
                count = running
                if rows_a.size:
                    count = running - np.bincount(rows_a, weights=np.minimum(finish_a / dt, 1.0), minlength=R)
                batch = np.minimum(np.maximum(np.rint(count), 1), self.S).astype(np.int64)
                generated = (self.output - 1.0 - self.rem)
                context = ((self.length - self.output + generated) * self.active).sum(axis=1) / np.maximum(running, 1)
                ctx_idx = np.minimum(np.searchsorted(_CONTEXT_GRID, context), len(_CONTEXT_GRID) - 1)
                engine = self.mode_engine[self.mode]
                k = self.mode_k[self.mode, batch]
                step_s = self.step_table[engine, batch, k, ctx_idx]
                decode_share = np.maximum(1.0 - (self.debt + prefill) / dt, 0.0)
                if rows_a.size:
                    self._first_tokens(t0, rows_a, cols_a, finish_a, step_s)
                completed = self._decode(t0, dt, all_rows, decode_share, step_s, k, engine)

                # phase B: slots that freed up during the slice, refilled in the order they freed
                if completed and len(self.queue):
                    d_rows, d_cols, d_time = self._freed
                    keep = serving[d_rows]
                    flat = (d_rows * self.S + d_cols)[keep]
                    times = d_time[keep]
                    rows_b, cols_b, finish_b, work_b = self._admit(t0, flat, times, times, busy)
                    if rows_b.size:
                        self._first_tokens(t0, rows_b, cols_b, finish_b, step_s)
                        fresh = np.zeros((R, self.S), dtype=bool)
                        fresh[rows_b, cols_b] = True
                        self._decode(t0, dt, all_rows, decode_share, step_s, k, engine, fresh)
                        np.maximum.at(busy, rows_b, finish_b)
                        # their prefill ran in time this slice's decoding already used: carry it over
                        busy += np.bincount(rows_b, weights=work_b, minlength=R)
            self.debt = np.maximum(busy - dt, 0.0)

            self.replica_seconds += billed * dt
            running_total = float(running[serving].sum())
            k_weighted = float((k * running).sum()) if k is not None else 0.0
            series.add(t0, dt, n_arrived, self.tokens - tokens_before, billed, n_serving, running_total,
                       len(self.queue), k_weighted)
            tpots = np.concatenate(self._slice_tpot) if self._slice_tpot else _NO_FLOAT
            self._slice_tpot = []
            window.append((n_arrived, running_total, len(self.queue), n_serving, tpots))
            if progress is not None:
                progress(t0 + dt)

        gpu_hours = self.replica_seconds * self.setup.tensor_parallel_size / 3600.0
        return SimResult(
            policy=self.policy.name, method=self.policy.method, duration_s=duration,
            requests_arrived=self.arrived, requests_completed=self.completed, output_tokens=self.tokens,
            gpu_hours=gpu_hours, cost_usd=gpu_hours * self.setup.gpu_price_per_hour,
            slo_tpot_ms=self.slo_tpot_ms, tpot_met=self.tpot_met,
            tpot_p50_ms=self.tpot_hist.percentile_ms(50), tpot_p95_ms=self.tpot_hist.percentile_ms(95),
            ttft_p50_ms=self.ttft_hist.percentile_ms(50), ttft_p95_ms=self.ttft_hist.percentile_ms(95),
            rollouts=self.rollouts,
            timeseries=series.finish(self.setup.tensor_parallel_size * self.setup.gpu_price_per_hour),
            events=self.events, slo_ttft_ms=self.slo_ttft_ms, ttft_met=self.ttft_met, slo_met=self.slo_met,
            slo_output_tokens=self.slo_tokens)

    def _observe(self, t: float, window: collections.deque) -> Observation:
        n = max(len(window), 1)
        arrivals = sum(w[0] for w in window)
        running = sum(w[1] for w in window)
        waiting = sum(w[2] for w in window) / n
        serving_sum = sum(w[3] for w in window)
        live = (self.state == STARTING) | (self.state == SERVING)
        samples = collections.Counter(round(w[1] / w[3], 1) for w in window if w[3])
        weight = sum(samples.values())
        tpots = [w[4] for w in window if len(w) > 4 and w[4].size]
        tpot_p95 = float(np.percentile(np.concatenate(tpots), 95) * 1e3) if tpots else None
        return Observation(
            t_s=t, arrival_rate_rps=arrivals / (n * self.config.slice_s),
            running_per_replica=running / serving_sum if serving_sum else 0.0, waiting=waiting,
            serving_replicas=int((self.state == SERVING).sum()), active_replicas=int(live.sum()),
            mode=self.mode_names[self.target_mode],
            rollout_in_progress=bool((live & (self.mode != self.target_mode)).any()),
            concurrency_histogram=tuple((c, count / weight) for c, count in sorted(samples.items())),
            window_s=n * self.config.slice_s, tpot_p95_ms=tpot_p95)


_NO_INT = np.empty(0, dtype=np.int64)
_NO_FLOAT = np.empty(0)


class _Series:
    """Per-bin sums over the run, turned into rates and means for the plots and reports."""

    FIELDS = ("arrivals", "tokens", "billed", "serving", "running", "queue", "k_weighted", "met", "completed")

    def __init__(self, n_bins: int, bin_s: float) -> None:
        self.bin_s = bin_s
        self.sums = {name: np.zeros(n_bins) for name in self.FIELDS}
        self.seconds = np.zeros(n_bins)
        self.serving_min = np.full(n_bins, np.inf)

    def add(self, t0: float, dt: float, arrivals: int, tokens: float, billed: int, serving: int,
            running: float, queue: int, k_weighted: float) -> None:
        j = min(int(t0 // self.bin_s), len(self.seconds) - 1)
        self.seconds[j] += dt
        s = self.sums
        s["arrivals"][j] += arrivals
        s["tokens"][j] += tokens
        s["billed"][j] += billed * dt
        s["serving"][j] += serving * dt
        s["running"][j] += running * dt
        s["queue"][j] += queue * dt
        s["k_weighted"][j] += k_weighted * dt
        if serving < self.serving_min[j]:
            self.serving_min[j] = serving

    def finish(self, price_per_replica_hour: float) -> dict[str, np.ndarray]:
        s, sec = self.sums, np.maximum(self.seconds, 1e-12)
        running = s["running"]
        return {
            "t_s": np.arange(len(sec)) * self.bin_s,
            "arrival_rps": s["arrivals"] / sec,
            "output_tok_s": s["tokens"] / sec,
            "replicas": s["billed"] / sec,
            "serving_replicas": s["serving"] / sec,
            "serving_replicas_min": self.serving_min,
            "running_per_replica": running / np.maximum(s["serving"], 1e-12),
            "queue": s["queue"] / sec,
            "mean_k": np.where(running > 0, s["k_weighted"] / np.maximum(running, 1e-12), 0.0),
            "cost_usd_per_hour": s["billed"] / sec * price_per_replica_hour,
            "slo_attainment": np.where(s["completed"] > 0, s["met"] / np.maximum(s["completed"], 1), np.nan),
        }


class _ArrivalChunks:
    """Poisson arrivals from the trace, generated a few hundred slices at a time."""

    CHUNK = 512

    def __init__(self, trace: LoadTrace, lengths: RequestLengths, rng: np.random.Generator, dt: float,
                 chunk: int | None = None) -> None:
        self.trace, self.lengths, self.rng, self.dt = trace, lengths, rng, dt
        if chunk is not None:
            self.CHUNK = max(int(chunk), 1)  # a trace whose future rate is not decided yet: one tick at a time
        self.first = -self.CHUNK
        self.bounds = np.zeros(1, dtype=np.int64)
        self.columns: tuple[np.ndarray, ...] = ()

    def slice(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        if i >= self.first + self.CHUNK:
            self._generate(i)
        j = i - self.first
        s = slice(self.bounds[j], self.bounds[j + 1])
        return tuple(c[s] for c in self.columns)  # type: ignore[return-value]

    def _generate(self, first: int) -> None:
        dt, rng = self.dt, self.rng
        t0 = (first + np.arange(self.CHUNK)) * dt
        rate = np.clip(self.trace.rate_rps(t0 + dt / 2), 0.0, None)
        counts = rng.poisson(rate * dt)
        n = int(counts.sum())
        offsets = rng.uniform(0.0, dt, n)
        slice_of = np.repeat(np.arange(self.CHUNK), counts)
        order = np.lexsort((offsets, slice_of))
        arrival = t0[slice_of] + offsets[order]  # slice_of is sorted, so order keeps it
        prompt, output, factor = self.lengths.sample(rng, n)
        self.columns = (arrival, (prompt + output).astype(float), output.astype(float), factor)
        self.bounds = np.concatenate(([0], np.cumsum(counts)))
        self.first = first


class _LogArrivals:
    """A request log's own arrivals and lengths, slice by slice; each request draws only its acceptance factor
    (a log records lengths, not how predictable the text was)."""

    def __init__(self, log: RequestLog, lengths: RequestLengths, rng: np.random.Generator, dt: float) -> None:
        arrival = np.asarray(log.arrival_s, dtype=float)
        # a one-token answer has no TPOT: such requests are served as two tokens
        output = np.maximum(np.asarray(log.output_tokens, dtype=float), 2.0)
        prompt = np.asarray(log.input_tokens, dtype=float)
        sigma = lengths.acceptance_sigma
        factor = rng.lognormal(-sigma**2 / 2, sigma, arrival.size)
        self.columns = (arrival, prompt + output, output, factor)
        n_slices = int(math.ceil(log.duration_s / dt)) + 1
        self.bounds = np.searchsorted(arrival, np.arange(n_slices + 1) * dt, side="left")

    def slice(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        i = min(i, self.bounds.size - 2)
        s = slice(self.bounds[i], self.bounds[i + 1])
        return tuple(c[s] for c in self.columns)  # type: ignore[return-value]


_TABLE_CACHE: dict[tuple, EngineTables] = {}


def engine_tables(setup: FleetSetup, config: FleetConfig, method: str | None, max_k: int) -> EngineTables:
    """The (cached) tables of the engine with `method`'s drafter loaded (None: the plain engine)."""
    key = (setup.model_id, setup.sku, setup.workload, setup.tensor_parallel_size, method, max_k,
           config.max_num_seqs, config.gpu_memory_utilization)
    if key not in _TABLE_CACHE:
        _TABLE_CACHE[key] = EngineTables(setup.twin(method), config.max_num_seqs, max_k,
                                         config.gpu_memory_utilization)
    return _TABLE_CACHE[key]


ArrivalChunks = _ArrivalChunks


def fleet_run(policy: FleetPolicy, trace: LoadTrace, setup: FleetSetup, config: FleetConfig,
              slo_tpot_ms: float | None, max_replicas: int, seed: int, slo_ttft_ms: float | None = None
              ) -> Generator[Observation, Action, SimResult]:
    """`simulate`'s run as a generator (`_Fleet.steps`): it yields the observation at every control tick and takes
    the action sent back, so a driver can run several pools in step (sim.mixed's closed loop); returns the result.
    The policy's `start()` sets the first replicas and mode."""
    if max_replicas < 1:
        raise ValueError(f"max_replicas must be >= 1 (got {max_replicas})")
    fleet = _Fleet(policy, trace, setup, config, slo_tpot_ms, max_replicas, seed,
                   lambda method, max_k: engine_tables(setup, config, method, max_k), slo_ttft_ms)
    return fleet.steps()


def simulate(policy: FleetPolicy, trace: LoadTrace, setup: FleetSetup, config: FleetConfig | None = None,
             slo_tpot_ms: float | None = None, max_replicas: int = 8, seed: int = 0,
             progress: Callable[[float], None] | None = None, slo_ttft_ms: float | None = None) -> SimResult:
    """Serve `trace` with `policy` on a fleet of at most `max_replicas` replicas; `progress(t_s)` per slice.

    The same seed gives the same arrivals and request lengths to every policy (a request log gives its own).
    A request is within SLO when its TPOT is within `slo_tpot_ms` and its TTFT within `slo_ttft_ms` (None:
    that SLO is not checked).
    """
    config = config or FleetConfig()
    if max_replicas < 1:
        raise ValueError(f"max_replicas must be >= 1 (got {max_replicas})")
    fleet = _Fleet(policy, trace, setup, config, slo_tpot_ms, max_replicas, seed,
                   lambda method, max_k: engine_tables(setup, config, method, max_k), slo_ttft_ms)
    return fleet.run(progress)
