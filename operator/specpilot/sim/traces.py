"""Load traces for `specpilot simulate`: the request arrival rate over time that the fleet must serve.

A trace is a rate function (requests per second at time t) over a duration. The simulator draws Poisson
arrivals from it. Four kinds, each also written as a `--trace` string:

- `constant:RPS[:SECONDS]`                 the same rate throughout;
- `diurnal:PEAK:TROUGH[:HOURS]`            a day as a sinusoid (trough at the start and end, peak halfway),
                                           compressed into HOURS (24 by default);
- `bursts:BASE:PEAK[:EVERY_S[:LENGTH_S]]`  BASE with a burst at PEAK lasting LENGTH_S every EVERY_S
                                           (defaults 600 and 60 s), the first burst one period in;
- `FILE.csv`                               rows of `time_s,arrival_rate_rps` (a header line is allowed),
                                           linear between rows, starting at the first row's time; or a
                                           request log (`sim.requestlog`: one row per request, its header
                                           naming arrival, input and output tokens), replayed as logged.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import numpy as np

__all__ = [
    "BurstTrace",
    "ConstantTrace",
    "CsvTrace",
    "DiurnalTrace",
    "LoadTrace",
    "TraceError",
    "parse_trace",
]

DAY_S = 86400.0


class TraceError(ValueError):
    """A trace that cannot be built; the message names the bad part (and the CSV line) and the fix."""


@dataclasses.dataclass(frozen=True)
class LoadTrace:
    """A request arrival rate over [0, duration_s)."""

    duration_s: float

    def rate_rps(self, t_s: np.ndarray) -> np.ndarray:
        """Arrival rate (requests/s) at each time in `t_s` (seconds from the start)."""
        raise NotImplementedError

    def describe(self) -> str:
        raise NotImplementedError

    def with_duration(self, duration_s: float) -> LoadTrace:
        """The same shape over another duration (`--duration`)."""
        _check_positive("duration", duration_s, "seconds")
        return dataclasses.replace(self, duration_s=float(duration_s))

    def max_rps(self) -> float:
        t = np.linspace(0.0, self.duration_s, 2001)
        return float(self.rate_rps(t).max())

    def mean_rps(self) -> float:
        t = np.linspace(0.0, self.duration_s, 2001)
        return float(self.rate_rps(t).mean())


@dataclasses.dataclass(frozen=True)
class ConstantTrace(LoadTrace):
    rps: float = 1.0

    def __post_init__(self) -> None:
        _check_nonnegative("constant rate", self.rps)
        _check_positive("duration", self.duration_s, "seconds")

    def rate_rps(self, t_s: np.ndarray) -> np.ndarray:
        return np.full(np.shape(t_s), self.rps, dtype=float)

    def describe(self) -> str:
        return f"constant {self.rps:g} req/s for {_duration_text(self.duration_s)}"


@dataclasses.dataclass(frozen=True)
class DiurnalTrace(LoadTrace):
    """A day as a raised cosine: TROUGH at t = 0, PEAK at half the period, compressed into `period_s`."""

    peak_rps: float = 1.0
    trough_rps: float = 0.0
    period_s: float = DAY_S

    def __post_init__(self) -> None:
        _check_nonnegative("diurnal trough", self.trough_rps)
        _check_positive("diurnal peak", self.peak_rps, "requests/s")
        if self.trough_rps > self.peak_rps:
            raise TraceError(f"diurnal trough ({self.trough_rps:g}) must be <= peak ({self.peak_rps:g}); "
                             f"write diurnal:PEAK:TROUGH:HOURS")
        _check_positive("diurnal period", self.period_s, "seconds")
        _check_positive("duration", self.duration_s, "seconds")

    def rate_rps(self, t_s: np.ndarray) -> np.ndarray:
        phase = 2.0 * math.pi * np.asarray(t_s, dtype=float) / self.period_s
        return self.trough_rps + (self.peak_rps - self.trough_rps) * 0.5 * (1.0 - np.cos(phase))

    def describe(self) -> str:
        return (f"diurnal {self.trough_rps:g}-{self.peak_rps:g} req/s, a day compressed into "
                f"{_duration_text(self.period_s)}" + ("" if self.duration_s == self.period_s
                                                     else f", {_duration_text(self.duration_s)} simulated"))


@dataclasses.dataclass(frozen=True)
class BurstTrace(LoadTrace):
    """BASE req/s with a burst at PEAK req/s lasting `burst_s` every `every_s`, the first one period in."""

    base_rps: float = 1.0
    burst_rps: float = 2.0
    every_s: float = 600.0
    burst_s: float = 60.0

    def __post_init__(self) -> None:
        _check_nonnegative("bursts base rate", self.base_rps)
        _check_nonnegative("bursts peak rate", self.burst_rps)
        _check_positive("bursts period", self.every_s, "seconds")
        _check_positive("burst length", self.burst_s, "seconds")
        if self.burst_s > self.every_s:
            raise TraceError(f"burst length ({self.burst_s:g} s) must be <= the period between bursts "
                             f"({self.every_s:g} s); write bursts:BASE:PEAK:EVERY_S:LENGTH_S")
        _check_positive("duration", self.duration_s, "seconds")

    def rate_rps(self, t_s: np.ndarray) -> np.ndarray:
        t = np.asarray(t_s, dtype=float)
        in_burst = (t >= self.every_s) & (np.mod(t, self.every_s) < self.burst_s)
        return np.where(in_burst, self.burst_rps, self.base_rps)

    def describe(self) -> str:
        return (f"bursts: {self.base_rps:g} req/s with {self.burst_s:g} s at {self.burst_rps:g} req/s every "
                f"{self.every_s:g} s, {_duration_text(self.duration_s)}")


@dataclasses.dataclass(frozen=True)
class CsvTrace(LoadTrace):
    """Arrival rates read from a CSV file, linear between rows; time runs from the first row's time."""

    times_s: tuple[float, ...] = ()
    rates_rps: tuple[float, ...] = ()
    source: str = ""

    def rate_rps(self, t_s: np.ndarray) -> np.ndarray:
        t = np.asarray(t_s, dtype=float) + self.times_s[0]
        return np.interp(t, self.times_s, self.rates_rps)

    def describe(self) -> str:
        return f"{self.source}: {len(self.times_s)} rows over {_duration_text(self.duration_s)}"


def _check_positive(what: str, value: float, unit: str) -> None:
    if not (math.isfinite(value) and value > 0):
        raise TraceError(f"{what} must be > 0 {unit} (got {value:g})")


def _check_nonnegative(what: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise TraceError(f"{what} must be a rate >= 0 requests/s (got {value:g})")


def _duration_text(seconds: float) -> str:
    if seconds >= 3600 and seconds % 360 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 6 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


_FORMS = ("constant:RPS[:SECONDS]", "diurnal:PEAK:TROUGH[:HOURS]", "bursts:BASE:PEAK[:EVERY_S[:LENGTH_S]]",
          "FILE.csv")


def parse_trace(text: str, default_duration_s: float = 3600.0, scale: float = 1.0) -> LoadTrace:
    """A trace from its `--trace` form (see the module docstring); `scale` compresses a request log's time."""
    if text.lower().endswith(".csv"):
        from .requestlog import is_request_log, read_request_log

        if is_request_log(text):
            return read_request_log(text, scale)
        if scale != 1:
            raise TraceError(f"--trace-scale applies to a request log; {text} has no header naming arrival, "
                             "input and output tokens (it is read as time_s,arrival_rate_rps)")
        return read_csv_trace(text)
    if scale != 1:
        raise TraceError(f"--trace-scale applies to a request log (FILE.csv), not to {text!r}; raise the rates "
                         "in the trace instead")
    kind, _, rest = text.partition(":")
    fields = [f for f in rest.split(":")] if rest else []
    try:
        numbers = [float(f) for f in fields]
    except ValueError:
        raise TraceError(f"--trace {text!r}: every field after the kind must be a number; use one of "
                         f"{', '.join(_FORMS)}") from None
    if kind == "constant" and len(numbers) in (1, 2):
        duration = numbers[1] if len(numbers) == 2 else default_duration_s
        return ConstantTrace(duration_s=duration, rps=numbers[0])
    if kind == "diurnal" and len(numbers) in (2, 3):
        period = numbers[2] * 3600.0 if len(numbers) == 3 else DAY_S
        return DiurnalTrace(duration_s=period, peak_rps=numbers[0], trough_rps=numbers[1], period_s=period)
    if kind == "bursts" and 2 <= len(numbers) <= 4:
        every = numbers[2] if len(numbers) >= 3 else 600.0
        length = numbers[3] if len(numbers) == 4 else 60.0
        return BurstTrace(duration_s=default_duration_s, base_rps=numbers[0], burst_rps=numbers[1],
                          every_s=every, burst_s=length)
    raise TraceError(f"--trace {text!r} is not a trace; use one of {', '.join(_FORMS)}")


def read_csv_trace(path: str | Path) -> CsvTrace:
    """Rows of `time_s,arrival_rate_rps`; errors name the file, the line and the fix."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise TraceError(f"trace file {path}: cannot read it ({exc.strerror or exc})") from None
    times: list[float] = []
    rates: list[float] = []
    header_allowed = True
    for line_no, row in enumerate(csv.reader(text.splitlines()), start=1):
        cells = [c.strip() for c in row]
        if not cells or all(not c for c in cells) or cells[0].startswith("#"):
            continue
        first_row, header_allowed = header_allowed, False
        if len(cells) < 2:
            raise TraceError(f"{path} line {line_no}: expected two columns time_s,arrival_rate_rps "
                             f"(got {','.join(row)!r})")
        try:
            t, rate = float(cells[0]), float(cells[1])
        except ValueError:
            if first_row and not _looks_numeric(cells[0]):
                continue  # a header line
            raise TraceError(f"{path} line {line_no}: time_s and arrival_rate_rps must be numbers "
                             f"(got {cells[0]!r}, {cells[1]!r})") from None
        if not math.isfinite(t) or not math.isfinite(rate):
            raise TraceError(f"{path} line {line_no}: values must be finite (got {cells[0]!r}, {cells[1]!r})")
        if rate < 0:
            raise TraceError(f"{path} line {line_no}: arrival_rate_rps must be >= 0 (got {rate:g})")
        if times and t <= times[-1]:
            raise TraceError(f"{path} line {line_no}: time_s must increase from row to row "
                             f"(got {t:g} after {times[-1]:g})")
        times.append(t)
        rates.append(rate)
    if len(times) < 2:
        raise TraceError(f"{path}: needs at least two rows of time_s,arrival_rate_rps (found {len(times)})")
    return CsvTrace(duration_s=times[-1] - times[0], times_s=tuple(times), rates_rps=tuple(rates),
                    source=path.name)


def _looks_numeric(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True
