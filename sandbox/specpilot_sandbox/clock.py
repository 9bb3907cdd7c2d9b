"""The simulated engine's clocks: wall time, or a virtual clock that no host can stretch.

A simulated GPU's step takes the twin's step time. On a slow or busy host the engine's own Python work and
its clients' (one HTTP chunk per request per step) can take longer than that, so wall-clock measurements
see the host's CPU instead of the GPU the twin stands for, and they see it unevenly: a step without
speculation hands every request one token, a speculative step several, so the host's cost per generated
token is higher without speculation and a busy host makes speculation look better than it is.

`VirtualClock` keeps simulated time apart from wall time:
- during a step it runs from the step's start to its end (start + the twin's step time) at the rate the
  engine paces the step, and stops at the end however late the host finishes the step's work;
- after a step it stands still while the engine waits for the clients' next requests (the arrival window,
  see `engine_core`), so a request sent in reply to a finished one arrives at the step's end, as with a
  client next to a real GPU;
- while the engine is idle it stands still too: with nothing to run, no simulated time passes, so a client
  that reads the last tokens of a level late (a busy host) does not stretch the level; and it stands still
  while the engine, woken by a request, waits for the rest of a burst of them to come in.

The engine publishes the clock in a small memory-mapped file (`SPECPILOT_SIM_CLOCK_FILE`), and a client on the
same host reads the same time (`specpilot_bench.clock.read_clock`, where the file's layout is defined), so the
benchmark Job's own load generator measures latencies and throughput in simulated seconds. The sandbox's
kubelet gives every engine it runs a clock file of its own, the serving pods' included, and the demo's clients
time each request with the clock of the replica it went to (`demo.load`). In a cluster nothing sets the
variable: clients use `time.perf_counter`.
"""

from __future__ import annotations

import mmap
import struct
import time
from pathlib import Path

from specpilot_bench.clock import CLOCK_FILE_ENV, CLOCK_LAYOUT, clock_value, open_clock_map

__all__ = ["CLOCK_FILE_ENV", "VirtualClock", "WallClock"]


class WallClock:
    """Simulated time is wall time (time.monotonic): an engine started without a clock file."""

    virtual = False

    def now(self) -> float:
        return time.monotonic()

    def step(self, simulated_s: float, wall_deadline: float) -> None:
        """A step of `simulated_s` starts and ends at `wall_deadline` (nothing to do on the wall)."""

    def step_end(self) -> float:
        return time.monotonic()

    def idle(self) -> None:
        """The engine has no work (nothing to do on the wall)."""


class VirtualClock:
    """Simulated seconds that advance by the twin's step times, not by the host's speed (module docstring)."""

    virtual = True

    def __init__(self, publish_path: str | Path | None = None) -> None:
        wall = time.monotonic()
        # Starts at the wall clock, the time base clients read before an engine publishes.
        self._anchor_wall, self._anchor_v, self._rate, self._cap = wall, wall, 0.0, wall
        self._seq = 0
        self._map: mmap.mmap | None = None
        if publish_path:
            self._map = open_clock_map(Path(publish_path), create=True)
        self._publish()

    def now(self) -> float:
        return clock_value(self._anchor_wall, self._anchor_v, self._rate, self._cap, time.monotonic())

    def step(self, simulated_s: float, wall_deadline: float) -> None:
        """A step of `simulated_s` simulated seconds starts now and is paced to end at `wall_deadline`."""
        wall = time.monotonic()
        start = self.now()
        self._set(wall, start, simulated_s / max(wall_deadline - wall, 1e-6), start + simulated_s)

    def step_end(self) -> float:
        """The running step is done: the clock stands at its end (until the next `step`); returns that time."""
        end = self._cap
        self._set(time.monotonic(), end, 0.0, end)
        return end

    def hold(self) -> None:
        """The clock stands still at the present (until the next `step`): arrivals meanwhile share one time."""
        now = self.now()
        self._set(time.monotonic(), now, 0.0, now)

    def idle(self) -> None:
        """No work: no simulated time passes until the next step."""
        self.hold()

    def _set(self, wall: float, v: float, rate: float, cap: float) -> None:
        self._anchor_wall, self._anchor_v, self._rate, self._cap = wall, v, rate, cap
        self._publish()

    def _publish(self) -> None:
        if self._map is None:
            return
        # A seqlock: readers retry while the sequence is odd or changed under them.
        self._seq += 1
        CLOCK_LAYOUT.pack_into(self._map, 0, self._seq, self._anchor_wall, self._anchor_v, self._rate, self._cap)
        self._seq += 1
        struct.pack_into("<Q", self._map, 0, self._seq)

    def close(self) -> None:
        if self._map is not None:
            self._map.close()
            self._map = None

