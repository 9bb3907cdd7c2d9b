"""Make a status (or a status merge patch) safe to send to the API server. Pure.

The API server refuses a whole write for one bad value: JSON has no NaN or Infinity (a 422, or a 400
from the client's encoder), integers beyond int64 do not fit, and an object may not exceed about
1.5 MB (413). A status computed from numbers a pod or Prometheus sent could hold any of these, and one
refused write used to stop kopf's timers for that object for good. `sanitize` replaces non-finite
numbers by null (in a merge patch null removes the key), clamps absurd magnitudes, cuts long strings
and lists, and `bounded_status` shrinks those bounds until the serialised status fits its budget.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

MAX_NUMBER = 1e15
"""Largest magnitude kept: far above any rate, count or price specpilot reports, far below int64 (9.2e18)
and inside a double's exact integers (2**53 = 9.0e15)."""
MAX_STRING = 32768
"""Longest string kept (a Condition message's schema bound); longer ones are cut with a marker."""
MAX_LIST = 4096
"""Most items kept in one list (the longest status list of the CRD, a schedule, has maxItems 4096)."""
MAX_KEYS = 1024
"""Most keys kept in one mapping."""
MAX_DEPTH = 32
"""Deeper values are dropped (null): no status of specpilot nests half as deep."""
STATUS_BUDGET_BYTES = 256 * 1024
"""What a status may take as compact JSON: well below the API server's 1.5 MB object limit, leaving room for
the spec (capped at 128 KiB by the tenancy policy) and metadata."""
CUT_MARK = "...(cut)"


@dataclass
class Report:
    """What `sanitize` changed (counts), so the caller can say so in a log line."""

    non_finite: int = 0
    clamped: int = 0
    strings_cut: int = 0
    lists_cut: int = 0
    dropped: int = 0

    def __bool__(self) -> bool:
        return bool(self.non_finite or self.clamped or self.strings_cut or self.lists_cut or self.dropped)

    def __str__(self) -> str:
        parts = [f"{n} {what}" for n, what in ((self.non_finite, "non-finite number(s) set to null"),
                                                (self.clamped, "number(s) clamped"),
                                                (self.strings_cut, "string(s) cut"),
                                                (self.lists_cut, "list(s) or mapping(s) cut"),
                                                (self.dropped, "value(s) too deep dropped")) if n]
        return ", ".join(parts) or "nothing changed"


def sanitize(value: Any, *, max_string: int = MAX_STRING, max_list: int = MAX_LIST, max_keys: int = MAX_KEYS,
             max_number: float = MAX_NUMBER, report: Report | None = None, _depth: int = 0) -> Any:
    """A copy of `value` (JSON-like: dicts, lists, str, numbers, bools, None) that the API server accepts:
    NaN/±Inf -> None, |x| > max_number -> ±max_number, strings over max_string characters cut, lists
    cut to their first max_list items, mappings to their first max_keys keys, anything else (a date, an
    enum) kept as its JSON form would be by the caller's encoder. Never raises."""
    report = report if report is not None else Report()
    kwargs = dict(max_string=max_string, max_list=max_list, max_keys=max_keys, max_number=max_number,
                  report=report, _depth=_depth + 1)
    if _depth > MAX_DEPTH:
        report.dropped += 1
        return None
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            report.non_finite += 1
            return None
        if abs(value) > max_number:
            report.clamped += 1
            return math.copysign(max_number, value)
        return value
    if isinstance(value, int):
        if abs(value) > max_number:
            report.clamped += 1
            return int(math.copysign(max_number, value))
        return value
    if isinstance(value, str):
        if len(value) > max_string:
            report.strings_cut += 1
            return value[:max(0, max_string - len(CUT_MARK))] + CUT_MARK
        return value
    if isinstance(value, dict):
        items = list(value.items())
        if len(items) > max_keys:
            report.lists_cut += 1
            items = items[:max_keys]
        return {str(k)[:max_string]: sanitize(v, **kwargs) for k, v in items}
    if isinstance(value, (list, tuple)):
        items = list(value)
        if len(items) > max_list:
            report.lists_cut += 1
            items = items[:max_list]
        return [sanitize(v, **kwargs) for v in items]
    return value


def size_bytes(value: Any) -> int:
    """Compact JSON size (non-JSON values such as datetimes counted by their str())."""
    return len(json.dumps(value, separators=(",", ":"), default=str, allow_nan=True))


def bounded_status(status: dict, budget_bytes: int = STATUS_BUDGET_BYTES) -> tuple[dict, Report]:
    """`sanitize(status)`, then smaller bounds on strings and lists until its compact JSON fits budget_bytes.

    The first pass keeps every value a valid status holds; the later ones cut what is longest first
    (messages, then lists) and are reached only by a status that something hostile or broken inflated."""
    report = Report()
    out = sanitize(status, report=report)
    max_string, max_list = MAX_STRING, MAX_LIST
    while size_bytes(out) > budget_bytes and (max_string > 64 or max_list > 1):
        max_string, max_list = max(64, max_string // 4), max(1, max_list // 4)
        report = Report()
        out = sanitize(status, max_string=max_string, max_list=max_list, report=report)
    return out, report
