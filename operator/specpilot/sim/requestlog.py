"""Request logs for `specpilot simulate --trace FILE.csv`: one row per request, replayed as it came.

A log gives each request's arrival and its input and output tokens; the simulator replays those arrivals and
lengths (not Poisson arrivals at the log's rate), so bursts and long requests arrive as they did. The columns
are found by their header, in the names public production traces use:

- arrival: `TIMESTAMP` (Azure's LLM inference traces), `arrival_s`, `arrival_time`, `time_s`, `timestamp_s`;
  a number is seconds, anything else a date and time (`2023-11-16 18:15:46.6805900`, ISO 8601);
- input tokens: `ContextTokens` (Azure), `input_tokens`, `prompt_tokens`, `input_len`, `prompt_len`;
- output tokens: `GeneratedTokens` (Azure), `output_tokens`, `completion_tokens`, `output_len`, `generated_tokens`.

Names match without regard to case; other columns are ignored; `#` lines are comments. Time runs from the
first request; rows out of order are sorted. `scale` compresses time (2: twice the rate, half the duration).
What is read is bounded (`LogLimits`); a bad row stops the read with its line and the fix.
"""

from __future__ import annotations

import csv
import dataclasses
import math
from datetime import datetime
from pathlib import Path

import numpy as np

from .traces import LoadTrace, TraceError
from .workloads import LengthDistribution, RequestLengths

__all__ = ["DRAIN_S", "LogLimits", "RequestLog", "is_request_log", "read_request_log"]

DRAIN_S = 60.0
"""A replayed log runs this long after its last arrival, so its last requests can finish."""
RATE_BIN_S = 10.0
"""The log's arrival rate (what planners observe) is its count of arrivals per bin of this many seconds."""

ARRIVAL_COLUMNS = ("timestamp", "arrival_s", "arrival_time", "arrival_time_s", "time_s", "timestamp_s")
INPUT_COLUMNS = ("contexttokens", "input_tokens", "prompt_tokens", "input_len", "prompt_len")
OUTPUT_COLUMNS = ("generatedtokens", "output_tokens", "completion_tokens", "output_len", "generated_tokens")


@dataclasses.dataclass(frozen=True)
class LogLimits:
    """What a log may hold: more is refused with the fix, before a run spends minutes or memory on it."""

    max_bytes: int = 512 * 1024 * 1024
    max_rows: int = 5_000_000
    max_input_tokens: int = 1_000_000
    max_output_tokens: int = 100_000


@dataclasses.dataclass(frozen=True, eq=False)
class RequestLog(LoadTrace):
    """Requests as logged: arrival (seconds from the first, ascending), input and output tokens."""

    arrival_s: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    input_tokens: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    output_tokens: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    source: str = ""
    scale: float = 1.0

    def __post_init__(self) -> None:
        # the per-bin counts, once: planners ask for the rate at every control step
        counts = np.bincount((self.arrival_s // RATE_BIN_S).astype(np.int64),
                             minlength=int(self.duration_s // RATE_BIN_S) + 1)
        object.__setattr__(self, "_counts", counts)

    @property
    def requests(self) -> int:
        return int(self.arrival_s.size)

    @property
    def mean_output_tokens(self) -> float:
        return float(self.output_tokens.mean()) if self.requests else 0.0

    def lengths(self, base: RequestLengths) -> RequestLengths:
        """The log's prompt and output lengths as distributions (log-normal, fitted to the log's mean and spread),
        with `base`'s acceptance spread (a log records lengths, not how predictable the text was)."""
        if not self.requests:
            return base
        return dataclasses.replace(base, prompt=_fitted(self.input_tokens, base.prompt),
                                   output=_fitted(self.output_tokens, base.output))

    def arrivals_between(self, t0_s: float, t1_s: float) -> int:
        """Requests arriving in [t0_s, t1_s)."""
        lo, hi = np.searchsorted(self.arrival_s, [t0_s, t1_s], side="left")
        return int(hi - lo)

    def rate_rps(self, t_s: np.ndarray) -> np.ndarray:
        t = np.asarray(t_s, dtype=float)
        counts = self._counts  # type: ignore[attr-defined]
        index = np.clip((t // RATE_BIN_S).astype(np.int64), 0, counts.size - 1)
        return np.where((t >= 0) & (t < self.duration_s), counts[index] / RATE_BIN_S, 0.0)

    def describe(self) -> str:
        scaled = f" at {self.scale:g}x its rate" if self.scale != 1 else ""
        last = float(self.arrival_s[-1]) if self.requests else 0.0
        return (f"{self.source}: {self.requests} logged requests over {last / 60:.1f} min{scaled} "
                f"({self.requests / max(last, 1e-9):.1f} req/s mean), replayed")

    def with_duration(self, duration_s: float) -> RequestLog:
        """The requests arriving within `duration_s` (a longer duration only idles after the last)."""
        if not (math.isfinite(duration_s) and duration_s > 0):
            raise TraceError(f"duration must be > 0 seconds (got {duration_s:g})")
        return self.subset(self.arrival_s < duration_s, duration_s)

    def subset(self, keep: np.ndarray, duration_s: float | None = None) -> RequestLog:
        """The requests where `keep` is true, over the same duration unless given."""
        return dataclasses.replace(self, arrival_s=self.arrival_s[keep], input_tokens=self.input_tokens[keep],
                                   output_tokens=self.output_tokens[keep],
                                   duration_s=self.duration_s if duration_s is None else float(duration_s))

    def thinned(self, every: int) -> RequestLog:
        """Every `every`-th request (a smaller load with the same shape, for quick runs)."""
        keep = np.zeros(self.requests, dtype=bool)
        keep[::max(int(every), 1)] = True
        return self.subset(keep)

    def window_cv(self, window_s: float = 10.0) -> float:
        """Coefficient of variation of the arrivals per window over the log: how bursty it is at that scale."""
        last = float(self.arrival_s[-1]) if self.requests else 0.0
        counts = np.bincount((self.arrival_s // window_s).astype(np.int64), minlength=int(last // window_s) + 1)
        counts = counts[: int(last // window_s)] if last >= window_s else counts  # whole windows only
        return float(counts.std() / counts.mean()) if counts.mean() > 0 else 0.0


def _fitted(tokens: np.ndarray, like: LengthDistribution) -> LengthDistribution:
    """A log-normal with the tokens' mean and log-spread, within `like`'s bounds."""
    values = np.maximum(tokens.astype(float), 1.0)
    sigma = float(np.log(values).std()) if values.size > 1 else 0.0
    return dataclasses.replace(like, mean=float(values.mean()), sigma=sigma, uniform=False)


def _column(header: list[str], names: tuple[str, ...]) -> int | None:
    lowered = [h.strip().lower() for h in header]
    for name in names:
        if name in lowered:
            return lowered.index(name)
    return None


def _header_of(path: Path) -> tuple[int, list[str]] | None:
    """The first row that is not blank or a comment, with its line number."""
    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f)
        for row in reader:
            if row and any(c.strip() for c in row) and not row[0].strip().startswith("#"):
                return reader.line_num, row
    return None


def is_request_log(path: str | Path) -> bool:
    """Whether the CSV's header names an arrival, an input-token and an output-token column."""
    try:
        first = _header_of(Path(path))
    except OSError:
        return False
    if first is None:
        return False
    header = first[1]
    return all(_column(header, names) is not None for names in (ARRIVAL_COLUMNS, INPUT_COLUMNS, OUTPUT_COLUMNS))


def _timestamp(cell: str) -> datetime | None:
    text = cell.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        return None


def _tokens(cell: str, what: str, limit: int, where: str) -> int:
    try:
        value = float(cell)
    except ValueError:
        raise TraceError(f"{where}: {what} must be a whole number of tokens (got {cell!r}); fix or drop the row"
                         ) from None
    if not (math.isfinite(value) and value >= 0 and value == int(value)):
        raise TraceError(f"{where}: {what} must be a whole number of tokens >= 0 (got {cell!r}); fix or drop "
                         "the row")
    if value > limit:
        raise TraceError(f"{where}: {what} {int(value)} is over the {limit} tokens one request may have; "
                         "cap it or drop the row")
    return int(value)


def read_request_log(path: str | Path, scale: float = 1.0, limits: LogLimits | None = None) -> RequestLog:
    """The log at `path` (see the module docstring), time compressed by `scale`; errors name the line and fix."""
    limits = limits or LogLimits()
    path = Path(path)
    if not (math.isfinite(scale) and scale > 0):
        raise TraceError(f"--trace-scale must be > 0 (got {scale:g})")
    try:
        size = path.stat().st_size
        first = _header_of(path)
    except OSError as exc:
        raise TraceError(f"request log {path}: cannot read it ({exc.strerror or exc})") from None
    if size > limits.max_bytes:
        raise TraceError(f"request log {path}: {size} bytes is over the {limits.max_bytes} read; cut the log "
                         "(e.g. the hours you want to replay)")
    if first is None:
        raise TraceError(f"request log {path}: no header; the first row must name the columns, e.g. "
                         "TIMESTAMP,ContextTokens,GeneratedTokens or arrival_s,input_tokens,output_tokens")
    header_line, header = first
    columns = [_column(header, names) for names in (ARRIVAL_COLUMNS, INPUT_COLUMNS, OUTPUT_COLUMNS)]
    if any(c is None for c in columns):
        raise TraceError(f"{path} line {header_line}: the header must name an arrival, an input-token and an "
                         "output-token column, e.g. TIMESTAMP,ContextTokens,GeneratedTokens or "
                         f"arrival_s,input_tokens,output_tokens (got {','.join(header)!r})")
    a_col, i_col, o_col = columns
    width = max(columns) + 1
    seconds: list[float] = []
    stamps: list[datetime] = []
    inputs: list[int] = []
    outputs: list[int] = []
    kind: str | None = None
    with path.open(newline="", encoding="utf-8", errors="replace") as f:
        reader = csv.reader(f)
        for row in reader:
            line = reader.line_num
            if line <= header_line or not row or not any(c.strip() for c in row) or row[0].strip().startswith("#"):
                continue
            where = f"{path} line {line}"
            if len(row) < width:
                raise TraceError(f"{where}: expected {width} columns as the header names (got {len(row)}: "
                                 f"{','.join(row)!r}); fix or drop the row")
            if len(inputs) >= limits.max_rows:
                raise TraceError(f"request log {path}: more than {limits.max_rows} requests; cut the log "
                                 f"(e.g. its first {limits.max_rows} rows)")
            cell = row[a_col].strip()
            try:
                value = float(cell)
                this = "seconds"
            except ValueError:
                stamp = _timestamp(cell)
                if stamp is None:
                    raise TraceError(f"{where}: arrival {cell!r} is neither seconds nor a date and time "
                                     "(e.g. 2023-11-16 18:15:46.680); fix or drop the row") from None
                this = "timestamp"
            kind = kind or this
            if this != kind:
                raise TraceError(f"{where}: arrival {cell!r} is a {this} but earlier rows give {kind}s; use one "
                                 "form for every row")
            if this == "seconds":
                if not math.isfinite(value) or value < 0:
                    raise TraceError(f"{where}: arrival must be seconds >= 0 (got {cell!r}); fix or drop the row")
                seconds.append(value)
            else:
                if stamps and (stamp.tzinfo is None) != (stamps[0].tzinfo is None):
                    raise TraceError(f"{where}: arrival {cell!r} mixes timestamps with and without a time zone; "
                                     "give every row the same form")
                stamps.append(stamp)
            inputs.append(_tokens(row[i_col].strip(), header[i_col].strip(), limits.max_input_tokens, where))
            outputs.append(_tokens(row[o_col].strip(), header[o_col].strip(), limits.max_output_tokens, where))
    if not inputs:
        raise TraceError(f"request log {path}: no requests after the header")
    if kind == "timestamp":
        origin = min(stamps)
        arrival = np.array([(s - origin).total_seconds() for s in stamps])
    else:
        arrival = np.array(seconds)
    order = np.argsort(arrival, kind="stable")
    arrival = (arrival[order] - arrival[order][0]) / scale
    return RequestLog(duration_s=float(arrival[-1]) + DRAIN_S, arrival_s=arrival,
                      input_tokens=np.array(inputs, dtype=np.int64)[order],
                      output_tokens=np.array(outputs, dtype=np.int64)[order], source=path.name, scale=scale)
