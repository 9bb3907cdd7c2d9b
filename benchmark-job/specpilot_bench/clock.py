"""The clock the benchmark times its levels with, injected: the wall clock, or a simulated engine's virtual clock.

In a cluster the load generator times requests with `time.perf_counter` (`wall_clock`). Against the sandbox's
simulated engine it reads the engine's virtual clock instead, so a level is timed in the simulated GPU's
seconds, not the host's: the engine publishes that clock in a small memory-mapped file and names it in the
environment (`CLOCK_FILE_ENV`, set by the sandbox for its benchmark Jobs); `clock_from_environment` picks the
reader. The file's layout is defined here, beside its reader, and the engine's writer
(`specpilot_sandbox.clock.VirtualClock`) imports it, so the benchmark never imports the sandbox.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

__all__ = ["CLOCK_FILE_ENV", "CLOCK_LAYOUT", "WRITER_WAIT_S", "Clock", "clock_from_environment", "clock_value",
           "open_clock_map", "read_clock", "wall_clock"]


class Clock(Protocol):
    """A `time.perf_counter`-like function: seconds, never going back, with an arbitrary origin."""

    def __call__(self) -> float: ...


wall_clock: Clock = time.perf_counter
"""The default: the host's clock, what a benchmark Job next to a real GPU times with."""

CLOCK_FILE_ENV = "SPECPILOT_SIM_CLOCK_FILE"
"""Environment variable naming the file a simulated engine publishes its virtual clock in; unset in a cluster."""
CLOCK_LAYOUT = struct.Struct("<Qdddd")
"""sequence (odd while a write is in progress), anchor wall time, anchor simulated time, rate, cap."""
WRITER_WAIT_S = 5.0
"""How long a reader waits for a write in progress to finish. A write takes microseconds, but on a busy host
the engine can be descheduled in the middle of one for a scheduler slice or more (a reader that gave up
after a thousand spins, about a millisecond, failed a benchmark Job on a host with one core kept busy); past
this the writer is taken to have died mid-write."""
_SPINS = 200
"""Reads retried back to back before the reader starts yielding the CPU to the writer."""


def clock_from_environment(environ: Mapping[str, str] = os.environ) -> Clock:
    """`wall_clock`, or the virtual clock in the file `CLOCK_FILE_ENV` names."""
    path = environ.get(CLOCK_FILE_ENV, "").strip()
    return read_clock(path) if path else wall_clock


def clock_value(anchor_wall: float, anchor_v: float, rate: float, cap: float, wall: float) -> float:
    """The virtual time at wall time `wall`: from the anchor at `rate` simulated seconds per wall second, up to `cap`."""
    return min(anchor_v + max(0.0, wall - anchor_wall) * rate, cap)


def open_clock_map(path: Path, *, create: bool) -> mmap.mmap:
    """The clock file, mapped (created and sized by the writer)."""
    # The file keeps its inode across engines (opened, never truncated), so a reader's map follows the next
    # engine a benchmark Job starts.
    flags = os.O_RDWR | (os.O_CREAT if create else 0)
    fd = os.open(path, flags, 0o600)
    try:
        if os.fstat(fd).st_size < CLOCK_LAYOUT.size:
            os.ftruncate(fd, CLOCK_LAYOUT.size)
        return mmap.mmap(fd, CLOCK_LAYOUT.size)
    finally:
        os.close(fd)


def read_clock(path: str | Path, writer_wait_s: float = WRITER_WAIT_S) -> Clock:
    """A `time.perf_counter`-like function that reads the virtual clock an engine publishes at `path`.

    Before an engine has published anything (the file is new) it reads the wall clock, which is where a
    virtual clock starts. While a write is in progress it retries: first back to back, then sleeping (so a
    writer descheduled mid-write gets the CPU back), for up to `writer_wait_s`.
    """
    path = Path(path)
    state: dict[str, mmap.mmap] = {}

    def now() -> float:
        view = state.get("map")
        if view is None:
            if not path.exists():
                return time.monotonic()
            view = state["map"] = open_clock_map(path, create=False)
        attempt, deadline = 0, None
        while True:
            seq, anchor_wall, anchor_v, rate, cap = CLOCK_LAYOUT.unpack_from(view, 0)
            wall = time.monotonic()
            if seq == 0:
                return wall
            if seq % 2 == 0 and struct.unpack_from("<Q", view, 0)[0] == seq:
                return clock_value(anchor_wall, anchor_v, rate, cap, wall)
            attempt += 1
            if attempt <= _SPINS:
                continue
            deadline = deadline if deadline is not None else wall + writer_wait_s
            if wall > deadline:
                raise RuntimeError(f"the virtual clock at {path} has been mid-write for {writer_wait_s:g} s: its "
                                   f"engine died while writing it, or stopped")
            time.sleep(min(0.0001 * 2 ** min(attempt - _SPINS, 7), 0.01))

    return now
