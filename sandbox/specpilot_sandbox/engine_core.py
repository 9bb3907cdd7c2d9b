"""The simulated engine's scheduler: vLLM-style continuous batching timed and accepted by the digital twin.

One `EngineCore` is one vLLM engine (one data-parallel rank). Each engine step it:
1. reserves KV blocks for the decoding requests' next tokens (k + 1 lookahead slots, as vLLM allocates),
   preempting the most recently admitted request when blocks run out (vLLM's recompute preemption: its
   blocks are freed and it later prefills its prompt and the tokens it already generated again);
2. continues chunked prefills and admits waiting requests first come, first served, while `max_num_seqs`,
   the step's token budget (`max_num_batched_tokens`) and free KV blocks allow. KV is held for what a
   request has (prompt + generated so far, in 16-token blocks), not reserved for its `max_tokens` up front,
   so a full cache shows up as waiting requests and preemptions, as in vLLM;
3. picks K from the batch size (all requests scheduled in the step) through the schedule's ranges
   (`api.schedule.k_at`: gap-carry and the cap at num_speculative_tokens), or the fixed K;
4. takes twin.step_time_s(decoding requests, K, mean context) plus the prefill cost of the step's
   prefill tokens, divides it by the time scale, and sleeps until the step's end;
5. then, per decoding request, drafts with probability f and accepts a prefix of the K drafts (one
   uniform u per draft: accepted length = #{j : u < p_j}, since the profile's p_j are prefix
   probabilities P(at least j accepted)), emits 1 + accepted tokens, and counts drafts, draft tokens and
   accepted tokens per position exactly as vLLM's spec-decode counters do. The u come from an
   equidistributed sequence (a random start plus an irrational step), not independent draws: the share of
   drafts accepting j tokens matches p_j to within about one draft over any run, so a short profile
   measures the twin's acceptance instead of sampling noise around it.

Times come from the core's clock (`sandbox.clock`). On the wall clock (an engine started without a clock file)
the twin's step times are divided by `time_scale` and steps are scheduled on a running deadline (the next step
starts where the last one ended while the engine stays busy), so Python overhead below the step time does not
slow the simulated GPU, and a client timing requests and the engine's /metrics agree. On a virtual clock (every
engine the sandbox's kubelet runs: the benchmark Jobs' and the serving pods')
simulated time advances by the twin's step times whatever the host's speed; an engine woken from idle waits
(with the clock standing still) until a burst of arrivals is in; and after a step that finished
requests the engine holds an arrival window: it waits (in wall time, with the clock standing at the step's
end) until as many new requests have arrived as finished, or none has come for the window's patience
(`ARRIVAL_WINDOW_S`), so a closed-loop client's
next request joins the next step however long the host took to deliver the last token and send it. That is
what `closed_loop_level` computes without any host at all, and what a measured profile is checked against.
The load gauges (running, waiting, KV usage) are then published as each step is scheduled, not as it
completes: the requests that replace the finished ones arrive at the step's end in simulated time, however
much wall time the window takes, so a scrape during the window reads the batch the clients hold.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import itertools
import time
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from specpilot import vllm_page
from specpilot.perf.twin import Twin
from specpilot.specdec import verified_tokens_per_step

from .clock import VirtualClock, WallClock
from .exporter import PromHistogram, VllmMetricsState

__all__ = ["BLOCK_SIZE", "EngineCore", "EngineMetrics", "SimRequest", "StepRecord", "LevelResult",
           "closed_loop_level", "closed_loop_ms_per_token"]

BLOCK_SIZE = 16
"""Tokens per KV block (vLLM's default on GPUs)."""
ITL_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0)
"""vLLM's bucket upper bounds for inter-token latency (a +Inf bucket follows)."""
E2E_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                 240.0, 480.0, 960.0, 1920.0, 7680.0)
"""vLLM's bucket upper bounds for end-to-end request latency (a +Inf bucket follows)."""
MAX_CATCH_UP_S = 0.02
"""How far (wall seconds) the step deadline may lag behind now before the engine stops catching up: a
pause of the process (GC, a busy laptop) must not turn into a burst of back-to-back steps."""
SETTLE_QUIET_S = 0.1
"""On a virtual clock, how long (wall seconds) no request may arrive before an engine woken from idle starts."""
LATE_WAKE_S = 0.02
"""A wait that ends this much (wall seconds) after its deadline was not this process's doing: look again."""
ARRIVAL_WINDOW_S = (0.05, 1.0)
"""Bounds (wall seconds) of the arrival window's patience on a virtual clock: when fewer requests arrive than
finished (the end of a level, clients that left), it closes once none has come for four times the typical
time the clients take per request for the requests still missing, within these bounds; each arrival starts
the wait again. Clients of 150 requests that finished in one step, on a busy core, send their first next one
only after a hundred milliseconds or so (every response is written and read first), and the window must hold
until the last one is in: a batch that starts without them runs staggered from then on, which the host-free
replay, whose clients answer at once, does not."""


class EngineMetrics(VllmMetricsState):
    """The exporter's vLLM metrics, driven by events (one engine step, one finished request) instead of rates.

    The rates of `VllmMetricsState` stay zero, so its counters move only through the `record_*` methods.
    Adds what the exporter does not serve: prompt tokens, preemptions, inter-token and e2e latency.
    """

    def __init__(self, *, model_name: str, engine: str, num_gpu_blocks: int,
                 acceptance_per_position: Sequence[float]) -> None:
        super().__init__(model_name=model_name, engine=engine, block_size=BLOCK_SIZE, num_gpu_blocks=num_gpu_blocks)
        # Non-empty turns the spec-decode families on and fixes their positions 0..K-1 from start-up, as vLLM.
        self.set_rates(acceptance_per_position=acceptance_per_position)
        self.prompt_tokens = 0
        self.preemptions = 0
        self.itl = PromHistogram(ITL_BUCKETS_S)
        self.e2e = PromHistogram(E2E_BUCKETS_S)

    def record_step(self, generated_tokens: int, drafts: int, draft_tokens: int,
                    accepted_per_position: Sequence[int]) -> None:
        self._generation_tokens += generated_tokens
        if drafts:
            self._drafts += drafts
            self._draft_tokens += draft_tokens
            self._accepted_tokens += sum(accepted_per_position)
            for j, accepted in enumerate(accepted_per_position):
                self._accepted_per_position[j] += accepted

    def record_first_token(self, ttft_s: float, prompt_tokens: int) -> None:
        self._ttft.observe(ttft_s, 1)
        self.prompt_tokens += prompt_tokens

    def record_finished(self, e2e_s: float, tpot_s: float | None) -> None:
        self._request_success += 1
        self.e2e.observe(e2e_s, 1)
        if tpot_s is not None:
            self._tpot.observe(tpot_s, 1)

    def metric_families(self) -> Iterator[Metric]:
        yield from super().metric_families()
        labels = [vllm_page.ENGINE_LABEL, vllm_page.MODEL_NAME_LABEL]
        values = [self.engine, self.model_name]
        for name, doc, value in ((vllm_page.PROMPT_TOKENS_TOTAL, "Number of prefill tokens processed.",
                                  self.prompt_tokens),
                                 (vllm_page.NUM_PREEMPTIONS_TOTAL, "Cumulative number of preemption from the engine.",
                                  self.preemptions)):
            family = CounterMetricFamily(name, doc, labels=labels)
            family.add_metric(values, value)
            yield family
        for name, doc, hist in ((vllm_page.ITL_SECONDS, "Histogram of inter-token latency in seconds.", self.itl),
                                (vllm_page.E2E_SECONDS, "Histogram of e2e request latency in seconds.", self.e2e)):
            family = HistogramMetricFamily(name, doc, labels=labels)
            family.add_metric(values, hist.cumulative(), sum_value=hist.sum_s)
            yield family


@dataclasses.dataclass(eq=False)
class SimRequest:
    """One request in the engine; the HTTP handler reads `(tokens, finish_reason)` items from `outputs`."""

    prompt_tokens: int
    max_tokens: int
    stop_at_tokens: int
    """Where the (simulated) model emits EOS: max_tokens with ignore_eos, else a workload-typical length."""
    arrival_s: float = dataclasses.field(default_factory=time.monotonic)
    outputs: asyncio.Queue = dataclasses.field(default_factory=asyncio.Queue)
    generated: int = 0
    prefilled: int = 0
    prefill_target: int = 0
    blocks: int = 0
    first_token_s: float | None = None
    last_token_s: float | None = None
    finish_reason: str | None = None
    aborted: bool = False

    def __post_init__(self) -> None:
        self.prefill_target = self.prompt_tokens

    @property
    def context_len(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def decoding(self) -> bool:
        return self.prefilled >= self.prefill_target

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None or self.aborted


@dataclasses.dataclass(frozen=True, slots=True)
class StepRecord:
    """What one engine step did and how long the twin said it takes."""

    batch_size: int
    """Requests scheduled in the step (what the schedule's K is looked up at)."""
    decode_batch_size: int
    num_speculative_tokens: int
    prefill_tokens: int
    mean_context_len: float
    simulated_s: float
    """The twin's step time (simulated seconds)."""
    duration_s: float
    """simulated_s / time_scale: the wall seconds the step takes."""


_DRAFT_STEP = (5 ** 0.5 - 1) / 2
_ACCEPT_STEP = 2 ** 0.5 - 1
"""Irrational steps of the two equidistributed sequences (golden ratio and silver ratio conjugates)."""


class _Equidistributed:
    """u_n = frac(start + n * step): uniform on [0, 1) in the limit, with discrepancy O(log n / n)."""

    def __init__(self, start: float, step: float) -> None:
        self._next = start
        self._step = step

    def take(self, n: int) -> np.ndarray:
        u = np.mod(self._next + self._step * np.arange(n), 1.0)
        self._next = (self._next + self._step * n) % 1.0
        return u


@dataclasses.dataclass(slots=True)
class _Plan:
    running: list[SimRequest]
    decoding: list[SimRequest]
    prefill_chunks: list[tuple[SimRequest, int]]
    record: StepRecord


def _blocks_for(tokens: int) -> int:
    return -(-tokens // BLOCK_SIZE)


class EngineCore:
    """Continuous batching over the twin (see the module docstring). `run()` is the engine loop."""

    def __init__(self, twin: Twin, *, k_at_batch: Callable[[int], int], max_k: int, kv_capacity_tokens: int,
                 max_num_seqs: int, max_num_batched_tokens: int, time_scale: float, seed: int,
                 metrics: EngineMetrics, step_log_size: int = 4096,
                 clock: WallClock | VirtualClock | None = None) -> None:
        if time_scale <= 0:
            raise ValueError(f"time_scale must be > 0 (got {time_scale})")
        self.twin = twin
        self.k_at_batch = k_at_batch
        self.max_k = max_k
        self._max_verified = int(verified_tokens_per_step(1.0, max_k))
        """Tokens one decoding request verifies in a step at most (a draft of `max_k` every step): the KV blocks it
        may need and the token budget it takes."""
        self.num_gpu_blocks = kv_capacity_tokens // BLOCK_SIZE
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.time_scale = time_scale
        self.clock = clock or WallClock()
        self.metrics = metrics
        rng = np.random.default_rng(seed)
        self._draft_draws = _Equidistributed(rng.random(), _DRAFT_STEP)
        self._accept_draws = _Equidistributed(rng.random(), _ACCEPT_STEP)
        self.step_log: collections.deque[StepRecord] = collections.deque(maxlen=step_log_size)
        self.waiting: collections.deque[SimRequest] = collections.deque()
        self.running: list[SimRequest] = []
        self.used_blocks = 0
        self._wake = asyncio.Event()
        self._arrivals = 0
        self._arrived = asyncio.Event()
        self.arrival_wait_s = 0.005
        """Typical wall seconds the clients take per request to send the next ones after a step (moving average
        over completed windows of their duration over the requests that finished)."""
        self._window_missing = 0
        """Requests the last arrival window closed without."""
        self.arrival_windows = [0, 0]
        """Arrival windows held, and how many of them closed before as many requests arrived as finished."""
        self.late_arrivals = 0
        """Requests that arrived after their window had closed, while the engine was busy (the batch they would
        have joined ran without them); each one widens the window."""
        self._window_closed_s: float | None = None
        """Wall time of the closed arrival window's last arrival (or its opening, a step's end, if none came);
        None while a window is open."""
        acceptance = twin.acceptance
        self._p = np.asarray(acceptance.per_position[:max_k], dtype=float)
        self._drafts_per_step = acceptance.drafts_per_step if max_k else 0.0
        self._step_overhead_s = twin.calibration.step_overhead_s

    # ---- requests --------------------------------------------------------------------------------------
    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)

    def now(self) -> float:
        """The core's time (simulated seconds on a virtual clock): what a request's arrival is stamped with."""
        return self.clock.now()

    def add_request(self, request: SimRequest) -> None:
        if self._window_closed_s is not None and self.running and self._window_missing:
            # Closed loop on a host that answered slower than the window: learn how long it takes.
            self.late_arrivals += 1
            self.arrival_wait_s = max(self.arrival_wait_s,
                                      (time.monotonic() - self._window_closed_s) / self._window_missing)
            self._window_missing -= 1
        self.waiting.append(request)
        self._arrivals += 1
        self._arrived.set()
        self._wake.set()

    def abort(self, request: SimRequest) -> None:
        """Drops a request whose client went away; its blocks are freed at the next step boundary."""
        if request.finished:
            return
        request.aborted = True
        if request in self.waiting:
            self.waiting.remove(request)

    def shutdown(self) -> None:
        """Ends every request still in the engine with finish reason "abort" (as vLLM does on shutdown), so
        their handlers answer and the server can close without waiting on them."""
        for request in [*self.running, *self.waiting]:
            if not request.finished:
                request.aborted = True
                request.finish_reason = "abort"
                request.outputs.put_nowait((0, "abort"))
        self.waiting.clear()
        self._drop_finished()

    # ---- the loop --------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Steps while there is work, sleeps on an event while there is none (see the module docstring)."""
        clock = self.clock
        deadline = time.monotonic()
        while True:
            plan = self.schedule_step()
            if plan is None:
                clock.idle()
                self._publish_load()
                self._wake.clear()
                await self._wake.wait()
                if clock.virtual:
                    await self._settle_arrivals()
                deadline = time.monotonic()
                continue
            now = time.monotonic()
            # On the wall clock a late step is caught up (within MAX_CATCH_UP_S); on a virtual one it need not be.
            deadline = (max(deadline, now - MAX_CATCH_UP_S) if not clock.virtual else now) + plan.record.duration_s
            clock.step(plan.record.simulated_s, deadline)
            await asyncio.sleep(max(0.0, deadline - now))
            finished = self.complete_step(plan, clock.step_end())
            if clock.virtual and finished:
                emptied = not self.load
                await self._arrival_window(finished)
                if emptied:  # the last requests finished: a new burst (the next level) may follow theirs
                    await self._settle_arrivals()

    async def _settle_arrivals(self) -> None:
        """Woken from idle, or emptied by a step, on a virtual clock: the clock stands still while a burst of
        requests (a level's first `concurrency`) comes in, until none has arrived for the quiet period
        (SETTLE_QUIET_S, or longer where the clients have been slower), so the burst starts together in one
        step as in `closed_loop_level` instead of as far apart as the host's sending took."""
        self.clock.hold()
        started = time.monotonic()
        self._window_closed_s, self._window_missing = None, 0
        while await self._next_arrival(time.monotonic() + max(SETTLE_QUIET_S, self.arrival_wait_s)):
            pass
        self._window_closed_s = started

    async def _arrival_window(self, finished: int) -> None:
        """Waits until `finished` new requests have arrived, or none has for the window's patience (the clock
        stands still)."""
        self.clock.hold()
        target = self._arrivals + finished
        started = last = time.monotonic()
        low, high = ARRIVAL_WINDOW_S
        self._window_closed_s = None
        while self._arrivals < target:
            patience = min(high, max(low, 4 * self.arrival_wait_s * (target - self._arrivals)))
            if not await self._next_arrival(last + patience):
                break
            last = time.monotonic()
        self.arrival_windows[0] += 1
        self._window_missing = max(0, target - self._arrivals)
        if not self._window_missing:
            self.arrival_wait_s += 0.2 * ((last - started) / finished - self.arrival_wait_s)
        else:
            self.arrival_windows[1] += 1
        self._window_closed_s = last

    async def _next_arrival(self, deadline: float) -> bool:
        """Whether a request arrives before `deadline` (wall). A deadline that fires late means this process
        was not running (a busy host): requests may be waiting in its sockets, so it looks again after a
        short grace instead of closing on them."""
        while True:
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), max(0.0, deadline - time.monotonic()))
                return True
            except TimeoutError:
                if time.monotonic() - deadline < LATE_WAKE_S:
                    return False
                deadline = time.monotonic() + LATE_WAKE_S

    def schedule_step(self) -> _Plan | None:
        """Decides the next step: preemptions, prefill chunks, admissions, K and the step's duration."""
        self._drop_aborted()
        if not self.running and not self.waiting:
            return None
        free = self.num_gpu_blocks - self.used_blocks
        # Decode growth first (running requests keep priority over new ones); out of blocks, preempt the last.
        i = 0
        while i < len(self.running):
            request = self.running[i]
            if request.decoding:
                need = _blocks_for(request.context_len + self._max_verified) - request.blocks
                while need > free:
                    victim = self.running[-1]
                    free += self._preempt(victim)
                    if victim is request:
                        break
                else:
                    request.blocks += need
                    free -= need
            i += 1
        decoding = [r for r in self.running if r.decoding]
        budget = self.max_num_batched_tokens - len(decoding) * self._max_verified
        chunks: list[tuple[SimRequest, int]] = []
        for request in self.running:
            if not request.decoding and budget > 0:
                chunk = min(request.prefill_target - request.prefilled, budget)
                chunks.append((request, chunk))
                budget -= chunk
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            request = self.waiting[0]
            need = _blocks_for(request.prefill_target + 1)
            if need > free:
                break  # first come, first served: the head of the queue waits for blocks
            self.waiting.popleft()
            request.prefilled = 0
            request.blocks = need
            free -= need
            self.running.append(request)
            chunk = min(request.prefill_target, budget)
            chunks.append((request, chunk))
            budget -= chunk
        self.used_blocks = self.num_gpu_blocks - free
        self._publish_load()
        if not decoding and not chunks:
            return None
        batch = len(self.running)
        k = min(self.k_at_batch(batch), self.max_k)
        mean_context = (sum(r.context_len for r in decoding) / len(decoding)) if decoding else 0.0
        simulated = self.twin.step_time_s(len(decoding), k, mean_context) if decoding else 0.0
        prefill_tokens = sum(chunk for _, chunk in chunks)
        if chunks:
            simulated += self.twin.prefill_time_s(prefill_tokens / len(chunks), len(chunks))
            if decoding:
                simulated -= self._step_overhead_s  # one step, one fixed overhead
        record = StepRecord(batch_size=batch, decode_batch_size=len(decoding), num_speculative_tokens=k,
                            prefill_tokens=prefill_tokens, mean_context_len=mean_context, simulated_s=simulated,
                            duration_s=simulated / self.time_scale)
        return _Plan(list(self.running), decoding, chunks, record)

    def complete_step(self, plan: _Plan, now_s: float) -> int:
        """Applies a step's outcome at `now_s`: tokens out, acceptance sampled, counters and histograms.
        Returns how many requests finished in the step."""
        self.step_log.append(plan.record)
        metrics = self.metrics
        k = plan.record.num_speculative_tokens
        generated = drafts = 0
        accepted_per_position = [0] * k
        decoding = plan.decoding
        if decoding:
            accepted = np.zeros(len(decoding), dtype=np.int64)
            if k:
                drafted = self._draft_draws.take(len(decoding)) < self._drafts_per_step
                drafts = int(drafted.sum())
                if drafts:
                    u = self._accept_draws.take(drafts)
                    lengths = (u[:, None] < self._p[None, :k]).sum(axis=1)
                    accepted[drafted] = lengths
                    counts = np.bincount(lengths, minlength=k + 1)
                    at_least = np.cumsum(counts[::-1])[::-1]  # at_least[j]: drafts accepting >= j tokens
                    accepted_per_position = [int(x) for x in at_least[1:k + 1]]
            for request, extra in zip(decoding, accepted.tolist()):
                if not request.aborted:
                    generated += self._emit(request, 1 + extra, now_s)
        for request, chunk in plan.prefill_chunks:
            if request.aborted:
                continue
            request.prefilled += chunk
            if request.decoding:
                first = request.first_token_s is None
                generated += self._emit(request, 1, now_s)
                if first:
                    metrics.record_first_token(now_s - request.arrival_s, request.prompt_tokens)
        metrics.record_step(generated, drafts, drafts * k, accepted_per_position)
        finished = sum(1 for r in plan.running if r.finish_reason is not None and not r.aborted)
        self._drop_finished()
        if not self.clock.virtual:  # on a virtual clock the next step publishes (see the module docstring)
            self._publish_load()
        return finished

    # ---- helpers ---------------------------------------------------------------------------------------
    def _emit(self, request: SimRequest, tokens: int, now_s: float) -> int:
        tokens = min(tokens, request.stop_at_tokens - request.generated)
        if request.last_token_s is not None:
            self.metrics.itl.observe(now_s - request.last_token_s, 1)
        else:
            request.first_token_s = now_s
        request.last_token_s = now_s
        request.generated += tokens
        if request.generated >= request.stop_at_tokens:
            request.finish_reason = "length" if request.generated >= request.max_tokens else "stop"
            e2e = now_s - request.arrival_s
            tpot = ((now_s - request.first_token_s) / (request.generated - 1)) if request.generated > 1 else None
            self.metrics.record_finished(e2e, tpot)
        request.outputs.put_nowait((tokens, request.finish_reason))
        return tokens

    def _preempt(self, request: SimRequest) -> int:
        """Frees a running request's blocks and puts it first in line to recompute; returns the blocks freed."""
        self.running.remove(request)
        freed, request.blocks = request.blocks, 0
        request.prefilled = 0
        request.prefill_target = request.context_len
        self.waiting.appendleft(request)
        self.metrics.preemptions += 1
        return freed

    def _drop_aborted(self) -> None:
        if any(r.aborted for r in self.running):
            self._drop_finished()

    def _drop_finished(self) -> None:
        keep = []
        for request in self.running:
            if request.finished:
                self.used_blocks -= request.blocks
                request.blocks = 0
            else:
                keep.append(request)
        self.running = keep

    def _publish_load(self) -> None:
        usage = self.used_blocks / self.num_gpu_blocks if self.num_gpu_blocks else 0.0
        self.metrics.set_load(running=len(self.running), waiting=len(self.waiting), kv_cache_usage=usage)



@dataclasses.dataclass(frozen=True)
class LevelResult:
    """What a closed-loop level measured in virtual time (simulated seconds)."""

    duration_s: float
    output_tokens: int
    output_throughput: float
    """Output tokens per simulated second over the level, as the benchmark's load generator computes it."""


def _closed_loop(core: EngineCore, prompt_lens: Iterator[int], output_len: int, concurrency: int,
                 on_finished: Callable[[SimRequest, float], bool]) -> float:
    """Runs the core's own scheduler in virtual time (no sleeping, the twin's step times added up) with
    `concurrency` requests in flight: a request that finishes is replaced at the end of its step, so the new
    one joins the next step. Stops when the prompts run out and every request has finished, or when
    `on_finished(request, now)` returns True. Returns the simulated seconds elapsed."""
    now = 0.0
    active: list[SimRequest] = []

    def submit() -> bool:
        prompt = next(prompt_lens, None)
        if prompt is None:
            return False
        request = SimRequest(prompt_tokens=prompt, max_tokens=output_len, stop_at_tokens=output_len, arrival_s=now)
        # Nobody reads the outputs: a queue that drops them keeps memory flat over long loops.
        request.outputs = _Discard()
        core.add_request(request)
        active.append(request)
        return True

    for _ in range(concurrency):
        submit()
    while active:
        plan = core.schedule_step()
        if plan is None:
            raise RuntimeError("the engine cannot schedule a request (is the KV cache too small for one?)")
        now += plan.record.simulated_s
        core.complete_step(plan, now)
        done = [r for r in active if r.finished]
        if not done:
            continue
        active = [r for r in active if not r.finished]
        for request in done:
            if on_finished(request, now):
                return now
            submit()
    return now


def closed_loop_level(core: EngineCore, prompt_lens: Sequence[int], output_len: int,
                      concurrency: int) -> LevelResult:
    """One level of the benchmark in virtual time: every prompt of `prompt_lens` (in order, `output_len`
    tokens each with ignore_eos) with at most `concurrency` in flight, as the load generator sends them.
    The figure a profile measured on the simulated engine is checked against (`sandbox.fidelity`)."""
    if concurrency < 1 or output_len < 1 or not prompt_lens:
        raise ValueError("concurrency and output_len must be >= 1 and prompt_lens non-empty")
    tokens = 0

    def count(request: SimRequest, _: float) -> bool:
        nonlocal tokens
        tokens += request.generated
        return False

    duration = _closed_loop(core, iter(prompt_lens), output_len, concurrency, count)
    return LevelResult(duration_s=duration, output_tokens=tokens, output_throughput=tokens / duration)


def closed_loop_ms_per_token(core: EngineCore, concurrency: int, prompt_tokens: int | Sequence[int], output_len: int,
                             num_requests: int | None = None) -> float:
    """What clients keeping `concurrency` requests in flight would measure on this engine: the mean over
    requests of end-to-end latency per output token (simulated ms, time to first token included). Every
    request generates `output_len` tokens, so `concurrency` x 1000 / this is the engine's output tokens per
    second (Little's law). The prompts are `prompt_tokens` long, or take the lengths of a sequence in turn.

    The same continuous batching, chunked prefill and KV accounting the live engine does (`_closed_loop`), at
    any load, in milliseconds. The first `concurrency` requests (which all arrive at once) are the warm-up and
    not counted; then `num_requests` are (default: max(64, 3 x concurrency)).
    """
    lengths = [prompt_tokens] if isinstance(prompt_tokens, int) else list(prompt_tokens)
    if concurrency < 1 or output_len < 1 or not lengths or min(lengths) < 1:
        raise ValueError("concurrency, prompt_tokens and output_len must be >= 1")
    measured = num_requests or max(64, 3 * concurrency)
    per_token: list[float] = []
    finished = 0

    def record(request: SimRequest, now: float) -> bool:
        nonlocal finished
        finished += 1
        if finished > concurrency:
            per_token.append(1000.0 * (now - request.arrival_s) / max(1, request.generated))
        return len(per_token) >= measured

    _closed_loop(core, itertools.cycle(lengths), output_len, concurrency, record)
    if not per_token:
        raise RuntimeError("the engine finished no request (is the KV cache too small for one?)")
    return float(np.mean(per_token))


class _Discard:
    def put_nowait(self, _: object) -> None:
        pass
