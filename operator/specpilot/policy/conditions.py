"""Status conditions: upserting one (its transition time moves only when its status does) and the
MetricsTruncated condition's rule. Pure."""

from __future__ import annotations

from datetime import datetime

from ..api.base import Condition

__all__ = ["TRUNCATED_SHOWN", "set_condition", "truncated_condition"]


TRUNCATED_SHOWN = 3
"""Cut reads named in the MetricsTruncated message; the rest are counted."""


def truncated_condition(cut: list[str], old: list[Condition]) -> tuple[bool, str, str] | None:
    """The MetricsTruncated condition (status, reason, message) after an observation: True when a read bound
    (size, time, series, draft positions) left something out, saying what; False once a later observation
    read everything; None while it never was True (the condition appears only once a bound was hit)."""
    if cut:
        shown = "; ".join(cut[:TRUNCATED_SHOWN]) + (f"; and {len(cut) - TRUNCATED_SHOWN} more" if
                                                     len(cut) > TRUNCATED_SHOWN else "")
        return True, "ReadLimitExceeded", (f"{shown}. The operator bounds what it reads from metrics endpoints "
                                           "(its metricsReadLimits config); decisions use what was read within them")
    if any(c.type == "MetricsTruncated" for c in old):
        return False, "WithinLimits", "the last observation was read within the operator's metricsReadLimits"
    return None


def set_condition(conditions: list[Condition], type_: str, status: bool | None, reason: str, message: str,
                  generation: int | None, now: datetime) -> list[Condition]:
    """Upsert a condition; lastTransitionTime moves only when the status changes."""
    value = "Unknown" if status is None else ("True" if status else "False")
    out = []
    found = False
    for c in conditions:
        if c.type == type_:
            found = True
            changed = c.status != value
            out.append(Condition(type=type_, status=value, reason=reason, message=message,
                                 last_transition_time=now if changed else (c.last_transition_time or now),
                                 observed_generation=generation))
        else:
            out.append(c)
    if not found:
        out.append(Condition(type=type_, status=value, reason=reason, message=message,
                             last_transition_time=now, observed_generation=generation))
    return out
