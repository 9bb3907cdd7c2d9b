"""The operator's verdict on a SpeculationProfile and how it reads one: the phase it decided is recorded in an
annotation (metadata, which the benchmark identity cannot write), and wins over whatever status.phase says. Pure."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

__all__ = ["OPERATOR_NOTE_REASONS", "TERMINAL_PHASES", "VERDICT_ANNOTATION", "VERDICT_MESSAGE_CHARS", "OwnedView",
           "job_completed_at", "owned_view", "result_complete", "verdict_annotation", "verdict_message", "verdict_of"]


VERDICT_ANNOTATION = "specpilot.io/verdict"
"""On a SpeculationProfile: the operator's own record of the phase it decided (Succeeded or Failed) with its reason
and message, as JSON. Metadata, which the benchmark identity cannot write (it may patch status only): status.phase,
reason and message mirror it, and a status that disagrees was written by someone else."""


VERDICT_MESSAGE_CHARS = 2048


TERMINAL_PHASES = ("Succeeded", "Failed")


def verdict_of(profile: dict) -> dict | None:
    """The operator's verdict on a profile ({"phase", "reason", "message"}), or None while it has given none."""
    text = (((profile.get("metadata") or {}).get("annotations")) or {}).get(VERDICT_ANNOTATION)
    if not text:
        return None
    try:
        verdict = json.loads(text)
    except ValueError:
        return None
    if not isinstance(verdict, dict) or verdict.get("phase") not in TERMINAL_PHASES:
        return None
    return {"phase": verdict["phase"], "reason": verdict.get("reason"), "message": verdict.get("message")}


def verdict_message(message: str | None) -> str | None:
    """A verdict's message as the annotation keeps it, and as the status carries it beside the verdict."""
    return (message or "")[:VERDICT_MESSAGE_CHARS] or None


def verdict_annotation(phase: str, reason: str | None, message: str | None) -> str:
    """The annotation value recording the operator's verdict."""
    return json.dumps({"phase": phase, "reason": reason, "message": verdict_message(message)}, sort_keys=True)


OPERATOR_NOTE_REASONS = frozenset({"Measuring", "PodNotStarting"})
"""Reasons the operator writes beside a verdict while a later Job (a refinement round) measures the profile: text
of these is its own, not a rewrite of the verdict's."""


def result_complete(profile: dict) -> bool:
    """Whether the profile's status holds every run its measurement needs (k=0 for a baseline, 1 and K for a
    method), each with points: a result the operator may check and, when sealed and plausible, accept."""
    spec = profile.get("spec") or {}
    method = spec.get("method")
    try:
        expected = {0} if not method else {1, int(method.get("numSpeculativeTokens") or 0)}
    except (TypeError, ValueError, AttributeError):
        return False
    runs = (profile.get("status") or {}).get("runs") or []
    measured = {r.get("numSpeculativeTokens") for r in runs if isinstance(r, dict) and r.get("points")}
    return expected <= measured


@dataclass(frozen=True)
class OwnedView:
    """A profile as the operator reads it: its phase from the operator's verdict, or (before one) from the
    sealed result and the Job; never from a status.phase someone else wrote."""

    profile: dict
    """The profile with status.phase, reason and message replaced by what the operator stands by."""
    phase: str
    """Pending, Running, Succeeded (a verdict, or a complete result to check) or Failed (a verdict)."""
    written: str | None
    """status.phase as stored, when it differs from `phase` (None: they agree)."""
    forged: bool
    """The stored phase is a decision (Succeeded or Failed) the operator did not make: reported, then restored."""
    text_forged: bool = False
    """status.reason or status.message differ from the operator's verdict while status.phase agrees: someone
    rewrote the text alone (reported, then restored)."""


def owned_view(profile: dict) -> OwnedView:
    """The operator's view of a profile (pure): a verdict wins over status; before a verdict a complete result is
    a Succeeded candidate (its seal and plausibility are checked next), anything else is Pending or Running
    whatever status.phase says."""
    status = profile.get("status") or {}
    stored = status.get("phase") or "Pending"
    verdict = verdict_of(profile)
    if verdict is not None:
        phase, reason, message = verdict["phase"], verdict["reason"], verdict["message"]
        view_status = {**status, "phase": phase, "reason": reason, "message": message}
        forged = stored in TERMINAL_PHASES and stored != phase
        text_forged = stored == phase and status.get("reason") not in OPERATOR_NOTE_REASONS and (
            status.get("reason"), status.get("message")) != (reason, message)
        return OwnedView({**profile, "status": view_status}, phase, stored if stored != phase else None, forged,
                         text_forged)
    else:
        phase = "Succeeded" if result_complete(profile) else ("Pending" if stored == "Pending" else "Running")
        view_status = {**status, "phase": phase}
        forged = stored in TERMINAL_PHASES and stored != phase
    return OwnedView({**profile, "status": view_status}, phase, stored if stored != phase else None, forged)


def job_completed_at(job: dict) -> datetime | None:
    """When a Job completed (status.completionTime, else its Complete condition's transition), or None."""
    status = job.get("status") or {}
    stamp = status.get("completionTime") or next(
        (c.get("lastTransitionTime") for c in status.get("conditions") or []
         if c.get("type") in ("Complete", "SuccessCriteriaMet") and c.get("status") == "True"), None)
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None
